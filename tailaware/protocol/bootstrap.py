"""Bootstrap intervals for a predicted mAP@k: over queries, and nested over the distractor sample.

Two sources of uncertainty (paper Sec. 4-5, App. C-D):

* queries: the benchmark's queries are a sample of possible queries. The query bootstrap
  resamples the per-query AP vector (`query_bootstrap`): B replicates are one gather and a mean.
* the distractor sample: the S sampled distractors are a sample of the pool, and the tail fits
  inherit their noise. The nested bootstrap (`nested_bootstrap`) resamples each query's
  distractor sample with Poisson(1) weights (the Poisson bootstrap of all S distractors,
  restricted to what the estimator reads: the top L stored scores and the counts) and reruns the
  estimator from scratch, vmapped over replicates in one jit call. Resampled stored scores keep
  their order; a positive's resampled count is the weight of the stored scores above it plus a
  nested Poisson draw for the unstored distractors above it, so counts and tail stay
  consistent. Each replicate also resamples queries, so it carries both sources; averaging the
  same replicates over all queries gives the distractor-only part.

The estimator inside the nested bootstrap is a pure-JAX hardness function (`hardness_fn`):
count, homogeneous, or the tail-aware core `hardness.log_tail_prob` combined with counts as
`hardness.estimate` does (count for positives at least `min_count` sampled distractors beat,
the fitted tail otherwise).

Shapes: Q queries, P positives (padded), M stored tail scores, L <= M of them resampled,
B replicates, G gallery sizes.
"""

import functools
import statistics
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from tailaware.core import buckets, law
from tailaware.io.scores import SampledScores
from tailaware.tail import dequantize

LEVELS = (0.90, 0.95)
# The tail model's error (`intervals`), two measured parts in quadrature, as standard deviations:
# THRESHOLD_SD per unit of threshold deviation (how far the prediction moves when the threshold
# keeps half or twice the excesses) and PRIOR_SD per unit of prior deviation (how far it moves
# under a flatter and a steeper prior on the tail shape, `hardness.PRIOR_SPREAD`). Chosen
# jointly on 2026-12-01 from the recorded parts of every interval (factors 2-4 x 0-2 in steps
# of 1/2) of the validation's paper and stress regimes (20 draws in each of 12 cells, with the
# nested bootstrap) and the sizes grid of `benchmarks/tail_families.py` (six families x 13
# gallery sizes and fractions, 2 draws; seeds 0, 1, 2 with 200, 1,000, 500 queries): (2.5, 1.5)
# holds the truth in 94%, 92% and 93% of the grid draws (median half-width 0.089, 0.078,
# 0.079), in 95% or more of every paper cell's draws (half-width 0.082) and all stress draws
# (0.148). The threshold term alone (3, 0), the choice before the prior term existed, has about
# the same grid coverage (93%, 92%, 91%) but covers only 70% of one paper cell (`truncnorm` at
# 1%); (3, 1) 85% there at the same width. Query intervals alone: 57%, 39%, 50% of the grid
# draws. The nested bootstrap's distractor term widens the interval further.
THRESHOLD_SD = 2.5
PRIOR_SD = 1.5


def percentile_interval(samples: np.ndarray, level: float, axis: int = 0) -> np.ndarray:
    """Returns the [lo, hi] percentile interval of `samples` along `axis` (numpy)."""
    a = (1.0 - level) / 2.0
    return np.quantile(samples, [a, 1.0 - a], axis=axis)


@jax.jit
def _query_means(weights, aps):
    return jnp.tensordot(aps, weights, axes=([-1], [1]))  # [..., B]


def resample_weights(num_queries: int, num_replicates: int, seed: int = 0) -> np.ndarray:
    """Returns [B, Q] float32 bootstrap weights: how often each query is drawn, divided by Q.

    The draws are numpy's (seeded, a few milliseconds); a replicate's mean is then one row of a
    matrix product, so all B replicates are one small jitted contraction that compiles in
    milliseconds (drawing the indices with `jax.random` cost ~0.8 s of compilation).
    """
    q, b = int(num_queries), int(num_replicates)
    idx = np.random.default_rng(seed).integers(0, q, (b, q))
    counts = np.bincount((idx + q * np.arange(b)[:, None]).ravel(), minlength=b * q)
    return (counts.reshape(b, q) / q).astype(np.float32)


