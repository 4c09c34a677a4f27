"""The nested bootstrap: Poisson draws against scipy, the resampling's consistency, and its
distractor spread against repeated independent samples."""

import jax
import numpy as np
import pytest
from scipy import stats

from tailaware.core import evaluate
from tailaware.protocol import nested
from tailaware.sim import simulate
from tailaware.tail import estimators, functional
from tailaware.tail.settings import TailSettings

Q = 120


@pytest.mark.parametrize("lam", [0.3, 4.0, 20.0, 500.0])
def test_poisson_matches_scipy(lam):
    draws = np.asarray(nested.poisson(jax.random.key(0), np.full(40_000, lam, np.float32)))
    assert draws.mean() == pytest.approx(lam, rel=0.03, abs=0.01)
    assert draws.var() == pytest.approx(lam, rel=0.06, abs=0.01)
    if lam < 24:
        k = np.arange(int(lam * 3) + 3)
        freq = np.array([(draws == i).mean() for i in k])
        np.testing.assert_allclose(freq, stats.poisson.pmf(k, lam), atol=0.01)
    ones = np.asarray(nested.poisson_one(jax.random.key(1), (40_000,)))
    assert ones.mean() == pytest.approx(1.0, abs=0.02) and ones.var() == pytest.approx(
        1.0, rel=0.05
    )


def test_resample_keeps_tail_and_counts_consistent():
    bench = simulate.make_benchmark(Q, 10**7, seed=2)
    sc = simulate.draw(bench, 0.01, 300, seed=3).scores
    c = functional.core(sc, TailSettings())
    tail, counts = jax.jit(nested.resample)(jax.random.key(0), c.tail, c.pos, c.counts, c.mask)
    tail, counts = np.asarray(tail), np.asarray(counts)
    assert (np.diff(tail, axis=1) <= 0).all()  # still descending
    # Every resampled score is one of the query's stored scores.
    assert all(np.isin(tail[i], np.asarray(c.tail[i])).all() for i in range(Q))
    pos = np.asarray(c.pos)
    covered = np.asarray(c.mask) & (pos >= np.asarray(c.tail)[:, -1:])
    seen = (tail[:, None, :] > pos[:, :, None]).sum(axis=2)
    # Positives above the last stored score: resampled count = resampled copies above them
    # (unless the copies ran past the stored width, which the width's margin makes rare).
    full = (tail[:, None, :] > pos[:, :, None]).sum(axis=2) < tail.shape[1]
    np.testing.assert_array_equal(counts[covered & full], seen[covered & full])
    m = np.asarray(c.mask)
    assert abs(counts[m].sum() / np.asarray(c.counts)[m].sum() - 1.0) < 0.05


def test_nested_sd_matches_repeated_draws():
    # The distractor-only spread of the nested bootstrap against the spread of the count
    # prediction over independent samples of the same benchmark (known truth of the noise).
    bench = simulate.make_benchmark(Q, 10**7, x_range=(1e-6, 0.05), seed=6)
    preds, sds = [], []
    for r in range(24):
        sc = simulate.draw(bench, 0.002, 200, seed=100 + r).scores
        aps = evaluate.per_query_ap(estimators.count(sc), 1e6, 100, sc.fixed_counts)
        preds.append(aps.mean())
        if r < 4:
            nb, _ = nested.nested_bootstrap(sc, "count", TailSettings(), 100, [1e6], 60, seed=r)
            sds.append(nb.distractor.std(ddof=1))
    ratio = np.mean(sds) / np.std(preds, ddof=1)
    assert 0.6 < ratio < 1.6
