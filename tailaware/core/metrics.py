"""Retrieval metrics: each a kernel over the positives' ranks, a normaliser and a cut-off.

A metric is defined once (`Metric`, registered in `METRICS`): a query with R positives at ranks
r_1 < r_2 < ... (j-th positive by score, 1-based) scores

    value = sum_j weight(j) * 1{r_j <= c} * gain(r_j) / norm(R, k),

with its cut-off c (`Cutoff`) either the global k or a per-query one from R.

| metric | weight(j) | gain(r) | norm(R, k) | cut-off c |
|---|---|---|---|---|
| `map` (ILIAS mAP@k) | j | 1 / r | min(k, R) | k |
| `recall` (ILIAS's `oracle`) | 1 | 1 | R | k |
| `precision` | 1 | 1 | k | k |
| `ndcg` (binary relevance) | 1 | 1 / log2(1 + r) | sum_{i <= min(k, R)} 1 / log2(1 + i) | k |
| `hit` | 1{j = 1} | 1 | 1 | k |
| `mrr` | 1{j = 1} | 1 / r | 1 | k |
| `map_at_r` (MAP@R) | j | 1 / r | R | R |
| `r_precision` | 1 | 1 | R | R |
| `top1` (top-1 accuracy) | 1{j = 1} | 1 | 1 | 1 |

MAP@R and R-precision are the metric-learning definitions of Musgrave et al., "A Metric Learning
Reality Check" (ECCV 2020): MAP@R = (1/R) sum_{i <= R} P(i) rel(i), with P(i) the precision of
the top i (a positive at rank r_j <= R contributes P(r_j) = j / r_j); R-precision = (positives
in the top R) / R.

The same kernel gives a fixed gallery's exact value from its ranks (`value_from_counts`) and the
law's expectation under Poisson counts (`tailaware.core.law`, one term per (gain, cut-off)).
Official definitions (the ILIAS and GLDv2 evaluation code; docs/outputs.md):
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

import types
from typing import NamedTuple, Protocol, TypeAlias

import jax
import jax.numpy as jnp
import numpy as np
from numpy.typing import ArrayLike

# A numpy or a jax.numpy array: the kernels below run on either (`_xp` picks the module).
Array: TypeAlias = np.ndarray | jax.Array


class Gain(Protocol):
    """A metric's rank function: g(r) [...] of ranks r [...] (float, >= 1)."""

    def __call__(self, r: Array, /) -> Array: ...


class Weight(Protocol):
    """A metric's weight of each positive from its rank j [P] among the positives (float,
    1-based): weight(j) [P]."""

    def __call__(self, j: Array, /) -> Array: ...


class Norm(Protocol):
    """A metric's normaliser from each query's positives R [...] (float, >= 1) and the global
    cut-off k: norm(R, k) [...], > 0."""

    def __call__(self, n_pos: Array, k: int, /) -> Array: ...


class PerQueryCutoff(Protocol):
    """A per-query cut-off from each query's positives R [...] (float, >= 1): c(R) [...],
    integer-valued in [1, R]."""

    def __call__(self, n_pos: Array, /) -> Array: ...


def _xp(*arrays: object) -> types.ModuleType:
    return jnp if any(isinstance(a, jax.Array) for a in arrays) else np


def _ones(r: Array) -> Array:
    return r * 0.0 + 1.0


def _inverse(r: Array) -> Array:
    return 1.0 / r


def _dcg(r: Array) -> Array:
    return 1.0 / _xp(r).log2(1.0 + r)


# The rank functions a metric's gain can be: the law keeps one term E[1{a + K <= c} g(a + K)] per
# (gain, cut-off) (`law.expected_terms`), shared by every metric with that pair.
GAINS: dict[str, Gain] = {"inverse": _inverse, "one": _ones, "dcg": _dcg}


def _ideal_dcg(n_pos: Array, k: int) -> Array:
    """Returns sum_{i <= min(k, n_pos)} 1 / log2(1 + i), elementwise (numpy or jax.numpy)."""
    xp = _xp(n_pos)
    i = xp.arange(1, int(k) + 1, dtype=n_pos.dtype)
    cum = xp.concatenate([xp.zeros(1, n_pos.dtype), xp.cumsum(1.0 / xp.log2(1.0 + i))])
    return cum[xp.minimum(n_pos, k).astype(np.int32)]