def query_bootstrap(aps, num_replicates: int = 1000, seed: int = 0) -> np.ndarray:
    """Returns bootstrap replicates of mean AP over resampled queries.

    Args:
      aps: [Q] or [G, Q] per-query AP (one row per gallery size; all rows share the resampled
        query sets, so a band over sizes is coherent).
      num_replicates: B.
      seed: seed of the resampling.

    Returns:
      [B] or [G, B] float64 replicates of mAP.
    """
    aps = jnp.asarray(aps, jnp.float32)
    weights = resample_weights(aps.shape[-1], num_replicates, seed)
    out = _query_means(jnp.asarray(weights), aps)
    return np.asarray(jax.device_get(out), np.float64)


# --- the estimator as a pure function of one sample ------------------------------------------


@functools.cache
def hardness_fn(name: str, min_count: int = 5) -> Callable | None:
    """Returns (tail [Q, L], pos, counts, mask [Q, P], S, q') -> (atoms [Q, P, A], w [Q, A]).

    The atoms and weights are the estimator's hardness posterior as the law averages over it
    (`estimators.Hardness.atoms`); point estimators have one atom of weight 1.

    `tail` holds the top L (resampled) scores of each query and q' puts the threshold where the
    estimator puts it on all its kept scores (see `core`).
    None when the estimator has no JAX form here (the nested bootstrap is then skipped).
    Cached, so that the jitted bootstrap compiles once per estimator.
    """

    def one_atom(x):
        return x[:, :, None], jnp.ones((x.shape[0], 1), x.dtype)

    if name == "count":
        return lambda tail, pos, counts, mask, s, tq: one_atom(jnp.where(mask, counts / s, 0.0))
    if name == "homogeneous":

        def homogeneous(tail, pos, counts, mask, s, tq):
            k = jnp.sum(jnp.where(mask, counts, 0.0), axis=1, keepdims=True)
            n = jnp.maximum(jnp.sum(mask, axis=1, keepdims=True), 1).astype(counts.dtype)
            return one_atom(jnp.where(mask, k / (n * s), 0.0))

        return homogeneous
    if name not in ("evt", "evt_averaged"):
        return None
    from tailaware.tail import (
        evt as hardness,  # the tail-aware core (imported lazily, like estimators)
    )

    # hardness.evt / evt_averaged call `estimate` with these tail models; a module-level
    # ESTIMATOR_METHODS there, when present, is the source of truth.
    methods = getattr(hardness, "ESTIMATOR_METHODS", {"evt": "mle", "evt_averaged": "mean"})
    method = methods[name]

    def evt(tail, pos, counts, mask, s, threshold_quantile):
        pos_nan = jnp.where(mask, pos, jnp.nan)
        if method == "mean":
            log_x, w = hardness.posterior(pos_nan, tail, s, threshold_quantile)
        else:
            log_x = hardness.log_tail_prob(pos_nan, tail, s, threshold_quantile, method)[..., None]
            w = jnp.ones((tail.shape[0], 1), tail.dtype)
        u, _, ex_mask = hardness.excesses(tail, threshold_quantile)
        fitted = jnp.any(ex_mask, axis=1)
        tail_priced = mask & (counts < min_count) & (pos >= u[:, None]) & fitted[:, None]
        x = jnp.where(tail_priced[..., None], jnp.exp(log_x), (counts / s)[..., None])
        return jnp.where(mask[..., None], x, 0.0), w

    return evt


