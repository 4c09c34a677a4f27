"""The reported intervals of a predicted metric: for these queries, and over queries like these.

Three sources of uncertainty (paper Sec. 4-5, App. C-D); the first is not uncertainty about
the number the full evaluation would print on a fixed query set, so it enters the second
interval only (`intervals`):

* queries: the benchmark's queries are a sample of possible queries. The query bootstrap
  resamples the per-query AP vector (`query_bootstrap`): B replicates are one gather and a mean.
* the distractor sample: the S sampled distractors are a sample of the pool, and the tail fits
  inherit their noise (`nested.nested_bootstrap`, or a stored sd).
* the tail model itself: how far the prediction moves when the tail threshold keeps half or
  twice the excesses, and under a flatter or a steeper prior on the tail shape; no resampling of
  the data sees it (`IntervalSettings`). The prior's term is each query's move, combined over
  the queries as independent errors (`prior_spread`): it shrinks as 1 / sqrt(queries), as the
  error does on real text (docs/validation.md, "The prior's term, query by query"); beside it,
  the aggregate move, the part of that error the queries share (`IntervalSettings.shared_sd`).

`intervals` combines them at one gallery size into an `Interval`; `item_intervals` for every
reported item (a metric at one size, a group of the ILIAS report).

Shapes: Q queries, B replicates, G gallery sizes, F threshold reruns, T other priors.
"""

import statistics

import jax
import jax.numpy as jnp
import numpy as np
from numpy.typing import ArrayLike

from tailaware.core.results import Bounds, Interval
from tailaware.protocol.settings import IntervalSettings

LEVELS = (0.90, 0.95)


def percentile_interval(samples: np.ndarray, level: float, axis: int = 0) -> np.ndarray:
    """Returns the [lo, hi] percentile interval of `samples` along `axis` (numpy)."""
    a = (1.0 - level) / 2.0
    bounds: np.ndarray = np.quantile(samples, [a, 1.0 - a], axis=axis)
    return bounds


@jax.jit
def _query_means(weights: jax.Array, aps: jax.Array) -> jax.Array:
    return jnp.tensordot(aps, weights, axes=([-1], [1]))  # [..., B]


def resample_weights(num_queries: int, num_replicates: int, seed: int = 0) -> np.ndarray:
    """Returns [B, Q] float32 bootstrap weights: how often each query is drawn, divided by Q.

    The draws are numpy's (seeded, a few milliseconds); a replicate's mean is then one row of a
    matrix product, so all B replicates are one small jitted contraction that compiles in
    milliseconds (drawing the indices with `jax.random` costs far more to compile).
    """
    q, b = int(num_queries), int(num_replicates)
    idx = np.random.default_rng(seed).integers(0, q, (b, q))
    counts = np.bincount((idx + q * np.arange(b)[:, None]).ravel(), minlength=b * q)
    return (counts.reshape(b, q) / q).astype(np.float32)


def query_bootstrap(aps: ArrayLike, num_replicates: int = 1000, seed: int = 0) -> np.ndarray:
    """Returns bootstrap replicates of mean AP over resampled queries.

    Args:
      aps: [Q] or [G, Q] per-query AP (one row per gallery size; all rows share the resampled
        query sets, so a band over sizes is coherent).
      num_replicates: B.
      seed: seed of the resampling.

    Returns:
      [B] or [G, B] float64 replicates of mAP.
    """
    values = jnp.asarray(aps, jnp.float32)
    weights = resample_weights(values.shape[-1], num_replicates, seed)
    out = _query_means(jnp.asarray(weights), values)
    return np.asarray(jax.device_get(out), np.float64)


def sd_model(
    threshold_deviation: float,
    prior_term: float,
    settings: IntervalSettings,
    shared_deviation: float = 0.0,
) -> float:
    """Returns the tail model's error as one sd: the measured moves, scaled, in quadrature.

    `prior_term` is the prior's term query by query (`prior_spread`), `shared_deviation` the
    aggregate move under the same priors (the part the queries share)."""
    terms = (
        settings.threshold_sd * float(threshold_deviation),
        settings.prior_sd * float(prior_term),
        settings.shared_sd * float(shared_deviation),
    )
    return float(np.sqrt(sum(t * t for t in terms)))


