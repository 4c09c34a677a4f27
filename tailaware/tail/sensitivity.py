"""Sensitivity of the predicted mAP@k to hardness, gallery size and tail fits, with `jax.grad`.

The prediction is mAP@k = mean_q AP_q with AP_q = 1 / min(k, n_pos) * sum_j w(r_j) j / r_j and
r_j = j + F_j + N x_j (`law.ap_at_k`, paper Sec. 3 and App. A). Everything here differentiates
that map; nothing re-derives it. The reported prediction (`predict`) is the expectation E[AP]
under Poisson counts (`law.expected_map`); the map is its smooth surrogate (they differ by the
Jensen gap, which is small unless many positives have N x between 1 and k), so the gradients
here describe the direction and size of responses, not the last digit of the prediction.

What the reports answer:

* `gradients`: d mAP / d log x for every positive, d mAP / d ln N (and per decade), and each
  query's own decay rate. Because x enters only through N x, a uniform relative error in
  hardness is exactly a change of gallery size: N d/dN = sum_j x_j d/dx_j, and
  mAP(x e^delta, N) = mAP(x, N e^delta).
* `uniform_response` / `positive_response`: exact and first-order change of mAP when hardness
  is off by a factor e^delta, next to top-1 accuracy, whose exp(-N x) response is exponential.
  A positive's precision term p = j / (j + F + N x) has elasticity d p / d log x = -p N x / r,
  at most 1/4 in size, and a hardness overshoot by a factor c shrinks it like 1 / c rather
  than exp(-c N x): the rational response the paper credits with damping tail-estimate error
  (App. A-B).
* `tail_gradients`: d mAP / d (log rate, threshold, xi, log sigma) of every query's tail fit.
  The fitted parameters are taken as given inputs (a stop-gradient at the fit).
  `score_gradients` goes through the fitter instead: d mAP / d sampled score and d mAP / d
  positive score via `evt.log_tail_prob`, whose fitted (xi, sigma) carry `gpd.fit`'s
  implicit-function-theorem derivatives (the threshold's rank and the count switch carry none).
* `uncertainty`: delta-method variance of mAP from hardness noise, split by query and by
  positive, from a log-hardness covariance (`count_log_x_covariance` for counted positives,
  `tail_log_x_covariance` for tail-priced ones). The variance of counts and of tail fits both
  fall roughly as 1 / S, so the queries and positives with the largest share are where a
  larger sample pays most; `blind_response` prices the positives no sampled distractor beats.
* `analyze` runs all of it on a `SampledScores` and its `Hardness`; `format_report` prints it.

Truncation: gradients default to `truncation="smooth"` (see `law.ap_at_k`), because the metric's
own hard cut-off has zero gradient across the k boundary; exact responses default to "hard",
the metric itself. Every function takes `truncation` and reports under the one it is given.

Shapes: Q queries, P positive slots per query (padded; `mask` marks real ones), D deltas,
S sample size, N target gallery size.
"""

import functools
from collections.abc import Callable, Sequence
from typing import NamedTuple, TypeAlias

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from tailaware.core import law
from tailaware.core.results import Hardness, TailFit
from tailaware.io.scores import SampledScores
from tailaware.tail import evt, plug_in
from tailaware.tail.models import TailModel
from tailaware.tail.settings import TailSettings

LN10 = float(np.log(10.0))


class Gradients(NamedTuple):
    """First-order sensitivity of the predicted mAP@k.

    Attributes:
      map: predicted mAP@k (scalar).
      aps: [Q] predicted AP@k per query.
      d_x: [Q, P] d mAP / d x_qj (0 at padding).
      d_log_x: [Q, P] d mAP / d log x_qj = x_qj d mAP / d x_qj, the mAP moved by a small
        relative error in one positive's hardness; 0 at x = 0 and at padding.
      d_log_n: d mAP / d ln N (<= 0).
      aps_d_log_n: [Q] d AP_q / d ln N, each query's own decay rate.
    """

    map: jax.Array
    aps: jax.Array
    d_x: jax.Array
    d_log_x: jax.Array
    d_log_n: jax.Array
    aps_d_log_n: jax.Array

    @property
    def per_decade(self) -> jax.Array:
        """mAP gained per decade of gallery growth, d mAP / d log10 N (negative: a loss)."""
        return LN10 * self.d_log_n


