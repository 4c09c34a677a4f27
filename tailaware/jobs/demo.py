"""The main job: predict a synthetic benchmark's full-scale mAP@k from a 5% sample.

It builds the synthetic ILIAS-like benchmark of `synthetic.py`, scores every query against
every distractor once (recording exact counts at several nested gallery sizes, the truth) and,
on the way, collects the sampled-scores of a uniform id-hash sample. Every estimator then
predicts mAP@k at each size from the sample alone; the table and plot set them against the
truth.
"""

import os
import time

import numpy as np
from absl import logging
from tqdm import tqdm

from tailaware.core import metrics, sampling
from tailaware.io import atomic
from tailaware.io.scores import SampledScores, make_scores
from tailaware.jobs import predict
from tailaware.sim import synthetic
from tailaware.tail import estimators


def _ground_truth(bench: synthetic.Benchmark):
    """Returns pos_scores [Q, P], mask [Q, P] and fixed counts [Q, P] (other positives above)."""
    sims = bench.queries @ bench.positives.T  # [Q, T]
    relevant = bench.query_instance[:, None] == bench.positive_instance[None, :]
    pos, mask = metrics.positives_from_dense(sims, relevant)
    fixed = metrics.counts_from_scores(sims, relevant, np.where(mask, pos, 0.0), mask)
    return pos.astype(np.float32), mask, fixed


def score(bench: synthetic.Benchmark, sizes, fraction: float, top_m: int, seed: int, progress=True):
    """Scores every distractor once (with a progress bar unless `progress` is False).

    Returns:
      (truth counts {size: [Q, P]}, SampledScores of the `fraction` id-hash sample).
    """
    pos, mask, fixed = _ground_truth(bench)
    pos_cmp = np.where(mask, pos, np.inf)[:, None, :]  # padding never counts
    q = bench.queries.shape[0]
    full = np.zeros(mask.shape, np.int64)
    sampled = np.zeros(mask.shape, np.int64)
    top = np.full((q, 0), -np.inf, np.float32)
    n_sample = 0
    truth = {}
    sizes = sorted(int(s) for s in sizes)
    with tqdm(
        total=bench.n_distractors,
        unit="img",
        unit_scale=True,
        desc="scoring",
        disable=not progress,
    ) as bar:
        for start, feats in synthetic.distractor_blocks(bench):
            stop = start + len(feats)
            sims = bench.queries @ feats.T  # [Q, B]
            keep = sampling.in_sample(bench.distractor_ids(start, stop), fraction, seed)
            cuts = [s - start for s in sizes if start < s <= stop]
            prev = 0
            for cut in [*cuts, len(feats)]:
                full += (sims[:, prev:cut, None] > pos_cmp).sum(axis=1)
                if start + cut in sizes:
                    truth[start + cut] = full.copy()
                prev = cut
            s_sims = sims[:, keep]
            sampled += (s_sims[:, :, None] > pos_cmp).sum(axis=1)
            n_sample += int(keep.sum())
            top = np.concatenate([top, s_sims], axis=1)
            if top.shape[1] > top_m:
                top = -np.partition(-top, top_m - 1, axis=1)[:, :top_m]
            bar.update(len(feats))
    top = -np.sort(-top, axis=1)
    scores = make_scores(
        top,
        np.where(mask, pos, np.nan),
        np.where(mask, sampled, -1),
        n_sample,
        np.where(mask, fixed, -1),
        source="synthetic benchmark",
    )
    return {s: np.where(mask, c, -1) for s, c in truth.items()}, scores


def true_map(counts: np.ndarray, fixed: np.ndarray, k: int) -> float:
    """Returns the exact mAP@k of a gallery from its distractor counts and fixed counts."""
    mask = counts >= 0
    return float(metrics.ap_at_k_from_counts(np.where(mask, counts + fixed, -1), mask, k).mean())


def curves(scores: SampledScores, config, sizes) -> dict:
    """Returns {estimator: [mAP@k at each size]} predicted from the sample alone."""
    out = {}
    for name in estimators.available():
        hardness = estimators.get(name)(scores, config)
        out[name] = [
            float(predict.per_query_ap(hardness, n, config.k, scores.fixed_counts, scores).mean())
            for n in sizes
        ]
    return out


def plot(path, truth, predicted, at_sample, k) -> None:
    """Writes a PNG of mAP@k versus gallery size.

    Args:
      path: the PNG to write.
      truth: (sizes, mAP@k) measured on the full galleries.
      predicted: (grid, {estimator: mAP@k on the grid}) from the sample alone.
      at_sample: (S, mAP@k measured on the sample).
      k: the cut-off, for the label.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.plot(*truth, "ko", label="truth (full gallery)", zorder=5)
    grid, curves_ = predicted
    for name, values in curves_.items():
        ax.plot(grid, values, "-", label=f"{name} (from sample)")
    ax.plot([at_sample[0]], [at_sample[1]], "r^", label="evaluate-at-S")
    ax.set_xscale("log")
    ax.set_xlabel("gallery size N (distractors)")
    ax.set_ylabel(f"mAP@{k}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    atomic.save_figure(fig, path)
    plt.close(fig)


def run(config, workdir: str) -> None:
    """The demo job (configs/default.py)."""
    t0 = time.time()
    d = config.demo
    bench = synthetic.make_benchmark(
        d.n_instances,
        d.queries_per_instance,
        d.positives_per_instance,
        d.n_distractors,
        d.dim,
        config.seed,
    )
    sizes = sorted({int(s) for s in d.sizes if s <= d.n_distractors} | {d.n_distractors})
    truth_counts, scores = score(bench, sizes, d.sample_fraction, config.evt.top_m, config.seed)
    k = int(config.k)
    truth = [true_map(truth_counts[s], scores.fixed_counts, k) for s in sizes]
    n_full = sizes[-1]
    grid = np.unique(np.geomspace(min(sizes[0], scores.n_sample), n_full, 25).round())
    predicted = curves(scores, config, [*grid, *sizes])
    predicted_grid = {name: v[: len(grid)] for name, v in predicted.items()}
    predicted = {name: v[len(grid) :] for name, v in predicted.items()}
    at_sample = float(predict.at_sample_ap(scores, k).mean())

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
    plot(
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
