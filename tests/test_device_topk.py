"""The device pass's pieces against numpy, and its every path against brute force."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tailaware.search import device_topk


def test_prefix_count_and_first_true_match_numpy():
    rng = np.random.default_rng(0)
    mask = rng.random((6, 300)) < np.asarray([0.0, 0.01, 0.1, 0.5, 0.9, 1.0])[:, None]
    np.testing.assert_array_equal(jax.jit(device_topk.prefix_count)(mask), np.cumsum(mask, axis=1))
    for c in (1, 7, 400):  # 400 > L: every row runs out
        got = np.asarray(jax.jit(device_topk.first_true, static_argnums=1)(mask, c))
        for row, cols in zip(mask, got, strict=True):
            want = np.flatnonzero(row)[:c]
            np.testing.assert_array_equal(cols[: want.size], want)
            assert (cols[want.size :] == mask.shape[1]).all()


def test_tally_counts_strictly_above_then_at_or_above():
    rng = np.random.default_rng(1)
    s = jnp.asarray(rng.integers(-4, 5, (5, 64)) / 4, jnp.float32)  # many ties
    levels = [jnp.asarray(rng.integers(-4, 5, 5) / 4, jnp.float32) for _ in range(3)]
    got = jax.jit(device_topk.tally, static_argnums=2)(s, levels, 2)
    s = np.asarray(s)
    for i, (g, v) in enumerate(zip(got, levels, strict=True)):
        above = s > np.asarray(v)[:, None] if i < 2 else s >= np.asarray(v)[:, None]
        np.testing.assert_array_equal(g, above.sum(axis=1))


@pytest.mark.parametrize("c, g", [(5, 4), (12, 1), (40, 8)])
def test_candidates_are_every_score_at_or_above_the_threshold_in_order(c, g):
    rng = np.random.default_rng(c)
    s = rng.integers(-8, 9, (9, 96)).astype(np.float32) / 8
    thr = np.sort(s, axis=1)[:, -c]  # at most c above, fewer where ties straddle it
    thr[0] = np.inf  # none
    thr[1] = s[1].max()  # the maximum only (and its ties)
    # Half a grid step up where ties straddle it (not nextafter: XLA flushes denormals to 0).
    thr = np.where((s >= thr[:, None]).sum(1) > c, thr + 1 / 16, thr).astype(np.float32)
    vals, cols = jax.jit(device_topk.candidates, static_argnums=(2, 3))(s, thr, c, g)
    for i in range(s.shape[0]):
        want = np.flatnonzero(s[i] >= thr[i])
        np.testing.assert_array_equal(cols[i, : want.size], want)
        np.testing.assert_array_equal(vals[i, : want.size], s[i, want])
        assert np.isneginf(vals[i, want.size :]).all()


def brute_force(scores, ids, pos, m):
    """Top-M by (score desc, id asc), -inf / -1 padded, and counts strictly above."""
    order = np.lexsort((np.broadcast_to(ids, scores.shape), -scores), axis=1)[:, :m]
    vals = np.take_along_axis(scores, order, axis=1)
    top = ids[order]
    if vals.shape[1] < m:
        vals = np.pad(vals, ((0, 0), (0, m - vals.shape[1])), constant_values=-np.inf)
        top = np.pad(top, ((0, 0), (0, m - top.shape[1])), constant_values=-1)
    counts = (scores[:, None, :] > pos[:, :, None]).sum(axis=2)
    return vals, top, counts


def test_every_path_matches_brute_force_on_one_device():
    # Scores on a grid of 1/8 (exact in float16 and any summation order) tie often; tiny sizes
    # force every path: dense blocks first (no threshold yet), then queries cut alone, then
    # appends and cuts of the full buffer.
    q, d, m, b, n_blocks = 9, 8, 6, 32, 14
    settings = device_topk.Settings(m, capacity=4, chunk=4, spare=2, heavy_rows=3)
    rng = np.random.default_rng(3)
    queries = (rng.integers(-1, 2, (q, d)) * 0.5).astype(np.float16)
    x = (rng.integers(-1, 2, (n_blocks * b, d)) * 0.5).astype(np.float16)
    x[: 3 * b] *= np.float16(0.5)  # lower scores first: tau keeps rising, candidates appear
    pos = rng.integers(-8, 9, (q, 3)).astype(np.float32) / 4
    pos[0, 1] = np.inf  # a padding slot
    floor = np.full(q, -np.inf, np.float32)
    buf = jax.tree.map(jnp.asarray, device_topk.empty(q, 3, settings))
    step = jax.jit(functools.partial(device_topk.step, settings=settings))
    for i in range(n_blocks):
        rows = np.arange(i * b, (i + 1) * b, dtype=np.int32)
        valid = rows < n_blocks * b - 5  # padding rows in the last block
        args = (queries, x[rows], np.where(valid, 0, -1), np.where(valid, rows, -1), pos, floor)
        buf = step(buf, *map(jnp.asarray, args))
    assert step._cache_size() == 1  # one compilation for every block and path
    vals, shard, row, counts = map(
        np.asarray, jax.jit(device_topk.finish, static_argnums=1)(buf, m)
    )
    scores = queries.astype(np.float32) @ x[: n_blocks * b - 5].astype(np.float32).T
    want = brute_force(scores, np.arange(scores.shape[1]), pos, m)
    # In canonical order already: lax.top_k keeps the leftmost of equal scores, the lower id.
    np.testing.assert_array_equal(vals, want[0])
    np.testing.assert_array_equal(row, want[1])
    assert (shard == 0).all()
    np.testing.assert_array_equal(counts, want[2])
    assert int(buf.dense) > 0 and int(buf.heavy) > 0 and int(buf.cuts) > 0
    assert int(buf.dense) < n_blocks


def test_settings_reject_empty_sizes():
    with pytest.raises(ValueError, match="must be positive"):
        device_topk.Settings(10, capacity=0)