def prior_spread(
    moved: ArrayLike, per_query: ArrayLike, weights: ArrayLike | None = None
) -> np.ndarray:
    """Returns [I] each item's prior term: sqrt(sum_q (w_q d_q)^2), d_q the query's largest
    move under the other priors and w_q its normalised weight in the item.

    Args:
      moved: [T, I, Q] the per-query values under the T other priors.
      per_query: [I, Q] the estimate's.
      weights: [I, Q] the items' query weights, or None (uniform).

    Each query's tail shape is its own unknown, so the errors the moves stand for are taken as
    independent across queries: the aggregate move (their mean, `deviation`) does not shrink
    with the query count, the error does (docs/validation.md, "The prior's term, query by
    query").
    """
    v = np.asarray(per_query, np.float64)
    w = np.ones_like(v) if weights is None else np.asarray(weights, np.float64)
    w = w / np.maximum(w.sum(axis=-1, keepdims=True), 1e-300)
    d = np.max(np.abs(np.asarray(moved, np.float64) - v), axis=0)  # [I, Q]
    out: np.ndarray = np.sqrt(np.sum((w * d) ** 2, axis=-1))
    return out


def in_range(lo: float, hi: float, low: float = 0.0) -> tuple[float, float]:
    """Returns (lo, hi) cut to [low, 1]: the range of mAP@k, or of a difference of two (low =
    -1); a normal widening can pass it."""
    return float(max(lo, low)), float(min(hi, 1.0))


def widened(
    point: float, bounds: tuple[float, float] | np.ndarray, half_width: float, low: float = 0.0
) -> tuple[float, float]:
    """Returns `bounds` (lo, hi) around `point` with a normal term of `half_width` added in
    quadrature on each side, cut to [low, 1] (`in_range`): every interval's terms combine so."""
    lo, hi = bounds
    grown = (point - np.hypot(point - lo, half_width), point + np.hypot(hi - point, half_width))
    return in_range(*grown, low=low)


def sampling_sd(sd_distractor: float | None, sd_subsample: float) -> float:
    """Returns the sampling sd of the interval for these queries: the larger of the nested
    replicates' and the sub-samples' reads. Both see the sample's own noise, so their
    quadrature sum would count it twice; the sub-samples' also sees the extrapolation's drift
    (docs/validation.md, "The sub-samples' term (issue #41)")."""
    return max(float(sd_distractor or 0.0), float(sd_subsample))


def for_these_queries(point: float, z: float, sampling: float, extra: float) -> tuple[float, float]:
    """Returns the interval for these queries at normal quantile `z`: normal with the sampling
    sd (`sampling_sd`; the point alone at 0), cut to [0, 1], then widened in quadrature by the
    other terms' sd `extra` (`widened`)."""
    base = in_range(point - z * sampling, point + z * sampling) if sampling > 0 else (point, point)
    return widened(point, base, z * extra)


