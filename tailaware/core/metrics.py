"""Retrieval metrics at a cut-off k: each a kernel over the positives' ranks and a normaliser.

A metric is defined once (`Metric`, registered in `METRICS`): a query with positives at ranks
r_1 < r_2 < ... (j-th positive by score, 1-based) scores

    value = sum_j weight(j) * 1{r_j <= k} * gain(r_j) / norm(n_pos, k).

| metric | weight(j) | gain(r) | norm(n_pos, k) |
|---|---|---|---|
| `map` (ILIAS mAP@k) | j | 1 / r | min(k, n_pos) |
| `recall` (ILIAS's `oracle`) | 1 | 1 | n_pos |
| `precision` | 1 | 1 | k |
| `ndcg` (binary relevance) | 1 | 1 / log2(1 + r) | sum_{i <= min(k, n_pos)} 1 / log2(1 + i) |
| `hit` (top-1 accuracy at k = 1) | 1{j = 1} | 1 | 1 |
| `mrr` | 1{j = 1} | 1 / r | 1 |

The same kernel gives a fixed gallery's exact value from its ranks (`value_from_counts`) and the
law's expectation under Poisson counts (`tailaware.core.law`, one table per gain). Official
definitions (the ILIAS and GLDv2 evaluation code; docs/outputs.md):
- ILIAS mAP@k: rank the database (positives + distractors) by descending score, keep the top k;
  AP = 1 / min(k, |gt|) * sum over positives ranked <= k of (positives at or above / rank).
- ILIAS `oracle`: (positives in the top k) / len(top k) * k / |gt|: recall@k when the list holds
  k items.
- GLDv2 retrieval mAP@100: the same sum over the first 100 predictions, divided by
  min(|gt|, 100); identical to ILIAS AP@100 on a full ranking.

Tie rule: the official ILIAS code sorts with an unstable argsort, so tie order is arbitrary.
tailaware counts a non-relevant item as outranking a positive only when its score is strictly
greater (positives win ties). Metrics are fractions in [0, 1]; ILIAS reports percent.

Shapes: Q queries, P positive slots (padded, `mask`), D database items.
"""

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np


def _xp(*arrays):
    return jnp if any(isinstance(a, jax.Array) for a in arrays) else np


def _ones(r):
    return r * 0.0 + 1.0


def _inverse(r):
    return 1.0 / r


def _dcg(r):
    return 1.0 / _xp(r).log2(1.0 + r)


# The rank functions a metric's gain can be: the law keeps one table of E[1{a + K <= k} g(a + K)]
# per gain (`law.rank_tables`), shared by every metric with that gain.
GAINS: dict[str, Callable] = {"inverse": _inverse, "one": _ones, "dcg": _dcg}


def _ideal_dcg(n_pos, k):
    """Returns sum_{i <= min(k, n_pos)} 1 / log2(1 + i), elementwise (numpy or jax.numpy)."""
    xp = _xp(n_pos)
    i = xp.arange(1, int(k) + 1, dtype=n_pos.dtype)
    cum = xp.concatenate([xp.zeros(1, n_pos.dtype), xp.cumsum(1.0 / xp.log2(1.0 + i))])
    return cum[xp.minimum(n_pos, k).astype(np.int32)]


class Metric(NamedTuple):
    """A retrieval metric@k: sum_j weight(j) 1{r_j <= k} gain(r_j) / norm(n_pos, k).

    Attributes:
      name: its registry key ("map", "recall", ...); reported as f"{name}@{k}".
      gain: a key of `GAINS`, the rank function.
      weight: j [P] (float, 1-based rank among the positives) -> [P] weights; numpy or jax.
      norm: (n_pos [...], k) -> the normaliser, > 0 for n_pos >= 1; numpy or jax.
      description: one line for docs and outputs.
    """

    name: str
    gain: str
    weight: Callable
    norm: Callable
    description: str

    def label(self, k: int) -> str:
        """Returns the name under which outputs report it: e.g. "map@1000"."""
        return f"{self.name}@{int(k)}"


def _first(j):
    return _xp(j).where(j == 1, 1.0, 0.0)


METRICS: dict[str, Metric] = {
    m.name: m
    for m in (
        Metric("map", "inverse", lambda j: j, lambda n, k: _xp(n).minimum(k, n), "ILIAS mAP@k"),
        Metric("recall", "one", _ones, lambda n, k: n * 1.0, "recall@k (ILIAS's oracle)"),
        Metric("precision", "one", _ones, lambda n, k: n * 0.0 + k, "precision@k"),
        Metric("ndcg", "dcg", _ones, _ideal_dcg, "nDCG@k, binary relevance"),
        Metric("hit", "one", _first, lambda n, k: n * 0.0 + 1.0, "hit@k (top-1 accuracy at k=1)"),
        Metric("mrr", "inverse", _first, lambda n, k: n * 0.0 + 1.0, "MRR@k"),
    )
}


def get(name: str) -> Metric:
    """Returns the metric called `name`."""
    if name not in METRICS:
        raise ValueError(f"unknown metric {name!r}; choose some of {sorted(METRICS)}")
    return METRICS[name]


