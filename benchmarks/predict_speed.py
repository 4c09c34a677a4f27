"""Wall time and peak memory of a whole prediction against a reference commit, in one run.

The predict job's work on a sampled-scores file (`prediction.estimate`, then `prediction.predict`
with its nested bootstrap, threshold and prior terms, budget check and curve), 1,232 simulated
queries at a 5% sample of 10^8 (ILIAS's image queries), each measurement in a fresh process:
cold (an empty persistent compilation cache, `tailaware.jobs.compilation_cache`) and warm (the
cache of the cold run), for this checkout with the default metrics (mAP@k and recall@k) and with
all six, and for the reference commit (`--reference`, mAP@k alone: what it predicts), its code
taken with `git archive` into a temporary folder. Then the scale: this checkout with the default
metrics on `--scale_queries` simulated queries (10,000: text-to-image benchmarks' 5k-25k), cold
and warm, its time against the 1,232 queries' and its peak memory. Prints one JSON line per
measurement (wall and CPU seconds: on a shared machine the CPU seconds compare better), the
ratios reference / this checkout and the scale's ratio.

Command (2 CPU cores):
  python benchmarks/predict_speed.py --reference=ad2377d
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CHILD = r"""
import json, resource, sys, time
root, scores_path, cache, metrics = sys.argv[1:5]
sys.path.insert(0, root)
import dataclasses
from tailaware.jobs import compilation_cache
compilation_cache.enable(cache)
from tailaware.io.scores import load_scores
from tailaware.protocol import prediction
from tailaware.protocol.settings import PredictSettings
fields = {f.name for f in dataclasses.fields(PredictSettings)}
kw = {"metrics": tuple(metrics.split(","))} if "metrics" in fields else {}
settings = PredictSettings(**kw)
scores = load_scores(scores_path)
t0, cpu0 = time.perf_counter(), time.process_time()
if hasattr(prediction, "estimate_and_predict"):  # what the predict job runs
    hardness, p = prediction.estimate_and_predict(scores, settings, 100_000_000)
else:
    hardness = prediction.estimate(scores, settings)
    p = prediction.predict(scores, settings, 100_000_000, hardness)
seconds, cpu = time.perf_counter() - t0, time.process_time() - cpu0
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
print(json.dumps({"seconds": seconds, "cpu_seconds": cpu, "peak_gb": rss, "map": p.map}))
"""


def _parse():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reference", default="e4146fa", help="the commit to compare against")
    p.add_argument("--queries", type=int, default=1232)
    p.add_argument("--fraction", type=float, default=0.05)
    p.add_argument("--scale_queries", type=int, default=10_000, help="0: no scale run")
    return p.parse_args()


def _run(root, scores, cache, metrics):
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    out = subprocess.run(
        [sys.executable, "-c", CHILD, root, scores, cache, metrics],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    args = _parse()
    sys.path.insert(0, ROOT)
    from tailaware.io import scores as scores_lib
    from tailaware.sim import simulate

    with tempfile.TemporaryDirectory() as tmp:

        def scores_file(queries):
            bench = simulate.make_benchmark(queries, seed=0)
            path = os.path.join(tmp, f"scores-{queries}.npz")
            scores_lib.save_scores(path, simulate.draw(bench, args.fraction, 4000, seed=1).scores)
            return path

        path = scores_file(args.queries)
        ref = os.path.join(tmp, "reference")
        os.makedirs(ref)
        archive = subprocess.run(
            ["git", "-C", ROOT, "archive", args.reference], capture_output=True, check=True
        )
        subprocess.run(["tar", "-x", "-C", ref], input=archive.stdout, check=True)
        rows = {}
        for name, root, metrics in (
            ("reference", ref, "map"),
            ("default metrics", ROOT, "map,recall"),
            ("all six metrics", ROOT, "map,recall,precision,ndcg,hit,mrr"),
        ):
            cache = os.path.join(tmp, f"cache-{len(rows)}")
            for phase in ("cold", "warm"):
                got = _run(root, path, cache, metrics)
                rows[(name, phase)] = got
                print(json.dumps({"run": name, "phase": phase, **got}), flush=True)
        for phase in ("cold", "warm"):
            r = rows[("reference", phase)]["seconds"]
            for name in ("default metrics", "all six metrics"):
                s = rows[(name, phase)]["seconds"]
                print(f"{phase}: {name} {s:.1f} s, reference {r:.1f} s: {r / s:.2f}x faster")
        peaks = {name: rows[(name, "warm")]["peak_gb"] for name, _ in rows}
        print("peak memory (warm, GB): " + ", ".join(f"{n} {v:.2f}" for n, v in peaks.items()))
        if args.scale_queries:
            big = scores_file(args.scale_queries)
            cache = os.path.join(tmp, "cache-scale")
            for phase in ("cold", "warm"):
                got = _run(ROOT, big, cache, "map,recall")
                print(json.dumps({"run": f"{args.scale_queries} queries", "phase": phase, **got}))
                s = rows[("default metrics", phase)]["seconds"]
                print(
                    f"{phase}: {args.scale_queries} queries {got['seconds']:.1f} s, "
                    f"{got['seconds'] / s:.2f}x the time of {args.queries}; "
                    f"peak memory {got['peak_gb']:.2f} GB",
                    flush=True,
                )


if __name__ == "__main__":
    main()
