"""Sensitivity: gradients against finite differences, exact responses, edges, delta-method variance.

Tolerances: float64 (`x64`) where a gradient is compared with finite differences (eps ~1e-6 of
a quantity ~1 leaves ~1e-9 truncation error); float32 only where the check is finiteness or an
identity that holds to rounding.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

from tailaware.core import evaluate, law
from tailaware.sim import synthetic
from tailaware.tail import estimators, evt, plug_in, sensitivity
from tailaware.tail.settings import TailSettings

Q, P = 6, 5
N, K = 5e4, 100.0


def hardness(seed, q=Q, p=P, lo=-6.0, hi=-2.5):
    rng = np.random.default_rng(seed)
    x = 10.0 ** rng.uniform(lo, hi, (q, p))
    mask = rng.random((q, p)) < 0.8
    mask[:, 0] = True
    fixed = np.where(mask, rng.integers(0, 3, (q, p)) * (rng.random((q, p)) < 0.3), 0)
    return jnp.asarray(np.where(mask, x, 0.0)), jnp.asarray(mask), jnp.asarray(fixed, float)


def tail_params(seed, q=Q, p=P):
    """A query's tail fit and positives above its threshold, some beyond the endpoint."""
    rng = np.random.default_rng(seed)
    params = sensitivity.TailParams(
        log_rate=jnp.asarray(np.log(rng.uniform(1e-4, 1e-3, q))),
        threshold=jnp.asarray(rng.uniform(0.3, 0.4, q)),
        xi=jnp.asarray(rng.uniform(-0.45, -0.1, q)),
        log_sigma=jnp.asarray(np.log(rng.uniform(0.02, 0.05, q))),
    )
    pos = jnp.asarray(params.threshold[:, None] + rng.uniform(0.0, 0.15, (q, p)))
    return params, pos


def test_gradients_match_finite_differences(x64):
    x, mask, fixed = hardness(0)

    @jax.jit  # check_grads calls f many times; compile it once
    def f(x, log_n):
        return law.map_at_k(x, mask, jnp.exp(log_n), K, fixed, truncation="smooth", tau=2.0)[0]

    check_grads(f, (x, jnp.log(N)), order=1, modes=["rev"], atol=1e-7, rtol=1e-4, eps=1e-9)
    g = sensitivity.gradients(x, mask, N, K, fixed=fixed, truncation="smooth", tau=2.0)
    gx, gn = jax.grad(f, argnums=(0, 1))(x, jnp.log(N))
    np.testing.assert_allclose(np.asarray(g.d_x), np.where(mask, gx, 0.0), rtol=1e-12)
    # Central differences in ln N, independent of autodiff.
    h = 1e-5
    fd = (f(x, jnp.log(N) + h) - f(x, jnp.log(N) - h)) / (2 * h)
    np.testing.assert_allclose(float(g.d_log_n), float(fd), rtol=1e-6)
    np.testing.assert_allclose(float(g.per_decade), np.log(10) * float(fd), rtol=1e-6)
    # A small relative error in one positive: d mAP / d log x by central differences.
    q, j = 2, 0
    e = jnp.zeros_like(x).at[q, j].set(1.0)
    fd_j = (f(x * jnp.exp(h * e), jnp.log(N)) - f(x * jnp.exp(-h * e), jnp.log(N))) / (2 * h)
    np.testing.assert_allclose(float(g.d_log_x[q, j]), float(fd_j), rtol=1e-6)


@pytest.mark.parametrize("truncation", ["hard", "smooth"])
def test_log_n_is_the_sum_of_log_x(truncation, x64):
    # x enters only through N x, so d/d ln N = sum_j d/d log x_j, per query and in total.
    x, mask, fixed = hardness(1)
    g = sensitivity.gradients(x, mask, N, K, fixed=fixed, truncation=truncation)
    np.testing.assert_allclose(float(g.d_log_n), float(g.d_log_x.sum()), rtol=1e-10)

    def ap(xq, mq, fq, log_n):
        return law.ap_at_k(xq, mq, jnp.exp(log_n), K, fq, truncation=truncation)

    direct = jax.vmap(jax.grad(ap, argnums=3), in_axes=(0, 0, 0, None))(x, mask, fixed, jnp.log(N))
    np.testing.assert_allclose(np.asarray(g.aps_d_log_n), np.asarray(direct), rtol=1e-9, atol=1e-15)
    assert float(g.d_log_n) < 0.0


