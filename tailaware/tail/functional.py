"""The estimators as pure JAX functions of one sample, for `jit` and `vmap` over (sub-)samples.

The nested bootstrap reruns the estimator on hundreds of resampled samples inside one compiled
program, and the budget check on nested sub-samples of different sizes; both need the estimator
as a traced function of fixed-shape arrays rather than `estimators.get(name)` on a file.
`hardness_fn(name, settings)` is that function; it calls the same tail model as the estimate
(`evt.posterior`, `evt.log_tail_prob`) and prices positives by the same rule (`evt.tail_priced`).

`Core` holds one sample's inputs at the width every sample of a study shares (`core`), and
`core_predict` evaluates the law on it.

Shapes: Q queries, P positives (padded), L stored tail scores read, A atoms, G gallery sizes.
"""

import dataclasses
import functools
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from tailaware.core import buckets, law
from tailaware.io.scores import SampledScores
from tailaware.tail import dequantize, evt
from tailaware.tail.settings import TailSettings


@functools.cache
def hardness_fn(name: str, settings: TailSettings) -> Callable | None:
    """Returns (tail [Q, L], pos, counts, mask [Q, P], S, q') -> (atoms [Q, P, A], w [Q, A]).

    The atoms and weights are the estimator's hardness posterior as the law averages over it
    (`Hardness.atoms`); point estimators have one atom of weight 1.

    `tail` holds the top L (resampled) scores of each query and q' puts the threshold where the
    estimator puts it on all its kept scores (see `core`). None when the estimator has no JAX
    form here (the nested bootstrap is then skipped). Cached, so that the jitted bootstrap
    compiles once per estimator and settings.
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
    method = evt.ESTIMATOR_METHODS.get(name)
    if method is None:
        return None

    share = evt.averaged_share(settings)

    def tail_aware(tail, pos, counts, mask, s, threshold_quantile):
        # The threshold at q' of this (sub-)sample's kept scores; the averaged posterior keeps
        # the same share of its excesses as on the full sample.
        averaged = 1.0 - share * (1.0 - threshold_quantile)
        at_q = dataclasses.replace(
            settings, threshold_quantile=threshold_quantile, averaged_quantile=averaged
        )
        pos_nan = jnp.where(mask, pos, jnp.nan)
        if method == "mean":
            log_x, w = evt.posterior(pos_nan, tail, s, at_q)
        else:
            log_x = evt.log_tail_prob(pos_nan, tail, s, at_q, method)[..., None]
            w = jnp.ones((tail.shape[0], 1), tail.dtype)
        u, _, ex_mask = evt.excesses(tail, threshold_quantile)
        priced = evt.tail_priced(mask, pos, counts, u, jnp.any(ex_mask, axis=1), settings.min_count)
        x = jnp.where(priced[..., None], jnp.exp(log_x), (counts / s)[..., None])
        return jnp.where(mask[..., None], x, 0.0), w

    return tail_aware


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


def resample_width(settings: TailSettings, m: int) -> int:
    """Returns L, the stored scores a resampled fit reads: the fit's excesses and a margin.

    A Poisson-resampled top k + 1 comes from the original top k + 1 + O(sqrt(k)) scores; 8 sd
    of margin makes running short a < 1e-12 event.
    """
    k = evt.excess_count(m, settings.threshold_quantile)
    return int(min(m, k + 1 + int(np.ceil(8.0 * np.sqrt(k + 1))) + 16))


def _kept(scores: SampledScores, top_m: int) -> int:
    """Returns m, the real (finite) kept scores per query: a file may store more columns than S
    (-inf padded; every row holds min(S, stored) real scores)."""
    return min(scores.tail_scores.shape[1], int(scores.n_sample), top_m)


def core(
    scores: SampledScores, settings: TailSettings, reference: SampledScores | None = None
) -> Core:
    """Returns the fixed-shape inputs of `scores` for `hardness_fn`.

    The estimator sets its threshold at the (k + 1)-th largest of m = min(M, top_m) kept
    scores, k = round((1 - q) m). Here every sample of a study (the `reference` sample and its
    sub-samples) gets the same width L and the same q' = 1 - k_ref / L_ref: a sample with k_s
    excesses keeps its top L_s = round(k_s L / k_ref) scores (padded with -inf), which puts the
    threshold at its own (k_s + 1)-th score. One compiled function then serves them all.
    """
    ref = scores if reference is None else reference
    top_m = int(settings.top_m)
    m_ref = _kept(ref, top_m)
    width = resample_width(settings, m_ref)
    k_ref = max(evt.excess_count(m_ref, settings.threshold_quantile), 1)
    tq = 1.0 - k_ref / width
    m_s = _kept(scores, top_m)
    keep = min(
        int(round(evt.excess_count(m_s, settings.threshold_quantile) * width / k_ref)), m_s, width
    )
    tail = np.full((scores.num_queries, width), -np.inf, np.float32)
    tail[:, :keep] = dequantize.spread_ties(scores.tail_scores[:, :m_s], settings.tie_share)[
        :, :keep
    ]
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


def core_predict(
    c: Core, estimator: str, settings: TailSettings, k: int, sizes
) -> tuple[np.ndarray, np.ndarray] | None:
    """Returns (per-query AP@k [G, Q] at `sizes`, hardness [Q, P]) through the JAX core, or None.

    Agrees with `estimators.get(estimator)` followed by the law (tests check it), without
    recompiling for every sub-sample width.
    """
    fn = hardness_fn(estimator, settings)
    if fn is None:
        return None
    sizes = jnp.asarray(np.asarray(sizes, np.float64), jnp.float32)
    k = int(k)
    table, grouping = law.rank_table(k), buckets.groups(c.mask)
    aps, x = _point(*c[:6], sizes, table, grouping, k=k, fn=fn, threshold_quantile=c[6])
    aps, x = jax.device_get((aps, x))
    return np.asarray(aps, np.float64), np.asarray(x, np.float64)
