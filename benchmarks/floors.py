"""The identifiability floor of every test (or dev) cell: each query's law cut lower, which the
sample sees only when it draws a distractor above the cut.

`tailaware.protocol.floors` holds the argument: for query q, B_q is A_q conditioned on a score
<= t_q (a simulated law: hardness x -> max(x - p, 0) / (1 - p), p = G(t_q); a real gallery: the
query's m highest distractors moved below everything, N and the sample's ids kept, counts
K -> max(K - m, 0)). The two samples differ with probability TV_q = 1 - (1 - p)^S (a law,
exactly) or at most 1 - (1 - f)^m (an id-hash sample), the truth rises by gap_q, and any
estimator whose prediction for q depends only on q's sample, positives, N and k has
max(|bias_A|, |bias_B|) >= mean_q max(0, max over t_q of gap_q - TV_q) / 2.

The cells are the validation's test split (`validation.SPLITS["test"]`, `configs/validate.py`
with seed 0; `--split=dev` the dev split's, with a dev run's records: how far the choices made on
dev can still go): the simulated families at each size (300 queries, the validate job's benchmark
seeds), gaps of E[AP] under the validation's Poisson oracle (`validation.expected_aps`: the
mean over pools of the realized truth the test split draws afresh per draw; the JSON line holds
the recorded realized truths' mean as `truth_realized`); the
real-text benchmarks of `--manifest` (`benchmarks/text_galleries.py`), gaps of the realized AP
of the full gallery, the validation's estimand. With `--records` (a validate run of the test
split) it prints the recorded estimator's bias and MAE in each cell next to the floor. On
`truncnorm` also the floor of benchmarks/identifiability.py (the same Gaussians cut higher,
truth lower: "higher") and the two cuts against each other ("both": the lower cut gives
bias_A - bias_L >= 2 floor_L, the higher one bias_H - bias_A >= 2 floor_H, so max(|bias_L|,
|bias_H|) >= floor_L + floor_H); after the table, the lower and higher floors at that script's
own settings (N = 1e8, k = 1000, 500 queries). Last (`--check`, a text benchmark at a fraction
whose samples are stored whole), the default estimator run on the lower-cut gallery itself:
its samples built from the recorded ones, its bias there next to its bias on the benchmark.

Command (about 2.5 minutes on 2 cores; the dev split about 1 minute):
  python benchmarks/floors.py --manifest=CACHE/manifest.json --records=W/validation.json
  python benchmarks/floors.py --split=dev --manifest=CACHE/manifest.json --records=W/validation.json
Prints the tables, then one JSON line.
"""

import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import identifiability  # noqa: E402  (the sibling script: the higher cut on truncnorm)

from tailaware.core import evaluate  # noqa: E402
from tailaware.io.scores import load_scores  # noqa: E402
from tailaware.protocol import floors, prediction, validation  # noqa: E402
from tailaware.protocol.settings import PredictSettings  # noqa: E402
from tailaware.sim import simulate  # noqa: E402

TARGETS = {0.0005: 0.02, 0.01: 0.01, 0.05: 0.005}  # issue #21's MAE targets per fraction


def _parse():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--split", default="test", choices=sorted(validation.SPLITS))
    p.add_argument("--manifest", default="", help="the text galleries' manifest ('': skip them)")
    p.add_argument("--records", default="", help="that split's validation.json ('': no errors)")
    p.add_argument("--queries", type=int, default=300, help="per simulated benchmark, as tested")
    p.add_argument("--k", type=int, default=100)
    p.add_argument("--check", default=None, help="text benchmark ('': none; SPLIT-minilm-names)")
    p.add_argument("--check_fraction", type=float, default=0.01, help="S must be <= 4,000")
    return p.parse_args()


def law_floors(bench: simulate.Benchmark, k: int, fractions) -> dict:
    """Returns the E[AP] truth and, per fraction, the floor and the share of queries a cut
    helps, for a simulated benchmark cut lower."""
    ap, gaps, masses = floors.law_gaps(bench, k)
    out = {"truth": float(ap.mean())}
    for f in fractions:
        tv = floors.hit_probability(masses[:, None], max(round(f * bench.n_pool), 1))
        out[str(f)] = _cell(gaps, tv)
    return out


def gallery_floors(entry: dict, k: int, fractions) -> dict:
    """As `law_floors`, for a real-text benchmark's full gallery (its manifest entry)."""
    truth = load_scores(entry["truth"])
    ap, gaps, moved = floors.gallery_gaps(truth.pos_counts, truth.fixed_counts, k)
    out = {"truth": float(ap.mean())}
    for f in fractions:
        out[str(f)] = _cell(gaps, floors.hit_probability(f, moved[:, None]))
    return out


