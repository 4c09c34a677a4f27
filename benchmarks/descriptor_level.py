"""Predicted mAP@k against exact truth on descriptor-level benchmarks (real cosine scores).

The validation job and `benchmarks/tail_families.py` test the estimators on the score-level
simulator, whose per-query distractor laws are written down (`tailaware.sim.simulate`). This sweep
asks the same question where nobody wrote the laws down: the demo's synthetic ILIAS-like
benchmark (`tailaware.sim.synthetic`: unit descriptors, 48 distractor clusters of unequal weight and
spread, object instances pulled towards them), scored exhaustively, so the score laws, their
tails and the hardness of every positive are whatever the geometry makes them. For each
descriptor dimension and seed it builds a benchmark, scores every distractor once (the truth at
the full pool and at a quarter of it, and an id-hash sample of each fraction, nested), and
predicts mAP@k at both sizes from each sample: the mean error (prediction minus truth) and the
mean absolute error of `evt_averaged`, `evt`, `count` and evaluate-at-S over the benchmarks,
and how often the 90% interval of `evt_averaged` without its nested bootstrap (the query
bootstrap widened by the threshold and prior terms, `intervals.item_intervals`; in brackets the
query interval alone) held the truth at the full pool.

Command (2 CPU cores; 40-80 s per benchmark, 12 at the defaults, about 15 minutes):
  python benchmarks/descriptor_level.py [--dims 64,128,256,512] [--seeds 0,1,2]
      [--fractions 0.05,0.01] [--distractors 2000000] [--instances 120]
Prints a row per benchmark and fraction, the summary, then one JSON line with every row.
"""

import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from tailaware.configs import default  # noqa: E402
from tailaware.core import evaluate, metrics  # noqa: E402
from tailaware.protocol import baselines, prediction  # noqa: E402
from tailaware.protocol.settings import PredictSettings  # noqa: E402
from tailaware.sim import synthetic  # noqa: E402
from tailaware.tail import estimators  # noqa: E402

MAP = (metrics.METRICS["map"],)  # the interval of mAP@k alone

ESTIMATORS = ("evt_averaged", "evt", "count")
COLUMNS = (*ESTIMATORS, "at_sample")


def _parse():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ints = lambda s: [int(v) for v in s.split(",")]
    p.add_argument("--dims", type=ints, default=[64, 128, 256, 512])
    p.add_argument("--seeds", type=ints, default=[0, 1, 2])
    floats = lambda s: [float(v) for v in s.split(",")]
    p.add_argument("--fractions", type=floats, default=[0.05, 0.01])
    p.add_argument("--distractors", type=int, default=2_000_000)
    p.add_argument("--instances", type=int, default=120)
    p.add_argument("--k", type=int, default=1000)
    return p.parse_args()


def cell(scores, truth: dict, settings: PredictSettings) -> dict:
    """Returns each estimator's error at every size of `truth` ({N: mAP}) and, at the largest
    N, whether the 90% interval of `evt_averaged` (and its query interval alone) held the truth."""
    k = settings.k
    sizes = sorted(truth)
    row = {}
    for name in ESTIMATORS:
        averaged = name == "evt_averaged"  # with its threshold reruns, for the interval
        h = (
            prediction.estimate(scores, settings)
            if averaged
            else estimators.get(name)(scores, settings.tail)
        )
        aps = evaluate.per_query_aps(h, sizes, k, scores.fixed_counts, scores)[0]  # [G, Q]
        for n, a in zip(sizes, aps, strict=True):
            row[f"{name}@{n}"] = float(a.mean()) - truth[n]
        if averaged:  # the reported interval at the largest N, without the nested bootstrap
            at_n = prediction.at_target(scores, settings, h, sizes[-1], metric_list=MAP)
            unc = at_n[f"map@{k}"].interval
            t = truth[sizes[-1]]
            lo, hi = unc.ci90.reported
            row["cover90"] = bool(lo <= t <= hi)
            row["cover90_query"] = bool(unc.ci90.query[0] <= t <= unc.ci90.query[1])
    at_sample = baselines.at_sample_map(scores, k)
    for n in sizes:
        row[f"at_sample@{n}"] = at_sample - truth[n]
    return row


def main():
    args = _parse()
    d = default.get_config().demo
    settings = PredictSettings(k=args.k)
    sizes = [args.distractors // 4, args.distractors]
    rows = []
    print(f"error of mAP@{args.k} at N = {sizes[-1]:,} ({args.instances} queries per benchmark)")
    print(
        f"{'dim':>4} {'seed':>4} {'fraction':>8} {'truth':>7}"
        + "".join(f"{c:>14}" for c in COLUMNS)
    )
    for dim in args.dims:
        for seed in args.seeds:
            bench = synthetic.make_benchmark(
                args.instances,
                d.queries_per_instance,
                d.positives_per_instance,
                args.distractors,
                dim,
                seed=seed,
            )
            for fraction in args.fractions:
                counts, scores = synthetic.score(
                    bench,
                    sizes,
                    fraction=fraction,
                    top_m=settings.tail.top_m,
                    seed=seed,
                    progress=False,
                )
                truth = {
                    n: metrics.map_from_counts(counts[n], args.k, scores.fixed_counts)
                    for n in sizes
                }
                row = {"dim": dim, "seed": seed, "fraction": fraction, "n_sample": scores.n_sample}
                row |= {f"truth@{n}": t for n, t in truth.items()} | cell(scores, truth, settings)
                rows.append(row)
                errs = "".join(f"{row[f'{c}@{sizes[-1]}']:>+14.4f}" for c in COLUMNS)
                print(
                    f"{dim:>4} {seed:>4} {fraction:>8} {truth[sizes[-1]]:>7.4f}{errs}", flush=True
                )
    summary = {}
    print(f"\nbias / MAE over the {len(rows) // len(args.fractions)} benchmarks")
    print(f"{'fraction':>8} {'N':>9}" + "".join(f"{c:>16}" for c in COLUMNS))
    for fraction in args.fractions:
        sel = [r for r in rows if r["fraction"] == fraction]
        for n in sizes:
            line = f"{fraction:>8} {n:>9,}"
            for c in COLUMNS:
                e = np.array([r[f"{c}@{n}"] for r in sel])
                summary[f"{c}@{n}/{fraction}"] = {"bias": e.mean(), "mae": np.abs(e).mean()}
                line += f"{e.mean():>+9.4f}/{np.abs(e).mean():.4f}"
            print(line)
        cover = np.mean([r["cover90"] for r in sel])
        cover_q = np.mean([r["cover90_query"] for r in sel])
        summary[f"cover90/{fraction}"] = {"cover90": cover, "cover90_query": cover_q}
        print(
            f"{fraction:>8} evt_averaged's 90% interval held the truth at N = {sizes[-1]:,} in "
            f"{cover:.0%} of the benchmarks (the query interval alone: {cover_q:.0%})"
        )
    print(json.dumps({"args": vars(args), "rows": rows, "summary": summary}, default=float))


if __name__ == "__main__":
    main()