class Cutoff(NamedTuple):
    """Where a metric stops counting ranks: the global k, or a cut-off of each query's own.

    Attributes:
      name: "k" for the global cut-off; else how labels name it ("R", "1").
      per_query: None for the global k; else (`PerQueryCutoff`) R [...] (each query's
        positives, float, >= 1) -> its cut-off, integer-valued in [1, R] (numpy or jax): the
        law sums each positive's Poisson counts up to the query's width, so a cut-off past R
        would be cut short.
    """

    name: str
    per_query: PerQueryCutoff | None = None


AT_K = Cutoff("k")
AT_R = Cutoff("R", lambda n_pos: n_pos * 1.0)
AT_1 = Cutoff("1", lambda n_pos: n_pos * 0.0 + 1.0)


class Metric(NamedTuple):
    """A retrieval metric: sum_j weight(j) 1{r_j <= c} gain(r_j) / norm(R, k), c its cut-off.

    Attributes:
      name: its registry key ("map", "recall", ...), the name `--config.metrics` takes.
      gain: a key of `GAINS`, the rank function.
      weight: j [P] (float, 1-based rank among the positives) -> [P] weights (`Weight`);
        numpy or jax.
      norm: (R [...], k) -> the normaliser, > 0 for R >= 1 (`Norm`); numpy or jax.
      description: one line for docs and outputs.
      cutoff: the global k (`AT_K`) or a per-query `Cutoff` (`AT_R`, `AT_1`, or one's own).
    """

    name: str
    gain: str
    weight: Weight
    norm: Norm
    description: str
    cutoff: Cutoff = AT_K

    def label(self, k: int) -> str:
        """Returns the key outputs report it under: "map@1000" at the global k; the name alone
        ("map_at_r") for a per-query cut-off, which the name says."""
        return f"{self.name}@{int(k)}" if self.cutoff.per_query is None else self.name

    def cutoff_value(self, k: int) -> int | str:
        """Returns its cut-off as outputs record it: k, or the per-query cut-off's name."""
        return int(k) if self.cutoff.per_query is None else self.cutoff.name

    def cut(self, n_pos: Array, k: int) -> Array:
        """Returns each query's cut-off for R = `n_pos` [...] (float) positives: k or c(R)."""
        if self.cutoff.per_query is None:
            return n_pos * 0.0 + k
        return self.cutoff.per_query(n_pos)


def _first(j: Array) -> Array:
    return _xp(j).where(j == 1, 1.0, 0.0)


def _positives(n: Array, k: int) -> Array:
    return n * 1.0


def _one(n: Array, k: int) -> Array:
    return n * 0.0 + 1.0


METRICS: dict[str, Metric] = {
    m.name: m
    for m in (
        Metric("map", "inverse", lambda j: j, lambda n, k: _xp(n).minimum(k, n), "ILIAS mAP@k"),
        Metric("recall", "one", _ones, _positives, "recall@k (ILIAS's oracle)"),
        Metric("precision", "one", _ones, lambda n, k: n * 0.0 + k, "precision@k"),
        Metric("ndcg", "dcg", _ones, _ideal_dcg, "nDCG@k, binary relevance"),
        Metric("hit", "one", _first, _one, "hit@k (top-1 accuracy at k=1)"),
        Metric("mrr", "inverse", _first, _one, "MRR@k"),
        Metric("map_at_r", "inverse", lambda j: j, _positives, "MAP@R (Musgrave et al.)", AT_R),
        Metric("r_precision", "one", _ones, _positives, "R-precision (Musgrave et al.)", AT_R),
        Metric("top1", "one", _first, _one, "top-1 accuracy", AT_1),
    )
}


def register(metric: Metric) -> Metric:
    """Registers `metric` under its name (every job, interval, curve and comparison then takes it
    by that name); returns it."""
    if metric.gain not in GAINS:
        raise ValueError(f"metric {metric.name!r}: unknown gain {metric.gain!r}; one of {GAINS}")
    METRICS[metric.name] = metric
    return metric


