"""Tests of the tail-aware hardness estimators against numpy/scipy transcriptions of eq. (B.1)."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import optimize, special, stats

from tailaware.core.results import Hardness
from tailaware.io.scores import make_scores
from tailaware.sim import simulate
from tailaware.tail import averaged, estimators, evt, functional
from tailaware.tail.settings import TailSettings

# 48 queries (16 draws from each of 3 laws), S = 50k, top M = 1000, P = 5 positives (padded).
LAWS = [stats.beta(a, b, loc=-1, scale=2) for a, b in ((31.5, 31.5), (40, 60), (8, 12))]
Q, S, M = 48, 50_000, 1_000
# True hardness of the positives: inside the kept tail (K ~ 50) to 200x beyond 1 / S.
X_TRUE = np.array([1e-3, 4e-5, 1e-5, 1e-6, 1e-7])


def _settings(**fields) -> TailSettings:
    return TailSettings(**{"top_m": M, **fields})


def _inputs(scores, settings):
    """Returns the positive scores [Q, P] (NaN padded), kept tail [Q, M] and S the estimate
    reads (`functional.core`)."""
    c = functional.core(scores, settings, full=True)
    return evt.nan_padded(c), c.tail, c.s


def _top_scores(rng, law, r, s, m):
    """Returns [r, m] descending top-m scores of s draws from `law` (uniform order statistics)."""
    e = np.cumsum(rng.exponential(size=(r, m)), axis=1)
    p = e / (e[:, -1:] + rng.gamma(s + 1 - m, size=(r, 1)))
    return law.isf(p)


@pytest.fixture(scope="module")
def scores():
    rng = np.random.default_rng(0)
    tail = np.concatenate([_top_scores(rng, law, Q // 3, S, M) for law in LAWS]).astype(np.float32)
    tail = -np.sort(-tail, axis=1)
    pos = np.concatenate([np.tile(law.isf(X_TRUE), (Q // 3, 1)) for law in LAWS]).astype(np.float32)
    pos[1, 3:] = np.nan  # padding
    # Every positive is above the M-th score, so the kept tail gives its exact count.
    assert np.all(np.nan_to_num(pos, nan=1.0) >= tail[:, -1:])
    counts = np.where(np.isnan(pos), -1, (tail[:, None, :] > pos[:, :, None]).sum(axis=2))
    return make_scores(tail, pos, counts, S)


@pytest.fixture(scope="module")
def results(scores):
    return estimators.get("evt")(scores, _settings()), estimators.get("evt_averaged")(
        scores, _settings()
    )


def test_evt_hardness_follows_eq_b1(scores, results):
    h, _ = results
    assert isinstance(h, Hardness)
    assert h.x.dtype == np.float64 and h.x.shape == scores.pos_scores.shape
    np.testing.assert_array_equal(h.mask, scores.mask)
    assert np.all(h.x[~h.mask] == 0) and not h.tail_priced[~h.mask].any()
    counts = scores.pos_counts
    # The count where at least min_count sampled distractors beat the positive, else the tail.
    np.testing.assert_array_equal(h.tail_priced, h.mask & (counts < 5))
    by_count = h.mask & (counts >= 5)
    assert by_count.sum() >= Q
    np.testing.assert_allclose(h.x[by_count], counts[by_count] / S)
    info = h.fit
    for key in (
        "xi",
        "sigma",
        "endpoint",
        "u",
        "n_exceed",
        "stable",
        "fitted",
        "share_tail_priced",
    ):
        assert getattr(info, key).shape == (Q,), key
    # Threshold at the 51st largest of the top 1000 (q = 0.95), excesses strictly above it.
    k = round(0.05 * M)
    tail = scores.tail_scores.astype(np.float64)
    np.testing.assert_array_equal(info.u, scores.tail_scores[:, k])
    np.testing.assert_array_equal(info.n_exceed, (tail[:, :k] > tail[:, k : k + 1]).sum(1))
    for q in range(Q):
        # The reported fit is a GPD fit of exactly these excesses (scipy's log-likelihood)...
        y = tail[q, :k] - info.u[q]
        y = y[y > 0]
        ll = stats.genpareto.logpdf(y, info.xi[q], scale=info.sigma[q]).sum()
        if info.xi[q] > -1:
            np.testing.assert_allclose(info.loglik[q], ll, rtol=1e-4)
        # ... and each tail price is (n_u / S) P(Y > s - u) under it (eq. B.1).
        for j in np.flatnonzero(h.tail_priced[q]):
            sf = stats.genpareto.sf(
                float(scores.pos_scores[q, j]) - float(info.u[q]),
                float(info.xi[q]),
                scale=float(info.sigma[q]),
            )
            np.testing.assert_allclose(h.x[q, j], info.n_exceed[q] / S * sf, rtol=1e-3)


def _grid(settings):
    """The shape grid of `evt.xi_grid`, transcribed: [-0.95, 0] in 20 points, then on above 0."""
    step = 0.95 / 19
    heavy = step * np.arange(1, int(np.floor(settings.xi_max / step + 1e-9)) + 1)
    return np.concatenate([np.linspace(-0.95, 0, 20), heavy])


def _log_prior(settings, xis, prior_mean=None, prior_sd=None):
    if settings.prior == "empirical_bayes":  # a discretised normal over the grid, shifted
        lp = -0.5 * ((xis - prior_mean - settings.eb_shift) / prior_sd) ** 2
    else:  # trapezoid weights times the lean towards longer tails
        w = np.ones(xis.size)
        w[[0, -1]] = 0.5
        lp = np.log(w) + settings.xi_tilt * xis
    return lp - np.log(np.exp(lp).sum())


def _profile_reference(y_exc, xi):
    """(sigma, log-likelihood with the scale integrated out by Laplace) at one shape, by scipy."""
    lo = max(-xi * y_exc.max(), 1e-9) * (1 + 1e-12)
    res = optimize.minimize_scalar(
        lambda sg: -stats.genpareto.logpdf(y_exc, xi, scale=sg).sum(),
        bounds=(lo, lo + 10 * y_exc.max()),
        method="bounded",
        options={"xatol": 1e-14},
    )
    # The curvature in log sigma by finite differences of scipy's log-likelihood, steps well
    # inside the distance to the edge.
    f = lambda ls: stats.genpareto.logpdf(y_exc, xi, scale=np.exp(ls)).sum()
    ls = np.log(res.x)
    h = min(1e-4, 1e-2 * np.log(res.x / lo)) if xi < 0 else 1e-4
    curvature = -(f(ls + h) - 2 * f(ls) + f(ls - h)) / h**2
    return res.x, -res.fun - 0.5 * np.log(curvature)


def _posterior_mean_reference(y_exc, y_pos, s, settings, prior_mean=None, prior_sd=None):
    """numpy/scipy transcription of the averaged tail, scales by scipy's bounded optimiser."""
    xis = _grid(settings)
    sigmas, lls = zip(*(_profile_reference(y_exc, xi) for xi in xis), strict=True)
    with np.errstate(divide="ignore"):
        lw = _log_prior(settings, xis, prior_mean, prior_sd) + np.array(lls)
    wts = np.exp(lw - lw.max())
    wts /= wts.sum()
    sf = np.array(
        [stats.genpareto.sf(y_pos, xi, scale=sg) for xi, sg in zip(xis, sigmas, strict=True)]
    )
    return np.log(len(y_exc) / s * (wts[:, None] * sf).sum(axis=0))


