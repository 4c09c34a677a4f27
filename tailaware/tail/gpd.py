"""Generalized Pareto (GPD) likelihoods for the tail fits: the constrained MLE and profiles.

The paper's tail-aware estimator (Appendix B) fits a GPD to each query's excesses over a high
threshold. `fit` is that fitter, the maximum-likelihood estimate under -1 <= xi <= 0 (cosine
scores are bounded). The averaged estimator's posterior (`tailaware.tail.evt`) needs the
likelihood profiled over the scale at fixed shapes instead: `profile_in_xi` for xi in [-1, 0]
and `profile_in_xi_heavy` for xi > 0 (real embeddings' tails fit at or past the bound at
practical depths). Everything is written for one problem of `n` padded excesses and batched
with `vmap`.

GPD survival, for excess y >= 0, scale sigma > 0 and shape xi:

    P(Y > y) = (1 + xi * y / sigma) ** (-1 / xi)      (exp(-y / sigma) at xi = 0),

with support 0 <= y <= sigma / -xi when xi < 0 (the *endpoint*).

Algorithm (fixed work per problem, no data-dependent Python control flow). In units of the
largest excess, z = y / y_max, Grimshaw's (1993) reparametrisation theta = -xi / sigma with
t = theta * y_max in [0, 1) profiles xi out in closed form,

    xi(t) = mean(log(1 - t z)),   sigma(t) = -xi(t) / t,

so every t < 1 keeps all excesses inside the support and t >= 0 is exactly xi <= 0. The profile
log-likelihood is searched on a fixed grid in s = -log(1 - t) (dense near t = 0, logarithmic in
the gap to the endpoint near t = 1), refined by a fixed number of safeguarded Newton steps on
its derivative inside the best grid point's bracket, and compared with the two boundary
candidates that Smith (1985) and the constraint set call for:

  * xi = 0 (exponential, sigma = mean(y)). When the excesses' coefficient of variation is at
    least 1 the profile has no interior optimum (Grimshaw 1993), so only the two boundaries
    compete; note that xi = -1 can still beat the exponential then (few excesses, or a cluster
    at the maximum), so CV > 1 alone does not imply xi = 0;
  * xi = -1 (uniform, sigma = y_max, log-likelihood -n log y_max), the limit t -> 1 where the
    likelihood for xi < -1 would be unbounded.

Where the profile wants xi < -1 it is clamped to -1 (the constrained profile is then n log t,
dominated by the xi = -1 candidate). `1 - t z` is evaluated as `log1p(-t z)` for t < 1/2 and as
`log(w + e z)` with w = 1 - z, e = 1 - t otherwise, so that neither the near-exponential nor the
near-endpoint regime loses precision in float32.

Gradients: the fitted (xi, sigma) carry implicit-function-theorem derivatives with respect to the
excesses (`fit` returns the optimum's value, and its tangent is -H^-1 d(grad loglik)/dy at the
optimum, H the Hessian in (xi, log sigma)). At the xi = 0 optimum sigma = mean(y) and at the
xi = -1 optimum sigma = max(y), differentiated directly. The search itself is never
differentiated (it runs under `stop_gradient`).

References:
  Smith, R. L. (1985). Maximum likelihood estimation in a class of nonregular cases. Biometrika.
  Grimshaw, S. D. (1993). Computing maximum likelihood estimates for the generalized Pareto
    distribution. Technometrics.
  Zhang, J. and Stephens, M. A. (2009). A new and efficient estimation method for the
    generalized Pareto distribution. Technometrics.
  Choulakian, V. and Stephens, M. A. (2001). Goodness-of-fit tests for the generalized Pareto
    distribution. Technometrics.
"""

import math
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike
from numpy.typing import DTypeLike

# Search settings: fixed work per problem. The grid in s = -log(1 - t) reaches a gap between the
# largest excess and the endpoint of exp(-s_max) * y_max; beyond it only the xi = -1 candidate
# can win. float32 stops where the gap is still a few ulps, so the endpoint stays representable
# above y_max.
S_MAX = {np.dtype(np.float32): 14.0, np.dtype(np.float64): 30.0}
# Newton steps of the profiles (`profile_in_xi`, `profile_in_xi_heavy`) and of `fit`'s
# refinement. `_newton` bisects whenever a step is not a good Newton step, so PROFILE_STEPS
# leave the bracket (1e-6, S_MAX] below float32's resolution in s even where Newton never helps;
# the counts are the fewest that reproduce longer runs (docs/estimators.md, "The fitters").
PROFILE_STEPS = 24
HEAVY_STEPS = 12
NEWTON_ITERS = 8
# A Newton step below this (relative to 1 + |s|, ~8 float32 ulps) ends the iteration.
NEWTON_TOL = 1e-6
# A solve whose root is uncertain by at most this (relative to 1 + |s|) has converged
# (`NewtonState`): float32 noise in a flat profile's slope leaves up to ~1e-5 (above
# NEWTON_TOL, so the iteration may never stop), a solve cut short ~1e-3 and more
# (docs/estimators.md, "The fitters").
CONVERGED_TOL = 1e-4
GRID_SIZE = 48
_LOG2 = math.log(2.0)