@pytest.mark.parametrize("truncation", ["hard", "smooth"])
def test_gradients_finite_at_edges(truncation):
    # x = 0 twice, a positive exactly at the k boundary (r = 3 + 97 = k), one far beyond k,
    # and padding; float32, the default dtype.
    x = jnp.array([[0.0, 0.0, 97.0 / N, 0.5, 0.0]], jnp.float32)
    mask = jnp.array([[True, True, True, True, False]])
    g = sensitivity.gradients(x, mask, jnp.float32(N), jnp.float32(K), truncation=truncation)
    for leaf in jax.tree_util.tree_leaves(g):
        assert np.isfinite(np.asarray(leaf)).all()
    assert float(g.d_log_x[0, 0]) == 0.0 and float(g.d_log_x[0, 4]) == 0.0
    assert float(g.d_x[0, 0]) < 0.0
    if truncation == "smooth":
        # At the k boundary the smooth step adds the loss of the positive falling out of the
        # top k, which the hard cut-off's gradient does not see.
        hard = sensitivity.gradients(x, mask, jnp.float32(N), jnp.float32(K), truncation="hard")
        assert float(g.d_x[0, 2]) < 2.0 * float(hard.d_x[0, 2]) < 0.0


def test_uniform_error_is_a_change_of_gallery_size(x64):
    x, mask, fixed = hardness(2)
    deltas = jnp.array([-2.0, -np.log(2), -1e-4, 0.0, 1e-4, np.log(2), 2.0])
    r = sensitivity.uniform_response(x, mask, N, K, deltas, fixed=fixed)
    base = law.map_at_k(x, mask, N, K, fixed)[0]
    for d, got in zip(np.asarray(deltas), np.asarray(r.map), strict=True):
        moved = law.map_at_k(x, mask, N * np.exp(d), K, fixed)[0]
        np.testing.assert_allclose(got, float(moved - base), atol=1e-14)
    # First order is exact in the limit, and an overestimate never raises mAP.
    small = np.abs(np.asarray(deltas)) == 1e-4
    np.testing.assert_allclose(
        np.asarray(r.map)[small], np.asarray(r.map_first_order)[small], rtol=1e-3
    )
    assert np.all(np.asarray(r.map)[np.asarray(deltas) > 0] <= 0)
    # Top-1 accuracy: mean over queries of exp(-N x_best) when the best positive has F = 0.
    xs, ms, fs = (np.asarray(a) for a in (x, mask, fixed))

    def top1(scale):
        keys = np.where(ms, fs + N * xs * scale, np.inf)
        best = keys.argmin(axis=1)
        rows = np.arange(Q)
        return np.mean(np.where(fs[rows, best] == 0, np.exp(-N * xs[rows, best] * scale), 0.0))

    want = [top1(np.exp(d)) - top1(1.0) for d in np.asarray(deltas)]
    np.testing.assert_allclose(np.asarray(r.top1), want, atol=1e-12)


def test_rational_response_is_damped_against_exponential(x64):
    # One positive at N x = 1: a 10x hardness overshoot costs AP a factor ~5.5, top-1 e^-9.
    x = jnp.array([[1.0 / N]])
    mask = jnp.array([[True]])
    r = sensitivity.uniform_response(x, mask, N, 1000.0, jnp.array([np.log(10.0)]))
    np.testing.assert_allclose(float(r.map[0]), 1 / 11 - 1 / 2, rtol=1e-12)
    np.testing.assert_allclose(float(r.top1[0]), np.exp(-10) - np.exp(-1), rtol=1e-12)
    # Elasticity of the precision term is -p (1 - p) at F = 0, at most 1/4.
    g = sensitivity.gradients(x, mask, N, 1000.0, truncation="hard")
    np.testing.assert_allclose(float(g.d_log_x[0, 0]), -0.25, rtol=1e-12)


