"""How far a gallery's realized metric falls from the law's expectation, query by query.

A prediction is E[metric@k] under the law (`law.query_metrics`): positive j of a query is
outranked by K_j ~ Poisson(n x_j) distractors (given the sample's own counts c_j in a gallery
that contains it: K_j = c_j + Poisson((n - S) x_j), `law.conditioned`). The full evaluation
prints one realization of those counts, not their expectation: on a fixed query set the
realized mean differs from the predicted one by the mean of each query's own draw, which no
resampling of the distractor sample sees and which shrinks as 1 / sqrt(Q) only
(docs/validation.md, "The two intervals on dev (issue #41)").

`spread` draws the counts jointly, as a gallery holds them: the distractors above a positive
are above every positive scored below it, so each query's counts in hardness order are a
cumulative sum of independent Poisson increments. Each draw first picks one atom of the query's
hardness posterior by its weight. Two count draws per atom draw separate the counts' own noise
(`Spread.counts`) from the posterior's spread over atoms (`Spread.total` minus it).

Shapes: Q queries, P positive slots (padded; `mask`), A atoms, D draws, M metrics, V views.
"""

from typing import NamedTuple

import numpy as np
from numpy.typing import ArrayLike

from tailaware.core import metrics

# Draws per query: the per-query variance is then known to ~sqrt(2 / D) = 13%, and a mean over
# queries' to far better (why the counts' noise alone, not the posterior's atoms, enters the
# interval: docs/validation.md, "The two intervals on dev (issue #41)").
DRAWS = 128
# Draws x queries x positive slots held at once (int64 counts: 32 MB).
_CHUNK_CELLS = 1 << 22


class Spread(NamedTuple):
    """Each query's variance of its realized metrics around the law's expectation.

    Attributes:
      counts: [M, Q] (or [V, M, Q] in views) E_atom Var(metric | atom): the realized counts'
        own noise.
      total: [M, Q] (or [V, M, Q]) Var(metric) with the atom drawn from the posterior too
        (>= `counts` up to the draws' noise).
    """

    counts: np.ndarray
    total: np.ndarray


def _draw_counts(
    rng: np.random.Generator, x: np.ndarray, mask: np.ndarray, base: np.ndarray, scale: float
) -> np.ndarray:
    """Returns [D, Q, P] int64 realized counts base + nested Poisson(scale x) (-1 at padding)."""
    key = np.where(mask, x, np.inf)
    order = np.argsort(key, axis=-1, kind="stable")
    xs = np.take_along_axis(np.where(mask, x, 0.0), order, axis=-1)
    valid = np.take_along_axis(np.broadcast_to(mask, x.shape), order, axis=-1)
    inc = np.diff(xs, axis=-1, prepend=0.0)
    drawn = np.zeros(x.shape, np.int64)
    drawn[valid] = rng.poisson(np.maximum(scale * inc[valid], 0.0))  # padding draws nothing
    drawn = np.cumsum(drawn, axis=-1)
    above = np.empty_like(drawn)
    np.put_along_axis(above, order, drawn, axis=-1)
    return np.where(mask, base + above, -1)


def spread(
    atoms: ArrayLike,
    weights: ArrayLike | None,
    mask: ArrayLike,
    n: float,
    k: int,
    *,
    fixed: ArrayLike | None = None,
    counts: ArrayLike | None = None,
    n_sample: float | None = None,
    metric_list: tuple[metrics.Metric, ...] = (metrics.METRICS["map"],),
    views: ArrayLike | None = None,
    draws: int = DRAWS,
    seed: int = 0,
) -> Spread:
    """Returns each query's variance of its realized metrics@k at gallery size `n` (`Spread`).

    Args:
      atoms: [Q, P, A] hardness atoms (or [Q, P], one atom).
      weights: [Q, A] their weights (rows sum to 1), or None (one atom).
      mask: [Q, P] real positives.
      n: the gallery size N.
      k: the global cut-off.
      fixed: [Q, P] always-indexed non-relevant items above each positive, or None.
      counts: [Q, P] the sample's own counts above each positive, or None; with `n_sample` = S
        and n >= S the draws condition on them, as the prediction does.
      metric_list: the M metrics.
      views: None, or [V, Q, P] bool subsets of each query's positives (the ILIAS report's
        groups: the others deleted from the list, the non-relevant items above each unchanged);
        the `Spread`'s fields are then [V, M, Q], each view's metrics.
      draws: D atom draws per query, each with two count draws.
      seed: seed of the draws.
    """
    mask = np.asarray(mask, bool)
    atoms = np.asarray(atoms, np.float64)
    atoms = atoms[..., None] if atoms.ndim == 2 else atoms
    q, p, a = atoms.shape
    w = np.ones((q, 1)) if weights is None else np.asarray(weights, np.float64)
    base = np.zeros((q, p), np.int64) if fixed is None else np.asarray(fixed, np.int64)
    scale = float(n)
    if counts is not None and n_sample is not None and n >= n_sample:
        base = base + np.asarray(counts, np.int64)
        scale = float(n) - float(n_sample)
    base = np.where(mask, base, 0)
    cum = np.cumsum(w, axis=-1)
    rng = np.random.default_rng(seed)
    chunk = max(1, min(int(draws), _CHUNK_CELLS // max(q * p, 1)))
    subsets = mask[None] if views is None else np.asarray(views, bool) & mask[None]
    first: list[np.ndarray] = []
    second: list[np.ndarray] = []
    for start in range(0, int(draws), chunk):
        d = min(chunk, int(draws) - start)
        u = rng.uniform(size=(d, q, 1)) * cum[None, :, -1:]
        pick = np.minimum((cum[None] < u).sum(axis=-1), a - 1)  # [D, Q]
        x = np.take_along_axis(atoms[None], pick[:, :, None, None], axis=-1)[..., 0]
        for out in (first, second):
            drawn = _draw_counts(rng, x, mask, base, scale).reshape(d * q, p)
            values = []
            for subset in subsets:  # each view's ranks once, for every metric
                ranks, valid = metrics.ranks_from_counts(drawn, np.tile(subset, (d, 1)))
                got = [metrics.value_from_ranks(m, ranks, valid, k) for m in metric_list]
                values.append([v.reshape(d, q) for v in got])
            out.append(np.asarray(values))  # [V, M, D, Q]
    v1, v2 = np.concatenate(first, axis=2), np.concatenate(second, axis=2)
    within = 0.5 * np.mean((v1 - v2) ** 2, axis=2)
    total = np.var(v1, axis=2, ddof=1)
    if views is None:
        within, total = within[0], total[0]
    return Spread(counts=within, total=total)


def mean_sd(variance: ArrayLike, weights: ArrayLike | None = None) -> np.ndarray:
    """Returns [...] the sd of a weighted mean of independent queries' realized values from
    their variances [..., Q]: sqrt(sum_q w_q^2 var_q), w = 1 / Q when `weights` is None."""
    var = np.asarray(variance, np.float64)
    w = np.full(var.shape[-1], 1.0 / var.shape[-1]) if weights is None else np.asarray(weights)
    sd: np.ndarray = np.sqrt(np.sum(w**2 * var, axis=-1))
    return sd
