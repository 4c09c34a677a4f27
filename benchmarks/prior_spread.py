"""The prior's term query by query against the aggregate move, on interval_coverage's records.

Issue #41. `benchmarks/interval_coverage.py` records each prediction's terms against its
realized truth. This script re-estimates each record's query set from the same sampled file
(the same code, so the point is the record's own, checked to 1e-6), takes each query's move
under the flatter and the steeper prior on the tail shape (`evaluate.per_query_aps`), and
writes the record with `prior_spread` (those moves combined as independent errors,
`intervals.prior_spread`) and `prior_moved` (their aggregate move, which the records' 0.5 x
`sd_model` was). Records that already hold `prior_spread` (interval_coverage.py from 6a60460 on)
are read as they are. Then it prints, per benchmark, fraction and set size, the coverage of the
interval for these queries and its median half-width over the MAE with the model term each
way: 0.5 x the aggregate move (the rule before) and `--factor` x the spread, and with
`--shared` 1.5 x the spread plus c x the aggregate move in quadrature. Only the model
term changes; the sampling and realized terms are the records'. ~5 s a record on 2 cores;
`--out` resumes.

  python benchmarks/prior_spread.py --records=workdir/coverage_dev.jsonl \
      --out=workdir/spread_dev.jsonl --factors=0.5,1,1.5,2
"""

import argparse
import collections
import json
import os
import statistics
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from interval_coverage import query_sets  # noqa: E402

from tailaware.core import evaluate  # noqa: E402
from tailaware.io import scores as scores_lib  # noqa: E402
from tailaware.protocol import intervals, prediction  # noqa: E402
from tailaware.protocol.settings import PredictSettings  # noqa: E402

Z90 = statistics.NormalDist().inv_cdf(0.95)


def _parse():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cache", default="/work/cache/text")
    p.add_argument("--records", required=True, help="interval_coverage.py's JSON lines")
    p.add_argument("--out", required=True, help="the records with the spread (resumes)")
    p.add_argument("--size", type=int, default=40)
    p.add_argument("--sets", type=int, default=24)
    p.add_argument("--factors", default="0.5,1,1.5,2")
    p.add_argument(
        "--shared", default="", help="c's of a term c x the aggregate move added in quadrature "
        "to 1.5 x the spread (a bias the set's queries share)"
    )  # fmt: skip
    return p.parse_args()


def spread_of(rec: dict, scores, n: int, idx: np.ndarray, k: int) -> dict:
    """Returns `rec` with its query set's prior spread and aggregate prior move."""
    sub = scores.subset(idx)
    h = prediction.estimate(sub, PredictSettings(k=k))
    aps = evaluate.per_query_aps(h, [n], k, sub.fixed_counts, sub, priors=True)[:, 0, :]
    if abs(aps[0].mean() - rec["map"]) > 1e-6:
        raise ValueError(f"{rec['key']}: point {aps[0].mean()} is not the record's {rec['map']}")
    return dict(
        rec,
        prior_spread=float(intervals.prior_spread(aps[1:, None], aps[None, 0])[0]),
        prior_moved=float(np.abs(aps[1:].mean(axis=1) - aps[0].mean()).max()),
    )


def these(rec: dict, sd_model: float) -> tuple[float, float]:
    """The interval for these queries with the model term `sd_model` (the rest the record's)."""
    s = intervals.sampling_sd(rec["sd_distractor"], rec["sd_subsample"])
    return intervals.for_these_queries(
        rec["map"], Z90, s, float(np.hypot(sd_model, rec["sd_realized"]))
    )


def table(records: list[dict], factors: list[float], shared: list[float] = ()) -> list[str]:
    cells = collections.defaultdict(list)
    for r in records:
        size = "all" if r["set"].startswith("all") else "set"
        cells[(r["benchmark"], r["fraction"], size)].append(r)
        cells[("pooled", "", size)].append(r)
    rules = [("0.5 x move", lambda r: 0.5 * r["prior_moved"])] + [
        (f"{f:g} x spread", lambda r, f=f: f * r["prior_spread"]) for f in factors
    ]
    rules += [
        (
            f"1.5 x spread, {c:g} x move",
            lambda r, c=c: float(np.hypot(1.5 * r["prior_spread"], c * r["prior_moved"])),
        )
        for c in shared
    ]
    out = [
        "| benchmark | fraction | queries | n | MAE | "
        + " | ".join(f"{name}: cover90, hw/MAE" for name, _ in rules)
        + " |",
        "|---|---|---|---|---|" + "---|" * len(rules),
    ]
    for (bench, frac, size), rs in sorted(cells.items()):
        mae = np.mean([abs(r["map"] - r["truth"]) for r in rs])
        parts = []
        for _, rule in rules:
            iv = [these(r, rule(r)) for r in rs]
            cover = np.mean([lo <= r["truth"] <= hi for (lo, hi), r in zip(iv, rs, strict=True)])
            half = np.median([(hi - lo) / 2 for lo, hi in iv])
            parts.append(f"{cover:.2f}, {half / mae:.2f}x")
        queries = "whole" if size == "all" else f"{rs[0]['set'].split('_')[0][1:]}"
        out.append(
            f"| {bench} | {frac} | {queries} | {len(rs)} | {mae:.4f} | " + " | ".join(parts) + " |"
        )
    return out


def main():
    args = _parse()
    with open(os.path.join(args.cache, "manifest.json")) as f:
        manifest = {b["name"]: b for b in json.load(f)["benchmarks"]}
    with open(args.records) as f:
        records = [json.loads(line) for line in f if line.strip()]
    done = {}
    if os.path.exists(args.out):
        with open(args.out) as f:
            done = {r["key"]: r for r in map(json.loads, f)}
    groups = collections.defaultdict(list)
    for r in records:
        if "prior_spread" in r:  # records of interval_coverage (6a60460 on) or of this script
            done[r["key"]] = dict(r, prior_moved=r.get("prior_moved", r.get("prior_deviation")))
        elif r["key"] not in done:
            groups[(r["benchmark"], r["fraction"], r["draw"])].append(r)
    for (name, frac, draw), recs in groups.items():
        bench = manifest[name]
        entry = next(e for e in bench["sampled"][frac] if e["draw"] == draw)
        scores = scores_lib.load_scores(entry["scores"])
        n = int(scores_lib.load_scores(bench["truth"]).n_sample)
        sets = dict(query_sets(scores.query_ids, args.size, args.sets))
        for r in recs:
            got = spread_of(r, scores, n, sets[r["set"]], 100)
            done[r["key"]] = got
            with open(args.out, "a") as f:
                f.write(json.dumps(got) + "\n")
            print(f"{r['key']}: spread {got['prior_spread']:.4f}, move {got['prior_moved']:.4f}")
    factors = [float(x) for x in args.factors.split(",")]
    shared = [float(x) for x in args.shared.split(",") if x]
    print("\n".join(table(list(done.values()), factors, shared)))


if __name__ == "__main__":
    main()