def _cell(gaps, tv) -> dict:
    margins = floors.margins(gaps, tv)
    return {"floor": floors.floor(gaps, tv), "share": float(np.mean(margins > 0))}


def default_on_cut(entry: dict, f: float, k: int) -> dict:
    """Returns the default estimator's bias on a real-text benchmark A and on its lower-cut
    gallery B (each query at its best cut for f, `floors.best_cuts`) over the manifest's draws
    at f, B's samples built from A's (`floors.cut_sample`), with the share of queries whose
    sample differs and how far the prediction moved on the queries whose sample did not (the
    empirical-Bayes prior pools the queries)."""
    truth = load_scores(entry["truth"])
    counts, fixed, n = truth.pos_counts, truth.fixed_counts, int(truth.n_sample)
    ap_a, gaps, moved = floors.gallery_gaps(counts, fixed, k)
    tv = floors.hit_probability(f, moved[:, None])
    m = floors.best_cuts(gaps, tv, moved)
    truths = {"A": ap_a, "B": floors.gallery_aps(counts, fixed, k, m[:, None])}
    settings = PredictSettings(k=k)
    rows = []
    for d in entry["sampled"][str(f)]:
        samples = {"A": load_scores(d["scores"])}
        samples["B"] = floors.cut_sample(samples["A"], truth.tail_scores, m)
        aps = {}
        for world, s in samples.items():
            h = prediction.estimate(s, settings)
            aps[world] = evaluate.per_query_ap(h, n, k, s.fixed_counts, s)
        same = (samples["A"].tail_scores == samples["B"].tail_scores).all(axis=1)
        moved_by = np.where(same, aps["B"] - aps["A"], 0.0)
        rows.append(
            [float(np.mean(aps[w] - truths[w])) for w in "AB"]
            + [float(np.mean(~same)), float(moved_by.sum() / len(same))]
        )
    bias_a, bias_b, differs, pooled = (float(v) for v in np.mean(rows, axis=0))
    return {
        "draws": len(rows),
        "floor": floors.floor(gaps, tv),
        "truth_a": float(ap_a.mean()),
        "truth_b": float(truths["B"].mean()),
        "bias_a": bias_a,
        "bias_b": bias_b,
        "differs": differs,
        "tv": float(floors.hit_probability(f, m).mean()),
        "moved_same": pooled,
    }


def recorded(records: dict, cell: str, f: float) -> dict:
    """Returns the recorded estimator's bias and MAE, and the mean realized truth, in a cell."""
    rows = records.get("cells", {}).get(cell, {}).get(str(f))
    if rows is None:
        return {}
    row = rows[records["estimator"]]
    return {"bias": row["bias"], "mae": row["mae"], "truth_realized": rows["_truth"]["mean"]}


def summary(cells: dict, far: float = 3.0) -> str:
    """Returns two lines: per target, the cells whose floor (cut lower) is above it; and the
    cells whose recorded |bias| is above the target and `far` times the floor (on `truncnorm`
    the larger of its floors)."""
    targets = {f: t for f, t in TARGETS.items() if all(str(f) in r for r in cells.values())}
    above = {f: [c for c, r in cells.items() if r[str(f)]["floor"] > t] for f, t in targets.items()}
    line = ", ".join(f"{f * 100:g}%: {len(v)} of {len(cells)}" for f, v in above.items())
    beyond = []
    for cell, res in cells.items():
        for f, t in targets.items():
            c = res[str(f)]
            bound = max(c["floor"], c.get("floor_higher", 0.0))
            if "bias" in c and abs(c["bias"]) > max(t, far * bound):
                beyond.append(f"{cell} {f * 100:g}%")
    return (
        f"floor above the target: {line}\n|bias| above the target and {far:g}x the floor: "
        f"{len(beyond)} cells ({'; '.join(beyond) or '-'})"
    )


