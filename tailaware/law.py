"""The Binomial scaling law of retrieval under distractors, as differentiable JAX.

For a query with positives sorted by descending score, the j-th positive (1-based) is outranked
by K_j ~ Binomial(N, x_j) of N distractors, where the hardness x_j = P(distractor score > s_j)
does not depend on N, plus F_j non-relevant items of an always-indexed part of the database
(ILIAS: the other instances' positives). Its rank is r_j = j + F_j + K_j (paper Sec. 3, App. A).

The expected-rank map replaces K_j by N x_j:

    AP@k = 1 / min(k, n_pos) * sum_{j : r_j <= k} j / r_j,     r_j = j + F_j + N x_j.

Fed realized fractions K_j / N it is the gallery's exact AP@k; fed population hardness it
predicts AP@k at any N. Everything here is written for one query and `vmap`-ed over queries.

Shapes: Q queries, P positive slots per query (padded; `mask` marks real ones).
"""

from typing import Literal

import jax
import jax.numpy as jnp
from jax.scipy.special import gammaln, xlog1py, xlogy

Truncation = Literal["hard", "smooth"]


def _sorted_offsets(x, mask, n, fixed):
    """Returns (d, valid) sorted so that d = F + N x ascends over the real positives."""
    fixed = jnp.zeros_like(x) if fixed is None else jnp.asarray(fixed, x.dtype)
    d = fixed + n * x
    # Padding sorts last; the double `where` keeps padded slots out of every gradient.
    key = jnp.where(mask, d, jnp.inf)
    order = jnp.argsort(key, stable=True)
    d_safe = jnp.where(mask, d, 0.0)
    return d_safe[order], mask[order]


def _truncate(r, k, truncation, tau):
    if truncation == "hard":
        # Guards float rounding only: r = j + N (K/N) must count when j + K = k exactly.
        eps = jnp.finfo(r.dtype).eps
        return (r <= k * (1.0 + 8.0 * eps)).astype(r.dtype)
    if truncation == "smooth":
        # A logistic step centred half a rank past k: integer ranks <= k weigh ~1 when tau << 1.
        return jax.nn.sigmoid((k + 0.5 - r) / tau)
    raise ValueError(f"truncation must be 'hard' or 'smooth', got {truncation!r}")


def ap_at_k(x, mask, n, k, fixed=None, truncation: Truncation = "hard", tau=1.0):
    """Returns AP@k of one query under the expected-rank map (paper Eq. for R_k).

    Args:
      x: [P] hardness of each positive, in [0, 1] (any order; padding ignored).
      mask: [P] bool, real positives.
      n: gallery size N (scalar; differentiable).
      k: the cut-off (scalar).
      fixed: [P] optional non-relevant items of the always-indexed database above each positive.
      truncation: "hard" is the metric's own indicator r_j <= k (zero gradient across the
        boundary); "smooth" replaces it by sigmoid((k + 0.5 - r_j) / tau), a differentiable
        surrogate for sensitivity work that differs from "hard" only for ranks within a few tau
        of k.
      tau: width of the smooth step, in ranks.

    Returns:
      Scalar AP@k; 0 for a query without positives.
    """
    x = jnp.asarray(x)
    d, valid = _sorted_offsets(x, mask, n, fixed)
    j = jnp.cumsum(valid).astype(x.dtype)
    r = j + d
    r_safe = jnp.where(valid, r, 1.0)
    w = _truncate(r_safe, k, truncation, tau)
    contrib = jnp.where(valid, w * j / r_safe, 0.0)
    n_pos = jnp.sum(valid).astype(x.dtype)
    denom = jnp.maximum(jnp.minimum(k, n_pos), 1.0)
    return jnp.sum(contrib) / denom


def map_at_k(x, mask, n, k, fixed=None, truncation: Truncation = "hard", tau=1.0):
    """Returns (mAP@k, per-query AP@k [Q]) for hardness x [Q, P] at gallery size n."""
    fixed = jnp.zeros_like(x) if fixed is None else jnp.asarray(fixed, x.dtype)
    aps = jax.vmap(lambda xi, mi, fi: ap_at_k(xi, mi, n, k, fi, truncation, tau))(x, mask, fixed)
    return jnp.mean(aps), aps


def realized_ap_at_k(counts, mask, k, fixed=None):
    """Returns the exact AP@k [Q] of a gallery from realized counts K [Q, P] (ranks j + F + K)."""
    counts = jnp.asarray(counts)
    ones = jnp.ones((), counts.dtype) if jnp.issubdtype(counts.dtype, jnp.floating) else 1.0
    x = jnp.where(mask, counts, 0).astype(jnp.result_type(float)) * ones
    return map_at_k(x, mask, 1.0, k, fixed)[1]


