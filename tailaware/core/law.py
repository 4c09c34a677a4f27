"""The Binomial scaling law of retrieval under distractors, as differentiable JAX.

For a query with positives sorted by descending score, the j-th positive (1-based) is outranked
by K_j ~ Binomial(N, x_j) of N distractors, where the hardness x_j = P(distractor score > s_j)
does not depend on N, plus F_j non-relevant items of an always-indexed part of the database
(ILIAS: the other instances' positives). Its rank is r_j = j + F_j + K_j (paper Sec. 3, App. A).

The expected-rank map replaces K_j by N x_j:

    AP@k = 1 / min(k, n_pos) * sum_{j : r_j <= k} j / r_j,     r_j = j + F_j + N x_j.

Fed realized fractions K_j / N it is the gallery's exact AP@k; fed population hardness it
predicts AP@k at any N. Its predictions are biased low when many positives have N x_j between 1
and k (j / r_j is convex in K_j: Jensen), so predictions use the expectation itself,
`expected_ap`: E[AP@k] = 1 / min(k, n_pos) sum_j j E[1{a_j + K_j <= k} / (a_j + K_j)], with
a_j = j + F_j and K_j ~ Poisson(N x_j), read from a precomputed table (`gain_table`), and
averaged over a posterior of the hardness given as weighted atoms. The map stays the
differentiable surrogate for sensitivity work. Everything here is written for one query and
`vmap`-ed over queries.

Shapes: Q queries, P positive slots per query (padded; `mask` marks real ones).
"""

import functools
from collections.abc import Callable, Iterable, Sequence
from typing import Literal, TypeAlias

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.special import gammaln, xlog1py, xlogy
from jax.typing import ArrayLike, DTypeLike
from scipy import special

from tailaware.core import metrics

Truncation = Literal["hard", "smooth"]
# A positive's log pmf of K at counts m [k]: (m, x_j) -> [k].
LogPmf: TypeAlias = Callable[[jax.Array, jax.Array], jax.Array]
# A number, or a traced scalar (a gallery size or a cut-off under `jit` / `vmap` / `grad`).
Scalar: TypeAlias = float | jax.Array
# `_table_rows`'s (row i, fraction, inside), each shaped like the Poisson means.
Rows: TypeAlias = tuple[jax.Array, jax.Array, jax.Array]


def _truncate(r: jax.Array, k: Scalar, truncation: Truncation, tau: Scalar) -> jax.Array:
    if truncation == "hard":
        # Guards float rounding only: r = j + N (K/N) must count when j + K = k exactly.
        eps = jnp.finfo(r.dtype).eps  # type: ignore[no-untyped-call]  # ml_dtypes' finfo: untyped
        return (r <= k * (1.0 + 8.0 * eps)).astype(r.dtype)
    if truncation == "smooth":
        # A logistic step centred half a rank past k: integer ranks <= k weigh ~1 when tau << 1.
        return jax.nn.sigmoid((k + 0.5 - r) / tau)
    raise ValueError(f"truncation must be 'hard' or 'smooth', got {truncation!r}")


def ap_at_k(
    x: ArrayLike,
    mask: ArrayLike,
    n: Scalar,
    k: Scalar,
    fixed: ArrayLike | None = None,
    *,
    truncation: Truncation = "hard",
    tau: Scalar = 1.0,
) -> jax.Array:
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
    xs, fs, valid, j = _by_rank(jnp.asarray(x), jnp.asarray(mask), n, fixed)
    r = j + fs + n * xs
    r_safe = jnp.where(valid, r, 1.0)
    w = _truncate(r_safe, k, truncation, tau)
    return _mean_precision(jnp.where(valid, w * j / r_safe, 0.0), valid, k)


def map_at_k(
    x: jax.Array,
    mask: ArrayLike,
    n: Scalar,
    k: Scalar,
    fixed: ArrayLike | None = None,
    *,
    truncation: Truncation = "hard",
    tau: Scalar = 1.0,
) -> tuple[jax.Array, jax.Array]:
    """Returns (mAP@k, per-query AP@k [Q]) for hardness x [Q, P] at gallery size n."""
    fixed = jnp.zeros_like(x) if fixed is None else jnp.asarray(fixed, x.dtype)

    def one(xi: jax.Array, mi: ArrayLike, fi: jax.Array) -> jax.Array:
        return ap_at_k(xi, mi, n, k, fi, truncation=truncation, tau=tau)

    aps = jax.vmap(one)(x, mask, fixed)
    return jnp.mean(aps), aps