def main():
    t0 = time.time()
    args = _parse()
    split = validation.SPLITS[args.split]
    check_name = f"{args.split}-minilm-names" if args.check is None else args.check
    fractions = split.fractions
    records = {}
    if args.records:
        with open(args.records) as fh:
            records = json.load(fh)
    cells = {}
    for i, ((regime, family), n_pool) in enumerate(
        (rf, n) for rf in split.simulated for n in split.sizes
    ):  # the benchmarks and seeds of `validation.study` (seed 0)
        bench = simulate.make_benchmark(
            args.queries, n_pool, family, seed=1000 * i, **simulate.REGIMES[regime]
        )
        res = law_floors(bench, args.k, fractions)
        if family == "truncnorm":  # also the higher cut, and the two cuts against each other
            higher = identifiability.floors(bench, args.k, fractions)
            for f in fractions:
                c = res[str(f)]
                c["floor_higher"] = higher[str(f)]["floor"]
                c["floor_both"] = c["floor"] + c["floor_higher"]
        cells[f"{regime}/{family} N={n_pool:.0e}"] = res
    if args.manifest:
        with open(args.manifest) as fh:
            entries = [e for e in json.load(fh)["benchmarks"] if e.get("split") == args.split]
        for entry in entries:
            cells[f"text/{entry['name']}"] = gallery_floors(entry, args.k, fractions)
    for cell, res in cells.items():
        for f in fractions:
            res[str(f)].update(recorded(records, cell, f))

    est = records.get("estimator", "")
    print(
        f"Identifiability floors of the {args.split} split, mAP@{args.k}: each query's law cut "
        f"lower (floor on max(|bias_A|, |bias_B|)); {est or 'no'} errors from {args.records or '-'}"
    )
    print(
        f"{'cell':<28} {'f':>6} {'truth':>7} {'floor':>7} {'helped':>6} {'target':>6} "
        f"{'bias':>8} {'MAE':>7} {'higher':>7} {'both':>7}"
    )
    for cell, res in cells.items():
        for f in fractions:
            c = res[str(f)]
            bias = f"{c['bias']:>+8.4f} {c['mae']:>7.4f}" if "bias" in c else f"{'':>8} {'':>7}"
            target = f"{TARGETS[f]:>6}" if f in TARGETS else f"{'':>6}"
            higher = (
                f"{c['floor_higher']:>7.4f} {c['floor_both']:>7.4f}" if "floor_both" in c else ""
            )
            print(
                f"{cell:<28} {f * 100:>5.2f}% {res['truth']:>7.4f} {c['floor']:>7.4f} "
                f"{c['share']:>6.2f} {target} {bias} {higher}".rstrip(),
                flush=True,
            )

    print(summary(cells))

    # Both floors at benchmarks/identifiability.py's own settings (its table in the docs).
    print(
        f"\ntruncnorm at N = {identifiability.N_POOL:.0e}, k = 1000, 500 queries "
        "(benchmarks/identifiability.py): floor cut lower / cut higher"
    )
    settings = {}
    for regime in ("paper", "stress"):
        bench = simulate.make_benchmark(
            500,
            identifiability.N_POOL,
            "truncnorm",
            seed=identifiability.SEED,
            **simulate.REGIMES[regime],
        )
        lower = law_floors(bench, 1000, identifiability.FRACTIONS)
        higher = identifiability.floors(bench, 1000)
        settings[regime] = {
            str(f): {"lower": lower[str(f)]["floor"], "higher": higher[str(f)]["floor"]}
            for f in identifiability.FRACTIONS
        }
        row = "  ".join(
            f"{f * 100:g}%: {v['lower']:.4f} / {v['higher']:.4f}"
            for f, v in zip(identifiability.FRACTIONS, settings[regime].values(), strict=True)
        )
        print(f"{regime:<8} {row}", flush=True)
    check = {}
    if args.manifest and check_name:
        check = default_on_cut(entries[check_name], args.check_fraction, args.k)
        c = check
        print(
            f"\nthe default on {check_name} at {args.check_fraction:g} and on its lower-cut "
            f"gallery ({c['draws']} draws): bias A {c['bias_a']:+.4f}, B {c['bias_b']:+.4f} "
            f"(floor {c['floor']:.4f}); truth A {c['truth_a']:.4f}, B {c['truth_b']:.4f}; "
            f"queries whose sample differs {c['differs']:.3f} (mean TV {c['tv']:.3f}); the "
            f"mAP moved {c['moved_same']:+.4f} through the queries whose sample did not"
        )
    seconds = time.time() - t0
    print(f"{seconds:.0f} s")
    print(
        json.dumps(
            {
                "k": args.k,
                "queries": args.queries,
                "records": args.records,
                "estimator": est,
                "cells": cells,
                "identifiability_settings": settings,
                "check": check,
                "seconds": seconds,
            }
        )
    )


if __name__ == "__main__":
    main()