def intervals(
    point: float,
    query_reps: np.ndarray,
    settings: IntervalSettings,
    *,
    nested: tuple[np.ndarray, np.ndarray] | None = None,
    deviation: float = 0.0,
    sd_distractor: float | None = None,
    prior_deviation: float = 0.0,
    sd_realized: float = 0.0,
    sd_subsample: float = 0.0,
    spread: float | None = None,
) -> Interval:
    """Returns the reported `Interval` at one gallery size: two intervals per level.

    For these queries (`Bounds.reported`, the headline): the realized value the full evaluation
    would print on this query set, uncertain through the distractor sample (a normal interval
    of its nested replicates' sd, or of a stored `sd_distractor`), the tail model and the
    realized counts. Its sampling part is normal with the larger of two reads of the sample's
    sd (`sampling_sd`): the nested replicates' and the prediction's moves between nested
    sub-samples of the sample (`sd_subsample`: sampling noise and the extrapolation's drift
    with S, which the resampled replicates do not see). The tail model's term, a normal error
    of sd `sd_model(deviation, spread, prior_deviation)`, and the counts' own noise around the law's
    expectation (`sd_realized`, shrinking as 1 / sqrt(queries): `core.realization`) are added
    to it in quadrature on each side. Over queries like these (`Bounds.queries`): that interval
    widened on each side, in quadrature, by the query bootstrap's percentile interval
    (independent sources; the 1000 cheap query replicates keep their own tails), so it always
    contains the first.
    `Bounds.sampling` (the query interval widened by the distractor sd) is kept as a part. Every
    interval is cut to [0, 1].

    Args:
      point: the prediction.
      query_reps: [B] query-bootstrap replicates.
      settings: the model terms' factors.
      nested: None or (distractor [B'], combined [B']) replicates at this size
        (`nested.Nested.at`).
      deviation: how far the prediction moves when the tail threshold does; 0 for estimators
        without a tail model.
      sd_distractor: the distractor replicates' sd where only it is known (a hardness artifact
        stores it): it widens the query interval as the replicates would, and the distractor
        interval is normal. Ignored when `nested` is given.
      prior_deviation: how far the prediction moves under other priors on the tail shape; 0
        without a tail posterior.
      spread: the prior's term query by query (`prior_spread`), which the model term uses;
        None: `prior_deviation` instead (an item without per-query values under the priors).
      sd_realized: the sd of the realized value around the law's expectation on these queries
        (`core.realization.mean_sd`); 0 when not measured.
      sd_subsample: the sub-samples' sd (`budget.subsample_sd`); 0 when not measured.
    """
    widen = nested is not None or sd_distractor is not None
    sd_q = float(np.std(query_reps, ddof=1))
    sd_d, sd_combined = 0.0, None
    if nested is not None:
        sd_d = float(np.std(nested[0], ddof=1))
        sd_combined = float(np.std(nested[1], ddof=1))
    elif sd_distractor is not None:
        sd_d = float(sd_distractor)
    spread_or_move = prior_deviation if spread is None else spread
    sd_m = sd_model(deviation, spread_or_move, settings, prior_deviation)
    bounds = []
    for level in LEVELS:
        lo, hi = percentile_interval(query_reps, level)
        query = in_range(lo, hi)
        z = statistics.NormalDist().inv_cdf(0.5 + level / 2.0)
        # Normal from the replicates' sd, as from a stored sd (an artifact, the curve between the
        # nested anchors): the same interval wherever the same sd is known, and steadier than
        # the tails of ~50 replicates.
        distractor = in_range(point - z * sd_d, point + z * sd_d) if widen else None
        if widen:
            grow = np.sqrt(1.0 + (sd_d / max(sd_q, 1e-12)) ** 2)
            lo, hi = point - (point - lo) * grow, point + (hi - point) * grow
        sampling = in_range(lo, hi)
        these = for_these_queries(
            point, z, sampling_sd(sd_d, sd_subsample), float(np.hypot(sd_m, sd_realized))
        )
        like = in_range(
            point - np.hypot(point - these[0], point - query[0]),
            point + np.hypot(these[1] - point, query[1] - point),
        )
        bounds.append(Bounds(these, sampling, query, distractor, like))
    return Interval(
        method="nested" if widen else "query",
        sd_query=sd_q,
        sd_distractor=sd_d if widen else None,
        sd_combined=sd_combined,
        threshold_deviation=float(deviation),
        prior_deviation=float(prior_deviation),
        sd_model=sd_m,
        ci90=bounds[0],
        ci95=bounds[1],
        sd_realized=float(sd_realized),
        sd_subsample=float(sd_subsample),
        prior_spread=0.0 if spread is None else float(spread),
    )


