"""The tail-aware (EVT) hardness estimator: per-query GPD tails priced beyond the sample.

Paper, Appendix B. For each query keep the top M sampled similarities, put the threshold u at
their q-quantile, fit a GPD (xi <= 0) to the excesses over u and price a positive at score s by

    x(s) = (n_u / S) * P(Y > s - u),                                        (B.1)

n_u the number of kept scores above u and S the full sample size. A positive that at least
`min_count` sampled distractors beat keeps its count K / S; the others get (B.1).

Two ways to turn the fit into P(Y > y):

* `evt` plugs in the maximum-likelihood (xi, sigma) (the paper). Beyond the fitted endpoint
  u + sigma / -xi the tail probability is exactly 0, which in the paper happens for 20-30% of
  fits and makes a positive "immune" at every gallery size.
* `evt_averaged` (the default) keeps the whole posterior over the tail instead of one fit:
  weights over a grid of xi in [-0.95, `TailSettings.xi_max`] from the likelihood with the scale
  integrated out (`posterior`), one hardness atom per xi, under a prior over xi fitted to the
  whole benchmark (empirical Bayes, `empirical_bayes_prior`). The law's prediction averages
  E[AP] over the atoms (`law.expected_map`), the posterior predictive of the metric, rather than
  plugging in one hardness: AP is far from linear in x across the decades a tail extrapolation
  spans, so the plug-in of even an unbiased x is biased. `Hardness.x` reports the posterior
  mean. The tail is conditioned on the scores' bound (`TailSettings.score_bound`), so no
  positive below it is priced a hard 0. Its threshold is at `averaged_quantile` unless a GPD
  does not fit the excesses there (an Anderson-Darling test, `select_threshold`): a
  near-duplicate cluster far above the bulk of the excesses, for one, makes the fitted tail look
  long and over-prices every positive; the threshold then moves up to keep half or a quarter of
  the excesses. docs/validation.md compares the two.

`estimate(..., reruns=True)` also reruns either with half and twice the excesses: how far the
prediction moves with the threshold is the tail model's own error, which the reported intervals
add to the sampling noise (`tailaware.protocol.intervals`). The averaged estimator is
re-weighted under a flatter and a steeper prior on xi as well (`TailSettings.prior_spread`):
what the data leave to the prior.

Shapes: Q queries, M kept scores per query, P positives per query (padded), W the static width
of the excess arrays, X the size of the xi grid. Tail probabilities are computed in log space.

The two are tail models (`tailaware.tail.models.TailModel`, in `tail/plug_in.py` and
`tail/averaged.py`); this module holds what they share: the excesses, threshold selection, the
posterior, pricing, the fit diagnostics, `tail_hardness` and the estimate.

Gradients: `log_tail_prob` is differentiable in the positive and tail scores. For the plug-in
the fitted (xi, sigma) carry implicit-function-theorem derivatives (see `gpd.fit`); for the
averaged model the per-xi scales are held fixed (`stop_gradient`) while the posterior weights
are differentiated through the log-likelihood, which is the exact derivative of the profile by
the envelope theorem, and through the Laplace width at those fixed scales (its dependence on the
scale is left out). The threshold's position (which order statistic is u, and its selection)
and the count switch are discrete and carry no gradient.
"""

import functools
import math
from collections.abc import Sequence
from types import ModuleType
from typing import TypeVar, cast

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike, DTypeLike

from tailaware.core.results import Hardness, TailFit
from tailaware.io.scores import SampledScores
from tailaware.tail import functional, gpd
from tailaware.tail.functional import ROUND_SLACK, Core, excess_count
from tailaware.tail.models import Excesses, TailAtoms, TailEstimate, TailModel
from tailaware.tail.settings import TailSettings, averaged_share

# Excesses per fit are at least this many when the sample allows (tiny samples, S * (1 - q)
# small, would otherwise fit two or three points).
MIN_EXCESSES = 10
# Grid over xi in [XI_MIN, 0] for the averaged estimator (see `posterior`): nearly the whole range
# where the GPD likelihood is bounded (xi > -1), short tails such as a uniform-like edge included.
# A grid stopping at the regular range's -1/2 over-prices the positives of every shorter tail by
# decades when the top M reach deep into a small sample; the price is some under-pricing of deep
# positives of truly short tails (docs/validation.md, "Other tail shapes").
XI_GRID_SIZE = 20
XI_MIN = -0.95
# Threshold selection (`select_threshold`): where the excesses over the q-quantile fail a
# goodness-of-fit test (`TailSettings.ad_critical`), the threshold moves up to keep these shares
# of them.
GOF_FACTORS = (1.0, 0.5, 0.25)
# Threshold stability: refit with the excess count scaled by these factors (the diagnostics' xi
# refits, and `estimate`'s reruns of the whole estimator).
STABILITY_FACTORS = (0.5, 2.0)

# A numpy or a JAX array (`tail_priced`, `priced_atoms`).
_Arr = TypeVar("_Arr", np.ndarray, jax.Array)