def test_positive_response_matches_a_loop(x64):
    x, mask, fixed = hardness(3)
    delta = 0.3
    exact, first = sensitivity.positive_response(
        x, mask, N, K, delta, fixed=fixed, truncation="smooth", tau=2.0
    )
    base = law.map_at_k(x, mask, N, K, fixed, truncation="smooth", tau=2.0)[0]
    for q in range(Q):
        for j in range(P):
            moved = x.at[q, j].multiply(np.exp(delta))
            want = law.map_at_k(moved, mask, N, K, fixed, truncation="smooth", tau=2.0)[0] - base
            np.testing.assert_allclose(
                float(exact[q, j]), float(want) if mask[q, j] else 0.0, atol=1e-14
            )
    small_e, small_f = sensitivity.positive_response(
        x, mask, N, K, 1e-5, fixed=fixed, truncation="smooth", tau=2.0
    )
    np.testing.assert_allclose(np.asarray(small_e), np.asarray(small_f), rtol=1e-3, atol=1e-15)


def test_tail_gradients_match_finite_differences(x64):
    params, pos = tail_params(4)
    x, mask, fixed = hardness(4)
    tail = jnp.asarray(np.random.default_rng(4).random((Q, P)) < 0.6) & mask

    @jax.jit
    def f(p):
        xt = jnp.where(tail, jnp.exp(sensitivity.gpd_log_x(p, pos)), x)
        return law.map_at_k(xt, mask, N, K, fixed, truncation="smooth", tau=2.0)[0]

    check_grads(f, (params,), order=1, modes=["rev"], atol=1e-8, rtol=1e-4, eps=1e-7)
    g = sensitivity.tail_gradients(
        params, pos, x, tail, mask, N, K, fixed=fixed, truncation="smooth", tau=2.0
    )
    for got, want in zip(g, jax.grad(f)(params), strict=True):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-12)
    # Raising the exceedance rate makes every tail-priced positive harder.
    assert np.all(np.asarray(g.log_rate) <= 0.0)


def test_tail_gradients_finite_beyond_endpoint_and_at_boundaries():
    # Query 0: xi = -1 (uniform tail) with a positive beyond the endpoint; query 1: xi = 0.
    params = sensitivity.TailParams(
        log_rate=jnp.log(jnp.array([1e-3, 1e-3], jnp.float32)),
        threshold=jnp.array([0.3, 0.3], jnp.float32),
        xi=jnp.array([-1.0, 0.0], jnp.float32),
        log_sigma=jnp.log(jnp.array([0.05, 0.05], jnp.float32)),
    )
    pos = jnp.array([[0.32, 0.36, 0.3], [0.32, 0.36, 0.7]], jnp.float32)
    mask = jnp.ones((2, 3), bool)
    x = jnp.zeros((2, 3), jnp.float32)
    args = (pos, x, mask, mask, jnp.float32(N), jnp.float32(K))
    for truncation in ("hard", "smooth"):
        g = sensitivity.tail_gradients(params, *args, truncation=truncation)
        assert all(np.isfinite(np.asarray(v)).all() for v in g)
    jac = sensitivity.tail_log_x_jacobian(params, pos)
    assert np.isfinite(np.asarray(jac)).all()
    assert np.all(np.asarray(jac[0, 1]) == 0.0)  # beyond the endpoint: x = 0 whatever the fit


def test_tail_gradient_in_xi_at_the_exponential_boundary(x64):
    params = sensitivity.TailParams(
        jnp.log(jnp.array([1e-3])), jnp.array([0.3]), jnp.array([0.0]), jnp.log(jnp.array([0.05]))
    )
    pos = jnp.array([[0.4]])
    f = lambda xi: sensitivity.gpd_log_x(params._replace(xi=xi), pos)[0, 0]
    one_sided = (f(jnp.array([0.0])) - f(jnp.array([-1e-6]))) / 1e-6
    got = sensitivity.tail_log_x_jacobian(params, pos)[0, 0, 1]
    np.testing.assert_allclose(float(got), float(one_sided), rtol=1e-3)


def nested_counts(rng, s, x, reps):
    """[reps, P] sampled outrankers of positives with ascending hardness x: one sample of S
    distractors falls in the nested bands [0, x_1), [x_1, x_2), ... (a multinomial)."""
    bands = np.diff(np.concatenate([[0.0], x, [1.0]]))
    return np.cumsum(rng.multinomial(s, bands, size=reps)[:, :-1], axis=1)