class Core(NamedTuple):
    """The estimator's inputs at a fixed shape, shared by every (sub-)sample of one study.

    Attributes:
      tail: [Q, L] top stored scores, -inf padded past each sample's own L_s (see `core`).
      pos, counts, fixed: [Q, P] float32 (0 at padding); mask [Q, P].
      s: S.
      threshold_quantile: q' (static): the (k + 1)-th of L_s kept scores is the threshold the
        estimator puts at its q-quantile of min(M, top_m).
    """

    tail: jax.Array
    pos: jax.Array
    counts: jax.Array
    mask: jax.Array
    fixed: jax.Array
    s: jax.Array
    threshold_quantile: float


def _n_excess(config, m: int) -> int:
    return int(np.floor((1.0 - float(config.evt.threshold_quantile)) * m + 0.5))


def resample_width(config, m: int) -> int:
    """Returns L, the stored scores the nested bootstrap resamples: the fit's excesses and a margin.

    A Poisson-resampled top k + 1 comes from the original top k + 1 + O(sqrt(k)) scores; 8 sd
    of margin makes running short a < 1e-12 event.
    """
    k = _n_excess(config, m)
    return int(min(m, k + 1 + int(np.ceil(8.0 * np.sqrt(k + 1))) + 16))


def _kept(scores: SampledScores, top_m: int) -> int:
    """Returns m, the real (finite) kept scores per query: a file may store more columns than S
    (-inf padded; every row holds min(S, stored) real scores)."""
    return min(scores.tail_scores.shape[1], int(scores.n_sample), top_m)


def core(scores: SampledScores, config, reference: SampledScores | None = None) -> Core:
    """Returns the fixed-shape inputs of `scores` for `hardness_fn`.

    The estimator sets its threshold at the (k + 1)-th largest of m = min(M, top_m) kept
    scores, k = round((1 - q) m). Here every sample of a study (the `reference` sample and its
    sub-samples) gets the same width L and the same q' = 1 - k_ref / L_ref: a sample with k_s
    excesses keeps its top L_s = round(k_s L / k_ref) scores (padded with -inf), which puts the
    threshold at its own (k_s + 1)-th score. One compiled function then serves them all.
    """
    ref = scores if reference is None else reference
    top_m = int(config.evt.top_m)
    m_ref = _kept(ref, top_m)
    width = resample_width(config, m_ref)
    k_ref = max(_n_excess(config, m_ref), 1)
    tq = 1.0 - k_ref / width
    m_s = _kept(scores, top_m)
    keep = min(int(round(_n_excess(config, m_s) * width / k_ref)), m_s, width)
    tail = np.full((scores.num_queries, width), -np.inf, np.float32)
    tail[:, :keep] = dequantize.spread_ties(scores.tail_scores[:, :m_s])[:, :keep]
    mask = scores.mask
    return Core(
        jnp.asarray(tail),
        jnp.asarray(np.where(mask, scores.pos_scores, 0.0), jnp.float32),
        jnp.asarray(np.where(mask, scores.pos_counts, 0), jnp.float32),
        jnp.asarray(mask),
        jnp.asarray(np.where(mask, scores.fixed_counts, 0), jnp.float32),
        jnp.float32(scores.n_sample),
        tq,
    )


@functools.partial(jax.jit, static_argnames=("k", "fn", "threshold_quantile"))
def _point(tail, pos, counts, mask, fixed, s, sizes, table, grouping, k, fn, threshold_quantile):
    atoms, w = fn(tail, pos, counts, mask, s, threshold_quantile)
    one = lambda n: buckets.expected_map(atoms, mask, n, k, fixed, w, counts, s, table, grouping)
    aps = jax.vmap(one)(sizes)
    return aps, jnp.sum(atoms * w[:, None, :], axis=2)


def core_predict(c: Core, estimator: str, config, sizes) -> tuple[np.ndarray, np.ndarray] | None:
    """Returns (per-query AP@k [G, Q] at `sizes`, hardness [Q, P]) through the JAX core, or None.

    Agrees with `estimators.get(estimator)` followed by the law (tests check it), without
    recompiling for every sub-sample width.
    """
    fn = hardness_fn(estimator, int(config.evt.min_count))
    if fn is None:
        return None
    sizes = jnp.asarray(np.asarray(sizes, np.float64), jnp.float32)
    k = int(config.k)
    table, grouping = law.rank_table(k), buckets.groups(c.mask)
    aps, x = _point(*c[:6], sizes, table, grouping, k=k, fn=fn, threshold_quantile=c[6])
    aps, x = jax.device_get((aps, x))
    return np.asarray(aps, np.float64), np.asarray(x, np.float64)