def _map(
    x: jax.Array,
    log_n: jax.Array,
    mask: ArrayLike,
    k: law.Scalar,
    *,
    fixed: ArrayLike | None,
    truncation: law.Truncation,
    tau: law.Scalar,
) -> tuple[jax.Array, jax.Array]:
    return law.map_at_k(x, mask, jnp.exp(log_n), k, fixed, truncation=truncation, tau=tau)


@functools.partial(jax.jit, static_argnames=("truncation",))
def gradients(
    x: ArrayLike,
    mask: ArrayLike,
    n: ArrayLike,
    k: law.Scalar,
    *,
    fixed: ArrayLike | None = None,
    truncation: law.Truncation = "smooth",
    tau: law.Scalar = 1.0,
) -> Gradients:
    """Returns the `Gradients` of mAP@k at gallery size n.

    Args:
      x: [Q, P] hardness.
      mask: [Q, P] bool, real positives.
      n: gallery size N (differentiated as ln N).
      k: the cut-off.
      fixed: [Q, P] optional always-indexed non-relevant items above each positive.
      truncation: "smooth" (default) or "hard"; see the module docstring.
      tau: width of the smooth step, in ranks.
    """
    x = jnp.asarray(x)
    log_n = jnp.log(jnp.asarray(n, x.dtype))
    grad = jax.value_and_grad(_map, argnums=(0, 1), has_aux=True)
    (value, aps), (g_x, g_n) = grad(x, log_n, mask, k, fixed=fixed, truncation=truncation, tau=tau)
    g_x = jnp.where(mask, g_x, 0.0)
    d_log_x = x * g_x
    # N d/dN = sum_j x_j d/dx_j for each query, since x enters AP_q only through N x_q.
    aps_d_log_n = aps.shape[0] * jnp.sum(d_log_x, axis=1)
    return Gradients(value, aps, g_x, d_log_x, g_n, aps_d_log_n)


class Response(NamedTuple):
    """Change of mAP@k and of top-1 accuracy when every hardness is multiplied by e^delta.

    Attributes:
      delta: [D] relative errors in log x.
      map: [D] exact mAP(x e^delta) - mAP(x).
      map_first_order: [D] delta * d mAP / d ln N (the same, to first order).
      top1: [D] exact change of mean top-1 accuracy, mean_q exp(-N x_q1) (Poisson form).
      top1_first_order: [D] its first-order change.
    """

    delta: jax.Array
    map: jax.Array
    map_first_order: jax.Array
    top1: jax.Array
    top1_first_order: jax.Array


def _top1(x: jax.Array, mask: ArrayLike, n: law.Scalar, fixed: jax.Array) -> jax.Array:
    return jnp.mean(jax.vmap(law.top1_accuracy, in_axes=(0, 0, None, 0))(x, mask, n, fixed))


@functools.partial(jax.jit, static_argnames=("truncation",))
def uniform_response(
    x: ArrayLike,
    mask: ArrayLike,
    n: ArrayLike,
    k: law.Scalar,
    deltas: ArrayLike,
    *,
    fixed: ArrayLike | None = None,
    truncation: law.Truncation = "hard",
    tau: law.Scalar = 1.0,
) -> Response:
    """Returns the `Response` to a relative error e^delta shared by every positive.

    Equivalent to moving the gallery from N to N e^delta, so the first-order slope is
    d mAP / d ln N; under log-uniform hardness it is the per-decade loss times delta / ln 10.

    Args:
      x, mask, n, k, fixed, truncation, tau: as in `gradients`.
      deltas: [D] errors in log x (delta = ln 2: hardness overestimated twofold).
    """
    x = jnp.asarray(x)
    deltas = jnp.asarray(deltas, x.dtype)
    fixed = jnp.zeros_like(x) if fixed is None else jnp.asarray(fixed, x.dtype)
    log_n = jnp.log(jnp.asarray(n, x.dtype))

    def value(log_n: jax.Array) -> tuple[jax.Array, jax.Array]:
        m, _ = _map(x, log_n, mask, k, fixed=fixed, truncation=truncation, tau=tau)
        return m, _top1(x, mask, jnp.exp(log_n), fixed)

    def shifted(d: jax.Array) -> tuple[jax.Array, jax.Array]:
        return value(log_n + d)

    (m0, t0), (dm, dt) = jax.jvp(value, (log_n,), (jnp.ones_like(log_n),))
    m, t = jax.vmap(shifted)(deltas)
    return Response(deltas, m - m0, deltas * dm, t - t0, deltas * dt)


