"""Rounded scores: the averaged estimator on float16 sampled scores, raw and with ties spread.

Scores computed or stored in float16 sit on a grid of 2^-11 near 0.8; the top 200 of a sample
span only tens of steps, and a GPD fit reads the pile-up of equal values as a short tail. Each
cell simulates a benchmark (`tailaware.sim.simulate`, N = 10^8), draws one sample, and predicts
mAP@1000 from its float32 tail scores, from the same scores rounded to float16 as a file would
hold them (`--positives` rounds the positives' scores too; `--step 0.001` rounds to a grid of
0.001 instead) with `tailaware.tail.dequantize` switched off (`TailSettings(tie_share=inf)`),
and with it on (the default). Prints the error of each against the realized truth.

Command (2 CPU cores, about a minute):
  python benchmarks/rounded_scores.py --queries=500
"""

import argparse
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from tailaware.core import evaluate, metrics  # noqa: E402
from tailaware.sim import simulate  # noqa: E402
from tailaware.tail import averaged, evt  # noqa: E402
from tailaware.tail.settings import TailSettings  # noqa: E402


def _parse():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--queries", type=int, default=500)
    p.add_argument("--fractions", type=float, nargs="+", default=[0.0005, 0.01, 0.05])
    p.add_argument("--positives", action="store_true", help="round the positives' scores too")
    p.add_argument("--step", type=float, default=0.0, help="round to this grid (0: float16)")
    p.add_argument("--cells", default="paper/kumaraswamy,stress/kumaraswamy,paper/normal")
    return p.parse_args()


def main():
    args = _parse()

    def error(scores, truth, spread=True):
        settings = TailSettings() if spread else TailSettings(tie_share=np.inf)
        h = evt.estimate(scores, settings, averaged.AVERAGED)
        ap = evaluate.per_query_ap(h, 1e8, 1000, scores.fixed_counts, scores).mean()
        return ap - truth

    print(f"error of evt_averaged's mAP@1000 at N = 1e8 ({args.queries} queries, one draw)")
    grid = f"step {args.step:g}" if args.step > 0 else "f16"
    head = f"{'regime/family':<22}{'f':>8}{'float32':>10}"
    print(f"{head}{grid + ' raw':>18}{grid + ' spread':>18}")
    for regime, family in (c.split("/") for c in args.cells.split(",")):
        bench = simulate.make_benchmark(
            args.queries, family=family, seed=0, **simulate.REGIMES[regime]
        )
        for f in args.fractions:
            d = simulate.draw(bench, f, 4000, seed=1)
            truth = metrics.map_from_counts(d.truth_counts, 1000)
            half = simulate.rounded(d.scores, np.float16, args.positives, args.step)
            row = (error(d.scores, truth), error(half, truth, False), error(half, truth))
            print(
                f"{regime + '/' + family:<22}{f:>8.2%}{row[0]:>+10.4f}{row[1]:>+18.4f}"
                f"{row[2]:>+18.4f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
