"""Two real encoders compared on one sample: the compare job's interval against the true difference.

Every encoder's benchmark of one split and kind (`benchmarks/text_galleries.py`: the same npm
summaries, the same hash-sampled distractors in each draw) is predicted per query set as
`interval_coverage.py` predicts it (the predict job's protocol), each prediction kept whole in
`--out`. Each pair of encoders on the same queries, fraction and draw is then compared
(`comparison.compare`) twice: with the sampling errors correlated as the predictions' nested
replicates are (drawn by distractor id, so the items both models scored got one weight in both),
and with the replicates dropped (the errors independent, as before). Each against the exact
difference of the two realized mAP@k. Printed per set size and fraction: the difference's MAE,
the coverage of both 90% intervals and their median half-widths, the median correlation.

  python benchmarks/paired_text.py --cache=/work/cache/text --split=dev --sets=4 \\
      --out=workdir/paired_dev.jsonl

With `--spread=RECORDS` (`sampling_spread.py`'s, ten draws per benchmark) it prints instead the
correlation of two encoders' whole-set errors over the draws: the pairing's truth.
"""

import argparse
import collections
import itertools
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import interval_coverage  # noqa: E402  (benchmarks/interval_coverage.py: the sets and the loop)

from tailaware.protocol import comparison, prediction, schema  # noqa: E402


def one(scores, truth_counts, n_full, settings) -> dict:
    """Returns `interval_coverage.one`'s record plus the prediction.json object."""
    t0 = time.time()
    hardness, p = prediction.estimate_and_predict(scores, settings, n_full)
    rec = interval_coverage.record(scores, truth_counts, n_full, settings, hardness, p, t0)
    rec["prediction"] = schema.prediction_json(p)
    return rec


def _strip(d: dict) -> dict:
    """Returns a prediction.json object without its nested replicates."""
    d = json.loads(json.dumps(d))
    for m in (d, *d.get("metrics", {}).values()):
        m.get("uncertainty", {}).pop("distractor_replicates", None)
    return d


def pairs(records: dict[str, dict]) -> list[dict]:
    """Returns one row per pair of encoders on the same kind, queries, fraction and draw."""
    groups = collections.defaultdict(dict)
    for r in records.values():
        split, encoder, kind = r["benchmark"].split("-", 2)
        groups[(split, kind, r["fraction"], r["draw"], r["set"])][encoder] = r
    rows = []
    for (_, kind, frac, draw, name), by_enc in sorted(groups.items()):
        for ea, eb in itertools.combinations(sorted(by_enc), 2):
            ra, rb = by_enc[ea], by_enc[eb]
            truth = ra["truth"] - rb["truth"]
            row = {"pair": f"{ea}-{eb}", "kind": kind, "fraction": frac, "draw": draw}
            row.update(set=name, size=len(ra["prediction"]["per_query_ap"]), truth=truth)
            for tag, strip in (("paired", False), ("independent", True)):
                a, b = (
                    schema.prediction_from_json(
                        _strip(r["prediction"]) if strip else r["prediction"]
                    )
                    for r in (ra, rb)
                )
                ap = comparison.compare(a, b).ap
                lo, hi = ap.ci90
                row[tag] = {
                    "error": ap.difference - truth,
                    "covered": bool(lo <= truth <= hi),
                    "half_width": (hi - lo) / 2,
                    "correlation": ap.sampling_correlation,
                    "resolved": ap.resolved,
                }
            rows.append(row)
    return rows


def summarize(rows: list[dict], by: str = "fraction") -> list[str]:
    """Returns the table of `rows` per query-set size and `by` ("fraction" or "pair")."""
    out = [
        f"{'queries':>7} {by:>14} {'n':>4} {'MAE':>7} {'corr':>6}  "
        f"{'cover90 paired':>14} {'half-width':>10}  {'cover90 indep.':>14} {'half-width':>10}"
    ]
    cells = collections.defaultdict(list)
    for r in rows:
        cells[(r["size"], r[by])].append(r)
    for (size, key), rs in sorted(cells.items()):
        p, i = ([r[t] for r in rs] for t in ("paired", "independent"))
        out.append(
            f"{size:>7} {key:>14} {len(rs):>4} "
            f"{np.mean([abs(x['error']) for x in p]):>7.4f} "
            f"{np.median([x['correlation'] for x in p]):>6.2f}  "
            f"{np.mean([x['covered'] for x in p]):>14.2f} "
            f"{np.median([x['half_width'] for x in p]):>10.4f}  "
            f"{np.mean([x['covered'] for x in i]):>14.2f} "
            f"{np.median([x['half_width'] for x in i]):>10.4f}"
        )
    return out


def over_draws(paths: list[str]) -> list[str]:
    """Returns, from `sampling_spread.py`'s records (ten draws of each benchmark), per kind,
    fraction and pair of encoders: the correlation of the two whole-set errors over the draws,
    the sd of their difference and of the two taken as independent."""
    errors = collections.defaultdict(dict)
    for path in paths:
        with open(path) as f:
            for line in f:
                r = json.loads(line)
                if r["set"].startswith("all"):
                    errors[(r["benchmark"], r["fraction"])][r["draw"]] = r["map"] - r["truth"]
    out = [f"{'kind':<9} {'fraction':>8} {'pair':<11} {'draws':>5} {'corr':>6} {'sd A-B':>7} "
           f"{'indep.':>7}"]  # fmt: skip
    names = sorted({b for b, _ in errors})
    for (ba, frac), (bb, _) in itertools.product(sorted(errors), repeat=2):
        split_a, enc_a, kind = ba.split("-", 2)
        split_b, enc_b, kind_b = bb.split("-", 2)
        if (split_a, kind, frac) != (split_b, kind_b, _) or names.index(ba) >= names.index(bb):
            continue
        ea, eb = errors[(ba, frac)], errors[(bb, frac)]
        draws = sorted(set(ea) & set(eb))
        x, y = (np.array([e[d] for d in draws]) for e in (ea, eb))
        out.append(
            f"{kind:<9} {frac:>8} {enc_a + '-' + enc_b:<11} {len(draws):>5} "
            f"{np.corrcoef(x, y)[0, 1]:>+6.2f} {np.std(x - y, ddof=1):>7.4f} "
            f"{np.hypot(np.std(x, ddof=1), np.std(y, ddof=1)):>7.4f}"
        )
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    interval_coverage.add_arguments(p)
    p.add_argument("--rows", default="", help="also write one JSON line per pair here")
    p.add_argument("--encoders", default="", help="only pairs of these (comma-separated)")
    p.add_argument(
        "--spread", default="", help="sampling_spread.py's records (comma-separated): only "
        "the correlation of two encoders' errors over the draws"
    )  # fmt: skip
    args = p.parse_args()
    if args.spread:
        print("\n".join(over_draws(args.spread.split(","))))
        return
    rows = pairs(interval_coverage.run(args, one))
    if args.encoders:
        keep = set(args.encoders.split(","))
        rows = [r for r in rows if set(r["pair"].split("-")) <= keep]
    if args.rows:
        with open(args.rows, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
    print("\n".join(summarize(rows) + [""] + summarize(rows, "pair")))


if __name__ == "__main__":
    main()
