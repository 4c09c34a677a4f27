"""Time and memory of a prediction when a few queries have far more positives than the rest.

Positives are padded to the widest query; `tailaware.core.buckets` evaluates the law in groups of
queries of similar width instead. Both sides run the same protocol on the same sample, each in
a fresh process (compilation included, peak memory its own): the estimate with its threshold
reruns, mAP@1000 on a 26-point curve, the threshold term, and optionally the nested bootstrap.
`grouped` is the library as it is; `padded` the same code with grouping switched off
(`max_share=0`), the reference.

Command (2 CPU cores): python benchmarks/wide_queries.py [--wide_positives 390 --nested 10]
Prints one JSON line: each side's seconds and peak memory, the ratios padded / grouped, and the
largest difference of their per-query predictions.
"""

import argparse
import dataclasses
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def _parse():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--queries", type=int, default=1199, help="narrow queries (1-10 positives)")
    p.add_argument("--wide", type=int, default=1, help="wide queries")
    p.add_argument("--wide_positives", type=int, default=200, help="their mean positives")
    p.add_argument("--fraction", type=float, default=0.05)
    p.add_argument("--nested", type=int, default=0, help="nested-bootstrap replicates (0: skip)")
    p.add_argument("--child", default="", help=argparse.SUPPRESS)
    p.add_argument("--out", default="", help=argparse.SUPPRESS)
    return p.parse_args()


def _sample(args):
    from tailaware.io import scores
    from tailaware.sim import simulate

    narrow = simulate.draw(simulate.make_benchmark(args.queries, seed=0), args.fraction, seed=1)
    wide = simulate.make_benchmark(
        args.wide, seed=5, mean_positives=args.wide_positives, max_positives=3 * args.wide_positives
    )
    wide = simulate.draw(wide, args.fraction, seed=2).scores
    p = int(wide.mask.sum(axis=1).max())  # P: the widest query's positives (packed first)
    wide = dataclasses.replace(
        wide,
        pos_scores=wide.pos_scores[:, :p],
        pos_counts=wide.pos_counts[:, :p],
        fixed_counts=wide.fixed_counts[:, :p],
    )
    return scores.concatenate([narrow.scores, wide])


def child(args) -> None:
    """Runs one side and writes its timings, peak memory and predictions to `args.out`."""
    from tailaware.core import buckets, evaluate
    from tailaware.protocol import nested, prediction
    from tailaware.protocol.settings import PredictSettings

    share = 0.0 if args.child == "padded" else buckets.MAX_SHARE  # 0: never split
    scores = _sample(args)
    settings = PredictSettings()
    t0 = time.perf_counter()
    hardness = prediction.estimate(scores, settings)
    sizes = np.concatenate([[1e8], np.geomspace(1e3, 1e9, 25)])
    fixed = scores.fixed_counts
    # The prediction with its prior maps in one pass, and the threshold reruns (the job's work).
    aps = evaluate.per_query_aps(
        hardness, sizes, 1000, fixed, scores, priors=True, max_share=share
    )[0]
    for rerun in hardness.reruns:
        evaluate.per_query_aps(rerun, sizes, 1000, fixed, scores, max_share=share)[0]
    out = {"seconds": time.perf_counter() - t0}
    if args.nested:
        t1 = time.perf_counter()
        tail = settings.tail
        nested.nested_bootstrap(
            scores, settings.estimator, tail, 1000, sizes, args.nested, max_share=share
        )
        out["nested_seconds"] = time.perf_counter() - t1
    out["peak_gb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    out["widths"] = [int(scores.mask.shape[1]), int(scores.mask.sum(axis=1).max())]
    np.save(args.out, aps)
    with open(args.out + ".json", "w") as fh:
        json.dump(out, fh)


def main():
    args = _parse()
    if args.child:
        child(args)
        return
    result = {"queries": args.queries, "wide": args.wide, "wide_positives": args.wide_positives}
    aps = {}
    with tempfile.TemporaryDirectory() as tmp:
        for side in ("grouped", "padded"):
            out = os.path.join(tmp, f"{side}.npy")
            cmd = [sys.executable, __file__, f"--child={side}", f"--out={out}"]
            cmd += [f"--{k}={v}" for k, v in vars(args).items() if k not in ("child", "out")]
            subprocess.run(cmd, check=True)
            with open(out + ".json") as fh:
                got = json.load(fh)
            result["slots_and_widest"] = got.pop("widths")
            result.update({f"{side}_{k}": v for k, v in got.items()})
            aps[side] = np.load(out)
    for key in ("seconds", "peak_gb", "nested_seconds"):
        if f"grouped_{key}" in result:
            result[f"ratio_{key}"] = result[f"padded_{key}"] / result[f"grouped_{key}"]
    result["max_abs_difference"] = float(np.abs(aps["grouped"] - aps["padded"]).max())
    print(json.dumps(result))


if __name__ == "__main__":
    main()
