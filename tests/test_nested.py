"""The nested bootstrap: Poisson draws against scipy, the resampling's consistency, and its
distractor spread against repeated independent samples."""

import dataclasses

import jax
import numpy as np
import pytest
from scipy import stats

from tailaware.core import evaluate
from tailaware.io import scores as scores_lib
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


def _positives(q: int, seed: int) -> np.ndarray:
    """Returns [q, 3] positive scores at hardness 1e-5 .. 3e-3 in a gallery whose item scores
    are tanh(0.2 (z + 0.3 e)): a part z common to the queries and a query's own e."""
    rng = np.random.default_rng(seed)
    marginal = np.sort(rng.standard_normal(2_000_000) + 0.3 * rng.standard_normal(2_000_000))
    x = np.exp(rng.uniform(np.log(1e-5), np.log(3e-3), (q, 3)))
    return np.tanh(0.2 * marginal[((1 - x) * marginal.size).astype(int)])


def _latent(r: np.random.Generator, q: int, s: int) -> np.ndarray:
    """Returns [q, s] latent scores of s sampled items: a common part and each query's own."""
    return r.standard_normal(s)[None, :] + 0.3 * r.standard_normal((q, s))


def _sample_file(latent: np.ndarray, pos: np.ndarray, ids: np.ndarray):
    """Returns the sampled-scores file of S items scored tanh(0.2 latent) ([Q, S]), named
    `ids` [S], every score stored."""
    sc = np.tanh(0.2 * latent)
    order = np.argsort(-sc, axis=1, kind="stable")
    counts = (sc[:, None, :] > pos[:, :, None]).sum(axis=2)
    tail = np.take_along_axis(sc, order, 1)
    return scores_lib.make_scores(tail, pos, counts, sc.shape[1], tail_ids=ids[order])


def test_shared_items_carry_the_samples_correlation_across_queries():
    # One uniform sample of a gallery serves every query: a distractor drawn in (or left out)
    # moves every query it is near. Here the queries' scores share most of their variation (a
    # uniform sample of a large gallery is iid items: each has a common score and a query's
    # own noise), so the mean over queries varies across independent samples far more than
    # queries apart would make it. One bootstrap weight per distractor (the file's `tail_ids`)
    # carries that; one per stored score (no ids) averages it away.
    n, q, s = 10**6, 60, 20_000
    pos = _positives(q, seed=0)

    def draw(seed):
        return _sample_file(_latent(np.random.default_rng(seed), q, s), pos, np.arange(s))

    preds = [
        evaluate.per_query_ap(estimators.count(sc), n, 100, sc.fixed_counts).mean()
        for sc in map(draw, range(100, 116))
    ]
    truth = np.std(preds, ddof=1)
    shared, apart = [], []
    for r in range(2):
        sc = draw(r)
        for out, one in ((shared, sc), (apart, dataclasses.replace(sc, tail_ids=None))):
            nb, _ = nested.nested_bootstrap(one, "count", TailSettings(), 100, [n], 50, seed=r)
            out.append(nb.distractor.std(ddof=1))
    # Loose below: the bootstrap cannot vary a count no sampled distractor makes (its blind
    # spot, shared or not).
    assert 0.35 < np.mean(shared) / truth < 1.6
    assert np.mean(shared) > 2.0 * np.mean(apart)


def test_id_weights_depend_on_the_key_and_id_alone():
    # One item gets one weight under one key whichever file holds it, with whatever other
    # items; other items and other keys draw afresh.
    key = nested.id_keys(3, 4)[2]
    ids = np.array([7, 2**40 + 7, 123456, 99], np.int64)
    hi, lo = (np.asarray(h) for h in nested.id_halves(ids))
    np.testing.assert_array_equal(hi, [0, 256, 0, 0])
    np.testing.assert_array_equal(lo, [7, 7, 123456, 99])
    w = np.asarray(nested.id_weights(key, hi, lo))
    again = np.asarray(nested.id_weights(key, hi[::-1], lo[::-1]))[::-1]
    np.testing.assert_array_equal(w, again)
    same = jax.random.key_data(nested.id_keys(3, 9)[2])  # the count does not move it
    np.testing.assert_array_equal(same, jax.random.key_data(key))
    many = np.arange(20_000, dtype=np.int64)
    z = np.zeros(many.size, np.uint32)
    draws = np.asarray(nested.id_weights(key, z, many.astype(np.uint32)))
    other = np.asarray(nested.id_weights(nested.id_keys(4, 1)[0], z, many.astype(np.uint32)))
    # Poisson(1): mean 1, variance 1, P(0) = e^-1; two seeds independent.
    assert abs(draws.mean() - 1) < 0.03 and abs(draws.var() - 1) < 0.05
    assert abs(np.mean(draws == 0) - np.exp(-1)) < 0.015
    assert abs(np.corrcoef(draws, other)[0, 1]) < 0.03


def test_two_models_on_one_sample_pair_their_replicates():
    # Two models score the same sampled items; B's scores are A's with a little noise of its
    # own, so a sample that flatters A flatters B too. The difference of their predictions
    # varies across independent samples far less than either; replicates weighted by id
    # (one weight per item in both files) carry that, and the paired bootstrap's sd of the
    # difference is held against its spread over 16 independent samples.
    n, q, s = 10**6, 60, 20_000
    pos = _positives(q, seed=1)

    def draw(seed):
        r = np.random.default_rng(seed)
        latent = _latent(r, q, s)
        noises = (0.0, 0.1 * r.standard_normal(s)[None, :])  # B's own
        return [_sample_file(latent + e, pos, np.arange(s) + seed * s) for e in noises]

    def predict(sc):
        return evaluate.per_query_ap(estimators.count(sc), n, 100, sc.fixed_counts).mean()

    diffs, each = [], []
    for a, b in map(draw, range(100, 116)):
        diffs.append(predict(a) - predict(b))
        each.append(predict(a))
    truth = np.std(diffs, ddof=1)
    assert truth < 0.5 * np.std(each, ddof=1)  # the setting pairs
    paired, apart = [], []
    for r in range(2):
        reps = [
            nested.nested_bootstrap(sc, "count", TailSettings(), 100, [n], 50, seed=r)[0]
            for sc in draw(r)
        ]
        assert all(x.by_id for x in reps)
        ra, rb = (x.distractor[0, 0] for x in reps)
        paired.append(np.std(ra - rb, ddof=1))
        apart.append(np.hypot(np.std(ra, ddof=1), np.std(rb, ddof=1)))
    assert 0.35 < np.mean(paired) / truth < 1.6
    assert np.mean(apart) > 2.0 * np.mean(paired)
