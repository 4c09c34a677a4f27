"""Two models' exact scores on one small gallery, and their sampled files on the same sample.

A paired study (a reference model correcting a new model's estimate, issue #42) needs what a
user of both models would have: each model's exact run over the whole gallery and both models'
sampled scores of the same uniform sample, item by item (`SampledScores.tail_ids`). Here the
gallery is small enough to hold every query's score of every distractor ([Q, N]), so the
truth is brute force.

Shapes: Q queries, P positive slots (padded), N distractors.
"""

from typing import NamedTuple

import numpy as np

from tailaware.core import metrics
from tailaware.io import reference_counts
from tailaware.io.scores import SampledScores, make_scores


class System(NamedTuple):
    """One model on one gallery: every score.

    Attributes:
      dist: [Q, N] float32 scores of each query against every distractor.
      pos: [Q, P] float32 scores of each query's positives, NaN padded.
      counts: [Q, P] int64 distractors strictly above each positive, -1 padded (brute force).
    """

    dist: np.ndarray
    pos: np.ndarray
    counts: np.ndarray

    @classmethod
    def from_scores(cls, dist, pos) -> "System":
        dist = np.asarray(dist, np.float32)
        pos = np.asarray(pos, np.float32)
        mask = ~np.isnan(pos)
        above = np.zeros(pos.shape, np.int64)
        for q in range(dist.shape[0]):
            ordered = np.sort(dist[q])
            above[q] = dist.shape[1] - np.searchsorted(ordered, pos[q], side="right")
        return cls(dist, pos, np.where(mask, above, -1))

    @classmethod
    def from_embeddings(cls, emb, query_rows, slots, distractor_rows) -> "System":
        """Returns the system of embeddings `emb` [n, d]: queries, positive slots [Q, P] (rows,
        -1 padded) and distractors as rows of `emb`; scores are float32 inner products."""
        emb = np.asarray(emb, np.float32)
        queries = emb[query_rows]
        dist = queries @ emb[distractor_rows].T
        pos = np.einsum("qd,qpd->qp", queries, emb[np.maximum(slots, 0)])
        return cls.from_scores(dist, np.where(slots >= 0, pos, np.nan))

    @property
    def n_distractors(self) -> int:
        return self.dist.shape[1]

    @property
    def query_ids(self) -> np.ndarray:
        return np.asarray([f"q{i}" for i in range(self.dist.shape[0])])

    def exact_map(self, k: int) -> float:
        """Returns the gallery's exact mAP@k."""
        return metrics.map_from_counts(self.counts, k)

    def reference_counts(self, k: int) -> reference_counts.ReferenceCounts:
        """Returns this system's exact run as a reference-counts record."""
        mask = self.counts >= 0
        slot = np.char.add("p", np.arange(mask.size).reshape(mask.shape).astype(str))
        return reference_counts.make(
            self.counts,
            self.query_ids,
            np.where(mask, slot, ""),
            n_distractors=self.n_distractors,
            k=k,
            metric_names=[f"map@{k}"],
            metric_values=[self.exact_map(k)],
        )


def sample_ids(n: int, fraction: float, seed: int) -> np.ndarray:
    """Returns the sorted distractor indices of a uniform sample of round(fraction n) of n, the
    same for every system of one gallery."""
    m = max(int(round(fraction * n)), 1)
    return np.sort(np.random.default_rng(seed).permutation(n)[:m])


def draw(system: System, fraction: float, *, seed: int, top_m: int = 4000) -> SampledScores:
    """Returns the system's sampled scores of `sample_ids(N, fraction, seed)`, with their ids."""
    ids = sample_ids(system.n_distractors, fraction, seed)
    sampled = system.dist[:, ids]
    order = np.argsort(-sampled, axis=1, kind="stable")[:, :top_m]
    tail = np.take_along_axis(sampled, order, axis=1)
    mask = system.counts >= 0
    counts = (sampled[:, None, :] > np.where(mask, system.pos, np.inf)[:, :, None]).sum(axis=2)
    return make_scores(
        tail,
        system.pos,
        np.where(mask, counts, -1),
        len(ids),
        query_ids=system.query_ids,
        tail_ids=ids[order],
        source=f"paired.draw(f={fraction}, seed={seed})",
    )
