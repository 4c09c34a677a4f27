"""Tests for tailaware.core.buckets: grouped E[AP] equals each query evaluated on its own."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tailaware.core import buckets, evaluate, law
from tailaware.io import scores
from tailaware.protocol import nested, prediction
from tailaware.protocol.settings import PredictSettings
from tailaware.sim import simulate
from tailaware.tail.settings import TailSettings

K = 100


def _wide_mask(rng, q=40, p=70):
    """A [Q, P] mask of mostly narrow queries, a few wide ones and one empty, scrambled slots."""
    n = rng.integers(1, 6, q)
    n[[3, 17]] = [p, 40]
    n[9] = 0
    mask = np.arange(p)[None, :] < n[:, None]
    return np.stack([rng.permutation(row) for row in mask])


def test_groups_partition_the_queries_and_keep_every_positive():
    rng = np.random.default_rng(0)
    mask = _wide_mask(rng)
    grouping = buckets.groups(mask)
    assert grouping is not None
    rows = np.concatenate([np.asarray(g.rows) for g in grouping])
    np.testing.assert_array_equal(np.sort(rows), np.arange(mask.shape[0]))
    slots = 0
    for g in grouping:
        r, cols = np.asarray(g.rows), np.asarray(g.cols)
        slots += cols.size
        for i, row in enumerate(r):
            n = mask[row].sum()
            assert set(cols[i, :n]) == set(np.flatnonzero(mask[row]))  # real positives first
            assert not mask[row, cols[i, n:]].any()
    assert slots <= buckets.MAX_SHARE * mask.size
    # One group, no split: equal widths, or narrow slots to begin with.
    assert buckets.groups(np.ones((5, 30), bool)) is None
    assert buckets.groups(mask[:, : buckets.MIN_WIDTH]) is None


def test_grouped_expected_map_equals_each_query_alone():
    rng = np.random.default_rng(1)
    mask = _wide_mask(rng)
    q, p = mask.shape
    atoms = np.exp(rng.uniform(np.log(1e-9), np.log(1e-3), (q, p, 3))).astype(np.float32)
    weights = rng.dirichlet(np.ones(3), q).astype(np.float32)
    counts = np.where(mask, rng.poisson(0.5, (q, p)), 0).astype(np.float32)
    fixed = np.where(mask, rng.integers(0, 3, (q, p)), 0).astype(np.float32)
    n, s = jnp.float32(1e7), jnp.float32(5e5)
    table = law.rank_tables(K)
    grouping = buckets.groups(mask)

    @jax.jit
    def grouped(a, m, f, w, c, g):
        return buckets.expected_map(
            a, m, n, K, fixed=f, weights=w, counts=c, n_sample=s, table=table, grouping=g
        )

    got = np.asarray(grouped(atoms, mask, fixed, weights, counts, grouping))
    # Reference: every query alone, on its real positives only (no padding at all).
    alone = jax.jit(
        lambda a, m, f, w, c: law.expected_map(
            a, m, n, K, fixed=f, weights=w, counts=c, n_sample=s, table=table
        )[1]
    )
    for i in range(q):
        keep = np.flatnonzero(mask[i])
        if not len(keep):
            assert got[i] == 0.0
            continue
        one = alone(
            atoms[i, keep][None],
            mask[i, keep][None],
            fixed[i, keep][None],
            weights[i][None],
            counts[i, keep][None],
        )
        np.testing.assert_allclose(got[i], float(one[0]), rtol=1e-5, atol=1e-7)
    # And the one padded call agrees.
    padded = np.asarray(grouped(atoms, mask, fixed, weights, counts, None))
    np.testing.assert_allclose(got, padded, rtol=1e-5, atol=1e-7)


@pytest.fixture(scope="module")
def wide_sample():
    """40 simulated queries with up to 10 positives plus two with about 60 (P = 80)."""
    narrow = simulate.draw(simulate.make_benchmark(40, seed=0), 0.05, 400, seed=1).scores
    wide = simulate.make_benchmark(2, seed=5, mean_positives=60, max_positives=80)
    return scores.concatenate([narrow, simulate.draw(wide, 0.05, 400, seed=2).scores])


@pytest.mark.slow
def test_prediction_and_nested_bootstrap_do_not_depend_on_grouping(wide_sample):
    sc = wide_sample
    assert buckets.groups(sc.mask) is not None and buckets.groups(sc.mask, 0.0) is None
    settings = PredictSettings(tail=TailSettings(top_m=400))
    sizes = np.array([1e4, 1e6, 1e8])
    h = prediction.estimate(sc, settings)
    aps = evaluate.per_query_aps(h, sizes, 1000, sc.fixed_counts, sc)[0]
    reps, _ = nested.nested_bootstrap(sc, settings.estimator, settings.tail, 1000, sizes, 3, seed=0)
    # The same computations on the padded arrays, without groups.
    aps0 = evaluate.per_query_aps(h, sizes, 1000, sc.fixed_counts, sc, max_share=0.0)[0]
    np.testing.assert_allclose(aps, np.asarray(aps0), rtol=1e-5, atol=1e-6)
    padded, _ = nested.nested_bootstrap(
        sc, settings.estimator, settings.tail, 1000, sizes, 3, seed=0, max_share=0.0
    )
    for got, want in zip(reps[1:3], padded[1:3], strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