def _n_excesses(
    n_finite: jax.Array, threshold_quantile: float, factor: float | jax.Array
) -> jax.Array:
    """Returns the number of excesses k for `n_finite` kept scores (int array)."""
    target = (1.0 - threshold_quantile) * factor * n_finite.astype(jnp.float32)
    k = jnp.floor(target + 0.5 + ROUND_SLACK).astype(jnp.int32)
    return jnp.clip(k, jnp.minimum(MIN_EXCESSES, n_finite - 1), n_finite - 1)


def excess_width(m: int, threshold_quantile: float, factor: float) -> int:
    """Returns the static width W of the excess arrays for M kept scores."""
    k = excess_count(m, threshold_quantile, factor)
    return max(1, min(m - 1, max(k, MIN_EXCESSES)))


def excesses(
    tail_scores: jax.Array,
    threshold_quantile: float = 0.95,
    factor: float | jax.Array = 1.0,
    width: int | None = None,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Returns the threshold and the excesses over it, per query.

    The threshold u is the (k + 1)-th largest kept score, k = round((1 - q) * factor * m_q) with
    m_q the query's finite kept scores (at least `MIN_EXCESSES` when there are enough); the
    excesses are the kept scores strictly above u, minus u.

    Args:
      tail_scores: [Q, M] descending, -inf padded.
      threshold_quantile: q.
      factor: scales the number of excesses (threshold-stability refits); may be traced when
        `width` is given.
      width: W, the static width of the excess arrays; by default the smallest that holds them
        (`excess_width`). A wider W pads with masked-out entries.

    Returns:
      (u [Q], y [Q, W], mask [Q, W]).
    """
    m = tail_scores.shape[1]
    # A traced `factor` comes with `width`: the default width reads a static one.
    width = width or excess_width(m, threshold_quantile, cast(float, factor))

    def one(tail: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        finite = jnp.isfinite(tail)
        n_finite = jnp.sum(finite).astype(jnp.int32)
        tail = jnp.where(finite, tail, 0.0)
        k = _n_excesses(n_finite, threshold_quantile, factor)
        u = tail[jnp.maximum(k, 0)]
        y = tail[:width] - u
        mask = (jnp.arange(width, dtype=jnp.int32) < k) & (y > 0) & finite[:width]
        return u, jnp.where(mask, y, 0.0), mask

    return jax.vmap(one)(tail_scores)


def _log_rate(n_u: jax.Array, n_sample: jax.Array) -> jax.Array:
    """Returns log(n_u / S), -inf at n_u = 0 (double-where guarded)."""
    pos = n_u > 0
    return jnp.where(pos, jnp.log(jnp.where(pos, n_u, 1.0) / n_sample), -jnp.inf)


def xi_grid(
    tilt: float, dtype: DTypeLike = jnp.float32, xi_max: float = 0.0
) -> tuple[jax.Array, jax.Array]:
    """Returns the [X] grid of shapes in [XI_MIN, xi_max] and its prior weights (trapezoid rule
    times the prior density exp(tilt xi), `TailSettings.xi_tilt`).

    The grid is XI_GRID_SIZE points from XI_MIN to 0 (the bounded tails), continued above 0 at
    the same spacing up to `xi_max` (`TailSettings.xi_max`: the heavy tails).
    """
    xis = jnp.linspace(XI_MIN, 0.0, XI_GRID_SIZE, dtype=dtype)
    step = -XI_MIN / (XI_GRID_SIZE - 1)
    heavy = step * np.arange(1, int(np.floor(xi_max / step + 1e-9)) + 1)
    xis = jnp.concatenate([xis, jnp.asarray(heavy, dtype)])
    w = jnp.full((xis.shape[0],), 1.0, dtype).at[0].set(0.5).at[-1].set(0.5)
    w = w * jnp.exp(tilt * xis)
    return xis, w / jnp.sum(w)


def _profile(y: jax.Array, mask: jax.Array, xis: jax.Array, n_bounded: int) -> gpd.Profile:
    """Returns the profile (`gpd.Profile` of [Q, X] arrays) at every shape of the grid: the
    bounded shapes (the first `n_bounded`, xi <= 0) by `gpd.profile_in_xi`, the heavy ones by
    `gpd.profile_in_xi_heavy`."""
    fit = jax.vmap(gpd.profile_in_xi, in_axes=(0, 0, None))
    profile = fit(y, mask, xis[:n_bounded])
    if xis.shape[0] > n_bounded:
        heavy = jax.vmap(gpd.profile_in_xi_heavy, in_axes=(0, 0, None))(y, mask, xis[n_bounded:])
        profile = jax.tree.map(lambda a, b: jnp.concatenate([a, b], axis=1), profile, heavy)
    return profile


# The empirical-Bayes prior's candidates (`empirical_bayes_prior`): means across the grid's range
# and sds from a near point mass to nearly flat.
EB_MEANS = 51
EB_SDS = (0.02, 0.04, 0.07, 0.1, 0.15, 0.25, 0.4)


def _normal_on_grid(xis: jax.Array, mu: jax.Array, tau: jax.Array) -> jax.Array:
    """Returns log N(mu, tau^2) discretised on the shape grid `xis` (normalised over its last
    axis): one prior for scalar `mu`, `tau`; [M, T, X] for `xis` [1, 1, X], `mu` [M, 1, 1] and
    `tau` [1, T, 1]."""
    z = (xis - mu) / tau
    return jax.nn.log_softmax(-0.5 * z * z, axis=-1)


def empirical_bayes_prior(
    log_lik: jax.Array, fitted: jax.Array, xis: jax.Array, shift: float = 0.0
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Returns the log prior [X] over the shape grid that maximises the benchmark's marginal
    likelihood, its mean moved by `shift` (`TailSettings.eb_shift`), and its fitted (mean, sd).

    The prior is a discretised normal N(mu, tau^2) over the grid, mu <= 0 (cosine scores are
    bounded: a benchmark's typical limiting shape is; a query's posterior still reaches the
    heavy shapes above 0, where noise and the penultimate effect put some); (mu, tau) maximise
    sum_q log sum_i pi_i L_q(xi_i) over the queries with a fitted tail (`fitted` [Q]), L_q the
    scale-integrated likelihood of query q's excesses (`log_lik` [Q, X]): type-II maximum
    likelihood by a search over `EB_MEANS` means in [grid start, 0] and the sds `EB_SDS`
    (two parameters: a grid search is exact enough and cheap, [Q, X] sums per candidate). The
    prior returned is N(mu + shift, tau^2) on the grid: the shift carries the shape the excesses
    show at the threshold to the tail deeper in, where the positives beyond the sample are priced.
    """
    mus = jnp.linspace(xis[0], jnp.minimum(xis[-1], 0.0), EB_MEANS)
    taus = jnp.asarray(EB_SDS, xis.dtype)
    log_prior = _normal_on_grid(xis[None, None, :], mus[:, None, None], taus[None, :, None])
    # log sum_x prior(x) L_q(x) as a product of exponentials, each query's likelihood scaled by
    # its largest: one matmul instead of the [M, T, Q, X] logsumexp.
    top = jnp.max(log_lik, axis=-1)
    top = jnp.where(jnp.isfinite(top), top, 0.0)
    mixed = jnp.einsum("mtx,qx->mtq", jnp.exp(log_prior), jnp.exp(log_lik - top[:, None]))
    tiny = np.finfo(mixed.dtype).tiny
    marginal = jnp.log(jnp.maximum(mixed, tiny)) + top[None, None, :]
    total = jnp.sum(jnp.where(fitted[None, None, :], marginal, 0.0), axis=-1)  # [M, T]
    best = jnp.argmax(total)
    i, j = best // taus.shape[0], best % taus.shape[0]
    return _normal_on_grid(xis, mus[i] + shift, taus[j]), mus[i], taus[j]


def _pricing_inputs(
    pos_scores: jax.Array, u: jax.Array, mask: jax.Array, n_sample: ArrayLike
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Returns log(n_u / S) [Q], padding [Q, P] and s - u [Q, P] for excesses `mask` over u."""
    dtype = u.dtype
    log_rate = _log_rate(jnp.sum(mask, axis=1).astype(dtype), jnp.asarray(n_sample, dtype))
    pad = jnp.isnan(pos_scores)
    return log_rate, pad, jnp.where(pad, 0.0, pos_scores) - u[:, None]


def gpd_log_x(
    log_rate: jax.Array, u: jax.Array, xi: jax.Array, sigma: jax.Array, pos_scores: jax.Array
) -> jax.Array:
    """Returns log x = log_rate + log P(Y > s - u) [Q, P] (eq. B.1): positives of scores
    `pos_scores` [Q, P] priced by one GPD(xi, sigma) [Q] per query over its threshold u [Q] with
    exceedance rate exp(log_rate) [Q] = n_u / S; -inf beyond the endpoint."""
    excess = pos_scores - u[:, None]
    return log_rate[:, None] + gpd.log_survival(excess, xi[:, None], sigma[:, None])


def plug_in_log_x(
    pos_scores: jax.Array,
    u: jax.Array,
    mask: jax.Array,
    n_sample: jax.Array,
    xi: jax.Array,
    sigma: jax.Array,
) -> jax.Array:
    """Returns `gpd_log_x` of the excesses `mask` [Q, W] over u [Q]; -inf at padding (NaN)."""
    log_rate, pad, _ = _pricing_inputs(pos_scores, u, mask, n_sample)
    log_x = gpd_log_x(log_rate, u, xi, sigma, jnp.where(pad, u[:, None], pos_scores))
    return jnp.where(pad, -jnp.inf, log_x)


def _pad_columns(a: jax.Array, width: int) -> jax.Array:
    """Returns [Q, W] `a` [Q, W'] zero-padded on the right to `width` columns (masked-out slots)."""
    return jnp.pad(a, ((0, 0), (0, width - a.shape[1])))


def select_threshold(
    tail_scores: jax.Array,
    threshold_quantile: float,
    ad_critical: float,
    factor: float | jax.Array = 1.0,
    width: int | None = None,
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """Returns the excesses over each query's selected threshold (see `posterior`).

    Candidates are the thresholds that keep `GOF_FACTORS` times the q-quantile's excesses (times
    `factor`, in W = `width` slots, as in `excesses`); each is tested with the Anderson-Darling
    statistic of its excesses against the GPD fitted by maximum likelihood on `gpd.fit`'s search
    grid (`gpd.grid_fit`, closed form). The lowest candidate with A^2 <= `ad_critical` is
    selected; where every candidate fails, the best-fitting one.

    Returns:
      (u [Q], y [Q, W], mask [Q, W], A^2 [F, Q]): as `excesses` at the selected thresholds
      (W of the q-quantile's), and every candidate's statistic (inf without excesses).
    """
    # A traced `factor` comes with `width`: the default width reads a static one.
    width = width or excess_width(tail_scores.shape[1], threshold_quantile, cast(float, factor))
    parts = [excesses(tail_scores, threshold_quantile, factor * f, width) for f in GOF_FACTORS]
    u = jnp.stack([p[0] for p in parts])
    y = jnp.stack([_pad_columns(p[1], width) for p in parts])
    mask = jnp.stack([_pad_columns(p[2], width) for p in parts])
    fit = jax.vmap(jax.vmap(gpd.grid_fit))
    ad = jax.vmap(jax.vmap(gpd.anderson_darling))(y, mask, *fit(y, mask))
    # A candidate without excesses (ties at the top) is never selected over one with some.
    ad = jnp.where(jnp.any(mask, axis=2), ad, jnp.inf)
    passed = ad <= ad_critical
    choice = jnp.where(jnp.any(passed, axis=0), jnp.argmax(passed, axis=0), jnp.argmin(ad, axis=0))

    def pick(a: jax.Array) -> jax.Array:
        return jnp.take_along_axis(a, choice.reshape((1, -1) + (1,) * (a.ndim - 2)), 0)[0]

    return pick(u), pick(y), pick(mask), ad


def posterior_atoms(
    pos_scores: jax.Array,
    tail_scores: jax.Array,
    n_sample: jax.Array,
    settings: TailSettings,
    *,
    factor: float | jax.Array = 1.0,
    width: int | None = None,
    eb_prior: jax.Array | None = None,
) -> TailAtoms:
    """Returns `posterior`'s atoms and weights as a `TailAtoms`, with whether every profile
    solve converged [Q], the selected excess count [Q], the A^2 statistics [F, Q] and the
    empirical-Bayes prior's (mean, sd) (NaN for the tilt prior).

    `factor` and `width` set the default threshold's excess count as in `excesses`; the
    posterior keeps `averaged_share(settings)` of them. `eb_prior`: [2] an empirical-Bayes prior's
    fitted (mean, sd) to use instead of fitting one (shifted by `eb_shift` all the same).
    """
    dtype = tail_scores.dtype
    xis, prior = xi_grid(settings.xi_tilt, dtype, settings.xi_max)
    q, critical = settings.threshold_quantile, settings.ad_critical
    factor = factor * averaged_share(settings)
    u, y, mask, ad = select_threshold(tail_scores, q, critical, factor, width)
    log_rate, pad, excess = _pricing_inputs(pos_scores, u, mask, n_sample)
    sigma, ll, converged = _profile(y, mask, xis, XI_GRID_SIZE)
    info = jax.vmap(gpd.scale_information, in_axes=(0, 0, None, 0))(y, mask, xis, sigma)
    tiny = jnp.finfo(dtype).tiny  # type: ignore[no-untyped-call]  # ml_dtypes' finfo: untyped
    log_width = -0.5 * jnp.log(jnp.maximum(info, tiny))
    log_prior, eb = jnp.log(prior), jnp.full((2,), jnp.nan, dtype)
    if settings.prior == "empirical_bayes" and eb_prior is not None:
        log_prior = _normal_on_grid(xis, eb_prior[0] + settings.eb_shift, eb_prior[1])
        eb = eb_prior.astype(dtype)
    elif settings.prior == "empirical_bayes":
        log_prior, mu, tau = empirical_bayes_prior(
            log_width + ll, jnp.any(mask, axis=1), xis, settings.eb_shift
        )
        eb = jnp.stack([mu, tau]).astype(dtype)
    log_w = log_prior[None, :] + log_width + ll
    weights = jax.nn.softmax(log_w, axis=1)
    if math.isinf(settings.score_bound):
        log_s = gpd.log_survival(excess[:, :, None], xis[None, None, :], sigma[:, None, :])
    else:  # the tail conditioned on the scores' bound
        room = (settings.score_bound - u)[:, None, None]
        log_s = gpd.log_survival_below(
            excess[:, :, None], room, xis[None, None, :], sigma[:, None, :]
        )
    log_x = jnp.where(pad[:, :, None], -jnp.inf, log_rate[:, None, None] + log_s)
    n_selected = jnp.sum(mask, axis=1).astype(dtype)
    return TailAtoms(log_x, weights, jnp.all(converged, axis=1), n_selected, ad, eb)


def posterior(
    pos_scores: jax.Array, tail_scores: jax.Array, n_sample: jax.Array, settings: TailSettings
) -> tuple[jax.Array, jax.Array]:
    """Returns the tail posterior over the xi grid: log hardness atoms and their weights.

    Per query, the weights are the marginal likelihood of xi with the scale integrated out
    (prior 1 / sigma) by Laplace's method, prior(xi) L_p(xi) / sqrt(J(xi)), with prior(xi)
    proportional to exp(xi_tilt xi) (`TailSettings.xi_tilt`; or the benchmark's empirical-Bayes
    normal, its mean moved by `TailSettings.eb_shift`): the profile likelihood L_p(xi) at the
    profiled scale sigma(xi), times the width of the likelihood in log sigma, J its observed
    information there (`gpd.scale_information`). The profile alone favours short tails (it ignores
    that sigma is fitted); integrating the scale out removes that bias. The observed information
    is finite at the interior optimum for every xi > -1, so the grid spans the non-regular range
    -1 < xi <= -1/2 too (`XI_MIN`), where the expected information n / (1 + 2 xi) does not exist.
    Atom i prices a positive at log((n_u / S) P(Y > s - u | xi_i, sigma(xi_i), Y <= b - u)), the
    GPD conditioned on the scores' bound b (`TailSettings.score_bound`; cosine similarities: 1;
    `gpd.log_survival_below`). The xi = 0 atom keeps the tail open up to b, so the mixture is a
    hard 0 only at or above b.

    The threshold is the q-quantile of the kept scores unless a GPD does not fit the excesses
    there (Anderson-Darling A^2 above `ad_critical`, e.g. a near-duplicate cluster above a bulk):
    then the lowest of the higher thresholds of `GOF_FACTORS` whose fit passes, or the best
    fitting one. A candidate keeps at least `MIN_EXCESSES` excesses where the sample allows, more
    than `min_count`, so the positives priced by the tail are those of the default threshold.

    Args:
      pos_scores: [Q, P] positive scores, NaN padded.
      tail_scores: [Q, M] kept sampled scores, descending, -inf padded.
      n_sample: S.
      settings: q (`threshold_quantile`), the prior's lean and the goodness-of-fit test's level.

    Returns:
      (log_x [Q, P, X], -inf at padding; weights [Q, X]).
    """
    return posterior_atoms(pos_scores, tail_scores, n_sample, settings)[:2]


def log_mean(log_atoms: jax.Array, weights: jax.Array) -> jax.Array:
    """Returns log of the posterior-mean hardness [Q, P] from atoms [Q, P, X], weights [Q, X]."""
    return jax.nn.logsumexp(log_atoms, axis=2, b=weights[:, None, :])


@functools.partial(jax.jit, static_argnames=("settings", "model"))
def log_tail_prob(
    pos_scores: jax.Array,
    tail_scores: jax.Array,
    n_sample: jax.Array,
    settings: TailSettings,
    model: TailModel,
) -> jax.Array:
    """Returns log x = log((n_u / S) P(Y > s - u)), the tail model's hardness (eq. B.1).

    Pure JAX, differentiable in `pos_scores` and `tail_scores` (see the module docstring for the
    gradient treatment). Positives at or below u get log(n_u / S); padding (NaN) gets -inf.

    Args:
      pos_scores: [Q, P] positive scores, NaN padded.
      tail_scores: [Q, M] kept sampled scores, descending, -inf padded.
      n_sample: S, the full sample size.
      settings: q and, for the averaged model, the posterior's prior and threshold test.
      model: the tail model (`estimators.tail_model`): its `price` of its atoms, e.g. the
        plug-in's one fit (`evt`) or the posterior mean of the tail probability over the atoms
        of `posterior` (`evt_averaged`'s reported x).

    Returns:
      [Q, P] log hardness; -inf beyond a plug-in endpoint or at padding.
    """
    mask = ~jnp.isnan(pos_scores)
    counts = jnp.zeros_like(pos_scores)  # which positives the tail prices plays no part here
    c = Core(
        tail=tail_scores,
        pos=pos_scores,
        counts=counts,
        mask=mask,
        fixed=counts,
        s=n_sample,
        threshold_quantile=settings.threshold_quantile,
    )
    est = tail_hardness(c, settings, model)
    return model.price(est.atoms.log_atoms, est.atoms.weights)


def stability_fits(
    tail_scores: jax.Array, threshold_quantile: float, stack_main: bool = True
) -> tuple[
    jax.Array,
    gpd.GPDFit,
    list[tuple[jax.Array, jax.Array, jax.Array]],
    list[gpd.GPDFit],
]:
    """Returns the main fit's threshold u [Q], its fit, and per `STABILITY_FACTORS` the excesses
    (u, y, mask) and the refit.

    The two threshold-stability refits run as one vmapped fit over [2 Q] problems padded to one
    width; with `stack_main` the main fit joins them ([3 Q] problems): one fitter in the
    compiled program instead of two. Padding with masked-out entries changes a fit only by float
    rounding, but that can tip a flat profile, so where the plug-in fit prices positives (`evt`)
    the main fit stays unpadded, bit for bit the one `tail_hardness` makes.
    """
    u, y, mask = excesses(tail_scores, threshold_quantile)
    others = [excesses(tail_scores, threshold_quantile, f) for f in STABILITY_FACTORS]
    parts = [p[1:] for p in others]
    if stack_main:
        parts = [(y, mask), *parts]
    width = max(y_k.shape[1] for y_k, _ in parts)
    every = jax.vmap(gpd.fit)(
        jnp.concatenate([_pad_columns(y_k, width) for y_k, _ in parts]),
        jnp.concatenate([_pad_columns(m_k, width) for _, m_k in parts]),
    )
    q = tail_scores.shape[0]
    fits = [jax.tree.map(lambda a, i=i: a[i * q : (i + 1) * q], every) for i in range(len(parts))]
    fit, *refits = fits if stack_main else [jax.vmap(gpd.fit)(y, mask), *fits]
    return u, fit, others, refits


def tail_fit(u: jax.Array, fit: gpd.GPDFit, refits: Sequence[gpd.GPDFit]) -> TailFit[jax.Array]:
    """Returns the fit fields of `TailFit` from `stability_fits`' outputs."""
    se = gpd.xi_standard_error(fit.xi, fit.n)
    stable = jnp.ones_like(fit.converged)
    for refit in refits:
        se_k = gpd.xi_standard_error(refit.xi, refit.n)
        stable = stable & (jnp.abs(refit.xi - fit.xi) <= 2.0 * jnp.maximum(se, se_k))
    xi_half, xi_double = (refit.xi for refit in refits)
    return TailFit(
        u=u,
        n_exceed=fit.n,
        xi=fit.xi,
        sigma=fit.sigma,
        endpoint=u + fit.endpoint,
        loglik=fit.loglik,
        at_xi0=fit.at_xi0,
        at_xi_minus1=fit.at_xi_minus1,
        converged=fit.converged,
        xi_half=xi_half,
        xi_double=xi_double,
        xi_se=se,
        stable=stable,
    )


@functools.partial(jax.jit, static_argnames=("threshold_quantile",))
def _diagnostics_jit(tail_scores: jax.Array, threshold_quantile: float) -> TailFit[jax.Array]:
    u, fit, _, refits = stability_fits(tail_scores, threshold_quantile)
    return tail_fit(u, fit, refits)


def diagnostics(tail_scores: ArrayLike, threshold_quantile: float = 0.95) -> TailFit[np.ndarray]:
    """Returns the per-query GPD fits of `tail_scores` [Q, M] at the `threshold_quantile` with
    their threshold stability: a `TailFit` of numpy arrays whose estimate and posterior fields
    are None."""
    fit = _diagnostics_jit(jnp.asarray(tail_scores), threshold_quantile=threshold_quantile)
    host: TailFit[np.ndarray] = jax.tree.map(np.asarray, jax.device_get(fit))
    return host


def tail_priced(mask: _Arr, pos: _Arr, counts: _Arr, u: _Arr, fitted: _Arr, min_count: int) -> _Arr:
    """Returns [Q, P] whether the tail prices each positive; counts price the others.

    The tail prices a real positive (`mask` [Q, P]) when fewer than `min_count` sampled
    distractors beat it (`counts` [Q, P]), its score `pos` [Q, P] lies at or above its query's
    threshold u [Q], and the query's tail was `fitted` [Q] (some stored score lies above u).
    numpy and JAX arrays alike.
    """
    priced: _Arr = mask & (counts < min_count) & (pos >= u[:, None]) & fitted[:, None]
    return priced


def priced_atoms(
    log_atoms: _Arr,
    priced: _Arr,
    counts: _Arr,
    n_sample: ArrayLike,
    mask: _Arr,
    xp: ModuleType = jnp,
) -> _Arr:
    """Returns the hardness atoms [Q, P, A]: the tail's exp(`log_atoms`) where it prices a
    positive (`priced` [Q, P]), the count K / S elsewhere, 0 at padding. `xp`: jax.numpy when
    traced, numpy for the host's float64 atoms."""
    x_count = xp.where(mask, counts / n_sample, 0.0)[..., None]
    atoms: _Arr = xp.where(priced[..., None], xp.exp(log_atoms), x_count)
    return atoms


def tail_hardness(
    c: Core,
    settings: TailSettings,
    model: TailModel,
    *,
    factor: float | jax.Array = 1.0,
    width: int | None = None,
) -> TailEstimate:
    """Returns the tail-aware estimate of one sample, traced: the one definition that the
    estimate (with its reruns), the nested bootstrap and the budget check all run.

    Args:
      c: the sample's inputs (`functional.Core`): positive scores, sampled counts above them and
        real positives [Q, P]; kept sampled scores [Q, M], descending, -inf padded; S.
      settings: the tail settings at `c`'s threshold quantile (`functional.tail_settings`).
      model: the tail model, whose `fit` prices the tail.
      factor, width: scale the default threshold's excess count, in W = `width` slots
        (`excesses`): the threshold reruns.
    """
    default = Excesses(*excesses(c.tail, settings.threshold_quantile, factor, width))
    fitted = jnp.any(default.mask, axis=1)
    priced = tail_priced(c.mask, c.pos, c.counts, default.u, fitted, settings.min_count)
    atoms = model.fit(c, settings, default, factor=factor, width=width)
    return TailEstimate(atoms, priced, default.u, fitted)


def nan_padded(c: Core) -> jax.Array:
    """Returns the positive scores [Q, P] of `c`, NaN at padding (as `gpd_log_x` prices them)."""
    return jnp.where(c.mask, c.pos, jnp.nan)


def rerun_width(
    tail: jax.Array, settings: TailSettings, factors: Sequence[float], share: float = 1.0
) -> int:
    """Returns the excess slots W that hold every threshold of `threshold_reruns`: the widest
    of the default thresholds' (times `factors`) and, for a model with its own threshold at
    `share` of the default's excesses, its."""
    return excess_width(tail.shape[1], settings.threshold_quantile, max(factors) * max(1.0, share))


def threshold_reruns(
    c: Core, settings: TailSettings, model: TailModel, *, reruns: bool, share: float = 1.0
) -> tuple[TailFit[jax.Array], TailEstimate, TailEstimate | None]:
    """Returns (the fit diagnostics, the estimate, its reruns or None), traced: the `RerunsFn`
    of a tail model without its own.

    With `reruns`, the estimate is also rerun with the excess count scaled by each of
    `STABILITY_FACTORS`: `tail_hardness` is traced once and mapped over the factors (1,
    *STABILITY_FACTORS) in the widest factor's slots (padding changes no result), so the reruns
    cost no compilation of their own; one after another (`lax.map`), not vmapped, so that the
    program holds one factor's temporaries at a time. `share`: the model's own threshold keeps
    this share of the default's excesses (`rerun_width`).
    """
    u, fit, _, refits = stability_fits(c.tail, settings.threshold_quantile)
    diag = tail_fit(u, fit, refits)
    factors = (1.0, *STABILITY_FACTORS) if reruns else (1.0,)
    width = rerun_width(c.tail, settings, factors, share)

    def one(f: jax.Array) -> TailEstimate:
        return tail_hardness(c, settings, model, factor=f, width=width)

    every = jax.lax.map(one, jnp.asarray(factors, c.tail.dtype))
    main = jax.tree.map(lambda a: a[0], every)
    rest = jax.tree.map(lambda a: a[1:], every) if reruns else None
    return diag, main, rest


@functools.partial(jax.jit, static_argnames=("settings", "model", "reruns"))
def _estimate_jit(
    c: Core, settings: TailSettings, model: TailModel, reruns: bool
) -> tuple[TailFit[jax.Array], TailEstimate, TailEstimate | None, jax.Array]:
    """Returns (the fit diagnostics, the estimate, its reruns or None, the estimate's log point
    hardness [Q, P]), traced: the model's `reruns` (`threshold_reruns` without one) and its
    `price`."""
    if model.reruns is None:
        diag, main, rest = threshold_reruns(c, settings, model, reruns=reruns)
    else:
        diag, main, rest = model.reruns(c, settings, reruns=reruns)
    return diag, main, rest, model.price(main.atoms.log_atoms, main.atoms.weights)


def _host_atoms(
    est: TailEstimate,
    counts: np.ndarray,
    n_sample: float,
    mask: np.ndarray,
    depleted: np.ndarray | None,
) -> tuple[np.ndarray, np.ndarray]:
    """Returns float64 atoms [Q, P, A] and weights [Q, A] of a fetched `TailEstimate`, the weights
    renormalised in float64 (they come from a float32 softmax), less the census's share
    `depleted` (`functional.deplete`)."""
    with np.errstate(under="ignore"):
        log_atoms = np.asarray(est.atoms.log_atoms, np.float64)
        atoms = priced_atoms(log_atoms, np.asarray(est.priced), counts, n_sample, mask, xp=np)
    atoms = functional.deplete(atoms, depleted, np)
    weights = np.asarray(est.atoms.weights, np.float64)
    return atoms, weights / weights.sum(axis=1, keepdims=True)


def estimate(
    scores: SampledScores,
    settings: TailSettings,
    model: TailModel,
    reruns: bool = False,
    prior: np.ndarray | None = None,
) -> Hardness:
    """Returns the tail-aware `Hardness` with the tail model `model`.

    With `reruns`, its `reruns` hold the estimate rerun with half and twice the excesses over
    its threshold (`STABILITY_FACTORS`; threshold selection included). A GPD is a model of the
    tail only asymptotically: a bounded score law's fitted shape drifts with the threshold (the
    penultimate effect), and how far the prediction moves with it is the usual measure of the
    tail model's own error, which no resampling of the data sees (the reported interval widens
    by it, `tailaware.protocol.intervals`). The reruns price positives as the estimate does, by
    the tail above their own threshold and by counts elsewhere, and carry no diagnostics. A
    model with a prior (`TailModel.prior_weights`) also returns, with the reruns, its weights
    under a flatter and a steeper prior on xi; one with more than one atom its atoms.

    `settings` gives M (`top_m`), q (`threshold_quantile`), `min_count` and the prior. `fit`
    holds the per-query diagnostics (`TailFit`). `prior`: the (mean, sd) of an empirical-Bayes
    prior to use instead of the one this sample fits (`Core.prior`).
    """
    c = functional.core(scores, settings, full=True, prior=prior)
    # The host prices counted positives in float64 from the file's exact counts and S.
    mask, s = scores.mask, float(scores.n_sample)
    counts = np.where(mask, scores.pos_counts, 0)
    diag, main, rest, log_x = jax.device_get(_estimate_jit(c, settings, model, reruns))
    diag = jax.tree.map(np.asarray, diag)
    priced = np.asarray(main.priced)
    with np.errstate(under="ignore"):
        x_tail = np.exp(np.asarray(log_x, np.float64))
    x = np.where(mask, np.where(priced, x_tail, counts / s), 0.0)
    dep = None if scores.depleted is None else np.where(mask, scores.depleted, 0.0)
    atoms, weights = None, None
    if np.shape(main.atoms.weights)[1] > 1:
        atoms, weights = _host_atoms(main, counts, s, mask, dep)
        if dep is not None:  # the census's share is taken atom by atom: x is their mean
            x = np.einsum("qpa,qa->qp", atoms, weights)
    else:
        x = functional.deplete(x[..., None], dep, np)[..., 0]

    n_pos = np.maximum(mask.sum(axis=1), 1)
    beyond = priced & (np.where(mask, np.asarray(c.pos), -np.inf) > diag.endpoint[:, None])
    diag = diag._replace(
        fitted=np.asarray(main.fitted),
        newton_converged=np.asarray(main.atoms.converged),
        share_tail_priced=priced.sum(axis=1) / n_pos,
        share_beyond_endpoint=beyond.sum(axis=1) / n_pos,
        share_zero=(mask & (x == 0) & priced).sum(axis=1) / n_pos,
    )
    others: tuple[Hardness, ...] = ()
    if rest is not None:
        others = tuple(
            _rerun(jax.tree.map(lambda a, i=i: a[i], rest), mask, counts, s, dep)
            for i in range(len(STABILITY_FACTORS))
        )
    if atoms is None or weights is None:  # a point estimate
        return Hardness(x=x, mask=mask, tail_priced=priced, fit=diag, reruns=others)
    reweigh = model.prior_weights if reruns else None
    return Hardness(
        x=x,
        mask=mask,
        tail_priced=priced,
        fit=diag,
        atoms=atoms,
        weights=weights,
        reruns=others,
        prior_weights=None if reweigh is None else reweigh(weights, settings),
    )


def _rerun(
    est: TailEstimate,
    mask: np.ndarray,
    counts: np.ndarray,
    n_sample: float,
    depleted: np.ndarray | None,
) -> Hardness:
    """Returns a rerun's `Hardness` from its fetched `TailEstimate`."""
    atoms, weights = _host_atoms(est, counts, n_sample, mask, depleted)
    x = np.einsum("qpa,qa->qp", atoms, weights)
    return Hardness(
        x=x, mask=mask, tail_priced=np.asarray(est.priced), atoms=atoms, weights=weights
    )


def prior_weights(weights: np.ndarray, settings: TailSettings) -> np.ndarray:
    """Returns [2, Q, X] the posterior weights over the xi grid under the priors exp((t -/+ d)
    xi), t = `xi_tilt` and d = `prior_spread`, from the weights [Q, X] under exp(t xi).

    The prior enters the weights as a factor (`posterior`), so another prior is a re-weighting of
    the same atoms (exact, in float64).
    """
    xis = np.asarray(xi_grid(settings.xi_tilt, xi_max=settings.xi_max)[0], np.float64)
    shifts = np.array([-settings.prior_spread, settings.prior_spread])
    w = np.asarray(weights, np.float64)[None] * np.exp(shifts[:, None] * xis)[:, None, :]
    reweighted: np.ndarray = w / w.sum(axis=2, keepdims=True)
    return reweighted