# CDF of Poisson(1) at 0..19; the mass beyond (< 1e-18) is folded into 19.
_POISSON1_CDF = np.cumsum(np.exp(-1.0) / np.cumprod(np.r_[1.0, np.arange(1.0, 20.0)]))[:-1]
# Below this mean, Poisson draws invert the CDF term by term; above it, a rounded normal (whose
# error in the bootstrap's variance is O(1 / mean)).
_SMALL_MEAN = 24


def poisson_one(key, shape):
    """Returns Poisson(1) draws by inverting the CDF (much faster on CPU than rejection)."""
    u = jax.random.uniform(key, shape)
    return jnp.searchsorted(jnp.asarray(_POISSON1_CDF, jnp.float32), u, side="right")


def poisson(key, lam):
    """Returns approximate Poisson(lam) draws (float32), exact in law for lam < 24."""
    k_u, k_z = jax.random.split(key)
    u = jax.random.uniform(k_u, lam.shape)
    small = lam < _SMALL_MEAN
    lam_s = jnp.where(small, lam, 0.0)

    def term(k, carry):
        n, pmf, cdf = carry
        pmf = pmf * lam_s / k
        return n + (u > cdf).astype(n.dtype), pmf, cdf + pmf

    pmf = jnp.exp(-lam_s)
    # 2 * 24 + 24 terms: the Poisson(24) mass beyond is < 1e-12.
    n, _, _ = jax.lax.fori_loop(1, 3 * _SMALL_MEAN, term, (jnp.zeros_like(lam), pmf, pmf))
    big = jnp.maximum(jnp.round(lam + jnp.sqrt(lam) * jax.random.normal(k_z, lam.shape)), 0.0)
    return jnp.where(small, n, big)


def _repeat(tail, w, cw):
    """Returns tail[i] repeated w[i] times, cut or padded (with the last copy) to len(tail).

    Slot p holds the item whose copies start at or before p: a scatter of each item's first
    slot and a running max, O(L) where `searchsorted` is O(L log L) and slower on CPU.
    Fewer than L copies pad with the last score; the threshold sits far above them (see
    `resample_width`), so they never reach the fit.
    """
    width = tail.shape[0]
    first = jnp.where(w > 0, cw - w, width)  # out of range -> dropped
    item = jnp.full((width,), -1, jnp.int32).at[first].max(jnp.arange(width, dtype=jnp.int32))
    item = jax.lax.cummax(item)
    return tail[jnp.clip(item, 0, width - 1)]


def resample(key, tail, pos, counts, mask):
    """Returns a Poisson-bootstrap (tail [Q, L], counts [Q, P]) of every query's sample.

    Args:
      key: PRNG key.
      tail: [Q, L] stored scores, descending (-inf padded when S < L).
      pos: [Q, P] positive scores (padding arbitrary).
      counts: [Q, P] float sampled distractors above each positive (>= the stored ones above).
      mask: [Q, P] real positives.
    """
    k_tail, k_rest = jax.random.split(key)
    finite = jnp.isfinite(tail)
    width = tail.shape[1]
    w = jnp.where(finite, poisson_one(k_tail, tail.shape), 0)
    cw = jnp.cumsum(w, axis=1)
    new_tail = jax.vmap(_repeat)(tail, w, cw)
    n_finite = jnp.sum(finite, axis=1)[:, None]
    new_tail = jnp.where(jnp.arange(width)[None, :] < n_finite, new_tail, -jnp.inf)

    # Stored scores above each positive [Q, P]: a binary search of the descending tail (a
    # comparison of every pair costs Q x P x L, too much for queries with hundreds of positives).
    n_above = jax.vmap(lambda t, p: jnp.searchsorted(-t, -p, side="left"))(tail, pos)
    w_above = jnp.where(
        n_above > 0, jnp.take_along_axis(cw, jnp.maximum(n_above - 1, 0), axis=1), 0
    )
    # Distractors above a positive but not among the L stored ones: nested Poisson draws.
    rest = jnp.where(mask, counts - n_above.astype(counts.dtype), 0.0)
    order = jnp.argsort(rest, axis=1)
    rest_sorted = jnp.take_along_axis(rest, order, axis=1)
    inc = jnp.diff(rest_sorted, axis=1, prepend=jnp.zeros_like(rest_sorted[:, :1]))
    drawn = jnp.cumsum(poisson(k_rest, inc), axis=1)
    rest_new = jnp.zeros_like(rest).at[jnp.arange(rest.shape[0])[:, None], order].set(drawn)
    new_counts = w_above.astype(counts.dtype) + rest_new
    return new_tail, jnp.where(mask, new_counts, 0.0)


