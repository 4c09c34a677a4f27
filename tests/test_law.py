"""The scaling law: exactness on realized counts, monotonicity, gradients, Binomial moments."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.stats
from hypothesis import given, settings
from hypothesis import strategies as st
from jax.test_util import check_grads

from tailaware.core import law, metrics

Q, P = 16, 9
map_jit = jax.jit(law.map_at_k, static_argnames=("truncation",))


def random_counts(seed, q=Q, p=P, n=100_000, scale=3000):
    rng = np.random.default_rng(seed)
    mask = rng.random((q, p)) < 0.7
    mask[:, 0] = True
    counts = np.where(mask, rng.integers(0, scale, (q, p)) * (rng.random((q, p)) < 0.6), -1)
    fixed = np.where(mask, rng.integers(0, 4, (q, p)) * (rng.random((q, p)) < 0.3), -1)
    # Distractor and fixed counts must both be non-increasing in score: sort them together.
    for i in range(q):
        m = mask[i]
        counts[i, m] = np.sort(counts[i, m])
        fixed[i, m] = np.sort(fixed[i, m])
        perm = rng.permutation(p)
        counts[i], fixed[i], mask[i] = counts[i, perm], fixed[i, perm], mask[i, perm]
    return counts, fixed, mask, n


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), k=st.sampled_from([1, 3, 100, 1000, 2500]))
def test_realized_fractions_reproduce_exact_map(seed, k):
    counts, fixed, mask, n = random_counts(seed)
    want = metrics.ap_at_k_from_counts(np.where(mask, counts + fixed, -1), mask, k)
    x = jnp.asarray(np.where(mask, counts, 0) / n, jnp.float32)
    _, got = map_jit(x, mask, jnp.float32(n), jnp.float32(k), jnp.asarray(fixed, jnp.float32))
    np.testing.assert_allclose(np.asarray(got), want, atol=2e-6)


def test_realized_fractions_float64(x64):
    counts, fixed, mask, n = random_counts(3, n=10**8)
    want = metrics.ap_at_k_from_counts(np.where(mask, counts + fixed, -1), mask, 1000)
    _, got = law.map_at_k(
        jnp.asarray(np.where(mask, counts, 0) / n),
        mask,
        1e8,
        1000.0,
        jnp.asarray(np.where(mask, fixed, 0), jnp.float64),
    )
    np.testing.assert_allclose(np.asarray(got), want, atol=1e-12)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), k=st.sampled_from([1, 10, 1000]))
def test_map_never_increases_with_n(seed, k):
    rng = np.random.default_rng(seed)
    x = jnp.asarray(rng.uniform(0, 1, (Q, P)) ** 6, jnp.float32)
    mask = jnp.asarray(rng.random((Q, P)) < 0.8)
    ns = np.geomspace(1, 1e9, 40)
    maps = [
        float(map_jit(x, mask, jnp.float32(n), jnp.float32(k), jnp.zeros_like(x))[0]) for n in ns
    ]
    assert np.all(np.diff(maps) <= 1e-6), maps


def test_invariant_to_query_and_slot_order():
    rng = np.random.default_rng(0)
    x = rng.uniform(0, 1e-4, (Q, P)).astype(np.float32)
    mask = rng.random((Q, P)) < 0.8
    mask[:, 0] = True
    args = (jnp.float32(1e6), jnp.float32(1000), jnp.zeros((Q, P), jnp.float32))
    base, aps = map_jit(jnp.asarray(x), mask, *args)
    qp, sp = rng.permutation(Q), rng.permutation(P)
    perm, aps_p = map_jit(jnp.asarray(x[qp][:, sp]), mask[qp][:, sp], *args)
    np.testing.assert_allclose(float(perm), float(base), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(aps_p), np.asarray(aps)[qp], rtol=1e-6)


def test_jit_vmap_and_loop_agree():
    counts, fixed, mask, n = random_counts(1)
    x = jnp.asarray(np.where(mask, counts, 0) / n, jnp.float32)
    f = jnp.asarray(np.where(mask, fixed, 0), jnp.float32)
    loop = [law.ap_at_k(x[i], mask[i], 2e5, 1000.0, f[i]) for i in range(Q)]
    _, batched = map_jit(x, mask, jnp.float32(2e5), jnp.float32(1000), f)
    np.testing.assert_allclose(np.asarray(batched), np.asarray(loop), rtol=1e-6)


@pytest.mark.parametrize("truncation", ["hard", "smooth"])
def test_gradients_finite_at_edges(truncation):
    # x = 0, a rank exactly at k, padding, and a positive far beyond k.
    x = jnp.array([[0.0, 0.0, 998.0 / 1e6, 0.5]], jnp.float32)
    mask = jnp.array([[True, True, True, False]])

    def f(x, log_n):
        return law.map_at_k(x, mask, jnp.exp(log_n), 1000.0, truncation=truncation)[0]

    gx, gn = jax.grad(f, argnums=(0, 1))(x, jnp.log(jnp.float32(1e6)))
    assert np.isfinite(np.asarray(gx)).all() and np.isfinite(float(gn))
    assert float(gx[0, 3]) == 0.0  # padding gets no gradient
    assert float(gx[0, 0]) < 0.0  # more hardness, lower AP


def test_smooth_truncation_gradients_match_finite_differences(x64):
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.uniform(0, 2e-3, (4, 6)))
    mask = jnp.asarray(rng.random((4, 6)) < 0.8)

    def f(x, log_n):
        return law.map_at_k(x, mask, jnp.exp(log_n), 100.0, truncation="smooth", tau=2.0)[0]

    check_grads(f, (x, jnp.log(5e4)), order=1, modes=["rev"], atol=1e-6, rtol=1e-4, eps=1e-8)


@pytest.mark.parametrize("n", [50, 10**4, 10**8])
def test_binomial_and_poisson_expectations_match_scipy(n, x64):
    k = 20
    rng = np.random.default_rng(n)
    x = rng.uniform(0, 30 / n, 5)
    mask = np.array([True, True, True, True, False])
    fixed = np.array([0, 1, 0, 2, 0])
    order = np.argsort(np.where(mask, fixed + n * x, np.inf), kind="stable")
    want_b = want_p = 0.0
    for j, i in enumerate(order[: mask.sum()], start=1):
        m = np.arange(k)
        r = j + fixed[i] + m
        want_b += (j * scipy.stats.binom.pmf(m, n, x[i]) / r * (r <= k)).sum()
        want_p += (j * scipy.stats.poisson.pmf(m, n * x[i]) / r * (r <= k)).sum()
    want_b, want_p = want_b / min(k, 4), want_p / min(k, 4)
    args = (jnp.asarray(x), jnp.asarray(mask), float(n), k, jnp.asarray(fixed, jnp.float64))
    np.testing.assert_allclose(float(law.expected_ap_binomial(*args)), want_b, rtol=1e-9)
    np.testing.assert_allclose(float(law.expected_ap_poisson(*args)), want_p, rtol=1e-9)


def _poisson_ap_reference(x, mask, n, k, fixed, shift=None):
    """scipy transcription: E[AP@k] with K_j = shift_j + Poisson(n x_j)."""
    shift = np.zeros_like(fixed) if shift is None else shift
    order = np.argsort(np.where(mask, fixed + shift + n * x, np.inf), kind="stable")
    total = 0.0
    for j, i in enumerate(order[: mask.sum()], start=1):
        m = np.arange(k + 1)
        r = j + fixed[i] + shift[i] + m
        total += (j * scipy.stats.poisson.pmf(m, n * x[i]) / r * (r <= k)).sum()
    return total / min(k, max(mask.sum(), 1))


@pytest.mark.parametrize("k", [1, 10, 100, 1000])
def test_expected_ap_table_matches_the_poisson_sum(k, x64):
    # Hardness over 12 decades, zeros, fixed counts, ranks past k: the table's interpolation
    # error stays below 2e-6 in AP.
    rng = np.random.default_rng(k)
    for _ in range(40):
        x = 10.0 ** rng.uniform(-12, -1, 6) * (rng.uniform(size=6) > 0.15)
        mask = rng.uniform(size=6) < 0.8
        mask[0] = True
        fixed = rng.integers(0, 4, 6) * (rng.uniform() < 0.5)
        n = 10.0 ** rng.uniform(2, 9)
        got = law.expected_ap(
            jnp.asarray(x), jnp.asarray(mask), n, k, fixed=jnp.asarray(fixed, float)
        )
        want = _poisson_ap_reference(x, mask, n, k, fixed)
        np.testing.assert_allclose(float(got), want, atol=2e-6)


def test_expected_ap_averages_hardness_atoms(x64):
    rng = np.random.default_rng(1)
    atoms = 10.0 ** rng.uniform(-9, -5, (5, 7))
    mask = np.array([True, True, True, False, True])
    w = rng.dirichlet(np.ones(7))
    fixed = np.zeros(5)
    got = law.expected_ap(jnp.asarray(atoms), jnp.asarray(mask), 1e8, 100, weights=jnp.asarray(w))
    want = sum(w[a] * _poisson_ap_reference(atoms[:, a], mask, 1e8, 100, fixed) for a in range(7))
    np.testing.assert_allclose(float(got), want, atol=2e-6)


def test_expected_map_conditions_on_the_sample(x64):
    # A gallery that contains the sample: K_j = c_j + Poisson((N - S) x_j). At N = S it is the
    # sample's realized AP; beyond it, the shifted Poisson sum; below S, no conditioning.
    rng = np.random.default_rng(2)
    q, p, s, k = 30, 4, 10**6, 100
    x = 10.0 ** rng.uniform(-8, -4, (q, p))
    mask = rng.uniform(size=(q, p)) < 0.8
    mask[:, 0] = True
    counts = np.where(mask, rng.poisson(s * x), 0)
    args = (jnp.asarray(x), jnp.asarray(mask))
    kw = dict(counts=jnp.asarray(counts, float), n_sample=float(s))
    _, at_s = law.expected_map(*args, float(s), k, **kw)
    realized = law.realized_ap_at_k(jnp.asarray(np.where(mask, counts, 0)), mask, k)
    np.testing.assert_allclose(np.asarray(at_s), np.asarray(realized), atol=2e-6)
    zeros = np.zeros(p)
    for n in (3e6, 1e8):
        _, got = law.expected_map(*args, n, k, **kw)
        want = [_poisson_ap_reference(x[i], mask[i], n - s, k, zeros, counts[i]) for i in range(q)]
        np.testing.assert_allclose(np.asarray(got), want, atol=2e-6)
    _, below = law.expected_map(*args, 1e5, k, **kw)
    want = [_poisson_ap_reference(x[i], mask[i], 1e5, k, zeros) for i in range(q)]
    np.testing.assert_allclose(np.asarray(below), want, atol=2e-6)


def test_expected_rank_map_is_close_to_binomial_mean_at_scale(x64):
    # The paper: at large N the expected-rank map and E[AP] differ by a few thousandths.
    rng = np.random.default_rng(0)
    x = jnp.asarray(10.0 ** rng.uniform(-9, -5, (64, 5)))
    mask = jnp.ones((64, 5), bool)
    plug = law.map_at_k(x, mask, 1e8, 1000.0)[0]
    mean = jnp.mean(jax.vmap(lambda a, m: law.expected_ap_binomial(a, m, 1e8, 1000))(x, mask))
    assert abs(float(plug) - float(mean)) < 0.05


def test_top1_survival_and_accuracy():
    x = np.array([0.0, 1e-8, 1e-6, 1e-3])
    np.testing.assert_allclose(
        np.asarray(law.top1_survival(jnp.asarray(x, jnp.float32), 1e6, exact=True)),
        scipy.stats.binom.pmf(0, 10**6, x),
        rtol=1e-4,
    )
    np.testing.assert_allclose(
        np.asarray(law.top1_survival(jnp.asarray(x), 1e6)), np.exp(-1e6 * x), rtol=1e-5
    )
    acc = law.top1_accuracy(jnp.array([2e-6, 1e-6, 0.5]), jnp.array([True, True, False]), 1e6)
    np.testing.assert_allclose(float(acc), np.exp(-1.0), rtol=1e-5)
    blocked = law.top1_accuracy(jnp.array([0.0]), jnp.array([True]), 1e6, jnp.array([1.0]))
    assert float(blocked) == 0.0


PER_QUERY = ("map_at_r", "r_precision", "top1")


def _poisson_metric_reference(metric, x, mask, n, k, fixed):
    """scipy transcription: E[metric] of one query with K_j ~ Poisson(n x_j), positive j (the
    j-th by F + n x) contributing weight(j) sum_m pmf(m) 1{j + F + m <= c} g(j + F + m)."""
    g = {"inverse": lambda r: 1.0 / r, "one": np.ones_like}[metric.gain]
    n_pos = int(mask.sum())
    cut = float(metric.cut(np.float64(n_pos), k))
    order = np.argsort(np.where(mask, fixed + n * x, np.inf), kind="stable")
    total = 0.0
    for j, i in enumerate(order[:n_pos], start=1):
        m = np.arange(int(cut) + 1)
        r = (j + fixed[i] + m).astype(float)
        pmf = scipy.stats.poisson.pmf(m, n * x[i])
        total += metric.weight(np.float64(j)) * (pmf * g(r) * (r <= cut)).sum()
    return total / float(metric.norm(np.float64(n_pos), k))


def _law_values(metric_list, x, mask, n, k, fixed):
    gains = law.table_gains(metric_list)
    tables = law.rank_tables(k, gains, jnp.asarray(x).dtype)
    one = lambda a, b, c: law.query_metrics(
        a, b, n, k, metric_list=metric_list, gains=gains, tables=tables, fixed=c
    )[0]
    return np.asarray(jax.vmap(one)(jnp.asarray(x), jnp.asarray(mask), jnp.asarray(fixed)))


@pytest.mark.parametrize("k", [1, 100])
def test_per_query_cutoff_metrics_match_the_poisson_sum(k, x64):
    # MAP@R, R-precision and top-1 (cut-offs R and 1, whatever k) against scipy's Poisson sums:
    # hardness over 10 decades, zeros, fixed counts, up to 9 positives.
    rng = np.random.default_rng(k)
    q, p = 30, 9
    x = 10.0 ** rng.uniform(-10, -2, (q, p)) * (rng.uniform(size=(q, p)) > 0.15)
    mask = rng.uniform(size=(q, p)) < 0.7
    mask[:, 0] = True
    fixed = (rng.integers(0, 3, (q, p)) * (rng.uniform(size=(q, p)) < 0.3)).astype(float)
    n = 1e6
    metric_list = (metrics.METRICS["map"], *(metrics.METRICS[m] for m in PER_QUERY))
    got = _law_values(metric_list, x, mask, n, k, fixed)  # [Q, M]
    for col, metric in enumerate(metric_list):
        rows = zip(x, mask, fixed, strict=True)
        want = [_poisson_metric_reference(metric, a, b, n, k, f) for a, b, f in rows]
        atol = 2e-6 if metric.cutoff.per_query is None else 1e-12  # a table vs a direct sum
        np.testing.assert_allclose(got[:, col], want, atol=atol, err_msg=metric.name)


def test_per_query_cutoff_metrics_match_monte_carlo():
    # The law's E[metric] against the mean exact value (`core.metrics`, from counts) of galleries
    # drawn at the same hardness, within 4 Monte-Carlo sds: each distractor outranks every
    # positive of hardness above its own draw, so the counts nest (K_j = the Poisson counts of
    # the increments of x in ascending order), as do the fixed items.
    rng = np.random.default_rng(7)
    q, p, n, k, draws = 8, 6, 1e5, 1000, 4000
    x = np.sort(10.0 ** rng.uniform(-6, -4, (q, p)), axis=1)
    mask = np.ones((q, p), bool)
    mask[:, 3:] = rng.uniform(size=(q, p - 3)) < 0.5
    fixed = np.cumsum(rng.uniform(size=(q, p)) < 0.2, axis=1).astype(float)
    metric_list = tuple(metrics.METRICS[m] for m in PER_QUERY)
    got = _law_values(metric_list, x.astype(np.float32), mask, n, k, fixed.astype(np.float32))
    steps = np.diff(x, axis=1, prepend=0.0)
    counts = np.cumsum(rng.poisson(n * steps, (draws, q, p)), axis=2)  # nested, [draws, Q, P]
    for col, metric in enumerate(metric_list):
        exact = np.stack(
            [
                metrics.value_from_counts(
                    metric, np.where(mask, c + fixed, -1).astype(int), mask, k
                )
                for c in counts
            ]
        )  # [draws, Q]
        sd = exact.std(axis=0) / np.sqrt(draws)
        assert np.all(np.abs(got[:, col] - exact.mean(axis=0)) <= 4 * sd + 1e-5), metric.name


def test_per_query_top1_is_the_poisson_survival():
    # top-1 = P(the best positive has nothing above it) = 1{F_1 = 0} exp(-N x_1), as
    # `law.top1_accuracy` writes it.
    x = jnp.array([[2e-6, 1e-6, 0.5], [0.0, 1e-7, 0.0]], jnp.float32)
    mask = jnp.array([[True, True, False], [True, True, False]])
    fixed = jnp.array([[0.0, 0.0, 0.0], [1.0, 0.0, 0.0]], jnp.float32)
    got = _law_values((metrics.METRICS["top1"],), x, mask, 1e6, 1000, fixed)[:, 0]
    want = jax.vmap(lambda a, m, f: law.top1_accuracy(a, m, 1e6, f))(x, mask, fixed)
    np.testing.assert_allclose(got, np.asarray(want), rtol=1e-6)
    np.testing.assert_allclose(got, [np.exp(-1.0), np.exp(-0.1)], rtol=1e-5)


@pytest.mark.parametrize("gain", sorted(metrics.GAINS))
@pytest.mark.parametrize("k", [7, 100, 1000])
def test_gain_tables_match_the_poisson_sum(k, gain):
    """The banded tables against E[1{a + K <= k} g(a + K)] summed with scipy's Poisson pmf over
    every count, at rows across the grid (tiny means, the bulk, the top) and every rank a."""
    h = law.gain_table(k, gain)
    lam = law.table_lambdas(k)
    m = np.arange(k)
    g = {"inverse": lambda r: 1.0 / r, "one": np.ones_like, "dcg": lambda r: 1 / np.log2(1 + r)}
    for i in np.linspace(0, lam.size - 1, 23).astype(int):
        pmf = scipy.stats.poisson.pmf(m, lam[i])
        r = (m[:, None] + np.arange(1, k + 1)[None, :]).astype(float)
        want = (pmf[:, None] * np.where(r <= k, g[gain](r), 0.0)).sum(axis=0)
        np.testing.assert_allclose(h[i], want, rtol=1e-12, atol=1e-300)