def _check_against_reference(scores, h, settings):
    priced = h.tail_priced
    for q in (0, 20, 40):
        # The threshold is the selected one (tested in test_threshold_selection*).
        k = int(h.fit.n_exceed_selected[q])
        u = float(scores.tail_scores[q, k])
        y_exc = scores.tail_scores[q, :k].astype(np.float64) - u
        j = np.flatnonzero(priced[q])
        y_pos = scores.pos_scores[q, j].astype(np.float64) - u
        mean, sd = h.fit.prior_mean[q], h.fit.prior_sd[q]
        ref = _posterior_mean_reference(y_exc[y_exc > 0], y_pos, S, settings, mean, sd)
        np.testing.assert_allclose(np.log(h.x[q, j]), ref, rtol=2e-3)


def test_averaged_matches_reference_and_is_never_zero(scores, results):
    h_mle, h = results
    priced = h.tail_priced
    np.testing.assert_array_equal(priced, h_mle.tail_priced)
    assert np.all(h.x[priced] > 0)
    # Beyond the plug-in endpoint the MLE says 0 (the paper's "immune"); the average does not.
    beyond = priced & (scores.pos_scores > h_mle.fit.endpoint[:, None])
    assert beyond.any() and np.all(h_mle.x[beyond] == 0) and np.all(h.x[beyond] > 0)
    np.testing.assert_array_equal(h_mle.fit.share_zero, beyond.sum(1) / h.mask.sum(1))
    _check_against_reference(scores, h, _settings())  # the default: empirical Bayes up to 0.5