def realized_ap_at_k(
    counts: ArrayLike, mask: ArrayLike, k: Scalar, fixed: ArrayLike | None = None
) -> jax.Array:
    """Returns the exact AP@k [Q] of a gallery from realized counts K [Q, P] (ranks j + F + K)."""
    counts = jnp.asarray(counts)
    ones = jnp.ones((), counts.dtype) if jnp.issubdtype(counts.dtype, jnp.floating) else 1.0
    x = jnp.where(mask, counts, 0).astype(jnp.result_type(float)) * ones
    return map_at_k(x, mask, 1.0, k, fixed)[1]


def _expected_ap_under(
    log_pmf_fn: LogPmf,
    x: jax.Array,
    mask: jax.Array,
    n: Scalar,
    k: int,
    *,
    fixed: ArrayLike | None,
) -> jax.Array:
    """E[AP@k] for one query when each K_j has log pmf `log_pmf_fn(m, x_j)`, m = 0..k-1.

    AP is a sum over positives, so its expectation needs only each K_j's marginal law: positive
    j contributes j E[1{j + F_j + K_j <= k} / (j + F_j + K_j)]. The j-th positive is the j-th
    smallest in hardness (and fixed count), as in `ap_at_k`.
    """
    xs, fs, valid, j = _by_rank(x, mask, n, fixed)
    m = jnp.arange(int(k), dtype=x.dtype)  # k is static here: the sum runs over K = 0..k-1
    logp = jax.vmap(lambda xj: log_pmf_fn(m, xj))(xs)  # [P, k]
    r = j[:, None] + fs[:, None] + m[None, :]
    term = jnp.where(r <= k, jnp.exp(logp) * j[:, None] / r, 0.0)
    return _mean_precision(jnp.where(valid, jnp.sum(term, axis=1), 0.0), valid, k)