def _expected_ap_under(log_pmf_fn, x, mask, n, k, fixed):
    """E[AP@k] for one query when each K_j has log pmf `log_pmf_fn(m, x_j)`, m = 0..k-1.

    AP is a sum over positives, so its expectation needs only each K_j's marginal law: positive
    j contributes j E[1{j + F_j + K_j <= k} / (j + F_j + K_j)]. The j-th positive is the j-th
    smallest in hardness (and fixed count), as in `ap_at_k`.
    """
    fixed = jnp.zeros_like(x) if fixed is None else jnp.asarray(fixed, x.dtype)
    key = jnp.where(mask, fixed + n * x, jnp.inf)
    order = jnp.argsort(key, stable=True)
    xs, fs, valid = jnp.where(mask, x, 0.0)[order], jnp.where(mask, fixed, 0.0)[order], mask[order]
    j = jnp.cumsum(valid).astype(x.dtype)
    m = jnp.arange(int(k), dtype=x.dtype)  # k is static here: the sum runs over K = 0..k-1
    logp = jax.vmap(lambda xj: log_pmf_fn(m, xj))(xs)  # [P, k]
    r = j[:, None] + fs[:, None] + m[None, :]
    term = jnp.where(r <= k, jnp.exp(logp) * j[:, None] / r, 0.0)
    per_pos = jnp.where(valid, jnp.sum(term, axis=1), 0.0)
    n_pos = jnp.sum(valid).astype(x.dtype)
    return jnp.sum(per_pos) / jnp.maximum(jnp.minimum(k, n_pos), 1.0)


def binomial_log_pmf(m, n, x):
    """log P(K = m) for K ~ Binomial(n, x); stable for n up to 1e9 and x down to 0."""
    # log C(n, m) = m log n + sum_{i<m} log1p(-i/n) - log m!, avoiding lgamma(n) cancellation.
    i = jnp.arange(m.shape[0], dtype=m.dtype)
    log_falling = jnp.cumsum(jnp.concatenate([jnp.zeros((1,), m.dtype), jnp.log1p(-i[:-1] / n)]))
    log_choose = m * jnp.log(n) + log_falling - gammaln(m + 1.0)
    out = log_choose + xlogy(m, x) + xlog1py(n - m, -x)
    return jnp.where(m <= n, out, -jnp.inf)


def poisson_log_pmf(m, lam):
    """log P(K = m) for K ~ Poisson(lam)."""
    return xlogy(m, lam) - lam - gammaln(m + 1.0)


def expected_ap_binomial(x, mask, n, k, fixed=None):
    """Returns the exact E[AP@k] of one query under K_j ~ Binomial(n, x_j) (k static)."""
    return _expected_ap_under(lambda m, xj: binomial_log_pmf(m, n, xj), x, mask, n, k, fixed)


def expected_ap_poisson(x, mask, n, k, fixed=None):
    """Returns E[AP@k] of one query under the rare-event limit K_j ~ Poisson(n x_j) (k static)."""
    return _expected_ap_under(lambda m, xj: poisson_log_pmf(m, n * xj), x, mask, n, k, fixed)


def top1_survival(x, n, exact: bool = False):
    """Returns P(no distractor outranks a positive of hardness x): exp(-n x), or (1 - x)^n."""
    return jnp.exp(xlog1py(n, -x)) if exact else jnp.exp(-n * x)


def recall_at_k(x, mask, n, k, fixed=None):
    """Returns the share of a query's positives whose expected rank is <= k (one query)."""
    d, valid = _sorted_offsets(jnp.asarray(x), mask, n, fixed)
    j = jnp.cumsum(valid).astype(d.dtype)
    hit = _truncate(jnp.where(valid, j + d, 1.0), k, "hard", 1.0)
    return jnp.sum(jnp.where(valid, hit, 0.0)) / jnp.maximum(jnp.sum(valid), 1).astype(d.dtype)


def top1_accuracy(x, mask, n, fixed=None):
    """Returns P(the first retrieved item is a positive) for one query, in the Poisson form.

    Every item above the best positive is above all others too, so the query scores a hit
    exactly when its best positive has no fixed non-relevant item above it (F_1 = 0) and no
    distractor (probability exp(-N x_1)).
    """
    x = jnp.asarray(x)
    fixed = jnp.zeros_like(x) if fixed is None else jnp.asarray(fixed, x.dtype)
    best = jnp.argmin(jnp.where(mask, fixed + n * x, jnp.inf))
    hit = mask[best] & (fixed[best] == 0)
    return jnp.where(hit, jnp.exp(-n * jnp.where(mask[best], x[best], 0.0)), 0.0)