def get(name: str) -> Metric:
    """Returns the metric called `name`."""
    if name not in METRICS:
        raise ValueError(f"unknown metric {name!r}; choose some of {sorted(METRICS)}")
    return METRICS[name]


def labelled(label: str, k: int) -> Metric:
    """Returns the registered metric that outputs at cut-off `k` report under `label`."""
    for m in METRICS.values():
        if m.label(k) == label:
            return m
    raise ValueError(f"no registered metric is reported as {label!r} at k = {k}")


def value_from_ranks(metric: Metric, ranks: Array, valid: Array, k: int) -> Array:
    """Returns the metric [Q] from the positives' ranks [Q, P] in rank order (`ranks_from_counts`;
    `valid` [Q, P] marks real positives) at the global cut-off `k` (or the metric's own per-query
    one), numpy or jax.numpy; 0 for a query without positives."""
    xp = _xp(ranks, valid)
    f = xp.result_type(float) if xp is jnp else np.float64
    j = xp.cumsum(valid, axis=1).astype(f)
    r = xp.where(valid, ranks, 1).astype(f)
    n_pos = valid.sum(axis=1).astype(f)
    cut = metric.cut(xp.maximum(n_pos, 1.0), k)[:, None]
    hit = valid & (r <= cut)
    terms = xp.where(hit, metric.weight(j) * GAINS[metric.gain](r), 0.0)
    norm = xp.where(n_pos > 0, metric.norm(xp.maximum(n_pos, 1.0), k), 1.0)
    return terms.sum(axis=1) / norm


def value_from_counts(metric: Metric, counts: Array, mask: Array, k: int) -> Array:
    """Returns the metric [Q] from the number of non-relevant items strictly above each positive
    [Q, P] (`mask` marks real positives)."""
    return value_from_ranks(metric, *ranks_from_counts(counts, mask), k)


def ap_at_k_from_counts(counts: Array, mask: Array, k: int) -> Array:
    """Returns AP@k [Q] from the number of non-relevant items strictly above each positive.

    Args:
      counts: [Q, P] integer counts (distractors plus any other non-relevant items).
      mask: [Q, P] bool, real positives.
      k: cut-off.
    """
    return value_from_counts(METRICS["map"], counts, mask, k)


def map_from_counts(counts: ArrayLike, k: int, fixed: ArrayLike | None = None) -> float:
    """Returns the exact mAP@k of a gallery from the items above each positive [Q, P] (-1 at
    padding), plus `fixed` [Q, P] always-indexed non-relevant items above each, when given."""
    counts = np.asarray(counts)
    mask = counts >= 0
    total = counts if fixed is None else np.where(mask, counts + np.asarray(fixed), -1)
    return float(ap_at_k_from_counts(total, mask, k).mean())


def ranks_from_counts(counts: Array, mask: Array) -> tuple[Array, Array]:
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


def counts_from_scores(scores: Array, relevant: Array, pos_scores: Array, pos_mask: Array) -> Array:
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


def positives_from_dense(scores: Array, relevant: Array) -> tuple[Array, Array]:
    """Returns (pos_scores [Q, P], pos_mask [Q, P]) gathered from a dense score matrix."""
    xp = _xp(scores, relevant)
    p = int(relevant.sum(axis=1).max())
    order = xp.argsort(~relevant, axis=1, stable=True)[:, :p]
    pos = xp.take_along_axis(scores, order, axis=1)
    mask = xp.take_along_axis(relevant, order, axis=1)
    return xp.where(mask, pos, xp.nan), mask


def ilias_map_at_k(scores: Array, relevant: Array, k: int = 1000) -> tuple[Array, Array]:
    """Returns (mAP@k, AP@k [Q]) from dense scores [Q, D] and ground truth [Q, D] (our tie rule)."""
    pos, mask = positives_from_dense(scores, relevant)
    xp = _xp(scores)
    counts = counts_from_scores(scores, relevant, xp.where(mask, pos, 0.0), mask)
    aps = ap_at_k_from_counts(counts, mask, k)
    return aps.mean(), aps


def gldv2_map_at_k(ranked_relevant: Array, n_gt: Array, k: int = 100) -> tuple[Array, Array]:
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