@functools.partial(jax.jit, static_argnames=("truncation",))
def positive_response(
    x: ArrayLike,
    mask: ArrayLike,
    n: law.Scalar,
    k: law.Scalar,
    delta: ArrayLike,
    *,
    fixed: ArrayLike | None = None,
    truncation: law.Truncation = "hard",
    tau: law.Scalar = 1.0,
) -> tuple[jax.Array, jax.Array]:
    """Returns (exact, first order) [Q, P] change of mAP@k when only x_qj is multiplied by e^delta.

    The first-order term is delta * d mAP / d log x_qj under the same truncation; the gap between
    the two is the curvature of the rational response (and, for "hard", the k boundary).
    """
    x = jnp.asarray(x)
    fixed = jnp.zeros_like(x) if fixed is None else jnp.asarray(fixed, x.dtype)
    scale = jnp.exp(jnp.asarray(delta, x.dtype))
    num_q, num_p = x.shape

    def one_query(xq: jax.Array, mq: ArrayLike, fq: jax.Array) -> jax.Array:
        def ap(xs: jax.Array) -> jax.Array:
            return law.ap_at_k(xs, mq, n, k, fq, truncation=truncation, tau=tau)

        def moved(e: jax.Array) -> jax.Array:
            return ap(jnp.where(e, xq * scale, xq))

        bump = jnp.eye(num_p, dtype=bool)
        return jnp.where(mq, jax.vmap(moved)(bump) - ap(xq), 0.0)

    exact = jax.vmap(one_query)(x, mask, fixed) / num_q
    g = gradients(x, mask, n, k, fixed=fixed, truncation=truncation, tau=tau)
    return exact, jnp.asarray(delta, x.dtype) * g.d_log_x


class TailParams(NamedTuple):
    """One query's tail fit (each field [Q] under batching).

    The tail prices a positive of score s above the threshold u at
    log x = log_rate + log P(Y > s - u), Y ~ GPD(xi, sigma) (paper App. B).

    Attributes:
      log_rate: log of the share of the whole sample above the threshold, log(n_u / S).
      threshold: u, in score units.
      xi: GPD shape, in [-1, 0].
      log_sigma: log of the GPD scale.
    """

    log_rate: jax.Array
    threshold: jax.Array
    xi: jax.Array
    log_sigma: jax.Array


# A tail's log hardness of the positives: (params, pos_scores [Q, P]) -> [Q, P] (`gpd_log_x`).
LogX: TypeAlias = Callable[[TailParams, jax.Array], jax.Array]


@jax.jit
def gpd_log_x(params: TailParams, pos_scores: jax.Array) -> jax.Array:
    """Returns the tail-priced log hardness [Q, P] of positives with scores `pos_scores` [Q, P].

    -inf beyond the fitted endpoint (an "immune" positive, x = 0), with zero, finite gradient.
    """
    sigma = jnp.exp(params.log_sigma)
    return evt.gpd_log_x(params.log_rate, params.threshold, params.xi, sigma, pos_scores)


@functools.partial(jax.jit, static_argnames=("truncation", "log_x_fn"))
def tail_gradients(
    params: TailParams,
    pos_scores: jax.Array,
    x: jax.Array,
    tail_priced: jax.Array,
    mask: jax.Array,
    n: law.Scalar,
    k: law.Scalar,
    *,
    fixed: ArrayLike | None = None,
    truncation: law.Truncation = "smooth",
    tau: law.Scalar = 1.0,
    log_x_fn: LogX = gpd_log_x,
) -> TailParams:
    """Returns d mAP@k / d (tail parameters) as a `TailParams` of [Q] gradients.

    The tail-priced positives (`tail_priced`) take x = exp(log_x_fn(params, pos_scores)); the
    others keep `x`. The parameters are the inputs here (stop-gradient at the fit): this is how
    mAP moves with each query's fitted tail, whatever moved the fit.
    """

    def f(p: TailParams) -> jax.Array:
        xt = jnp.where(tail_priced & mask, jnp.exp(log_x_fn(p, pos_scores)), x)
        return law.map_at_k(xt, mask, n, k, fixed, truncation=truncation, tau=tau)[0]

    grad: TailParams = jax.grad(f)(params)  # the gradient has the parameters' structure
    return grad


