"""Wall time of the whole prediction protocol against a scipy/numpy loop doing the same work.

The JAX side, in a fresh process so that compilation counts: the tail-aware estimate for every
query with its reruns at half and twice the excesses (`prediction.estimate`: GPD fits, one
compiled program; `estimate_s`), mAP@k at the target N and on a 25-point curve from 10^3 to
10^9 with 1,000 query-bootstrap replicates of every point (one jit call; `maps_s`), and the
interval's model term (the threshold reruns' curves, `prediction.threshold_maps`: `threshold_s`;
the curves under the other priors on the tail shape come with the E[AP] pass, `maps_s`).
Optionally (`--nested`) the nested bootstrap too, reported separately. It runs twice, in two
fresh processes sharing an empty persistent compilation cache (`tailaware.jobs.compilation_cache`,
on in every `launch.py` job): `jax_cold_s` compiles everything, `jax_warm_s` is every later run
on the same machine.

The reference, same run, same sample: `scipy.stats.genpareto.fit` per query in a Python loop
(shape left free: scipy has no constrained fitter), the tail probabilities of the positives, the
same AP@k formula in numpy, a Python loop of 1,000 `numpy.random.choice` replicates, and the
same fits and curve at half and twice the excesses (the threshold term).

Command (2 CPU cores; the sample is simulated first, outside the timings):
  python benchmarks/protocol.py --queries=1200
Prints one JSON line: seconds of each side and the ratios reference / JAX (cold and warm).
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


TIMINGS = ("jax_s", "estimate_s", "maps_s", "intervals_s", "nested_s")


def _parse():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--queries", type=int, default=1200)
    p.add_argument("--fraction", type=float, default=0.05)
    p.add_argument("--n_target", type=float, default=1e8)
    p.add_argument("--estimator", default="evt_averaged")
    p.add_argument("--replicates", type=int, default=1000)
    p.add_argument("--nested", type=int, default=0, help="nested-bootstrap replicates (0: skip)")
    p.add_argument("--child", default="", help=argparse.SUPPRESS)
    return p.parse_args()


def _sample(args):
    from tailaware.sim import simulate

    bench = simulate.make_benchmark(args.queries, seed=0)
    return simulate.draw(bench, args.fraction, 4000, seed=1).scores


def jax_side(args) -> dict:
    """Runs the protocol with tailaware; returns timings (compilation included)."""
    from tailaware.core import evaluate
    from tailaware.jobs import compilation_cache
    from tailaware.protocol import nested, prediction
    from tailaware.protocol.settings import PredictSettings

    compilation_cache.enable()  # the directory comes from TAILAWARE_JAX_CACHE (set by main)
    scores = _sample(args)
    settings = PredictSettings(estimator=args.estimator)
    t0 = time.perf_counter()
    hardness = prediction.estimate(scores, settings)  # with the threshold reruns
    t1 = time.perf_counter()
    sizes = np.concatenate([[args.n_target], np.geomspace(1e3, 1e9, 25)])
    # The prediction's pass: the estimate under every prior and its reruns, at every size.
    every, rows = prediction.variants(hardness)
    values, _ = evaluate.predicted_values(
        every, scores.mask, sizes, 1000, scores.fixed_counts, scores
    )
    t2 = time.perf_counter()
    preds = prediction.metric_predictions(
        values, rows, settings.metric_list()[:1], settings, sizes[1:]
    )
    t3 = time.perf_counter()
    ci90 = list(preds["map@1000"].interval.ci90.reported)
    out = {
        "jax_s": time.perf_counter() - t0,
        "estimate_s": t1 - t0,
        "maps_s": t2 - t1,
        "intervals_s": t3 - t2,
        "map": float(values[0, 0, 0].mean()),
    }
    out["ci90"] = ci90
    if args.nested:
        t1 = time.perf_counter()
        nested.nested_bootstrap(
            scores, args.estimator, settings.tail, 1000, sizes, args.nested, num_atoms=4
        )
        out["nested_s"] = time.perf_counter() - t1
    return out


def reference_side(args) -> dict:
    """The same protocol as a scipy/numpy loop (the paper-style implementation)."""
    from scipy import stats

    scores = _sample(args)
    t0 = time.perf_counter()
    mask, s = scores.mask, float(scores.n_sample)
    sizes = np.concatenate([[args.n_target], np.geomspace(1e3, 1e9, 25)])

    def maps(q):
        """Per-query AP [G, Q] of the plug-in GPD tail over the q-quantile of the top 4000."""
        x = np.where(mask, scores.pos_counts, 0) / s
        for i in range(scores.num_queries):
            tail = scores.tail_scores[i, :4000]
            u = np.quantile(tail, q)
            y = tail[tail > u] - u
            xi, _, sigma = stats.genpareto.fit(y, floc=0.0)
            rate = y.size / s
            for j in np.flatnonzero(mask[i] & (scores.pos_counts[i] < 5)):
                if scores.pos_scores[i, j] > u:
                    x[i, j] = rate * stats.genpareto.sf(scores.pos_scores[i, j] - u, xi, 0.0, sigma)
        aps = []
        for n in sizes:
            d = np.where(mask, n * x, np.inf)
            d = np.sort(d, axis=1)
            j = np.arange(1, d.shape[1] + 1)[None, :]
            r = j + d
            hit = np.isfinite(d) & (r <= 1000)
            n_pos = mask.sum(axis=1)
            total = np.where(hit, j / np.where(np.isfinite(r), r, 1), 0).sum(axis=1)
            aps.append(total / np.minimum(1000, n_pos))
        return np.stack(aps)

    aps = maps(0.95)
    rng = np.random.default_rng(0)
    reps = np.empty((len(sizes), args.replicates))
    for b in range(args.replicates):
        idx = rng.choice(scores.num_queries, scores.num_queries)
        reps[:, b] = aps[:, idx].mean(axis=1)
    # The threshold term: the same at half and twice the excesses (q = 0.975 and 0.9).
    dev = np.max([np.abs(maps(q).mean(axis=1) - aps.mean(axis=1)) for q in (0.975, 0.9)], axis=0)
    return {
        "reference_s": time.perf_counter() - t0,
        "map_reference": float(aps[0].mean()),
        "threshold_deviation_reference": float(dev[0]),
    }


def main():
    args = _parse()
    if args.child:
        fn = jax_side if args.child == "jax" else reference_side
        print(json.dumps(fn(args), default=float))
        return
    out = {"queries": args.queries, "estimator": args.estimator, "replicates": args.replicates}
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, TAILAWARE_JAX_CACHE=cache)
        for side, tag in (("jax", "cold"), ("jax", "warm"), ("reference", "")):
            cmd = [sys.executable, __file__, f"--child={side}"]
            cmd += [f"--{k}={v}" for k, v in vars(args).items() if k != "child"]
            res = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, check=True, env=env)
            got = json.loads(res.stdout.strip().splitlines()[-1])
            if tag:
                got = {(f"{k[:-2]}_{tag}_s" if k in TIMINGS else k): v for k, v in got.items()}
            out.update(got)
    out["ratio_cold"] = out["reference_s"] / out["jax_cold_s"]
    out["ratio_warm"] = out["reference_s"] / out["jax_warm_s"]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