def _by_rank(
    x: jax.Array, mask: jax.Array, n: Scalar, fixed: ArrayLike | None
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """Returns (x, F, valid, j) [P] ordered by F + n x, padding last; j the 1-based rank."""
    fixed = jnp.zeros_like(x) if fixed is None else jnp.asarray(fixed, x.dtype)
    order = jnp.argsort(jnp.where(mask, fixed + n * x, jnp.inf), stable=True)
    xs, fs, valid = jnp.where(mask, x, 0.0)[order], jnp.where(mask, fixed, 0.0)[order], mask[order]
    return xs, fs, valid, jnp.cumsum(valid).astype(x.dtype)


def _mean_precision(per_pos: jax.Array, valid: jax.Array, k: Scalar) -> jax.Array:
    """Returns sum_j per_pos_j / min(k, n_pos): AP@k from each positive's precision term."""
    n_pos = jnp.sum(valid).astype(per_pos.dtype)
    return jnp.sum(per_pos) / jnp.maximum(jnp.minimum(k, n_pos), 1.0)


def binomial_log_pmf(m: jax.Array, n: Scalar, x: jax.Array) -> jax.Array:
    """log P(K = m) for K ~ Binomial(n, x); stable for n up to 1e9 and x down to 0."""
    # log C(n, m) = m log n + sum_{i<m} log1p(-i/n) - log m!, avoiding lgamma(n) cancellation.
    i = jnp.arange(m.shape[0], dtype=m.dtype)
    log_falling = jnp.cumsum(jnp.concatenate([jnp.zeros((1,), m.dtype), jnp.log1p(-i[:-1] / n)]))
    log_choose = m * jnp.log(n) + log_falling - gammaln(m + 1.0)
    out = log_choose + xlogy(m, x) + xlog1py(n - m, -x)
    return jnp.where(m <= n, out, -jnp.inf)


def poisson_log_pmf(m: ArrayLike, lam: ArrayLike) -> jax.Array:
    """log P(K = m) for K ~ Poisson(lam)."""
    return xlogy(m, lam) - lam - gammaln(m + 1.0)


def expected_ap_binomial(
    x: jax.Array, mask: jax.Array, n: Scalar, k: int, fixed: ArrayLike | None = None
) -> jax.Array:
    """Returns the exact E[AP@k] of one query under K_j ~ Binomial(n, x_j) (k static)."""
    log_pmf = lambda m, xj: binomial_log_pmf(m, n, xj)
    return _expected_ap_under(log_pmf, x, mask, n, k, fixed=fixed)


def expected_ap_poisson(
    x: jax.Array, mask: jax.Array, n: Scalar, k: int, fixed: ArrayLike | None = None
) -> jax.Array:
    """Returns E[AP@k] of one query under the rare-event limit K_j ~ Poisson(n x_j) (k static)."""
    log_pmf = lambda m, xj: poisson_log_pmf(m, n * xj)
    return _expected_ap_under(log_pmf, x, mask, n, k, fixed=fixed)


def top1_survival(x: jax.Array, n: Scalar, exact: bool = False) -> jax.Array:
    """Returns P(no distractor outranks a positive of hardness x): exp(-n x), or (1 - x)^n."""
    return jnp.exp(xlog1py(n, -x)) if exact else jnp.exp(-n * x)


def top1_accuracy(
    x: ArrayLike, mask: ArrayLike, n: Scalar, fixed: ArrayLike | None = None
) -> jax.Array:
    """Returns P(the first retrieved item is a positive) for one query, in the Poisson form.

    Every item above the best positive is above all others too, so the query scores a hit
    exactly when its best positive has no fixed non-relevant item above it (F_1 = 0) and no
    distractor (probability exp(-N x_1)).
    """
    x = jnp.asarray(x)
    mask = jnp.asarray(mask)
    fixed = jnp.zeros_like(x) if fixed is None else jnp.asarray(fixed, x.dtype)
    best = jnp.argmin(jnp.where(mask, fixed + n * x, jnp.inf))
    hit = mask[best] & (fixed[best] == 0)
    return jnp.where(hit, jnp.exp(-n * jnp.where(mask[best], x[best], 0.0)), 0.0)


# The table's grid in log(lambda): below LAMBDA_MIN the Poisson law is a point mass at 0 to
# within LAMBDA_MIN; the upper end is far enough past k that P(K <= k) underflows.
LAMBDA_MIN = 1e-10
TABLE_POINTS = 4096
TABLE_BLOCKS = 32  # row blocks of `gain_table`, each reading only its counts' range


def _lambda_max(k: int) -> float:
    return float(k + 40.0 * np.sqrt(k) + 100.0)


@functools.lru_cache(maxsize=16)
def gain_table(k: int, gain: str = "inverse") -> np.ndarray:
    """Returns h [L, k] float64: h[i, a - 1] = E[1{a + K <= k} g(a + K)], K ~ Poisson(lam_i).

    g is the rank function `metrics.GAINS[gain]` (1 / r for mAP and MRR, 1 for recall,
    precision and hit, 1 / log2(1 + r) for nDCG). lam_i is a log-spaced grid of L =
    TABLE_POINTS points from LAMBDA_MIN to k + 40 sqrt(k) + 100 (`table_lambdas`). Matrix
    products h = pmf @ T with T[m, a - 1] = g(a + m) when a + m <= k, by `TABLE_BLOCKS` blocks of
    rows: a block of means in [lo, hi] reads only the counts m from lo - 40 sqrt(lo) - 60 to
    hi + 40 sqrt(hi) + 60, outside which each row's pmf is below 1e-300 of its mode (most of the
    log-spaced grid lies below lam = 1: 60 of k columns), equal to the single product to 1e-15
    at a fraction of its cost. Cached (read-only).
    """
    lam = table_lambdas(k)
    m = np.arange(k, dtype=np.float64)
    r = m[:, None] + np.arange(1, k + 1)[None, :]  # [k (m), k (a)]
    t = np.where(r <= k, metrics.GAINS[gain](np.minimum(r, k)), 0.0)
    log_factorial = special.gammaln(m + 1.0)
    h = np.empty((lam.size, k))
    for rows in np.array_split(np.arange(lam.size), TABLE_BLOCKS):
        low, top = lam[rows[0]], lam[rows[-1]]
        start = int(np.clip(np.floor(low - 40.0 * np.sqrt(low) - 60.0), 0, k))
        stop = int(np.clip(np.ceil(top + 40.0 * np.sqrt(top) + 60.0), start, k))
        ms = m[start:stop]
        log_pmf = ms[None, :] * np.log(lam[rows])[:, None] - lam[rows][:, None]
        pmf = np.exp(log_pmf - log_factorial[None, start:stop])  # [rows, stop - start]
        h[rows] = pmf @ t[start:stop]
    h.flags.writeable = False
    return h


@functools.lru_cache(maxsize=8)
def rank_tables(
    k: int, gains: tuple[str, ...] = ("inverse",), dtype: DTypeLike = jnp.float32
) -> jax.Array:
    """Returns the `gain_table`s of `gains` for jitted callers: [L, k, G, 2], rows i and i + 1
    paired.

    One gather then reads every gain of a (lambda, rank) cell, and an interpolation between grid
    rows i and i + 1 reads one pair rather than two entries k apart. Passed as an argument
    (`tables=`), the tables are not baked into the compiled program as constants (32 MB per gain
    at k = 1000, costly to trace and compile). Cached.
    """
    if not gains:  # every metric cut per query: no table read
        return jnp.zeros((1, 1, 0, 2), dtype)
    h = np.stack([gain_table(int(k), g) for g in gains], axis=-1)  # [L, k, G]
    return jnp.asarray(np.stack([h, np.concatenate([h[1:], h[-1:]])], axis=-1), dtype)


def table_lambdas(k: int) -> np.ndarray:
    """Returns the [L] log-spaced Poisson means of `gain_table(k, ...)`."""
    return np.geomspace(LAMBDA_MIN, _lambda_max(k), TABLE_POINTS)


def _table_rows(lam: jax.Array, k: int) -> Rows:
    """Returns (row i, fraction, inside) locating Poisson means `lam` on the tables' grid (linear
    in log lambda); `inside` is False beyond the grid's top, where every entry is 0."""
    lo, hi = np.log(LAMBDA_MIN), np.log(_lambda_max(k))
    step = (hi - lo) / (TABLE_POINTS - 1)
    safe = jnp.where(lam > LAMBDA_MIN, lam, LAMBDA_MIN)
    t = jnp.clip((jnp.log(safe) - lo) / step, 0.0, TABLE_POINTS - 1.0)
    i = jnp.minimum(jnp.floor(t).astype(jnp.int32), TABLE_POINTS - 2)
    return i, t - i.astype(t.dtype), lam <= _lambda_max(k)


def _lookup(a: jax.Array, rows: Rows, k: int, tables: jax.Array) -> jax.Array:
    """Returns E[1{a + K <= k} g(a + K)] [..., G] for every gain of `tables` (`rank_tables`).

    `a` holds integer-valued ranks >= 1; a > k gives 0; `rows` = `_table_rows(lam, k)`, lam below
    LAMBDA_MIN reading the first grid row, lam beyond the grid's top giving 0.
    """
    i, frac, inside = rows
    col = jnp.clip(a.astype(jnp.int32) - 1, 0, k - 1)
    pair = tables[i, col]  # [..., G, 2]: rows i and i + 1
    h = (1.0 - frac)[..., None] * pair[..., 0] + frac[..., None] * pair[..., 1]
    return jnp.where(((a <= k) & inside)[..., None], h, 0.0)


def table_gains(metric_list: Iterable[metrics.Metric]) -> tuple[str, ...]:
    """Returns the gains of the metrics cut at the global k, each once, in order: the gains
    `rank_tables` holds for them (a per-query cut-off needs no table)."""
    return tuple(dict.fromkeys(m.gain for m in metric_list if m.cutoff.per_query is None))


def _poisson_sum(a: jax.Array, lam: jax.Array, cut: ArrayLike, gain: str) -> jax.Array:
    """Returns E[1{a + K <= c} g(a + K)] [P], K ~ Poisson(lam) [P], at a cut-off c <= P.

    The direct sum over K = 0..P-1 (P = a's length): with a >= 1 and c <= P no larger K counts.
    """
    m = jnp.arange(a.shape[0], dtype=a.dtype)
    r = jnp.maximum(a[:, None] + m[None, :], 1.0)  # [P (positive), P (K)]
    pmf = jnp.exp(poisson_log_pmf(m[None, :], lam[:, None]))
    return jnp.sum(jnp.where(r <= cut, pmf * metrics.GAINS[gain](r), 0.0), axis=1)


def expected_terms(
    a: jax.Array,
    lam: jax.Array,
    n_pos: jax.Array,
    k: int,
    *,
    keys: Sequence[tuple[str, metrics.Cutoff]],
    gains: Sequence[str],
    rows: Rows | None,
    tables: jax.Array,
) -> jax.Array:
    """Returns E[1{a + K <= c} g(a + K)] [P, T] for each (gain, `Cutoff`) of `keys` [T].

    The one path every metric's expectation takes. At the global k (c = k) the term is read from
    the tables (`rank_tables(k, gains)`, located by `rows` = `_table_rows(lam, k)`); at a per-query
    cut-off c = cutoff(R) <= R (R = `n_pos`, the query's positives) it is the Poisson sum itself
    (`_poisson_sum`), as cheap as a table row for a query's P positives.

    Args:
      a: [P] integer-valued ranks j + F_j >= 1 (padding anything); lam: [P] Poisson means.
      n_pos: the query's positives R (>= 1); k: the global cut-off (static).
      keys: the (gain, cut-off) pairs (static); gains: the tables' gains, in their order.
    """
    h = None if rows is None else _lookup(a, rows, k, tables)  # [P, G]
    cols = []
    for gain, cutoff in keys:
        if cutoff.per_query is not None:
            cols.append(_poisson_sum(a, lam, cutoff.per_query(n_pos), gain))
        elif h is None:
            raise ValueError("a metric cut at the global k needs the tables' `rows`")
        else:
            cols.append(h[:, gains.index(gain)])
    return jnp.stack(cols, axis=-1)


def query_metrics(
    x: jax.Array,
    mask: jax.Array,
    n: Scalar,
    k: int,
    *,
    metric_list: Sequence[metrics.Metric],
    gains: Sequence[str],
    tables: jax.Array,
    fixed: ArrayLike | None = None,
    views: jax.Array | None = None,
) -> jax.Array:
    """Returns E[metric] [V, M] of one query with hardness x [P] (one atom), K_j ~ Poisson(n x_j).

    Each metric is a sum over the positives (`core.metrics.Metric`), so its expectation needs
    only each K_j's marginal law: positive j (the j-th smallest in F_j + n x_j) contributes
    weight(j) E[1{j + F_j + K_j <= c} gain(j + F_j + K_j)], c its cut-off (`expected_terms`). A
    view keeps a subset of the positives and deletes the others from the list (the ILIAS
    report's groups): its positives are ranked among themselves, the non-relevant items above
    each unchanged, and a per-query cut-off follows the view's own positives.

    Args:
      x: [P] hardness; mask: [P] real positives; n: gallery size N; k: the global cut-off
        (static).
      metric_list: the `Metric`s (static); gains: `table_gains(metric_list)`.
      tables: `rank_tables(k, gains)`.
      fixed: [P] always-indexed non-relevant items above each positive.
      views: [V, P] bool subsets of the positives; None: one view, every positive.
    """
    fixed = jnp.zeros_like(x) if fixed is None else jnp.asarray(fixed, x.dtype)
    order = jnp.argsort(jnp.where(mask, fixed + n * x, jnp.inf), stable=True)
    xs, fs, valid = jnp.where(mask, x, 0.0)[order], jnp.where(mask, fixed, 0.0)[order], mask[order]
    lam = n * xs
    rows = _table_rows(lam, int(k)) if gains else None
    views = valid[None] if views is None else views[:, order] & valid[None]
    keys = tuple(dict.fromkeys((m.gain, m.cutoff) for m in metric_list))

    def one_view(v: jax.Array) -> jax.Array:
        j = jnp.cumsum(v).astype(x.dtype)
        n_pos = jnp.sum(v).astype(x.dtype)
        r_pos = jnp.maximum(n_pos, 1.0)
        h = expected_terms(
            j + fs, lam, r_pos, int(k), keys=keys, gains=gains, rows=rows, tables=tables
        )
        out = []
        for m in metric_list:
            terms = jnp.where(v, m.weight(j) * h[:, keys.index((m.gain, m.cutoff))], 0.0)
            norm = jnp.where(n_pos > 0, m.norm(r_pos, int(k)), 1.0)
            out.append(jnp.sum(terms) / norm)
        return jnp.stack(out)

    return jax.vmap(one_view)(views)


def expected_ap(
    x: ArrayLike,
    mask: jax.Array,
    n: Scalar,
    k: int,
    *,
    fixed: ArrayLike | None = None,
    weights: jax.Array | None = None,
    table: jax.Array | None = None,
) -> jax.Array:
    """Returns E[AP@k] of one query, K_j ~ Poisson(n x_j), averaged over hardness atoms
    (`query_metrics` for mAP).

    Positive j (the j-th smallest in F_j + n x_j) contributes j E[1{j + F_j + K_j <= k} /
    (j + F_j + K_j)]; AP is linear in these, so a posterior over the hardness enters as the
    weighted mean over its atoms. Agrees with `expected_ap_poisson` to the table's interpolation
    error (< 1e-5 in AP; tests check it).

    Args:
      x: [P] hardness, or [P, A] atoms of a hardness posterior (one column per atom).
      mask: [P] bool, real positives.
      n: gallery size N.
      k: the cut-off (static: it sizes the table).
      fixed: [P] optional always-indexed non-relevant items above each positive.
      weights: [A] atom weights summing to 1 (uniform when None).
      table: `rank_tables(k)`, passed by jitted callers (built as a constant when None).

    Returns:
      Scalar E[AP@k]; 0 for a query without positives.
    """
    x = jnp.asarray(x)
    atoms = x if x.ndim == 2 else x[:, None]
    w = jnp.full(atoms.shape[1], 1.0 / atoms.shape[1], atoms.dtype) if weights is None else weights
    table = rank_tables(int(k), ("inverse",), atoms.dtype) if table is None else table
    mean_ap = (metrics.METRICS["map"],)

    def one(xa: jax.Array) -> jax.Array:
        return query_metrics(
            xa, mask, n, k, metric_list=mean_ap, gains=("inverse",), tables=table, fixed=fixed
        )[0, 0]

    return jnp.sum(jax.vmap(one, in_axes=1)(atoms) * w)


def conditioned(
    n: Scalar, fixed: jax.Array, mask: jax.Array, counts: ArrayLike, n_sample: Scalar
) -> tuple[jax.Array, jax.Array]:
    """Returns (n', fixed') conditioning on the sample's own counts: in a gallery that contains
    the sample (n >= S), K_j = c_j + Poisson((n - S) x_j), so the counts join the fixed items and
    n - S distractors remain; below S (a sub-gallery) K_j ~ Poisson(n x_j), unchanged."""
    inside = n >= n_sample
    fixed = fixed + jnp.where(inside & mask, jnp.asarray(counts, fixed.dtype), 0.0)
    return jnp.where(inside, n - n_sample, n), fixed


def expected_map(
    x: jax.Array,
    mask: jax.Array,
    n: Scalar,
    k: int,
    *,
    fixed: ArrayLike | None = None,
    weights: jax.Array | None = None,
    counts: ArrayLike | None = None,
    n_sample: Scalar | None = None,
    table: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array]:
    """Returns (mean E[AP@k], per-query E[AP@k] [Q]) for x [Q, P] or atoms [Q, P, A], w [Q, A].

    With the sample's own counts (`counts` [Q, P] of `n_sample` = S sampled distractors) the
    prediction conditions on them (`conditioned`): at n = S it is the sample's realized AP
    exactly and the sampled part adds no noise beyond it. `table`: `rank_tables(k)`.
    """
    dtype = jnp.result_type(x)
    fixed = jnp.zeros(mask.shape, dtype) if fixed is None else jnp.asarray(fixed, dtype)
    if counts is not None:
        if n_sample is None:
            raise ValueError("conditioning on the sample's counts needs its size n_sample")
        n, fixed = conditioned(n, fixed, mask, counts, n_sample)

    def one(a: jax.Array, b: jax.Array, c: jax.Array, w: jax.Array | None) -> jax.Array:
        return expected_ap(a, b, n, k, fixed=c, weights=w, table=table)

    aps = jax.vmap(one)(x, mask, fixed, weights)
    return jnp.mean(aps), aps