def test_count_covariance_matches_simulated_nested_counts(x64):
    # Three positives of one query, hardness 2e-3 < 5e-3 < 2e-2, S = 20k: simulate the sample.
    s, xs = 20_000, np.array([2e-3, 5e-3, 2e-2])
    counts = nested_counts(np.random.default_rng(0), s, xs, 4000)
    mask = np.ones((1, 3), bool)
    expected = np.round(s * xs)[None]  # the delta method at the expected counts
    cov = sensitivity.count_log_x_covariance(expected, mask, s)[0]
    emp = np.cov(np.log(counts / s).T)
    np.testing.assert_allclose(np.asarray(cov), emp, rtol=0.15)
    zero = sensitivity.count_log_x_covariance(np.array([[0, 4]]), np.ones((1, 2), bool), s)[0]
    assert float(zero[0, 0]) == 0.0 and float(zero[0, 1]) == 0.0 and float(zero[1, 1]) > 0.0


def test_count_covariance_uses_the_expected_counts(x64):
    cov = sensitivity.count_log_x_covariance(
        np.array([[40, 100, -1]]), np.array([[1, 1, 0]], bool), 1000
    )
    want = np.array([[0.9 / 100, 0.9 / 100, 0], [0.9 / 100, 0.9 / 100, 0], [0, 0, 0]])
    want[0, 0] = 0.96 / 40
    np.testing.assert_allclose(np.asarray(cov[0]), want, rtol=1e-12)


def test_tail_param_covariance_is_the_gpd_information_inverse(x64):
    sigma = sensitivity.tail_param_covariance(
        jnp.array([-0.2, -0.8, 0.0]), jnp.array([200, 200, 50])
    )
    c = 0.8
    np.testing.assert_allclose(
        np.asarray(sigma[0]), np.array([[1, 0, 0], [0, c * c, -c], [0, -c, 2 * c]]) / 200
    )
    for m in np.asarray(sigma):
        assert np.linalg.eigvalsh(m).min() >= -1e-15


def test_delta_method_sd_matches_resampled_counts(x64):
    # The count estimator on a simulated sample: resample the counts, recompute mAP, compare
    # the spread with the delta-method sd from the gradients and the nested-count covariance.
    # Ranks stay well inside k, where the map is smooth and the linearisation holds.
    q, p, s, n, k = 8, 3, 20_000, 1e5, 1000.0
    rng = np.random.default_rng(1)
    x_true = np.sort(10 ** rng.uniform(-3.3, -2.3, (q, p)), axis=1)
    mask = np.ones((q, p), bool)
    draws = np.stack([nested_counts(rng, s, xq, 400) for xq in x_true], axis=1)  # [R, Q, P]
    f = jax.jit(lambda x: law.map_at_k(x, mask, n, k, truncation="smooth", tau=2.0)[0])
    maps = np.array([float(f(jnp.asarray(c / s))) for c in draws])
    x0 = jnp.asarray(draws[0] / s)
    g = sensitivity.gradients(x0, mask, n, k, truncation="smooth", tau=2.0)
    cov = sensitivity.count_log_x_covariance(draws[0], mask, s)
    unc = sensitivity.uncertainty(g.d_log_x, cov)
    np.testing.assert_allclose(float(unc.sd), maps.std(), rtol=0.25)
    np.testing.assert_allclose(float(unc.share.sum()), 1.0, rtol=1e-12)
    np.testing.assert_allclose(float(unc.query_var.sum()), float(unc.sd) ** 2, rtol=1e-12)
    np.testing.assert_allclose(
        np.asarray(unc.value),
        np.abs(g.d_log_x) / np.sqrt(draws[0]) * np.sqrt(1 - draws[0] / s),
        rtol=1e-12,
    )


def test_uncertainty_of_zero_gradients_is_zero():
    unc = sensitivity.uncertainty(jnp.zeros((2, 3)), jnp.zeros((2, 3, 3)))
    assert float(unc.sd) == 0.0 and np.all(np.asarray(unc.share) == 0.0)


def test_blind_response_prices_unseen_positives_at_the_floor(x64):
    x = jnp.array([[0.0, 3e-4], [0.0, 0.0]])
    mask = jnp.array([[True, True], [True, False]])
    blind = x == 0
    got = sensitivity.blind_response(x, mask, blind, 1e4, 1000.0, 1e4)
    base = law.map_at_k(x, mask, 1e4, 1000.0)[1]
    floor = law.map_at_k(jnp.array([[1e-4, 3e-4], [1e-4, 0.0]]), mask, 1e4, 1000.0)[1]
    np.testing.assert_allclose(np.asarray(got), np.asarray(floor - base) / 2, rtol=1e-12)
    assert np.all(np.asarray(got) < 0)


