"""A synthetic ILIAS-like benchmark with exact ground truth at every gallery size.

Descriptors live on the unit sphere in `dim` dimensions. Distractors come from a mixture of
clusters of unequal weight and spread (web images are not isotropic); object instances sit at
varying distances from those clusters and spread their query and positives by an
instance-specific amount, so hardness is heterogeneous across queries and positives. Distractors
are generated block by block from per-block seeds: 2M of them never sit in memory at once, and
any block can be regenerated identically.

`score` scores every query against every distractor once: the exact counts at nested gallery
sizes (the truth) and, on the way, the sampled scores of a uniform id-hash sample.
"""

import dataclasses
from collections.abc import Iterator

import numpy as np
from tqdm import tqdm

from tailaware.core import metrics, sampling
from tailaware.io.scores import make_scores


@dataclasses.dataclass(frozen=True)
class Benchmark:
    """Queries, positives and the recipe for the distractors.

    Attributes:
      queries: [Q, d] float32 unit vectors.
      query_instance: [Q] instance id of each query.
      positives: [T, d] float32 unit vectors of all instances' positives.
      positive_instance: [T] instance id of each positive.
      n_distractors: size of the full distractor pool.
      centers: [C, d] distractor cluster centres; weights [C] and spreads [C] alongside.
    """

    queries: np.ndarray
    query_instance: np.ndarray
    positives: np.ndarray
    positive_instance: np.ndarray
    n_distractors: int
    centers: np.ndarray
    weights: np.ndarray
    spreads: np.ndarray
    seed: int

    @property
    def dim(self) -> int:
        return self.queries.shape[1]

    def distractor_ids(self, start: int, stop: int) -> list[str]:
        return [f"synthetic{i // 100_000:04d}/{i:09d}" for i in range(start, stop)]


def _normalize(v: np.ndarray) -> np.ndarray:
    return (v / np.linalg.norm(v, axis=-1, keepdims=True)).astype(np.float32)


def make_benchmark(
    n_instances: int,
    queries_per_instance: int,
    positives_per_instance: int,
    n_distractors: int,
    dim: int,
    *,
    seed: int = 0,
    n_clusters: int = 48,
) -> Benchmark:
    """Returns a synthetic benchmark (see the module docstring)."""
    rng = np.random.default_rng(seed)
    centers = _normalize(rng.standard_normal((n_clusters, dim)))
    weights = rng.dirichlet(np.full(n_clusters, 0.7))
    spreads = rng.uniform(0.6, 1.6, n_clusters)

    # Instances: pulled towards a random distractor cluster by a varying amount (hard instances
    # look like common web content), with a varying intra-instance spread.
    pull = rng.uniform(0.0, 1.6, n_instances)
    home = rng.choice(n_clusters, n_instances, p=weights)
    inst = _normalize(pull[:, None] * centers[home] + rng.standard_normal((n_instances, dim)) / 2)
    spread = rng.lognormal(np.log(0.55), 0.35, n_instances)

    def views(count):
        noise = rng.standard_normal((n_instances, count, dim)) / np.sqrt(dim)
        return _normalize(inst[:, None, :] + spread[:, None, None] * noise * np.sqrt(dim) / 4)

    q = views(queries_per_instance).reshape(-1, dim)
    p = views(positives_per_instance).reshape(-1, dim)
    ids = np.arange(n_instances)
    return Benchmark(
        queries=q,
        query_instance=np.repeat(ids, queries_per_instance),
        positives=p,
        positive_instance=np.repeat(ids, positives_per_instance),
        n_distractors=n_distractors,
        centers=centers,
        weights=weights,
        spreads=spreads,
        seed=seed,
    )


def distractor_blocks(bench: Benchmark, block: int = 200_000) -> Iterator[tuple[int, np.ndarray]]:
    """Yields (start, [B, d] float32 distractors) covering [0, n_distractors) in order."""
    for start in range(0, bench.n_distractors, block):
        stop = min(start + block, bench.n_distractors)
        rng = np.random.default_rng([bench.seed, 1, start])
        c = rng.choice(len(bench.weights), stop - start, p=bench.weights)
        noise = rng.standard_normal((stop - start, bench.dim)).astype(np.float32)
        yield start, _normalize(bench.centers[c] + bench.spreads[c, None] * noise / 3.0)


def _ground_truth(bench: Benchmark):
    """Returns pos_scores [Q, P], mask [Q, P] and fixed counts [Q, P] (other positives above)."""
    sims = bench.queries @ bench.positives.T  # [Q, T]
    relevant = bench.query_instance[:, None] == bench.positive_instance[None, :]
    pos, mask = metrics.positives_from_dense(sims, relevant)
    fixed = metrics.counts_from_scores(sims, relevant, np.where(mask, pos, 0.0), mask)
    return pos.astype(np.float32), mask, fixed


def score(bench: Benchmark, sizes, *, fraction: float, top_m: int, seed: int, progress=True):
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
        for start, feats in distractor_blocks(bench):
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
        fixed_counts=np.where(mask, fixed, -1),
        source="synthetic benchmark",
    )
    return {s: np.where(mask, c, -1) for s, c in truth.items()}, scores