class GPDFit(NamedTuple):
    """A fitted GPD per problem (leading batch shape `[...]` under vmap).

    Attributes:
      xi: shape, in [-1, 0].
      sigma: scale (> 0 for any problem with a positive excess; 0 when there is none).
      loglik: maximised log-likelihood (0 with no excess; +inf when every excess is 0); carries
        no gradient.
      endpoint: upper end of the support in excess units, sigma / -xi (inf at xi = 0).
      n: number of excesses (masked-in entries), as the float dtype.
      at_xi0: the optimum is the xi = 0 (exponential) boundary.
      at_xi_minus1: the optimum is the xi = -1 (uniform) boundary.
      converged: a proper optimum was found (False for degenerate input, a search that ended
        at the grid edge, or a Newton refinement that did not converge).
      newton_converged: the Newton refinement of an interior optimum met its tolerance
        (`NewtonState.converged`); True where the optimum is a boundary or there is none.
    """

    xi: jax.Array
    sigma: jax.Array
    loglik: jax.Array
    endpoint: jax.Array
    n: jax.Array
    at_xi0: jax.Array
    at_xi_minus1: jax.Array
    converged: jax.Array
    newton_converged: jax.Array


class NewtonState(NamedTuple):
    """How a Newton solve (`_newton`) ended, as jaxopt's solvers return their state.

    Attributes:
      converged: `error` <= `CONVERGED_TOL`: the iterate is the root to float resolution.
        False when the step budget ran out first, e.g. the root lies outside the bracket (g
        never changed sign) or the steps were too few to close in on it.
      iterations: the steps taken until a Newton step met `NEWTON_TOL` and the iteration
        stopped (the whole budget when none did: float32 noise in g can keep the step a few
        ulps long at the root).
      error: the uncertainty left in the root relative to 1 + |s| at the last step: the Newton
        step, or, once g has changed sign, the bracket's width if smaller.
    """

    converged: jax.Array
    iterations: jax.Array
    error: jax.Array


class NewtonStep(NamedTuple):
    """A Newton solve's result (jaxopt's `OptStep`): the root `params` and its `state`."""

    params: jax.Array
    state: NewtonState


class Profile(NamedTuple):
    """The likelihood profiled over the scale at fixed shapes [X] (`profile_in_xi`).

    Attributes:
      sigma: [X] the scale maximising the likelihood at each shape.
      loglik: [X] the log-likelihood there.
      converged: [X] the Newton solve for the scale met its tolerance (`NewtonState`); True at
        shapes with a closed form and without excesses.
    """

    sigma: jax.Array
    loglik: jax.Array
    converged: jax.Array


def s_grid(dtype: DTypeLike = np.float32) -> np.ndarray:
    """Returns the [GRID_SIZE] search grid in s = -log(1 - t) (s = 0 excluded), as numpy."""
    j = np.arange(1, GRID_SIZE + 1) / GRID_SIZE
    return (S_MAX[np.dtype(dtype)] * j * np.sqrt(j)).astype(dtype)