@pytest.fixture(scope="module")
def tiny_benchmark():
    """A 12-query synthetic benchmark scored against 30k distractors, with a 20% sample."""
    bench = synthetic.make_benchmark(12, 1, 4, 30_000, 32, seed=1)
    truth, scores = synthetic.score(bench, [30_000], fraction=0.2, top_m=400, seed=1)
    return scores, TailSettings(top_m=400, threshold_quantile=0.9)


@pytest.mark.parametrize("name", ["count", "evt"])
def test_analyze_agrees_with_the_prediction(tiny_benchmark, name):
    scores, settings = tiny_benchmark
    hard = estimators.get(name)(scores, settings)
    rep = sensitivity.analyze(scores, hard, 30_000, 100, truncation="hard")
    # The analysis differentiates the expected-rank map (the prediction's smooth surrogate).
    fixed = np.where(hard.mask, scores.fixed_counts, 0).astype(np.float32)
    _, want = law.map_at_k(hard.x.astype(np.float32), hard.mask, 30_000.0, 100.0, fixed)
    np.testing.assert_allclose(np.asarray(rep.gradients.aps), want, rtol=1e-5, atol=1e-7)
    # ... which stays within the Jensen gap of the predicted E[AP] (small at N = 30k here).
    pred = evaluate.per_query_ap(hard, 30_000, 100, scores.fixed_counts, scores)
    assert abs(float(np.mean(want)) - float(np.mean(pred))) < 0.02
    assert np.isfinite(float(rep.uncertainty.sd)) and float(rep.uncertainty.sd) > 0.0
    assert (rep.tail is None) == (name == "count")
    if name == "evt":
        assert np.all(np.asarray(rep.tail.log_rate) <= 0.0)
    text = sensitivity.format_report(rep)
    assert "per decade" in text and len(text.splitlines()) >= 4


@pytest.mark.slow  # compiles the tail fit and its implicit derivative in float64
def test_score_gradients_through_the_fitter(tiny_benchmark, x64):
    scores, settings = tiny_benchmark
    hard = estimators.get("evt")(scores, settings)
    tail = jnp.asarray(scores.tail_scores, jnp.float64)
    pos = jnp.asarray(scores.pos_scores, jnp.float64)
    x, mask, tp = jnp.asarray(hard.x), jnp.asarray(hard.mask), jnp.asarray(hard.tail_priced)
    s = float(scores.n_sample)
    d_pos, d_tail = sensitivity.score_gradients(
        pos, tail, s, x, tp, mask, 3e4, 100.0, settings=settings
    )
    assert np.isfinite(np.asarray(d_pos)).all() and np.isfinite(np.asarray(d_tail)).all()
    # A raised tail score makes the tail heavier and mAP lower, somewhere.
    assert float(jnp.sum(d_tail)) < 0.0

    @jax.jit
    def f(t):
        log_x = evt.log_tail_prob(pos, t, s, settings, plug_in.PLUG_IN)
        xt = jnp.where(tp & mask, jnp.exp(log_x), x)
        return law.map_at_k(xt, mask, 3e4, 100.0, truncation="smooth", tau=1.0)[0]

    # Central differences along a random direction of the excesses (the threshold's rank fixed).
    rng = np.random.default_rng(0)
    v = jnp.where(jnp.arange(tail.shape[1]) < 30, rng.standard_normal(tail.shape), 0.0)
    h = 1e-7
    fd = (f(tail + h * v) - f(tail - h * v)) / (2 * h)
    np.testing.assert_allclose(float(jnp.sum(d_tail * v)), float(fd), rtol=1e-3, atol=1e-8)


def test_analyze_differentiates_only_a_plug_in_tail(tiny_benchmark):
    # A tail that is not the plug-in fit (as evt_averaged's average over xi) is not
    # differentiated as one.
    scores, settings = tiny_benchmark
    hard = estimators.get("evt")(scores, settings)
    hard = hard._replace(x=np.where(hard.tail_priced, 2.0 * hard.x + 1e-7, hard.x))
    rep = sensitivity.analyze(scores, hard, 30_000, 100)
    assert rep.tail is None and bool(np.any(np.asarray(rep.tail_priced)))
    assert np.isfinite(float(rep.uncertainty.sd))