def value_from_ranks(metric: Metric, ranks, valid, k):
    """Returns the metric [Q] from the positives' ranks [Q, P] in rank order (`ranks_from_counts`;
    `valid` [Q, P] marks real positives), numpy or jax.numpy; 0 for a query without positives."""
    xp = _xp(ranks, valid)
    f = xp.result_type(float) if xp is jnp else np.float64
    j = xp.cumsum(valid, axis=1).astype(f)
    r = xp.where(valid, ranks, 1).astype(f)
    hit = valid & (ranks <= k)
    terms = xp.where(hit, metric.weight(j) * GAINS[metric.gain](r), 0.0)
    n_pos = valid.sum(axis=1).astype(f)
    norm = xp.where(n_pos > 0, metric.norm(xp.maximum(n_pos, 1.0), k), 1.0)
    return terms.sum(axis=1) / norm


def value_from_counts(metric: Metric, counts, mask, k):
    """Returns the metric [Q] from the number of non-relevant items strictly above each positive
    [Q, P] (`mask` marks real positives)."""
    return value_from_ranks(metric, *ranks_from_counts(counts, mask), k)


def ap_at_k_from_counts(counts, mask, k):
    """Returns AP@k [Q] from the number of non-relevant items strictly above each positive.

    Args:
      counts: [Q, P] integer counts (distractors plus any other non-relevant items).
      mask: [Q, P] bool, real positives.
      k: cut-off.
    """
    return value_from_counts(METRICS["map"], counts, mask, k)


def map_from_counts(counts, k, fixed=None) -> float:
    """Returns the exact mAP@k of a gallery from the items above each positive [Q, P] (-1 at
    padding), plus `fixed` [Q, P] always-indexed non-relevant items above each, when given."""
    counts = np.asarray(counts)
    mask = counts >= 0
    total = counts if fixed is None else np.where(mask, counts + np.asarray(fixed), -1)
    return float(ap_at_k_from_counts(total, mask, k).mean())


def recall_at_k_from_counts(counts, mask, k):
    """Returns recall@k [Q]: the share of each query's positives ranked within the top k."""
    return value_from_counts(METRICS["recall"], counts, mask, k)


def top1_from_counts(counts, mask):
    """Returns top-1 accuracy [Q]: 1.0 when the first retrieved item is a positive (hit@1)."""
    return value_from_counts(METRICS["hit"], counts, mask, 1)


def ranks_from_counts(counts, mask):
    """Returns (ranks, valid) [Q, P]: the realized ranks j + c_(j) of each query's positives.

    Positives are sorted by their count of non-relevant items above (= by descending score);
    `valid` is the mask in that order. Ranks at padding are meaningless.
    """
    xp = _xp(counts, mask)
    key = xp.where(mask, counts, xp.iinfo(counts.dtype).max)
    order = xp.argsort(key, axis=1, stable=True)
    c = xp.take_along_axis(xp.where(mask, counts, 0), order, axis=1)
    valid = xp.take_along_axis(mask, order, axis=1)
    j = xp.cumsum(valid, axis=1)
    return j + c, valid


def counts_from_scores(scores, relevant, pos_scores, pos_mask):
    """Returns the non-relevant items strictly above each positive [Q, P].

    Args:
      scores: [Q, D] similarities of each query to the database.
      relevant: [Q, D] bool ground truth.
      pos_scores: [Q, P] the positives' scores (padded).
      pos_mask: [Q, P] real positives.
    """
    xp = _xp(scores, pos_scores)
    nonrel = xp.where(relevant, -xp.inf, scores)
    above = (nonrel[:, None, :] > pos_scores[:, :, None]).sum(axis=2)
    return xp.where(pos_mask, above, -1)


def positives_from_dense(scores, relevant):
    """Returns (pos_scores [Q, P], pos_mask [Q, P]) gathered from a dense score matrix."""
    xp = _xp(scores, relevant)
    p = int(relevant.sum(axis=1).max())
    order = xp.argsort(~relevant, axis=1, stable=True)[:, :p]
    pos = xp.take_along_axis(scores, order, axis=1)
    mask = xp.take_along_axis(relevant, order, axis=1)
    return xp.where(mask, pos, xp.nan), mask


def ilias_map_at_k(scores, relevant, k=1000):
    """Returns (mAP@k, AP@k [Q]) from dense scores [Q, D] and ground truth [Q, D] (our tie rule)."""
    pos, mask = positives_from_dense(scores, relevant)
    xp = _xp(scores)
    counts = counts_from_scores(scores, relevant, xp.where(mask, pos, 0.0), mask)
    aps = ap_at_k_from_counts(counts, mask, k)
    return aps.mean(), aps


def gldv2_map_at_k(ranked_relevant, n_gt, k=100):
    """Returns (mAP@k, AP [Q]) as the official GLDv2 retrieval metric defines it.

    Args:
      ranked_relevant: [Q, L] bool, whether the i-th prediction of each query is a (first
        occurrence of a) relevant image; queries with no prediction have an all-False row.
      n_gt: [Q] number of relevant images of each query (queries in the solution have >= 1).
      k: cut-off (100 in the benchmark).
    """
    xp = _xp(ranked_relevant, n_gt)
    rel = ranked_relevant[:, :k]
    hits = xp.cumsum(rel, axis=1)
    i = xp.arange(1, rel.shape[1] + 1)
    ap = xp.where(rel, hits / i, 0.0).sum(axis=1)
    ap = ap / xp.minimum(n_gt, k).astype(ap.dtype)
    return ap.mean(), ap