@functools.partial(jax.jit, static_argnames=("log_x_fn",))
def tail_log_x_jacobian(
    params: TailParams, pos_scores: jax.Array, log_x_fn: LogX = gpd_log_x
) -> jax.Array:
    """Returns d log x_qj / d (log_rate, xi, log_sigma)_q as [Q, P, 3] (zero beyond the endpoint).

    Each positive depends on its own query's parameters only, so one forward-mode pass per
    parameter gives the whole block-diagonal Jacobian.
    """

    log_x = log_x_fn(params, pos_scores)

    def at(p: TailParams) -> jax.Array:
        return log_x_fn(p, pos_scores)

    def along(field: str) -> jax.Array:
        tangent = params._replace(
            **{f: jnp.zeros_like(getattr(params, f)) for f in TailParams._fields}
        )
        tangent = tangent._replace(**{field: jnp.ones_like(getattr(params, field))})
        d: jax.Array
        _, d = jax.jvp(at, (params,), (tangent,))
        return d

    jac = jnp.stack([along("log_rate"), along("xi"), along("log_sigma")], axis=-1)
    # Beyond the endpoint x = 0 whatever the parameters do (log x = -inf has slope 1 in log_rate).
    return jnp.where(jnp.isfinite(log_x)[..., None] & jnp.isfinite(jac), jac, 0.0)


def tail_param_covariance(xi: ArrayLike, n_exceed: ArrayLike) -> jax.Array:
    """Returns the asymptotic covariance [Q, 3, 3] of (log rate, xi, log sigma) of a tail fit.

    The exceedance count over a fixed threshold is Binomial, so Var(log rate) ~ 1 / n_u (with u
    at an order statistic, as `evt.excesses` sets it, the same noise moves u instead, to
    first order with the same effect on x). For the GPD maximum-likelihood
    fit (Smith 1985, regular for xi > -1/2), with c = 1 + xi,
    Var(xi) = c^2 / n_u, Var(log sigma) = 2 c / n_u, Cov(xi, log sigma) = -c / n_u; non-regular
    fits (xi <= -1/2) get c = 1/2, a rough but positive-semidefinite scale (compare
    `gpd.xi_standard_error`). The threshold is held fixed (conditional on u).
    """
    xi = jnp.asarray(xi)
    n_u = jnp.maximum(jnp.asarray(n_exceed, xi.dtype), 1.0)
    c = jnp.maximum(1.0 + xi, 0.5)
    zero = jnp.zeros_like(xi)
    rows = [
        jnp.stack([jnp.ones_like(xi), zero, zero], -1),
        jnp.stack([zero, c * c, -c], -1),
        jnp.stack([zero, -c, 2.0 * c], -1),
    ]
    return jnp.stack(rows, -2) / n_u[:, None, None]


def tail_log_x_covariance(
    params: TailParams, pos_scores: jax.Array, n_exceed: ArrayLike, log_x_fn: LogX = gpd_log_x
) -> jax.Array:
    """Returns Cov(log x_qi, log x_qj) [Q, P, P] of tail-priced positives, J Sigma J^T."""
    jac = tail_log_x_jacobian(params, pos_scores, log_x_fn)
    sigma = tail_param_covariance(params.xi, n_exceed)
    return jnp.einsum("qia,qab,qjb->qij", jac, sigma, jac)


def count_log_x_covariance(counts: ArrayLike, mask: ArrayLike, n_sample: ArrayLike) -> jax.Array:
    """Returns Cov(log x_qi, log x_qj) [Q, P, P] of the count estimator x = K / S.

    The counts of one query are nested (a harder positive's sampled outrankers include an
    easier one's), so Cov(K_i, K_j) = S x_min (1 - x_max) and, by the delta method,
    Cov(log x_i, log x_j) = (1 - x_max) / (S x_max) = (1 - x_max) / K_max: relative standard
    deviation 1 / sqrt(K) on the diagonal. Zero where either count is 0 (x = 0 has no log;
    see `blind_response` for those).
    """
    counts = jnp.asarray(counts)
    dtype = jnp.result_type(float)
    k = jnp.where(mask, counts, 0).astype(dtype)
    k_max = jnp.maximum(k[:, :, None], k[:, None, :])
    seen = (k[:, :, None] > 0) & (k[:, None, :] > 0)
    k_safe = jnp.where(seen, k_max, 1.0)
    x_max = k_safe / jnp.asarray(n_sample, dtype)
    return jnp.where(seen, (1.0 - x_max) / k_safe, 0.0)