@functools.partial(
    jax.jit, static_argnames=("k", "fn", "num_replicates", "batch_size", "threshold_quantile")
)
def _nested(
    key,
    tail,
    pos,
    counts,
    mask,
    fixed,
    s,
    sizes,
    table,
    grouping,
    k,
    fn,
    num_replicates,
    batch_size,
    threshold_quantile,
):
    q = tail.shape[0]

    def one(key):
        k_q, k_d = jax.random.split(key)
        t, c = resample(k_d, tail, pos, counts, mask)
        atoms, w = fn(t, pos, c, mask, s, threshold_quantile)
        one_size = lambda n: buckets.expected_map(
            atoms, mask, n, k, fixed, w, c, s, table, grouping
        )
        aps = jax.vmap(one_size)(sizes)
        idx = jax.random.randint(k_q, (q,), 0, q)
        return jnp.mean(aps, axis=1), jnp.mean(aps[:, idx], axis=1)

    keys = jax.random.split(key, num_replicates)
    return jax.lax.map(one, keys, batch_size=batch_size)


def nested_bootstrap(
    scores: SampledScores,
    estimator: str,
    config,
    sizes,
    num_replicates: int = 100,
    seed: int = 0,
    batch_size: int = 1,
) -> dict | None:
    """Returns nested-bootstrap replicates of mAP@k at each gallery size, or None.

    Every replicate resamples each query's distractor sample (Poisson weights), reruns the
    estimator and evaluates the law; it also draws a resample of queries.

    Args:
      scores: the sample.
      estimator: a name `hardness_fn` knows (None is returned for others).
      config: the job config (`k`, `evt`).
      sizes: [G] gallery sizes.
      num_replicates: B.
      seed: PRNG seed.
      batch_size: replicates vmapped together (memory ~ batch_size * G * Q * P * atoms floats).
        One at a time is the fastest as well as the leanest on 2 cores (1,200 queries, 26 sizes,
        20 atoms, 50 replicates: 22 s and 0.8 GB peak at 1, 22 s / 1.0 GB at 2, 27 s / 1.6 GB
        at 4, 27 s / 2.4 GB at 8; with 60 positive slots 147 s / 1.7 GB at 1, 170 s / 8.9 GB
        at 8); results do not depend on it.

    Returns:
      {"distractor": [G, B] mAP over all queries (distractor and fit noise only),
       "combined": [G, B] mAP over resampled queries (queries, distractors and fits)}.
    """
    fn = hardness_fn(estimator, int(config.evt.min_count))
    if fn is None:
        return None
    c = core(scores, config)
    dist, comb = _nested(
        jax.random.key(seed),
        *c[:6],
        jnp.asarray(np.asarray(sizes, np.float64), jnp.float32),
        law.rank_table(int(config.k)),
        buckets.groups(c.mask),
        k=int(config.k),
        fn=fn,
        num_replicates=int(num_replicates),
        batch_size=int(min(batch_size, num_replicates)),
        threshold_quantile=c.threshold_quantile,
    )
    dist, comb = jax.device_get((dist, comb))
    return {
        "distractor": np.asarray(dist, np.float64).T,
        "combined": np.asarray(comb, np.float64).T,
    }


