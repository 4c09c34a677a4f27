"""Tests of the realized metric's spread around the law's expectation (`core.realization`)."""

import numpy as np
from scipy import stats

from tailaware.core import metrics, realization

MAP = metrics.METRICS["map"]


def test_one_positive_matches_the_poisson_law():
    """One positive, K ~ Poisson(n x): AP@k = 1{1 + F + K <= k} / (1 + F + K), summed exactly."""
    k, n, fixed = 20, 1000.0, 2
    xs = np.array([0.0005, 0.004, 0.012])
    got = realization.spread(
        xs[:, None], None, np.ones((3, 1), bool), n, k, fixed=np.full((3, 1), fixed), draws=4000
    )
    m = np.arange(200)
    for i, x in enumerate(xs):
        pmf = stats.poisson.pmf(m, n * x)
        ap = np.where(1 + fixed + m <= k, 1.0 / (1 + fixed + m), 0.0)
        var = pmf @ ap**2 - (pmf @ ap) ** 2
        # 4000 draws: the variance's relative sd is sqrt(2 / 4000) = 2%.
        np.testing.assert_allclose(got.counts[0, i], var, rtol=0.1)
        np.testing.assert_allclose(got.total[0, i], var, rtol=0.1)


def test_two_positives_match_simulated_galleries():
    """Counts are nested as in a gallery: every distractor above the first positive is above the
    second. Reference: galleries of n uniform distractor scores, counted directly."""
    k, n = 50, 2000
    scores = np.array([0.995, 0.99])  # hardness 1 - s: 0.005, 0.01
    rng = np.random.default_rng(1)
    aps = []
    for _ in range(3000):
        d = rng.uniform(size=n)
        c = np.array([[np.sum(d > s) for s in scores]])
        aps.append(metrics.value_from_counts(MAP, c, np.ones((1, 2), bool), k)[0])
    x = (1.0 - scores)[None, :]
    got = realization.spread(x, None, np.ones((1, 2), bool), n, k, draws=3000)
    np.testing.assert_allclose(got.counts[0, 0], np.var(aps), rtol=0.12)


def test_posterior_atoms_add_their_spread():
    """Two equally likely atoms far apart: the total variance adds the atoms' own spread."""
    k, n = 10, 100.0
    atoms = np.array([[[0.0, 0.2]]])  # AP 1 (no distractor can pass) or ~0 (20 above on average)
    got = realization.spread(atoms, np.array([[0.5, 0.5]]), np.ones((1, 1), bool), n, k)
    assert got.counts[0, 0] < 0.01
    np.testing.assert_allclose(got.total[0, 0], 0.25, rtol=0.2)


def test_conditions_on_the_sample_counts():
    """In a gallery containing the sample, K = c + Poisson((n - S) x): at n = S nothing is left
    to draw and the realized value is the sample's own."""
    mask = np.ones((2, 3), bool)
    x = np.array([[0.001, 0.01, 0.02], [0.0, 0.005, 0.05]])
    c = np.array([[0, 3, 9], [1, 2, 30]])
    got = realization.spread(x, None, mask, 500.0, 100, counts=c, n_sample=500.0, draws=16)
    np.testing.assert_array_equal(got.counts, 0.0)
    np.testing.assert_allclose(got.total, 0.0, atol=1e-30)
    more = realization.spread(x, None, mask, 5000.0, 100, counts=c, n_sample=500.0, draws=16)
    assert np.all(more.counts > 0)


def test_padding_and_other_metrics():
    """Padded slots are ignored; each metric of the list gets its own row."""
    mask = np.array([[True, True, False]])
    x = np.array([[0.001, 0.01, 0.9]])
    one = realization.spread(x, None, mask, 1000.0, 100, draws=64, seed=3)
    cut = realization.spread(x[:, :2], None, mask[:, :2], 1000.0, 100, draws=64, seed=3)
    np.testing.assert_allclose(one.counts, cut.counts)
    both = realization.spread(
        x, None, mask, 1000.0, 100, metric_list=(MAP, metrics.METRICS["recall"]), draws=64
    )
    assert both.counts.shape == (2, 1)


def test_mean_sd():
    var = np.array([0.04, 0.09, 0.0, 0.01])
    np.testing.assert_allclose(realization.mean_sd(var), np.sqrt(var.sum()) / 4)
    w = np.array([0.5, 0.5, 0.0, 0.0])
    np.testing.assert_allclose(realization.mean_sd(var, w), np.sqrt(0.25 * 0.13))


def test_views_delete_the_other_positives():
    """A view's metric is the full list's with the other positives deleted: a view of one
    positive equals that positive alone."""
    mask = np.ones((1, 2), bool)
    x = np.array([[0.002, 0.02]])
    views = np.array([[[True, True]], [[False, True]]])
    both = realization.spread(x, None, mask, 1000.0, 50, views=views, draws=1000, seed=5)
    assert both.counts.shape == (2, 1, 1)
    whole = realization.spread(x, None, mask, 1000.0, 50, draws=1000, seed=5)
    np.testing.assert_allclose(both.counts[0], whole.counts)
    alone = realization.spread(x[:, 1:], None, mask[:, 1:], 1000.0, 50, draws=1000)
    # 1,000 draws of a skewed AP: each variance is known to ~10%.
    np.testing.assert_allclose(both.counts[1, 0, 0], alone.counts[0, 0], rtol=0.3)