class Uncertainty(NamedTuple):
    """Delta-method variance of mAP@k from hardness noise, and who contributes it.

    Attributes:
      sd: standard deviation of mAP (scalar); at a sample c times larger, about sd / sqrt(c).
      query_var: [Q] each query's variance g_q^T C_q g_q (they sum to sd^2: queries are
        treated as independent, which ignores that they share one distractor sample).
      share: [Q, P] each positive's share of the variance, g_i (C g)_i / sd^2 (sums to 1).
      value: [Q, P] |d mAP / d log x| * sd(log x), the mAP one standard error of that
        positive's hardness moves.
    """

    sd: jax.Array
    query_var: jax.Array
    share: jax.Array
    value: jax.Array


def uncertainty(d_log_x: jax.Array, log_x_cov: jax.Array) -> Uncertainty:
    """Returns the `Uncertainty` of mAP@k from gradients d_log_x [Q, P] and Cov(log x) [Q, P, P]."""
    cg = jnp.einsum("qij,qj->qi", log_x_cov, d_log_x)
    per_pos = d_log_x * cg
    query_var = jnp.sum(per_pos, axis=1)
    var = jnp.sum(query_var)
    var_safe = jnp.where(var > 0, var, 1.0)
    sd_log_x = jnp.sqrt(jnp.maximum(jnp.diagonal(log_x_cov, axis1=1, axis2=2), 0.0))
    return Uncertainty(
        sd=jnp.sqrt(jnp.maximum(var, 0.0)),
        query_var=query_var,
        share=jnp.where(var > 0, per_pos / var_safe, 0.0),
        value=jnp.abs(d_log_x) * sd_log_x,
    )


@functools.partial(jax.jit, static_argnames=("truncation",))
def blind_response(
    x: ArrayLike,
    mask: jax.Array,
    blind: jax.Array,
    n: law.Scalar,
    k: law.Scalar,
    n_sample: ArrayLike,
    *,
    fixed: ArrayLike | None = None,
    truncation: law.Truncation = "hard",
) -> jax.Array:
    """Returns the mAP@k change [Q] if each `blind` positive had x = 1 / S, the detection floor.

    A positive that no sampled distractor beats has hardness below about 1 / S; a count prices
    it at 0. This is what pricing those positives at the floor instead costs each query (summed
    over queries: the mAP change), a scale for what a larger sample could still reveal.
    """
    x = jnp.asarray(x)
    floor = 1.0 / jnp.asarray(n_sample, x.dtype)
    moved = jnp.where(blind & mask, jnp.maximum(x, floor), x)
    _, base = law.map_at_k(x, mask, n, k, fixed, truncation=truncation)
    _, aps = law.map_at_k(moved, mask, n, k, fixed, truncation=truncation)
    return (aps - base) / x.shape[0]


def tail_params(fit: TailFit[np.ndarray], n_sample: float) -> TailParams:
    """Returns the `TailParams` [Q] of the plug-in fits of a tail-aware estimate (`Hardness.fit`).

    Queries without a fit (no excess) get log_rate = -inf and sigma = 1: they price nothing.
    """
    dtype = jnp.result_type(float)
    n_u = jnp.asarray(fit.n_exceed, dtype)
    sigma = jnp.asarray(fit.sigma, dtype)
    fitted = (n_u > 0) & (sigma > 0)
    return TailParams(
        log_rate=jnp.where(fitted, jnp.log(jnp.where(fitted, n_u, 1.0) / n_sample), -jnp.inf),
        threshold=jnp.asarray(fit.u, dtype),
        xi=jnp.asarray(fit.xi, dtype),
        log_sigma=jnp.log(jnp.where(fitted, sigma, 1.0)),
    )