def test_averaged_with_the_tilt_prior_matches_reference(scores):
    settings = _settings(prior="tilt", xi_max=0.0)
    h = estimators.get("evt_averaged")(scores, settings)
    assert np.isnan(h.fit.prior_mean).all()
    _check_against_reference(scores, h, settings)


def test_empirical_bayes_prior_maximises_the_marginal_likelihood():
    # Per-query log-likelihood tables of queries whose shapes cluster near -0.2: the prior's
    # (mean, sd) against a brute-force numpy search of the same candidates, and the fitted mean
    # near the shapes' centre.
    rng = np.random.default_rng(4)
    xis = _grid(TailSettings(xi_max=0.5))
    centres = rng.normal(-0.2, 0.05, 300)
    log_lik = -0.5 * ((xis[None, :] - centres[:, None]) / 0.1) ** 2
    fitted = np.ones(300, bool)
    fitted[:5] = False  # queries without a fit carry no evidence
    lp, mu, tau = jax.jit(evt.empirical_bayes_prior)(
        jnp.asarray(log_lik, jnp.float32), jnp.asarray(fitted), jnp.asarray(xis, jnp.float32)
    )
    best = None
    for m in np.linspace(xis[0], 0.0, evt.EB_MEANS):  # the mean held <= 0
        for t in evt.EB_SDS:
            p = -0.5 * ((xis - m) / t) ** 2
            p -= np.log(np.exp(p).sum())
            total = np.sum(special.logsumexp(log_lik[fitted] + p[None, :], axis=1))
            if best is None or total > best[0]:
                best = (total, m, t)
    assert float(mu) == pytest.approx(best[1], abs=1e-5)
    assert float(tau) == pytest.approx(best[2], rel=1e-6)
    assert abs(float(mu) + 0.2) < 0.05
    np.testing.assert_allclose(np.exp(np.asarray(lp)).sum(), 1.0, rtol=1e-5)