def deviation(maps: np.ndarray | None, points: ArrayLike) -> np.ndarray:
    """Returns [G] the largest distance of reruns' mAP@k `maps` [F, G] from `points` [G] (0 when
    `maps` is None): how far the prediction moves with the tail model."""
    points = np.asarray(points, np.float64)
    return np.zeros_like(points) if maps is None else np.max(np.abs(maps - points), axis=0)


def item_intervals(
    per_query: ArrayLike,
    *,
    settings: IntervalSettings,
    query_replicates: int,
    seed: int,
    weights: ArrayLike | None = None,
    reruns: np.ndarray | None = None,
    priors: np.ndarray | None = None,
    nested: tuple[np.ndarray, np.ndarray] | None = None,
    sd_distractor: np.ndarray | None = None,
    sd_realized: np.ndarray | None = None,
    sd_subsample: np.ndarray | None = None,
    spread: np.ndarray | None = None,
) -> list[Interval]:
    """Returns the `Interval` of each reported item: a weighted mean of per-query values.

    Item i is sum_q weights[i, q] v[i, q] (the mean over queries when `weights` is None): a metric
    at one gallery size, or a group or category of the ILIAS report. Its query bootstrap
    resamples the queries with the same draws for every item (so bands over sizes and groups
    are coherent), re-weighting them: sum_q c_q w_q v_q / sum_q c_q w_q.

    Args:
      per_query: [I, Q] each item's per-query values.
      settings: the model terms' factors.
      query_replicates, seed: the query bootstrap's B and seed.
      weights: [I, Q] the items' query weights, or None (uniform).
      reruns: [F, I] the items' values under the threshold reruns, or None.
      priors: [T, I] their values under the other priors on the tail shape, or None.
      nested: (distractor [I, B'], combined [I, B']) replicates, or None.
      sd_distractor: [I] the distractor replicates' sds where only they are known (NaN: none),
        or None; ignored for an item with `nested` replicates.
      sd_realized: [I] the sd of each item's realized value around its expectation, or None.
      sd_subsample: [I] each item's sub-samples' sd (`budget.subsample_sd`), or None.
      spread: [I] each item's prior term query by query (`prior_spread`), or None (the
        aggregate prior deviation instead).

    Each `Interval` also holds `threshold_maps` and `prior_maps`: the reruns' values (half, twice
    the excesses; flatter, steeper prior), which a comparison pairs across two systems.
    """
    v = np.asarray(per_query, np.float64)
    w = np.full_like(v, 1.0 / v.shape[1]) if weights is None else np.asarray(weights, np.float64)
    points = np.sum(w * v, axis=1)
    drawn = resample_weights(v.shape[1], int(query_replicates), int(seed)).astype(np.float64)
    den = w @ drawn.T  # [I, B]; 0 where a draw holds none of an item's queries (then NaN)
    query_reps = np.where(den > 0, ((w * v) @ drawn.T) / np.where(den > 0, den, 1.0), np.nan)
    dev, dev_prior = deviation(reruns, points), deviation(priors, points)
    out = []
    for i, point in enumerate(points):
        nest = None if nested is None else (nested[0][i], nested[1][i])
        sd = None if sd_distractor is None or np.isnan(sd_distractor[i]) else sd_distractor[i]
        reps = query_reps[i][np.isfinite(query_reps[i])]  # a draw without the item's queries
        real = 0.0 if sd_realized is None else float(sd_realized[i])
        sub = 0.0 if sd_subsample is None else float(sd_subsample[i])
        unc = intervals(
            float(point),
            reps,
            settings,
            nested=nest,
            deviation=dev[i],
            sd_distractor=sd,
            prior_deviation=dev_prior[i],
            sd_realized=real,
            sd_subsample=sub,
            spread=None if spread is None else float(spread[i]),
        )
        out.append(unc._replace(threshold_maps=_listed(reruns, i), prior_maps=_listed(priors, i)))
    return out


def _listed(values: np.ndarray | None, i: int) -> tuple[float, ...] | None:
    """Returns item i's values under the reruns [F, I] (None stays None)."""
    return None if values is None else tuple(float(x) for x in values[:, i])