@functools.partial(jax.jit, static_argnames=("settings", "model", "truncation"))
def score_gradients(
    pos_scores: jax.Array,
    tail_scores: jax.Array,
    n_sample: ArrayLike,
    x: jax.Array,
    tail_priced: jax.Array,
    mask: jax.Array,
    n: law.Scalar,
    k: law.Scalar,
    *,
    fixed: ArrayLike | None = None,
    settings: TailSettings = TailSettings(),
    model: TailModel = plug_in.PLUG_IN,
    truncation: law.Truncation = "smooth",
    tau: law.Scalar = 1.0,
) -> tuple[jax.Array, jax.Array]:
    """Returns (d mAP / d pos_scores [Q, P], d mAP / d tail_scores [Q, M]) through the tail fit.

    The tail-priced positives take `evt.log_tail_prob` of the tail `model` (differentiated
    through the fitter by implicit differentiation for the default, the plug-in); the others
    keep `x`. A sampled score's gradient says how much the prediction leans on that one
    distractor; a positive's says how much a small change of its similarity would move mAP.
    """

    def f(pos: jax.Array, tail: jax.Array) -> jax.Array:
        log_x = evt.log_tail_prob(pos, tail, n_sample, settings, model)
        xt = jnp.where(tail_priced & mask, jnp.exp(log_x), x)
        return law.map_at_k(xt, mask, n, k, fixed, truncation=truncation, tau=tau)[0]

    d_pos, d_tail = jax.grad(f, argnums=(0, 1))(pos_scores, tail_scores)
    return jnp.where(mask, d_pos, 0.0), jnp.where(jnp.isfinite(tail_scores), d_tail, 0.0)


class Report(NamedTuple):
    """Everything `analyze` finds, as arrays (device arrays; `format_report` prints them).

    Attributes:
      truncation: the truncation every gradient here uses ("smooth" unless asked otherwise).
      gradients: `Gradients` of the prediction.
      uncertainty: `Uncertainty` from counting noise and tail-fit noise.
      blind: [Q] mAP change if every positive priced at exactly 0 had x = 1 / S (hard metric).
      tail: `TailParams` of d mAP / d parameter per query, or None when the estimate has no
        plug-in tail to differentiate (a count-only estimator, or `evt_averaged`, whose tail
        probability is an average over xi; its tail-priced positives then carry no variance).
      tail_priced: [Q, P] the positives the tail prices.
    """

    truncation: str
    gradients: Gradients
    uncertainty: Uncertainty
    blind: jax.Array
    tail: TailParams | None
    tail_priced: jax.Array


def analyze(
    scores: SampledScores,
    hard: Hardness,
    n: float,
    k: int,
    *,
    truncation: law.Truncation = "smooth",
    tau: float = 1.0,
) -> Report:
    """Returns the sensitivity `Report` of the prediction `hard` makes at gallery size n.

    Counted positives get the nested-count covariance, tail-priced ones the tail-fit covariance
    (their two groups are treated as independent). The tail parts need the plug-in fit's
    parameters (`Hardness.fit`), and are computed only when that fit
    reproduces the tail-priced hardness (so not for `evt_averaged`; see `Report.tail`).
    """
    dtype = jnp.result_type(float)
    fit = hard.fit
    has_tail = fit is not None and bool(np.any(hard.tail_priced))
    q = hard.mask.shape[0]
    pos = jnp.asarray(np.where(hard.mask, scores.pos_scores, 0.0), dtype)
    if fit is not None and has_tail:
        params = tail_params(fit, scores.n_sample)
        n_u = jnp.asarray(fit.n_exceed, dtype)
        # Differentiate the tail only where it is the plug-in fit that priced the positives.
        plug_in = np.exp(np.asarray(gpd_log_x(params, pos), np.float64))
        tp = hard.tail_priced & hard.mask
        has_tail = np.allclose(plug_in[tp], hard.x[tp], rtol=1e-3, atol=0.0)
    if not has_tail:  # the tail part is masked out: one compiled program serves both cases
        params = TailParams(*(jnp.zeros((q,), dtype) for _ in TailParams._fields))
        n_u = jnp.ones((q,), dtype)
    grads, unc, blind, d_tail = _analyze(
        jnp.asarray(hard.x, dtype),
        jnp.asarray(hard.mask),
        jnp.asarray(n, dtype),
        jnp.asarray(k, dtype),
        fixed=jnp.asarray(np.where(hard.mask, scores.fixed_counts, 0), dtype),
        counts=jnp.asarray(np.where(hard.mask, scores.pos_counts, 0), dtype),
        counted=jnp.asarray(hard.mask & ~hard.tail_priced),
        tail=jnp.asarray(hard.tail_priced & hard.mask & has_tail),
        pos=pos,
        params=params,
        n_u=n_u,
        n_sample=jnp.asarray(scores.n_sample, dtype),
        truncation=truncation,
        tau=tau,
    )
    tail = jnp.asarray(hard.tail_priced & hard.mask)
    return Report(truncation, grads, unc, blind, d_tail if has_tail else None, tail)


