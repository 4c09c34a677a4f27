"""The demo job: predict a synthetic benchmark's full-scale mAP@k from a 5% sample.

It builds the synthetic ILIAS-like benchmark of `sim.synthetic`, scores every query against every
distractor once (recording exact counts at several nested gallery sizes, the truth) and, on the
way, collects the sampled scores of a uniform id-hash sample. Every estimator then predicts
mAP@k at each size from the sample alone; the table and plot set them against the truth.
Writes `results.json` and `map_vs_gallery.png` to the workdir.
"""

import os
import time

import numpy as np
from absl import logging

from tailaware.core import evaluate, metrics
from tailaware.io import atomic
from tailaware.io.scores import SampledScores
from tailaware.jobs import config as config_lib
from tailaware.protocol import baselines, plots
from tailaware.sim import synthetic
from tailaware.tail import estimators
from tailaware.tail.settings import TailSettings


def curves(scores: SampledScores, settings: TailSettings, k: int, sizes) -> dict:
    """Returns {estimator: [mAP@k at each size]} predicted from the sample alone."""
    out = {}
    sizes = np.asarray(sizes, np.float64)
    for name, estimator in estimators.ESTIMATORS.items():
        hardness = estimator(scores, settings)
        aps = evaluate.per_query_aps(hardness, sizes, k, scores.fixed_counts, scores)[0]
        out[name] = [float(v) for v in aps.mean(axis=1)]
    return out


def run(config, workdir: str) -> None:
    """Scores the demo's benchmark, predicts from its sample, prints and writes the results."""
    tail = config_lib.check_demo(config)
    t0 = time.time()
    d = config.demo
    bench = synthetic.make_benchmark(
        d.n_instances,
        d.queries_per_instance,
        d.positives_per_instance,
        d.n_distractors,
        d.dim,
        seed=config.seed,
    )
    sizes = sorted({int(s) for s in d.sizes if s <= d.n_distractors} | {d.n_distractors})
    truth_counts, scores = synthetic.score(
        bench, sizes, fraction=d.sample_fraction, top_m=tail.top_m, seed=config.seed
    )
    k = int(config.k)
    truth = [metrics.map_from_counts(truth_counts[s], k, scores.fixed_counts) for s in sizes]
    n_full = sizes[-1]
    grid = np.unique(np.geomspace(min(sizes[0], scores.n_sample), n_full, 25).round())
    predicted = curves(scores, tail, k, [*grid, *sizes])
    predicted_grid = {name: v[: len(grid)] for name, v in predicted.items()}
    predicted = {name: v[len(grid) :] for name, v in predicted.items()}
    at_sample = baselines.at_sample_map(scores, k)

    rows = [(name, values[-1]) for name, values in predicted.items()]
    rows.append(("evaluate-at-S", at_sample))
    lines = [
        f"Synthetic benchmark: {len(bench.queries)} queries, {n_full:,} distractors; "
        f"sample S = {scores.n_sample:,} ({d.sample_fraction:.1%}).",
        f"True mAP@{k} at N = {n_full:,}: {truth[-1]:.4f}",
        f"  {'estimator':<16}{'predicted':>10}{'error':>9}",
    ]
    lines += [f"  {n:<16}{v:>10.4f}{v - truth[-1]:>+9.4f}" for n, v in rows]
    print("\n".join(lines))

    os.makedirs(workdir, exist_ok=True)
    plots.map_vs_gallery(
        os.path.join(workdir, "map_vs_gallery.png"),
        (sizes, truth),
        (grid, predicted_grid),
        (scores.n_sample, at_sample),
        k,
    )
    atomic.write_json(
        os.path.join(workdir, "results.json"),
        {
            "k": k,
            "n_sample": scores.n_sample,
            "sample_fraction": d.sample_fraction,
            "sizes": sizes,
            "truth": truth,
            "predicted": predicted,
            "at_sample": at_sample,
            "errors_at_full": {n: v - truth[-1] for n, v in rows},
            "seconds": time.time() - t0,
        },
    )
    logging.info("wrote %s in %.0f s", workdir, time.time() - t0)