def test_accuracy_far_in_the_tail(scores, results):
    # A small version of the validation: positives at true hardness 0.05 / S and 0.005 / S,
    # Beta laws, 16 draws each, only 50 excesses per fit. The averaged tail is never 0, within
    # about half a decade in the median and off by 10x less often than the plug-in MLE, which
    # has "immune" zeros.
    h_mle, h = results
    for j in (3, 4):
        x_true = np.array([law.sf(law.isf(X_TRUE[j]).astype(np.float32)) for law in LAWS])
        x_true = np.repeat(x_true, Q // 3)
        rows = scores.mask[:, j]
        err = np.log10(h.x[rows, j] / x_true[rows])
        with np.errstate(divide="ignore"):
            err_mle = np.log10(h_mle.x[rows, j] / x_true[rows])
        print(
            f"x = {X_TRUE[j]:.0e}: median log10 ratio, averaged {np.median(err):+.2f}, "
            f"plug-in {np.median(err_mle):+.2f}; zero share of the plug-in "
            f"{np.mean(np.isneginf(err_mle)):.2f}"
        )
        assert np.all(np.isfinite(err))
        assert abs(np.median(err)) < 0.6
        assert np.mean(np.abs(err) > 1) < np.mean(np.abs(err_mle) > 1)
        assert np.mean(np.isneginf(err_mle)) > 0.05


def test_settings_are_read(scores, results):
    base, _ = results
    counts_only = estimators.get("evt")(scores, _settings(min_count=0))
    assert not counts_only.tail_priced.any()
    np.testing.assert_allclose(counts_only.x, np.where(scores.mask, scores.pos_counts, 0) / S)
    fewer = estimators.get("evt")(scores, _settings(min_count=1))
    np.testing.assert_array_equal(fewer.tail_priced, scores.mask & (scores.pos_counts < 1))
    assert fewer.tail_priced.sum() < base.tail_priced.sum()
    # top_m and threshold_quantile reach the JAX core: 10% of the top 500 are the excesses.
    info = estimators.get("evt_averaged")(scores, _settings(top_m=500, threshold_quantile=0.9)).fit
    np.testing.assert_array_equal(info.n_exceed, 50)
    # The averaged posterior fits the excesses over its own quantile (0.975): 2.5% of 500 where
    # that threshold passes the goodness-of-fit test, fewer where it is raised; at least
    # MIN_EXCESSES (10) for 1% of 500.
    assert info.n_exceed_selected.max() == 13 and np.median(info.n_exceed_selected) == 13
    deeper = estimators.get("evt_averaged")(
        scores, _settings(top_m=500, averaged_quantile=0.99)
    ).fit
    assert deeper.n_exceed_selected.max() == evt.MIN_EXCESSES == 10


def test_empirical_bayes_shift_moves_the_fitted_prior(scores):
    # The shift moves the fitted prior's mean after the fit: the fit (mean, sd) is the same at
    # any shift, and the posterior at shift d is the one at 0 re-weighted by the ratio of the
    # two normals on the grid; a longer shift weighs longer tails more on every query.
    pos, tail, s = _inputs(scores, _settings())
    post = jax.jit(evt.posterior_atoms, static_argnums=3)
    _, w0, _, _, _, eb0 = post(pos, tail, s, _settings(eb_shift=0.0))
    _, w1, _, _, _, eb1 = post(pos, tail, s, _settings(eb_shift=0.1))
    np.testing.assert_array_equal(eb0, eb1)
    mu, tau = np.asarray(eb0, np.float64)
    xis = _grid(_settings())
    ratio = np.exp(-0.5 * ((xis - mu - 0.1) / tau) ** 2 + 0.5 * ((xis - mu) / tau) ** 2)
    ref = np.asarray(w0, np.float64) * ratio
    np.testing.assert_allclose(w1, ref / ref.sum(axis=1, keepdims=True), rtol=2e-3, atol=1e-7)
    assert (np.asarray(w1) @ xis > np.asarray(w0) @ xis).all()


def test_posterior_reads_short_and_long_bounded_tails():
    # Exact GPD tails (the top 200 of 4,000 kept scores are GPD too): the posterior mean of xi
    # over `evt_averaged`'s grid is close to the truth, also below the regular range's -1/2
    # (a grid stopped there reads -0.8 as about -0.5 and over-prices small samples by decades).
    rng = np.random.default_rng(5)
    true_xi = np.repeat([-0.8, -0.3], 40)
    y = stats.genpareto.rvs(true_xi[:, None], scale=0.05, size=(80, 4000), random_state=rng)
    tail = -np.sort(-(0.3 + y), axis=1).astype(np.float32)
    pos = tail[:, :1] + 0.001
    posterior = jax.jit(evt.posterior, static_argnums=3)

    def mean_xi(rows, settings):
        _, w = posterior(jnp.asarray(pos[rows]), jnp.asarray(tail[rows]), 10**5, settings)
        xis, _ = evt.xi_grid(settings.xi_tilt, xi_max=settings.xi_max)
        return np.asarray(w) @ np.asarray(xis)

    # The tilt prior on [-0.95, 0], both shapes in one benchmark; the empirical-Bayes prior on
    # [-0.95, 0.5], one benchmark per shape (it shrinks a benchmark's queries to their centre).
    # At the paper's 200 excesses (averaged_quantile 0.95): the grid's reach is the point.
    tilt = mean_xi(np.arange(80), TailSettings(prior="tilt", xi_max=0.0, averaged_quantile=0.95))
    eb = TailSettings(averaged_quantile=0.95)
    for xi in (-0.8, -0.3):
        for got in (tilt[true_xi == xi], mean_xi(true_xi == xi, eb)):
            assert abs(got.mean() - xi) < 0.05, (xi, got.mean())
            assert np.mean(np.abs(got - xi) < 0.15) >= 0.9, xi


def test_threshold_selection_keeps_gpd_tails():
    # Exact GPD tails (threshold-stable): the default threshold passes the Anderson-Darling test
    # but for the test's false alarms (~0.5%), and the statistic is the one of its own excesses.
    rng = np.random.default_rng(5)
    law = stats.genpareto(rng.uniform(-0.5, 0.0, (300, 1)), loc=0.2, scale=0.03)  # a row each
    tail = _top_scores(rng, law, 300, 1_000_000, 4000).astype(np.float32)
    tail = -np.sort(-tail, axis=1)
    critical = TailSettings().ad_critical
    select = jax.jit(evt.select_threshold, static_argnums=(1, 2))
    u, y, mask, ad = jax.device_get(select(jnp.asarray(tail), 0.95, critical))
    kept = ad[0] <= critical
    print(f"default threshold kept for {kept.mean():.3f} of exact GPD tails")
    assert kept.mean() >= 0.97
    # The default threshold is the 201st score; a rejected one moves up (100 or 50 excesses).
    np.testing.assert_array_equal(u[kept], tail[kept, 200])
    assert np.all(u[~kept] > tail[~kept, 200])
    np.testing.assert_array_equal(mask.sum(1), (tail[:, :200] > u[:, None]).sum(1))


def test_threshold_selection_never_picks_a_threshold_without_excesses():
    # The top 60 scores tied: a quarter of the default excesses (50) would be no excess at all,
    # which would price the tail at rate 0; the selection keeps a threshold below the ties.
    tail = np.concatenate([np.full(60, 0.9), np.linspace(0.8, 0.1, 3940)]).astype(np.float32)
    select = jax.jit(evt.select_threshold, static_argnums=(1, 2))
    u, y, mask, ad = jax.device_get(select(jnp.asarray(tail[None]), 0.95, 2.0))
    assert np.isinf(ad[2, 0]) and mask.sum() >= 60 and u[0] < 0.9


def test_threshold_selection_finds_a_cluster_above_the_bulk():
    # The simulator's near-duplicate mixture at a 0.05% sample: ~50 cluster scores sit far above
    # the other 150 excesses of the default threshold, whose GPD fit (xi ~ 0, a long tail) then
    # over-prices every positive. The selected threshold fits the cluster alone.
    bench = simulate.make_benchmark(60, family="mixture", seed=0, **simulate.REGIMES["paper"])
    sc = simulate.draw(bench, 0.0005, 4000, seed=0).scores
    pos = jnp.asarray(np.where(sc.mask, sc.pos_scores, np.nan), jnp.float32)
    tail = jnp.asarray(sc.tail_scores)

    def log10_x(settings):
        fn = jax.jit(lambda p, t: evt.posterior_atoms(p, t, float(sc.n_sample), settings))
        post = jax.device_get(fn(pos, tail))
        return np.asarray(evt.log_mean(post.log_atoms, post.weights)) / np.log(10), post.n_selected

    selected, n_u = log10_x(TailSettings())
    fixed, n_fixed = log10_x(TailSettings(ad_critical=np.inf))  # every default threshold passes
    priced = sc.mask & (sc.pos_counts < 5) & (bench.x > 0)
    truth = np.log10(np.where(priced, bench.x, 1.0))
    err = {k: np.median(np.abs(v - truth)[priced]) for k, v in (("sel", selected), ("fix", fixed))}
    print(
        f"median |log10 error| of tail-priced hardness: selected {err['sel']:.2f}, fixed "
        f"{err['fix']:.2f}"
    )
    n = 4000 * (1.0 - TailSettings().averaged_quantile)  # the averaged posterior's excesses
    assert np.all(n_fixed == round(n)) and np.mean(n_u < n) > 0.5
    assert err["sel"] < err["fix"] - 0.5  # half a decade closer in the median (the posterior
    # mean, which the long-tailed atoms dominate; the prediction itself goes from -0.28 to
    # +0.007 in benchmarks/tail_families.py)


def test_excesses_threshold_rule():
    tail = jnp.asarray([[0.9, 0.8, 0.8, 0.7, 0.6, 0.5] + [0.4] * 14, [0.5] * 3 + [-jnp.inf] * 17])
    u, y, mask = evt.excesses(tail, 0.5)
    # Row 0: m = 20, k = 10 -> u is the 11th largest; ties at u are not excesses.
    # Row 1: 3 finite scores -> k = 2, all tied: no excess.
    np.testing.assert_allclose(u, [0.4, 0.5])
    np.testing.assert_array_equal(mask.sum(1), [6, 0])
    np.testing.assert_allclose(np.asarray(y)[0, :6], [0.5, 0.4, 0.4, 0.3, 0.2, 0.1], atol=1e-7)


def _scores_like_fixture(tails, pos, s):
    """Builds `SampledScores` of the fixture's shapes ([Q, M], [Q, P]) to reuse its compilation.

    Rows of `tails` [r, M] and `pos` [r, P] fill the first r queries; the rest repeat row 0.
    """
    reps = np.concatenate([np.arange(len(tails)), np.zeros(Q - len(tails), int)])
    tail, pos = tails[reps].astype(np.float32), pos[reps].astype(np.float32)
    counts = np.where(np.isnan(pos), -1, (tail[:, None, :] > pos[:, :, None]).sum(axis=2))
    with np.errstate(invalid="ignore"):  # scores.py diffs the -inf padding
        return make_scores(tail, pos, counts, s)


def test_small_samples_and_short_rows():
    # S = 1 (no fit possible) and S = 40 (below top_m and the minimum excess count).
    rng = np.random.default_rng(1)
    for s in (1, 40):
        tail = np.full((2, M), -np.inf)
        tail[:, :s] = -np.sort(-rng.uniform(-0.2, 0.4, (2, s)), axis=1)
        pos = np.asarray([[0.5, 0.3, 0.2, 0.1, 0.0], [0.1, np.nan, np.nan, np.nan, np.nan]])
        sc = _scores_like_fixture(tail, pos, s)
        for fn in (estimators.get("evt"), estimators.get("evt_averaged")):
            h = fn(sc, _settings())
            assert not np.isnan(h.x).any()
            assert np.all((h.x >= 0) & (h.x <= 1))
            for _, v in h.fit.items():
                assert not np.isnan(v).any()
            if s == 1:
                assert not h.tail_priced.any()
            else:
                assert h.tail_priced[0, 0]


@pytest.mark.slow
def test_gradients_are_finite_and_match_finite_differences(scores, x64):
    # One positive beyond a plug-in endpoint (x = 0 there): x = exp(log x) and its gradient stay
    # finite. The derivative along a random direction matches central differences: in the
    # positive scores for both methods, and in the tail scores (through the threshold and the
    # fit's implicit derivatives) for the plug-in MLE; the averaged method holds its per-xi
    # scales fixed, so its tail-score gradient is not the full derivative and is not compared.
    tail = jnp.asarray(scores.tail_scores[20:22], jnp.float64)
    pos = jnp.asarray(scores.pos_scores[20:22, 1:4], jnp.float64).at[:, -1].set(0.99)
    rng = np.random.default_rng(3)
    d_pos = jnp.asarray(rng.standard_normal(pos.shape))
    d_tail = jnp.asarray(rng.uniform(0.5, 1.0, tail.shape))  # keeps the kept scores' order
    for model in estimators.tail_models():
        f = lambda p, t, model=model: jnp.sum(
            jnp.exp(evt.log_tail_prob(p, t, float(S), TailSettings(), model))
        )
        g_pos, g_tail = jax.jit(jax.grad(f, argnums=(0, 1)))(pos, tail)
        assert np.all(np.isfinite(np.asarray(g_pos))) and np.all(np.isfinite(np.asarray(g_tail)))
        dt = d_tail if model.name == "evt" else jnp.zeros_like(tail)
        f_jit, eps = jax.jit(f), 1e-9
        fd = f_jit(pos + eps * d_pos, tail + eps * dt) - f_jit(pos - eps * d_pos, tail - eps * dt)
        np.testing.assert_allclose(
            jnp.vdot(g_pos, d_pos) + jnp.vdot(g_tail, dt), fd / (2 * eps), rtol=1e-3
        )


def test_threshold_stability_flags_a_changing_tail():
    rng = np.random.default_rng(2)
    body = stats.beta(30, 30, loc=-1, scale=2)
    s = 20_000
    stable_tail = -np.sort(-body.rvs(s, random_state=rng))[:M]
    # A flat second component holding the top 30 scores: xi changes with the threshold.
    bump = np.concatenate([body.rvs(s - 30, random_state=rng), rng.uniform(0.45, 0.5, 30)])
    changing_tail = -np.sort(-bump)[:M]
    pos = np.full((2, 5), 0.6)
    sc = _scores_like_fixture(np.stack([stable_tail, changing_tail]), pos, s)
    info = estimators.get("evt")(sc, _settings()).fit
    np.testing.assert_array_equal(info.stable[:2], [True, False])


@pytest.mark.slow
@pytest.mark.parametrize("name", ["evt", "evt_averaged"])
def test_reruns_are_the_estimator_at_other_thresholds(scores, name):
    # Half and twice the excesses over the q = 0.95 threshold are the thresholds of q = 0.975
    # and q = 0.9 (and the averaged estimator's, over its 0.975 quantile, those of 0.9875 and
    # 0.95): the reruns (one vmapped program with the estimate) against the estimator run at
    # those quantiles; the estimate itself is the one computed without reruns.
    got = evt.estimate(scores, _settings(), estimators.tail_model(name), reruns=True)
    alone = estimators.get(name)(scores, _settings())
    assert alone.reruns == ()
    np.testing.assert_allclose(got.x, alone.x, rtol=1e-4, atol=1e-12)  # float32 rounding
    np.testing.assert_array_equal(got.tail_priced, alone.tail_priced)
    if alone.atoms is not None:
        np.testing.assert_allclose(got.weights, alone.weights, rtol=1e-4, atol=1e-7)
    half, double = got.reruns
    averaged = TailSettings().averaged_quantile
    for rerun, factor in ((half, 0.5), (double, 2.0)):
        q, q_averaged = 1.0 - 0.05 * factor, 1.0 - (1.0 - averaged) * factor
        ref = estimators.get(name)(
            scores, _settings(threshold_quantile=q, averaged_quantile=q_averaged)
        )
        np.testing.assert_array_equal(rerun.tail_priced, ref.tail_priced)
        np.testing.assert_allclose(rerun.x, ref.x, rtol=1e-3, atol=1e-12)  # padding: rounding
        assert (ref.atoms is None) == (name == "evt")
        if ref.atoms is not None:
            np.testing.assert_allclose(rerun.weights, ref.weights, rtol=1e-4, atol=1e-7)
    assert (got.prior_weights is None) == (name == "evt") and alone.prior_weights is None


@pytest.mark.slow
def test_prior_reruns_are_the_posterior_under_the_other_priors(scores):
    # The re-weighted posterior (float64, from the weights under exp(t xi)) against the
    # posterior computed afresh with the prior exp(t' xi) for t' = t -/+ the prior's spread
    # (the tilt prior: the re-weighting is the same factor for any base prior).
    settings = _settings(prior="tilt", xi_max=0.0)
    got = evt.estimate(scores, settings, averaged.AVERAGED, reruns=True)
    flat, steep = got.prior_weights
    pos, tail, s = _inputs(scores, settings)
    tilt, spread = settings.xi_tilt, settings.prior_spread
    posterior = jax.jit(evt.posterior, static_argnums=3)
    for weights, t in ((flat, tilt - spread), (steep, tilt + spread)):
        other = dataclasses.replace(settings, xi_tilt=t)
        _, ref = posterior(pos, tail, s, other)
        np.testing.assert_allclose(weights, ref, rtol=2e-3, atol=1e-7)
    # A flatter prior weighs shorter tails more: every query's posterior mean of xi is lower.
    xis = _grid(settings)
    mean_xi = [w @ xis for w in (flat, got.weights, steep)]
    assert (np.diff(mean_xi, axis=0) > 0).all()