def intervals(
    point: float,
    query_reps: np.ndarray,
    nested: dict | None,
    deviation=0.0,
    sd_distractor: float | None = None,
    prior_deviation=0.0,
) -> dict:
    """Returns the reported intervals at one gallery size.

    `ci90` / `ci95` is the sampling interval (`{tag}_sampling`) widened by the tail model's own
    error. The sampling interval is the nested one (queries, distractors and fits) when the
    nested replicates exist, else the query interval; the nested interval is the
    query-bootstrap percentile interval widened in quadrature by the distractor replicates'
    variance (the two sources are independent; the quadrature keeps the 1000 cheap query
    replicates' tails rather than the percentiles of ~200 nested ones). The model term: a
    normal error of standard deviation sd_model = hypot(`THRESHOLD_SD` x `deviation`, `PRIOR_SD`
    x `prior_deviation`), added in quadrature on each side. Every interval is cut to [0, 1].

    Args:
      point: the prediction.
      query_reps: [B] query-bootstrap replicates.
      nested: None or {"distractor": [B'], "combined": [B']} at this size.
      deviation: how far the prediction moves when the tail threshold does (`protocol.
        model_deviations`); 0 for estimators without a tail model.
      sd_distractor: the distractor replicates' sd where only it is known (a hardness artifact
        stores it, `tailaware.io.artifact`): it widens the query interval as the replicates would,
        and the distractor interval is normal. Ignored when `nested` is given.
      prior_deviation: how far the prediction moves under other priors on the tail shape
        (`protocol.prior_maps`); 0 without a tail posterior.
    """
    widen = nested is not None or sd_distractor is not None
    out = {"ci_method": "nested" if widen else "query"}
    sd_q = float(np.std(query_reps, ddof=1))
    out["sd_query"] = sd_q
    sd_d = 0.0
    if nested is not None:
        sd_d = float(np.std(nested["distractor"], ddof=1))
        out["sd_combined"] = float(np.std(nested["combined"], ddof=1))
    elif sd_distractor is not None:
        sd_d = float(sd_distractor)
    if widen:
        out["sd_distractor"] = sd_d
    sd_m = float(np.hypot(THRESHOLD_SD * float(deviation), PRIOR_SD * float(prior_deviation)))
    out["threshold_deviation"] = float(deviation)
    out["prior_deviation"] = float(prior_deviation)
    out["sd_model"] = sd_m
    for level in LEVELS:
        tag = f"ci{int(round(level * 100))}"
        lo, hi = percentile_interval(query_reps, level)
        out[f"{tag}_query"] = in_range(lo, hi)
        z = statistics.NormalDist().inv_cdf(0.5 + level / 2.0)
        if nested is not None:
            dlo, dhi = percentile_interval(nested["distractor"], level)
            center = float(np.mean(nested["distractor"]))
            out[f"{tag}_distractor"] = in_range(point + dlo - center, point + dhi - center)
        elif widen:
            out[f"{tag}_distractor"] = in_range(point - z * sd_d, point + z * sd_d)
        if widen:
            grow = np.sqrt(1.0 + (sd_d / max(sd_q, 1e-12)) ** 2)
            lo, hi = point - (point - lo) * grow, point + (hi - point) * grow
        out[f"{tag}_sampling"] = in_range(lo, hi)
        lo, hi = point - np.hypot(point - lo, z * sd_m), point + np.hypot(hi - point, z * sd_m)
        out[tag] = in_range(lo, hi)
    return out


def in_range(lo, hi, low=0.0) -> list[float]:
    """Returns [lo, hi] cut to [low, 1]: the range of mAP@k, or of a difference of two (low =
    -1); a normal widening can pass it."""
    return [float(max(lo, low)), float(min(hi, 1.0))]