@functools.partial(jax.jit, static_argnames=("truncation",))
def _analyze(
    x: jax.Array,
    mask: jax.Array,
    n: jax.Array,
    k: jax.Array,
    *,
    fixed: jax.Array,
    counts: jax.Array,
    counted: jax.Array,
    tail: jax.Array,
    pos: jax.Array,
    params: TailParams,
    n_u: jax.Array,
    n_sample: jax.Array,
    truncation: law.Truncation,
    tau: law.Scalar,
) -> tuple[Gradients, Uncertainty, jax.Array, TailParams]:
    """The arrays of `analyze`, as one compiled program."""
    grads = gradients(x, mask, n, k, fixed=fixed, truncation=truncation, tau=tau)

    def both(m: jax.Array) -> jax.Array:
        return m[:, :, None] & m[:, None, :]

    cov = jnp.where(both(counted), count_log_x_covariance(counts, mask, n_sample), 0.0)
    cov = cov + jnp.where(both(tail), tail_log_x_covariance(params, pos, n_u), 0.0)
    d_tail = tail_gradients(
        params, pos, x, tail, mask, n, k, fixed=fixed, truncation=truncation, tau=tau
    )
    blind = blind_response(x, mask, mask & (x == 0), n, k, n_sample, fixed=fixed)
    return grads, uncertainty(grads.d_log_x, cov), blind, d_tail


def format_report(
    report: Report, query_ids: Sequence[object] | np.ndarray | None = None, top: int = 5
) -> str:
    """Returns a plain-text summary: decay, uncertainty, and the queries and positives behind it.

    The table lists the `top` queries with the largest share of the hardness-noise variance
    (where a larger sample helps most) with their decay per decade and the AP change if their
    zero-priced positives sat at x = 1 / S; then the queries that decay fastest and the
    positives whose one-standard-error hardness error moves mAP most.
    """
    g, u = report.gradients, report.uncertainty
    aps = np.asarray(g.aps)
    q = len(aps)
    ids = [str(i) for i in query_ids] if query_ids is not None else [f"q{i}" for i in range(q)]
    blind = np.asarray(report.blind) * q  # per-query AP change
    decay = LN10 * np.asarray(g.aps_d_log_n)
    qvar = np.asarray(u.query_var, np.float64)
    total = qvar.sum()
    share = qvar / total if total > 0 else np.zeros_like(qvar)  # no noise: no share to split
    lines = [
        f"predicted mAP@k {float(g.map):.4f}; {float(g.per_decade):+.4f} per decade of gallery "
        f"growth (d mAP / d log10 N, {report.truncation} truncation)",
        f"hardness-noise sd {float(u.sd):.4f} (about {float(u.sd) / np.sqrt(2):.4f} with a "
        f"sample twice as large); positives priced at 0 would cost {blind.sum() / q:+.4f} at "
        "x = 1/S",
        f"  {'query':<14}{'AP':>8}{'var share':>11}{'dAP/dlog10N':>13}{'blind dAP':>11}",
    ]
    for i in np.argsort(-share)[:top]:
        lines.append(
            f"  {ids[i]:<14}{aps[i]:>8.4f}{share[i]:>11.1%}{decay[i]:>+13.4f}{blind[i]:>+11.4f}"
        )
    fastest = np.argsort(decay)[:top]
    lines.append(
        "fastest decay per decade: " + ", ".join(f"{ids[i]} {decay[i]:+.3f}" for i in fastest)
    )
    value = np.asarray(u.value)
    tail = np.asarray(report.tail_priced)
    best = np.argsort(-value, axis=None)[:top]
    lines.append(
        "positives one standard error moves most: "
        + ", ".join(
            f"{ids[i]}/{j} {value[i, j]:.4f} ({'tail' if tail[i, j] else 'count'})"
            for i, j in zip(*np.unravel_index(best, value.shape), strict=True)
        )
    )
    if report.tail is not None:
        d_xi = np.asarray(report.tail.xi)
        worst = int(np.argmax(np.abs(d_xi)))
        lines.append(
            f"tail fits: largest |d mAP / d xi| {d_xi[worst]:+.4f} at {ids[worst]}; "
            f"sum of d mAP / d log rate {float(np.sum(np.asarray(report.tail.log_rate))):+.4f}"
        )
    return "\n".join(lines)
