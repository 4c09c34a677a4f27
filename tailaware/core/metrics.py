"""Exact retrieval metrics on a fixed gallery, vectorised for numpy and jax.numpy.

Official definitions (the ILIAS and GLDv2 evaluation code; docs/outputs.md):
- ILIAS mAP@k: rank the database (positives + distractors) by descending score, keep the top k;
  AP = 1 / min(k, |gt|) * sum over positives ranked <= k of (positives at or above / rank).
- GLDv2 retrieval mAP@100: the same sum over the first 100 predictions, divided by
  min(|gt|, 100); identical to ILIAS AP@100 on a full ranking.

Tie rule: the official ILIAS code sorts with an unstable argsort, so tie order is arbitrary.
tailaware counts a non-relevant item as outranking a positive only when its score is strictly
greater (positives win ties). Metrics are fractions in [0, 1]; ILIAS reports percent.

Shapes: Q queries, P positive slots (padded, `mask`), D database items.
"""

import jax
import jax.numpy as jnp
import numpy as np


def _xp(*arrays):
    return jnp if any(isinstance(a, jax.Array) for a in arrays) else np


def ap_at_k_from_counts(counts, mask, k):
    """Returns AP@k [Q] from the number of non-relevant items strictly above each positive.

    Args:
      counts: [Q, P] integer counts (distractors plus any other non-relevant items).
      mask: [Q, P] bool, real positives.
      k: cut-off.
    """
    xp = _xp(counts, mask)
    ranks, valid = ranks_from_counts(counts, mask)
    j = xp.cumsum(valid, axis=1)
    hit = valid & (ranks <= k)
    contrib = xp.where(hit, j / xp.where(valid, ranks, 1), 0.0)  # int / int -> float
    n_pos = valid.sum(axis=1)
    return contrib.sum(axis=1) / xp.maximum(xp.minimum(k, n_pos), 1).astype(contrib.dtype)


def map_from_counts(counts, k, fixed=None) -> float:
    """Returns the exact mAP@k of a gallery from the items above each positive [Q, P] (-1 at
    padding), plus `fixed` [Q, P] always-indexed non-relevant items above each, when given."""
    counts = np.asarray(counts)
    mask = counts >= 0
    total = counts if fixed is None else np.where(mask, counts + np.asarray(fixed), -1)
    return float(ap_at_k_from_counts(total, mask, k).mean())


def recall_at_k_from_counts(counts, mask, k):
    """Returns recall@k [Q]: the share of each query's positives ranked within the top k."""
    xp = _xp(counts, mask)
    ranks, valid = ranks_from_counts(counts, mask)
    hits = (valid & (ranks <= k)).sum(axis=1)
    return hits / xp.maximum(valid.sum(axis=1), 1)


def top1_from_counts(counts, mask):
    """Returns top-1 accuracy [Q]: 1.0 when the first retrieved item is a positive."""
    xp = _xp(counts, mask)
    return xp.any(mask & (counts == 0), axis=1).astype(float)


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
