"""A synthetic ILIAS-like benchmark with exact ground truth at every gallery size.

Descriptors live on the unit sphere in `dim` dimensions. Distractors come from a mixture of
clusters of unequal weight and spread (web images are not isotropic); object instances sit at
varying distances from those clusters and spread their query and positives by an
instance-specific amount, so hardness is heterogeneous across queries and positives. Distractors
are generated block by block from per-block seeds: 2M of them never sit in memory at once, and
any block can be regenerated identically.
"""

import dataclasses
from collections.abc import Iterator

import numpy as np


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