def _grid_constants(grid: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Returns (t, exp(-s)) at the grid points, in the grid's dtype, the same on every CPU.

    numpy's float32 exp and expm1 dispatch to CPU-specific kernels (AVX-512 or not) that differ
    in the last bit, and a flat profile's grid argmax can follow that bit; the C library's
    float64 functions, rounded once to the grid's dtype, do not differ.
    """
    t = [-math.expm1(-float(s)) for s in grid]
    e = [math.exp(-float(s)) for s in grid]
    return np.asarray(t).astype(grid.dtype), np.asarray(e).astype(grid.dtype)


def _log_q(s: jax.Array, z: jax.Array, w: jax.Array) -> jax.Array:
    """Returns log(1 - t z) [n] at t = 1 - exp(-s), accurate at both ends; s a traced scalar."""
    t = -jnp.expm1(-s)
    small = t < 0.5
    # Both branches are evaluated; each argument is kept in its own safe domain.
    near = jnp.log1p(-jnp.where(small, t, 0.0) * z)
    far = jnp.log(jnp.where(small, 1.0, w + jnp.exp(-s) * z))
    return jnp.where(small, near, far)


def _profile_from_mean_log(t: jax.Array, xbar: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Returns (loglik / n, xi, sigma) of the constrained profile, in units of y_max."""
    xi = jnp.maximum(xbar, -1.0)
    sigma = -xi / t
    return -jnp.log(sigma) - (1.0 / xi + 1.0) * xbar, xi, sigma


def _grid_profile(z: jax.Array, w: jax.Array, n: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Returns the profile log-likelihood / n and mean(log(1 - t z)) on the grid, [GRID_SIZE]."""
    grid = s_grid(z.dtype)
    near = grid < _LOG2  # static: each grid point evaluates one branch only
    t, e = _grid_constants(grid)
    parts = []
    if near.any():
        tn = jnp.asarray(t[near])
        parts.append(jnp.sum(jnp.log1p(-tn[:, None] * z[None, :]), axis=1))
    if (~near).any():
        ef = jnp.asarray(e[~near])
        parts.append(jnp.sum(jnp.log(w[None, :] + ef[:, None] * z[None, :]), axis=1))
    xbar = jnp.concatenate(parts) / n
    ll, _, _ = _profile_from_mean_log(jnp.asarray(t), xbar)
    # Where the profile wants xi < -1 it is n log t, below the xi = -1 candidate: such points must
    # not draw the refinement away from an interior local maximum.
    return jnp.where(jnp.isnan(ll) | (xbar < -1.0), -jnp.inf, ll), xbar


def _profile_derivatives(
    s: jax.Array, z: jax.Array, w: jax.Array, n: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """Returns (d/ds, d2/ds2) of the profile log-likelihood / n at s (unclamped branch)."""
    t = -jnp.expm1(-s)
    e = jnp.exp(-s)
    small = t < 0.5
    q = jnp.where(small, 1.0 - t * z, w + e * z)
    xb = jnp.sum(_log_q(s, z, w)) / n
    r = z / q
    d1 = -jnp.sum(r) / n  # d xbar / dt
    d2 = -jnp.sum(r * r) / n  # d2 xbar / dt2
    clamped = xb < -1.0
    xb_safe = jnp.where(clamped | (xb == 0), -1.0, xb)
    g_t = 1.0 / t - d1 / xb_safe - d1
    h_t = -1.0 / t**2 - (d2 * xb_safe - d1 * d1) / xb_safe**2 - d2
    # Clamped at xi = -1 the profile is log t.
    g_t = jnp.where(clamped, 1.0 / t, g_t)
    h_t = jnp.where(clamped, -1.0 / t**2, h_t)
    return e * g_t, e * e * h_t - e * g_t


def _search(
    z: jax.Array, w: jax.Array, n: jax.Array
) -> tuple[tuple[jax.Array, jax.Array, jax.Array, jax.Array], NewtonState]:
    """Returns the best interior profile point (loglik / n, xi, sigma, on_edge) in y_max units,
    and the refinement's `NewtonState`.

    A fixed grid picks the basin; `_newton` on the profile's derivative refines it inside the
    best grid point's bracket with a fixed number of steps.
    """
    grid_np = s_grid(z.dtype)
    grid = jnp.asarray(grid_np)
    ll_grid, xbar_grid = _grid_profile(z, w, n)
    k = jnp.argmax(ll_grid)
    padded = jnp.concatenate([jnp.asarray([grid_np[0] * 1e-2], z.dtype), grid])
    lo, hi = padded[k], padded[jnp.minimum(k + 2, GRID_SIZE)]

    slope = lambda s: _profile_derivatives(s, z, w, n)
    s, state = _newton(slope, grid[k], lo, hi, NEWTON_ITERS)
    t = -jnp.expm1(-s)
    ll, xi, sigma = _profile_from_mean_log(t, jnp.sum(_log_q(s, z, w)) / n)
    ll = jnp.where(jnp.isnan(ll), -jnp.inf, ll)
    better = ll >= ll_grid[k]
    t_k = -jnp.expm1(-grid[k])
    _, xi_k, sigma_k = _profile_from_mean_log(t_k, xbar_grid[k])
    on_edge = k == GRID_SIZE - 1
    return (
        jnp.where(better, ll, ll_grid[k]),
        jnp.where(better, xi, xi_k),
        jnp.where(better, sigma, sigma_k),
        on_edge,
    ), state


def _scaled_log1p(
    y: jax.Array, xi: jax.Array, sig: jax.Array
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """Returns (r, log1p(a), log1p(a) / a, inside) for r = y / sig, a = xi r, double-where safe.

    log1p(a) / a -> 1 as a -> 0, which keeps every GPD expression continuous at xi = 0; outside
    the support (a <= -1) the first two are evaluated at a = 0 and `inside` is False.
    """
    r = y / sig
    a = xi * r
    inside = a > -1.0
    a_safe = jnp.where(inside, a, 0.0)
    # Near a = 0 the series 1 - a/2 + a^2/3 (error a^3/4 < 1e-12) keeps the value and, unlike a
    # constant 1, the slope -1/2: d/dxi of log S at xi = 0 is r^2 / 2, not 0.
    small = jnp.abs(a_safe) < 1e-4
    log1p = jnp.log1p(a_safe)
    series = 1.0 - a_safe / 2.0 + a_safe * a_safe / 3.0
    return r, log1p, jnp.where(small, series, log1p / jnp.where(small, 1.0, a_safe)), inside


def loglik(xi: jax.Array, sigma: jax.Array, y: jax.Array, mask: jax.Array) -> jax.Array:
    """Returns the GPD log-likelihood of excesses `y` [n] (entries where `mask` is False ignored).

    -inf when an excess lies beyond the endpoint; continuous at xi = 0. For one problem; vmap
    for batches.
    """
    sig = jnp.where(sigma > 0, sigma, 1.0)
    r, log1p, ratio, inside = _scaled_log1p(y, xi, sig)
    # (1 + 1/xi) log1p(a) = log1p(a) + r log1p(a)/a, which is r at xi = 0.
    term = log1p + r * ratio
    # At xi = -1 the density is uniform on [0, sigma], endpoint included.
    uniform = xi == -1.0
    term = jnp.where(uniform, 0.0, term)
    inside = jnp.where(uniform, (y >= 0) & (y <= sig), inside)
    per = jnp.where(inside, -jnp.log(sig) - term, -jnp.inf)
    return jnp.sum(jnp.where(mask, per, 0.0))


def _loglik_params(params: jax.Array, y: jax.Array, mask: jax.Array) -> jax.Array:
    """Log-likelihood in (xi, log sigma), for the implicit derivative of an interior optimum."""
    xi, log_sigma = params
    sigma = jnp.exp(log_sigma)
    a = xi * y / sigma
    a = jnp.where(mask & (a > -1.0), a, 0.0)
    per = -log_sigma - (1.0 / xi + 1.0) * jnp.log1p(a)
    return jnp.sum(jnp.where(mask, per, 0.0))


@jax.custom_jvp
def _implicit_interior(
    xi_hat: jax.Array, sigma_hat: jax.Array, y: jax.Array, weight: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """Returns (xi_hat, sigma_hat): an interior optimum, with implicit tangents in `y`.

    The primal is the identity (free in the forward pass). The tangent is the implicit-function
    theorem's -H^-1 (d grad / dy) y_dot, in (xi, log sigma), H the Hessian at the optimum; zero
    where H is not negative definite. `weight` is the float mask.
    """
    del y, weight
    return xi_hat, sigma_hat


@_implicit_interior.defjvp
def _implicit_interior_jvp(
    primals: tuple[jax.Array, ...], tangents: tuple[jax.Array, ...]
) -> tuple[tuple[jax.Array, jax.Array], tuple[jax.Array, jax.Array]]:
    xi_hat, sigma_hat, y, weight = primals
    y_dot = tangents[2]
    xi_safe = jnp.where((xi_hat < 0) & (xi_hat > -1), xi_hat, -0.5)
    sig_safe = jnp.where(sigma_hat > 0, sigma_hat, 1.0)
    p_hat = jnp.stack([xi_safe, jnp.log(sig_safe)])
    mask = weight > 0
    grad_p = lambda yy: jax.grad(_loglik_params)(p_hat, yy, mask)
    _, g_dot = jax.jvp(grad_p, (y,), (y_dot,))
    h = jax.hessian(_loglik_params)(p_hat, y, mask)
    det = h[0, 0] * h[1, 1] - h[0, 1] * h[1, 0]
    ok = (h[0, 0] < 0) & (det > 0) & jnp.isfinite(det)
    det_safe = jnp.where(ok, det, 1.0)
    hinv = jnp.stack([jnp.stack([h[1, 1], -h[0, 1]]), jnp.stack([-h[1, 0], h[0, 0]])]) / det_safe
    d = jnp.where(ok, -(hinv @ g_dot), 0.0)
    return (xi_hat, sigma_hat), (d[0], sigma_hat * d[1])


def _in_max_units(
    y: jax.Array, mask: jax.Array
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array, jax.Array, jax.Array, jax.Array, jax.Array]:
    """Returns the masked excesses in units of the largest one, as both searches need them.

    Returns (y, n, n_safe, y_max, ok, scale, z, w): `y` zeroed at padding; n excesses (n_safe
    >= 1 for divisions); `ok` when some excess is positive; `scale` = y_max (1 when not ok), a
    constant for the search (`stop_gradient`); z = y / scale and w = 1 - z computed as
    (scale - y) / scale so it keeps precision near the maximum (1 at padding).
    """
    dtype = y.dtype
    y = jnp.where(mask, y, 0.0)
    n = jnp.sum(mask).astype(dtype)
    y_max = jnp.max(y)
    ok = (n > 0) & (y_max > 0)
    n_safe = jnp.where(n > 0, n, 1.0)
    scale = jax.lax.stop_gradient(jnp.where(ok, y_max, 1.0))
    yz = jax.lax.stop_gradient(y)
    z = jnp.where(mask, yz / scale, 0.0)
    w = jnp.where(mask, (scale - yz) / scale, 1.0)
    return y, n, n_safe, y_max, ok, scale, z, w


def fit(y: jax.Array, mask: jax.Array) -> GPDFit:
    """Fits a GPD with -1 <= xi <= 0 by maximum likelihood to the excesses of one problem.

    Args:
      y: [n] excesses over the threshold (>= 0 where masked in; any finite value elsewhere).
      mask: [n] bool, which entries are real excesses.

    Returns:
      A `GPDFit` of scalars. Batch with `jax.vmap(fit)` (or use `fit_batch`).
    """
    dtype = y.dtype
    y, n, n_safe, y_max, ok, scale, z, w = _in_max_units(y, mask)

    m1 = jnp.sum(z) / n_safe
    m2 = jnp.sum(z * z) / n_safe
    cv_ge_1 = m2 >= 2.0 * m1 * m1

    # Candidates, log-likelihood per excess in y_max units.
    m1_safe = jnp.where(m1 > 0, m1, 1.0)
    ll_exp = -jnp.log(m1_safe) - 1.0
    ll_unif = jnp.zeros((), dtype)
    (ll_int, xi_int, sig_int, on_edge), newton = _search(z, w, n_safe)
    ll_int = jnp.where(cv_ge_1 | jnp.isnan(ll_int), -jnp.inf, ll_int)

    choose_exp = (ll_exp >= ll_int) & (ll_exp >= ll_unif)
    choose_unif = ~choose_exp & (ll_unif >= ll_int)
    choose_int = ~choose_exp & ~choose_unif

    xi_int = jax.lax.stop_gradient(xi_int)
    sig_int_y = jax.lax.stop_gradient(sig_int * scale)
    # Keep the largest excess inside the support after rounding (matters in float32 only).
    eps = jnp.finfo(dtype).eps  # type: ignore[no-untyped-call]  # ml_dtypes' finfo: untyped
    sig_int_y = jnp.maximum(sig_int_y, -xi_int * scale * (1.0 + 4.0 * eps))
    xi_i, sig_i = _implicit_interior(xi_int, sig_int_y, y, mask.astype(dtype))
    sigma_exp = jnp.sum(y) / n_safe
    xi = jnp.where(choose_exp, 0.0, jnp.where(choose_unif, -1.0, xi_i))
    sigma = jnp.where(choose_exp, sigma_exp, jnp.where(choose_unif, y_max, sig_i))

    ll_z = jnp.where(choose_exp, ll_exp, jnp.where(choose_unif, ll_unif, ll_int))
    ll = jax.lax.stop_gradient(n * (ll_z - jnp.log(scale)))

    # Degenerate input: no excess, or every excess equal to 0 (density unbounded).
    xi = jnp.where(ok, xi, jnp.where(n > 0, -1.0, 0.0))
    sigma = jnp.where(ok, sigma, 0.0)
    ll = jnp.where(ok, ll, jnp.where(n > 0, jnp.inf, 0.0))
    xi_neg = jnp.where(xi < 0, xi, -1.0)
    endpoint = jnp.where(xi < 0, sigma / -xi_neg, jnp.where(ok, jnp.inf, 0.0))
    newton_converged = ~(ok & choose_int) | newton.converged
    converged = ok & ~(choose_int & on_edge) & jnp.isfinite(ll) & newton_converged
    return GPDFit(
        xi=xi.astype(dtype),
        sigma=sigma.astype(dtype),
        loglik=ll.astype(dtype),
        endpoint=endpoint.astype(dtype),
        n=n,
        at_xi0=ok & choose_exp,
        at_xi_minus1=ok & choose_unif,
        converged=converged,
        newton_converged=newton_converged,
    )


fit_batch = jax.jit(jax.vmap(fit))
fit_batch.__doc__ = """Fits [Q, n] padded excesses with a [Q, n] mask; returns a `GPDFit` of [Q]."""


def log_survival(y: ArrayLike, xi: jax.Array, sigma: jax.Array) -> jax.Array:
    """Returns log P(Y > y) under GPD(xi, sigma): continuous at xi = 0, -inf beyond the endpoint.

    Broadcasts `y` against `xi` and `sigma`; differentiable with finite gradients everywhere
    (double-where guards at xi = 0, at the endpoint and beyond it). sigma = 0 (no fit) gives
    -inf for y > 0 and 0 for y <= 0.
    """
    y = jnp.maximum(y, 0.0)
    ok = sigma > 0
    sig = jnp.where(ok, sigma, 1.0)
    r, _, ratio, inside = _scaled_log1p(y, xi, sig)
    # -log1p(a) / xi = -r log1p(a) / a, continuous at xi = 0.
    out = jnp.where(inside, -r * ratio, -jnp.inf)
    return jnp.where(ok, out, jnp.where(y > 0, -jnp.inf, 0.0))


def log_survival_below(y: ArrayLike, c: ArrayLike, xi: jax.Array, sigma: jax.Array) -> jax.Array:
    """Returns log P(Y > y | Y <= c) under GPD(xi, sigma): the tail conditioned on a bound c > 0.

    log((G(y) - G(c)) / (1 - G(c))), G the survival (`log_survival`); -inf at y >= c and beyond
    the endpoint; `log_survival` where G(c) = 0 (a bounded tail whose endpoint lies below c).
    Broadcasts; finite gradients (double-where guards where the difference vanishes).
    """
    log_y = log_survival(y, xi, sigma)
    log_c = log_survival(c, xi, sigma)
    d = log_c - log_y  # log(G(c) / G(y)) < 0 strictly inside (nan where both are -inf)
    inside = d < 0.0
    d_safe = jnp.where(inside, d, -1.0)
    log_c_safe = jnp.where(log_c < 0.0, log_c, -1.0)  # c > 0 keeps G(c) < 1 where sigma > 0
    out = log_y + jnp.log(-jnp.expm1(d_safe)) - jnp.log1p(-jnp.exp(log_c_safe))
    return jnp.where(inside, out, -jnp.inf)


def grid_fit(y: jax.Array, mask: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Returns (xi, sigma) maximising the likelihood over `fit`'s search grid and its boundaries.

    `fit` without the Newton refinement (nor derivatives): the best of the grid points of the
    profile in s = -log(1 - t), the exponential (xi = 0) and the uniform (xi = -1). Closed form
    per grid point, so cheap to compile and run, e.g. to screen many thresholds; (0, 0) without
    a positive excess.
    """
    _, n, n_safe, y_max, ok, scale, z, w = _in_max_units(y, mask)
    m1 = jnp.sum(z) / n_safe
    ll_exp = -jnp.log(jnp.where(m1 > 0, m1, 1.0)) - 1.0
    ll_grid, xbar = _grid_profile(z, w, n_safe)
    k = jnp.argmax(ll_grid)
    _, xi_k, sig_k = _profile_from_mean_log(-jnp.expm1(-jnp.asarray(s_grid(z.dtype))[k]), xbar[k])
    best = jnp.argmax(jnp.stack([ll_exp, ll_grid[k], jnp.zeros_like(ll_exp)]))
    xi = jnp.stack([0.0, xi_k, -1.0]).astype(z.dtype)[best]
    sigma = jnp.stack([m1, sig_k, 1.0]).astype(z.dtype)[best] * scale
    # Keep the largest excess inside the support after rounding (as `fit` does).
    eps = jnp.finfo(z.dtype).eps  # type: ignore[no-untyped-call]  # ml_dtypes' finfo: untyped
    sigma = jnp.maximum(sigma, -xi * scale * (1.0 + 4.0 * eps))
    return jnp.where(ok, xi, 0.0), jnp.where(ok, sigma, 0.0)


def anderson_darling(y: jax.Array, mask: jax.Array, xi: jax.Array, sigma: jax.Array) -> jax.Array:
    """Returns the Anderson-Darling statistic A^2 of excesses `y` [n] against GPD(xi, sigma).

    A^2 = -n - (1/n) sum_i [(2i - 1) log F(y_(i)) + (2n + 1 - 2i) log(1 - F(y_(i)))] over the
    excesses in ascending order. `y` must hold its masked-in excesses as a prefix in descending
    order (as `evt.excesses` returns them); log F and log(1 - F) are floored at -50 so an
    excess at or beyond a fitted endpoint gives a large finite statistic, not inf. 0 with no
    excess. With (xi, sigma) fitted to the same excesses its null distribution depends little on
    xi or n (Choulakian and Stephens 2001; `TailSettings.ad_critical`).
    """
    n = jnp.sum(mask).astype(y.dtype)
    log_s = log_survival(jnp.where(mask, y, 0.0), xi, sigma)
    log_s = jnp.maximum(log_s, -50.0)
    log_f = jnp.maximum(jnp.log(-jnp.expm1(jnp.minimum(log_s, -1e-30))), -50.0)
    rank = n - jnp.arange(y.shape[0], dtype=y.dtype)  # ascending rank i of the descending prefix
    terms = (2.0 * rank - 1.0) * log_f + (2.0 * n + 1.0 - 2.0 * rank) * log_s
    total = jnp.sum(jnp.where(mask, terms, 0.0))
    return jnp.where(n > 0, -n - total / jnp.maximum(n, 1.0), 0.0)


def xi_standard_error(xi: ArrayLike, n: ArrayLike) -> jax.Array:
    """Returns the asymptotic standard error of xi, (1 + xi) / sqrt(n) (Smith 1985, xi > -1/2).

    Floored at 1 / sqrt(n) / 4 so that fits in the non-regular range (xi <= -1/2) still get a
    usable, if rough, scale for threshold-stability checks.
    """
    n_safe = jnp.maximum(n, 1.0)
    return jnp.maximum(1.0 + xi, 0.25) / jnp.sqrt(n_safe)


# `_newton`'s scan carry: (s, lo, hi, stopped, signs, iterations, error).
_Carry = tuple[jax.Array, jax.Array, jax.Array, jax.Array, jax.Array, jax.Array, jax.Array]


def _newton(
    slope: Callable[[jax.Array], tuple[jax.Array, jax.Array]],
    s0: jax.Array,
    lo: ArrayLike,
    hi: ArrayLike,
    steps: int,
) -> NewtonStep:
    """Returns the root of a decreasing g by a safeguarded Newton iteration from s0 in [lo, hi],
    with its `NewtonState`.

    `slope(s)` returns (g, h = g'). A step that leaves the bracket, or where h >= 0, bisects it
    instead. Once the Newton step from s is below `NEWTON_TOL` (relative), s is the root and
    stays: there float32 rounding makes the sign of g noisy (XLA may even evaluate the sum twice,
    rounded differently, for the bracket and for the step), so a step a hair outside the bracket
    would bisect a stale bracket and leave the root.
    """
    dtype = s0.dtype

    def step(carry: _Carry, _: None) -> tuple[_Carry, None]:
        s, lo, hi, stopped, signs, iterations, error = carry
        g, h = slope(s)
        lo = jnp.where(g > 0, s, lo)
        hi = jnp.where(g > 0, hi, s)
        d = g / jnp.where(h < 0, h, -1.0)
        s_new = s - d
        good = (h < 0) & (s_new >= lo) & (s_new <= hi) & jnp.isfinite(s_new)
        done = stopped | ((h < 0) & (jnp.abs(d) <= NEWTON_TOL * (1.0 + jnp.abs(s))))
        s_next = jnp.where(done, s, jnp.where(good, s_new, 0.5 * (lo + hi)))
        # The state (not the iterate): the steps until the stop, the error left at the last.
        signs = signs | jnp.stack([g > 0, g <= 0])
        width = jnp.where(signs.all(), hi - lo, jnp.inf)
        error = jnp.minimum(jnp.where(h < 0, jnp.abs(d), jnp.inf), width) / (1.0 + jnp.abs(s))
        iterations = iterations + (~stopped).astype(jnp.int32)
        return (s_next, lo, hi, done, signs, iterations, error), None

    signs = jnp.zeros((2,), bool)  # g > 0 seen, g <= 0 seen: the root is bracketed
    lo, hi = jnp.asarray(lo, dtype), jnp.asarray(hi, dtype)
    stopped, iterations = jnp.asarray(False), jnp.asarray(0, jnp.int32)
    init = (s0, lo, hi, stopped, signs, iterations, jnp.asarray(jnp.inf, dtype))
    (s, _, _, _, _, iterations, error), _ = jax.lax.scan(step, init, None, length=steps)
    return NewtonStep(s, NewtonState(error <= CONVERGED_TOL, iterations, error))


def profile_in_xi(y: jax.Array, mask: jax.Array, xis: jax.Array) -> Profile:
    """Returns the scale and log-likelihood maximised over sigma at each fixed shape in `xis`.

    For fixed xi in (-1, 0) the log-likelihood in t = -xi y_max / sigma is log t + a mean(log(1 -
    t z)) (times n, up to constants), a = -1/xi - 1 >= 0: concave, so a safeguarded Newton
    iteration on its derivative (divisions only) finds the unique optimum with the support
    constraint (t < 1) built in. xi = 0 and xi = -1 use their closed forms (sigma = mean(y) and
    sigma = max(y)). The per-xi scales carry no gradient (`stop_gradient`); the
    log-likelihoods are differentiable in `y` at those scales, which by the envelope theorem is
    the profile's exact gradient.

    Args:
      y: [n] excesses; mask: [n] bool.
      xis: [X] shapes in [-1, 0].

    Returns:
      A `Profile` of [X] arrays; sigma = 0 and loglik = 0 when there is no positive excess.
    """
    dtype = y.dtype
    y, n, n_safe, y_max, ok, scale, z, w = _in_max_units(y, mask)
    s_max = S_MAX[np.dtype(dtype)]

    def one(xi: jax.Array) -> tuple[jax.Array, jax.Array]:
        interior = (xi < 0) & (xi > -1)
        a = jnp.where(interior, -1.0 / jnp.where(interior, xi, -0.5) - 1.0, 1.0)

        def slope(s: jax.Array) -> tuple[jax.Array, jax.Array]:
            t = -jnp.expm1(-s)
            e = jnp.exp(-s)
            q = jnp.where(t < 0.5, 1.0 - t * z, w + e * z)
            r = z / q
            g_t = 1.0 / t - a * jnp.sum(r) / n_safe
            h_t = -1.0 / t**2 - a * jnp.sum(r * r) / n_safe
            return e * g_t, e * e * h_t - e * g_t

        # Start near the root of 1/t = a mean(z) / (1 - t) for a typical excess.
        s, state = _newton(slope, jnp.asarray(1.0, dtype), 1e-6, s_max, PROFILE_STEPS)
        t = -jnp.expm1(-s)
        return jnp.where(interior, -xi / t, 1.0), ~interior | state.converged

    sig_z, converged = jax.vmap(one)(xis)
    sig_z = jnp.where(xis == 0, jnp.sum(z) / n_safe, jnp.where(xis == -1, 1.0, sig_z))
    sigma = jax.lax.stop_gradient(sig_z * scale)
    eps = jnp.finfo(dtype).eps  # type: ignore[no-untyped-call]  # ml_dtypes' finfo: untyped
    sigma = jnp.maximum(sigma, -xis * scale * (1.0 + 4.0 * eps))
    ll = jax.vmap(lambda xi, sig: loglik(xi, sig, y, mask))(xis, sigma)
    sigma = jnp.where(ok, sigma, 0.0)
    ll = jnp.where(ok, ll, 0.0)
    return Profile(sigma, ll, ~ok | converged)


def profile_in_xi_heavy(y: jax.Array, mask: jax.Array, xis: jax.Array) -> Profile:
    """`profile_in_xi` for heavy tails, fixed shapes xi > 0 (unbounded support).

    With tau = xi / sigma and s = log(tau y_max), the log-likelihood is n s - a sum log(1 +
    exp(s) z_i) up to constants, a = 1 + 1/xi > 1: concave in s (its second derivative is
    -a sum p_i (1 - p_i), p_i = sigmoid(s + log z_i)), so the safeguarded Newton iteration on
    n - a sum p_i finds the unique optimum. Cosine scores are bounded, so the limiting tail has xi
    <= 0; at practical depths real embeddings' tails fit near or beyond xi = 0 (docs/estimators.md),
    and an estimator confined to xi <= 0 is biased short where the truth sits at the bound.

    Args:
      y: [n] excesses; mask: [n] bool.
      xis: [X] shapes > 0.

    Returns:
      A `Profile` of [X] arrays; sigma = 0 and loglik = 0 when there is no positive excess.
    """
    dtype = y.dtype
    y, n, n_safe, y_max, ok, scale, z, w = _in_max_units(y, mask)
    log_z = jnp.log(jnp.where(mask & (z > 0), z, 1.0))
    use = mask & (z > 0)
    mean_z = jnp.sum(z) / n_safe

    def one(xi: jax.Array) -> tuple[jax.Array, jax.Array]:
        a = 1.0 + 1.0 / xi

        def slope(s: jax.Array) -> tuple[jax.Array, jax.Array]:
            p = jax.nn.sigmoid(s + log_z)
            g = n_safe - a * jnp.sum(jnp.where(use, p, 0.0))
            return g, -a * jnp.sum(jnp.where(use, p * (1.0 - p), 0.0))

        # Start at the method-of-moments scale, sigma = (1 - xi) mean(y) (xi < 1).
        s0 = jnp.log(xi * (1.0 - jnp.minimum(xi, 0.9)) / jnp.maximum(mean_z, 1e-6))
        s0 = jnp.clip(s0, -30.0, 30.0).astype(dtype)
        s, state = _newton(slope, s0, -30.0, 30.0, HEAVY_STEPS)
        return xi / jnp.exp(s), state.converged  # sigma in units of y_max

    sig_z, converged = jax.vmap(one)(xis)
    sigma = jax.lax.stop_gradient(sig_z * scale)
    ll = jax.vmap(lambda xi, sig: loglik(xi, sig, y, mask))(xis, sigma)
    return Profile(jnp.where(ok, sigma, 0.0), jnp.where(ok, ll, 0.0), ~ok | converged)


def scale_information(y: jax.Array, mask: jax.Array, xis: jax.Array, sigma: jax.Array) -> jax.Array:
    """Returns the observed information of the log-likelihood in log sigma at each (xi, sigma).

    J = -d^2 loglik / d(log sigma)^2 = (1 + xi) sum_i r_i / (1 + xi r_i)^2, r_i = y_i / sigma:
    the curvature Laplace's method integrates the scale out with (`evt.posterior`). Unlike
    the expected information n / (1 + 2 xi) it is finite and positive at an interior profile
    optimum for every xi in (-1, 0], the non-regular range -1 < xi <= -1/2 included, and for the
    heavy tails xi > 0 of `profile_in_xi_heavy`. At xi = 0 it is sum(y) / sigma, n at the
    exponential MLE.

    Args:
      y: [n] excesses; mask: [n] bool; xis: [X] shapes > -1; sigma: [X] scales (> 0
        where there are excesses; 0 gives J = 0).

    Returns:
      [X] J (0 without excesses or where an excess lies at or beyond the endpoint).
    """
    ok = sigma > 0
    r = y[None, :] / jnp.where(ok, sigma, 1.0)[:, None]
    den = 1.0 + xis[:, None] * r
    use = mask[None, :] & ok[:, None] & (den > 0)
    den = jnp.where(use, den, 1.0)
    return (1.0 + xis) * jnp.sum(jnp.where(use, r / (den * den), 0.0), axis=1)
