"""Predicted mAP@k against the simulator's exact truth on every distractor-law family.

The validate job (`configs/validate.py`) studies two families in depth (20 draws, intervals,
calibration). This sweep asks the cheaper, broader question: how biased is each estimator on
tail shapes it was not designed around? For every family in `simulate.FAMILIES` (bounded
penultimate laws, exact GPD tails partly shorter than the averaged estimator's prior, beta,
an untruncated Gaussian, a near-duplicate mixture), a benchmark in the paper regime
(`simulate.REGIMES["paper"]`), N = 10^8, and sample fractions 0.05%, 1% and 5%, it prints the
mean error (prediction minus realized truth) of `evt_averaged`, `evt` and `count` over a few
independent draws, the mean absolute error of each estimator over all cells, and how often the
90% interval of `evt_averaged` held the truth (the reported interval without its nested
bootstrap: the query bootstrap widened by the threshold and prior terms, `intervals.
item_intervals`; and the query interval alone).

`--grid sizes` asks the same at other gallery sizes and sample fractions (N = 7.6e5 to 1e9,
S = 1e4 to 3e7: a GLDv2-sized pool, small samples whose top 4,000 reach deep into the bulk,
large fractions where the count is nearly right), 13 (N, f) cells per family; `--grid small`
at S = 20 to 10,000 of a 200k pool (below the ILIAS job's sample floor).

Commands (about one / three minutes on 2 cores):
  python benchmarks/tail_families.py [--queries 200] [--draws 2] [--seed 0] [--xi_tilt 0]
  python benchmarks/tail_families.py --grid sizes
(`--xi_tilt` overrides the averaged estimator's prior lean, `TailSettings.xi_tilt`.)
Prints the table, then one JSON line with every cell.
"""

import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from tailaware.core import evaluate, metrics  # noqa: E402
from tailaware.protocol import prediction  # noqa: E402
from tailaware.protocol.settings import PredictSettings  # noqa: E402
from tailaware.sim import simulate  # noqa: E402
from tailaware.tail import estimators  # noqa: E402

MAP = (metrics.METRICS["map"],)  # the interval of mAP@k alone
from tailaware.tail.settings import TailSettings  # noqa: E402

ESTIMATORS = ("evt_averaged", "evt", "count")
# (N, sample fraction) cells of each grid.
GRIDS = {
    "paper": [(100_000_000, f) for f in (0.0005, 0.01, 0.05)],
    "sizes": [
        (759_000, 0.05),
        (1_000_000, 0.01),
        (1_000_000, 0.1),
        (1_000_000, 0.5),
        (10_000_000, 0.002),
        (10_000_000, 0.05),
        (10_000_000, 0.3),
        (100_000_000, 0.0005),
        (100_000_000, 0.01),
        (100_000_000, 0.05),
        (100_000_000, 0.2),
        (1_000_000_000, 0.001),
        (1_000_000_000, 0.01),
    ],
    # Small samples of a 200k pool, S = 20 to 10,000: coverage below and at the ILIAS job's
    # floor (`budget.MIN_SAMPLE`; docs/validation.md, "The smallest sample").
    "small": [(200_000, f) for f in (0.0001, 0.001, 0.0025, 0.005, 0.01, 0.05)],
}


def _parse():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--queries", type=int, default=200)
    p.add_argument("--draws", type=int, default=2)
    p.add_argument("--families", default=",".join(simulate.FAMILIES))
    p.add_argument("--grid", choices=sorted(GRIDS), default="paper")
    p.add_argument("--k", type=int, default=1000)
    p.add_argument(
        "--seed",
        type=int,
        default=0,
        help="benchmarks and draws (0: the one docs/validation.md reports)",
    )
    p.add_argument("--xi_tilt", type=float, default=None, help="override TailSettings.xi_tilt")
    return p.parse_args()


def cell(bench, fraction, draws, settings: PredictSettings, seed=0) -> dict:
    """Returns the mean truth, each estimator's mean error over `draws` draws, and the share of
    draws whose 90% interval for `evt_averaged` holds the truth: the reported one (query
    bootstrap, threshold and prior terms; no nested bootstrap, for time) and the query interval
    alone."""
    k = settings.k
    errors = {name: [] for name in ESTIMATORS}
    truths, covered, covered_query = [], [], []
    for draw in range(draws):
        d = simulate.draw(bench, fraction, int(settings.tail.top_m), seed * draws + draw)
        sc = d.scores
        truth = metrics.map_from_counts(d.truth_counts, k)
        truths.append(truth)
        for name in ESTIMATORS:
            averaged = name == "evt_averaged"  # with its threshold reruns, for the interval
            if averaged:
                h = prediction.estimate(sc, settings)
            else:
                h = estimators.get(name)(sc, settings.tail)
            aps = evaluate.per_query_ap(h, bench.n_pool, k, sc.fixed_counts, sc)
            errors[name].append(float(aps.mean()) - truth)
            if averaged:
                at_n = prediction.at_target(sc, settings, h, bench.n_pool, metric_list=MAP)
                unc = at_n[f"map@{k}"].interval
                lo, hi = unc.ci90.reported
                covered.append(lo <= truth <= hi)
                covered_query.append(unc.ci90.query[0] <= truth <= unc.ci90.query[1])
    return {
        "truth": float(np.mean(truths)),
        **{n: float(np.mean(e)) for n, e in errors.items()},
        "cover90": float(np.mean(covered)),
        "cover90_query": float(np.mean(covered_query)),
    }


def main():
    args = _parse()
    tail = TailSettings() if args.xi_tilt is None else TailSettings(xi_tilt=args.xi_tilt)
    settings = PredictSettings(k=args.k, tail=tail)
    cells = {}
    head = "  ".join(f"{n:>12}" for n in ESTIMATORS)
    print(f"mean error of mAP@{args.k} ({args.queries} queries, {args.draws} draws)")
    print(f"{'family':<12} {'N':>8} {'fraction':>8} {'truth':>7}  {head}  cover90 (query)")
    for family in args.families.split(","):
        for n_pool, f in GRIDS[args.grid]:
            bench = simulate.make_benchmark(
                args.queries, n_pool, family, seed=args.seed, **simulate.REGIMES["paper"]
            )
            c = cell(bench, f, args.draws, settings, args.seed)
            cells[f"{family}/{n_pool:.3g}/{f}"] = c
            row = "  ".join(f"{c[n]:>+12.4f}" for n in ESTIMATORS)
            row += f"  {c['cover90']:>7.2f} ({c['cover90_query']:.2f})"
            print(f"{family:<12} {n_pool:>8.3g} {f:>8} {c['truth']:>7.4f}  {row}", flush=True)
    mae = {n: float(np.mean([abs(c[n]) for c in cells.values()])) for n in ESTIMATORS}
    cover = {
        t: float(np.mean([c[t] for c in cells.values()])) for t in ("cover90", "cover90_query")
    }
    print(f"{'mean |error| over all cells':<39}  " + "  ".join(f"{mae[n]:>12.4f}" for n in mae))
    print(
        f"evt_averaged's 90% interval held the truth in {cover['cover90']:.0%} of the draws "
        f"(the query interval alone: {cover['cover90_query']:.0%})"
    )
    print(
        json.dumps(
            {
                "queries": args.queries,
                "draws": args.draws,
                "seed": args.seed,
                "grid": args.grid,
                "cells": cells,
                "mae": mae,
                "coverage": cover,
            }
        )
    )


if __name__ == "__main__":
    main()
