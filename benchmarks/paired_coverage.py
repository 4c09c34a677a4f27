"""How often the paired comparison's 90% interval holds the true difference of two systems.

Two simulated systems on the same queries (`simulate.second_system`: system B's hardness is
A's times a lognormal factor, against distractor laws of its own), each sampled independently
at fraction f of an N = 10^8 pool, each predicted by the predict job (`prediction.predict`: the
default estimator with its nested bootstrap, threshold reruns and prior reruns), compared by
the compare job (`comparison.compare`). The truth is the difference of the two pools'
realized mAP@1000.

Per cell (family, f) it prints the mean error of the predicted difference, the coverage of the
reported 90% interval (every term), of the interval without the model terms (threshold and
prior: queries and distractor samples alone), its median half-width, and how often the
difference was resolved and, when resolved, of the right sign.

Command (about ten minutes on 2 cores at the defaults):
  python benchmarks/paired_coverage.py [--queries 300] [--draws 8] [--shift 0.7]
Prints the table, then one JSON line with every cell.
"""

import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from tailaware.core import metrics  # noqa: E402
from tailaware.protocol import comparison, prediction  # noqa: E402
from tailaware.protocol.settings import PredictSettings  # noqa: E402
from tailaware.sim import simulate  # noqa: E402

N_POOL = 100_000_000
K = 1000


def _parse():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--queries", type=int, default=300)
    p.add_argument("--draws", type=int, default=8)
    p.add_argument("--fractions", default="0.0005,0.01,0.05")
    p.add_argument("--families", default="kumaraswamy,truncnorm")
    p.add_argument("--shift", type=float, default=0.7, help="B's log hardness shift")
    p.add_argument("--spread", type=float, default=0.5, help="sd of B's log hardness factor")
    return p.parse_args()


def one_draw(bench_a, bench_b, fraction, seed, config) -> dict:
    preds, truths = [], []
    for i, bench in enumerate((bench_a, bench_b)):
        draw = simulate.draw(bench, fraction, 4000, seed=2 * seed + i)
        preds.append(prediction.predict(draw.scores, config, N_POOL))
        truths.append(metrics.map_from_counts(draw.truth_counts, K))
    full = comparison.compare(*preds).ap._asdict()
    a, b = preds
    plain = comparison.paired(
        a.per_query_ap,
        b.per_query_ap,
        sd_distractor_a=a.interval.sd_distractor or 0.0,
        sd_distractor_b=b.interval.sd_distractor or 0.0,
    )
    truth = truths[0] - truths[1]
    inside = lambda ci: bool(ci[0] <= truth <= ci[1])
    return {
        "truth": truth,
        "error": full["difference"] - truth,
        "covered": inside(full["ci90"]),
        "covered_sampling": inside(plain["ci90"]),
        "half_width": 0.5 * (full["ci90"][1] - full["ci90"][0]),
        "resolved": full["resolved"],
        "right_sign": bool(np.sign(full["difference"]) == np.sign(truth)),
    }


def main():
    args = _parse()
    config = PredictSettings()
    regime = simulate.REGIMES["paper"]
    cells = []
    print(
        f"{'family':<13}{'f':>8}{'truth':>9}{'error':>9}{'cover90':>9}{'w/o mdl':>9}"
        f"{'±90':>8}{'resolved':>10}{'sign ok':>9}"
    )
    for family in args.families.split(","):
        for fraction in map(float, args.fractions.split(",")):
            draws = []
            for d in range(args.draws):
                bench_a = simulate.make_benchmark(
                    args.queries, N_POOL, family, seed=100 + d, **regime
                )
                bench_b = simulate.second_system(bench_a, 200 + d, args.shift, args.spread)
                draws.append(one_draw(bench_a, bench_b, fraction, d, config))
            mean = lambda key, rows=draws: float(np.mean([r[key] for r in rows]))
            resolved = [r for r in draws if r["resolved"]]
            cell = {
                "family": family,
                "fraction": fraction,
                "truth": mean("truth"),
                "bias": mean("error"),
                "mae": float(np.mean([abs(r["error"]) for r in draws])),
                "coverage90": mean("covered"),
                "coverage90_sampling": mean("covered_sampling"),
                "median_half_width": float(np.median([r["half_width"] for r in draws])),
                "resolved": mean("resolved"),
                "right_sign_when_resolved": (
                    float(np.mean([r["right_sign"] for r in resolved])) if resolved else None
                ),
            }
            cells.append(cell)
            sign = cell["right_sign_when_resolved"]
            print(
                f"{family:<13}{fraction:>8.4%}{cell['truth']:>+9.4f}{cell['bias']:>+9.4f}"
                f"{cell['coverage90']:>9.2f}{cell['coverage90_sampling']:>9.2f}"
                f"{cell['median_half_width']:>8.4f}{cell['resolved']:>10.2f}"
                f"{'-' if sign is None else f'{sign:.2f}':>9}",
                flush=True,
            )
    overall = float(np.mean([c["coverage90"] for c in cells]))
    sampling = float(np.mean([c["coverage90_sampling"] for c in cells]))
    print(
        f"\ncoverage of the 90% interval over all cells: {overall:.2f} "
        f"(without the threshold and prior terms {sampling:.2f})"
    )
    print(json.dumps({"args": vars(args), "cells": cells}))


if __name__ == "__main__":
    main()
