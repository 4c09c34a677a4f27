"""The scoring engine against brute-force numpy: top-M, exact counts, backends, merge, resume."""

import dataclasses
import sys

import jax
import numpy as np
import pytest

from tailaware.io import ilias_folder
from tailaware.search import device_topk, scoring, topk

Q, D, M = 7, 16, 25  # odd Q exercises the jax backend's padding to the 2 CPU devices
SHARD_ROWS = (90, 0, 130, 57)  # an empty shard and uneven blocks on purpose


def ternary(rng, *shape):
    # Entries in {-1/4, 0, 1/4} with D = 16: every dot product is a multiple of 1/16 in
    # [-1, 1], exact in float16 inputs, bfloat16 inputs and any float32 summation order, so
    # all backends must agree bit for bit, and ties are frequent (the tie rule is exercised).
    return (rng.integers(-1, 2, size=shape) * 0.25).astype(np.float16)


def make_problem(seed=0, n_pos=4, shard_rows=SHARD_ROWS, dim=D):
    rng = np.random.default_rng(seed)
    queries = ternary(rng, Q, dim)
    shards_x = [ternary(rng, n, dim) for n in shard_rows]
    # Positive scores on the score grid, some very low (so counts go beyond the top-M), NaN pads.
    pos = rng.integers(-6, 12, size=(Q, n_pos)).astype(np.float32) / 16
    pos[1, 2:] = np.nan
    pos[3, 0] = -0.75
    shards = [
        ilias_folder.memory_shard(i, x, [f"d{i}/{j}" for j in range(x.shape[0])], f"shard{i}")
        for i, x in enumerate(shards_x)
    ]
    return queries, pos, shards, shards_x


def brute_force(queries, pos, shards_x, m, fraction=1.0, seed=0):
    """The reference: score everything, sort by (score desc, id asc), count strictly above."""
    from tailaware.core import sampling

    vals, ids = [], []
    for i, x in enumerate(shards_x):
        rows = np.flatnonzero(
            sampling.in_sample([f"d{i}/{j}" for j in range(x.shape[0])], fraction, seed)
        )
        vals.append(queries.astype(np.float32) @ x[rows].astype(np.float32).T)
        ids.append(scoring.global_ids(i, rows))
    vals, ids = np.concatenate(vals, axis=1), np.concatenate(ids)
    ids = np.broadcast_to(ids, vals.shape)
    order = np.lexsort((ids, -vals), axis=1)[:, :m]
    top_v = np.take_along_axis(vals, order, axis=1)
    top_i = np.take_along_axis(ids, order, axis=1)
    if top_v.shape[1] < m:
        pad = m - top_v.shape[1]
        top_v = np.pad(top_v, ((0, 0), (0, pad)), constant_values=-np.inf)
        top_i = np.pad(top_i, ((0, 0), (0, pad)), constant_values=-1)
    counts = (vals[:, None, :] > pos[:, :, None]).sum(axis=2)
    return top_v, top_i, counts, vals.shape[1]


def run_engine(backend_name, queries, pos, shards, m=M, block=40, fraction=1.0, **kw):
    backend = scoring.make_backend(backend_name, queries, m, block, kw.pop("dtype", "float16"))
    spec = scoring.SearchSpec(fraction, 0, m, "test")
    return scoring.score_shards(backend, pos, shards, spec, block_size=block, **kw)


@pytest.mark.parametrize("backend", ["host", "jax", "faiss"])
@pytest.mark.parametrize("fraction", [1.0, 0.4])
def test_backends_match_brute_force(backend, fraction):
    queries, pos, shards, shards_x = make_problem()
    state, n = run_engine(backend, queries, pos, shards, fraction=fraction)
    top_v, top_i, counts, s = brute_force(queries, pos, shards_x, M, fraction)
    assert n == s
    np.testing.assert_array_equal(state.vals, top_v)
    np.testing.assert_array_equal(state.ids, top_i)
    np.testing.assert_array_equal(state.counts, counts)
    # Some counts go beyond the kept M scores: the exact count is not read off the top-M.
    assert (counts > M).any()


def test_jax_bfloat16_and_m_larger_than_sample():
    queries, pos, shards, shards_x = make_problem(seed=1)
    m = 400  # more than the 277 distractors: -inf padding
    state, _ = run_engine("jax", queries, pos, shards, m=m, dtype="bfloat16")
    top_v, top_i, counts, _ = brute_force(queries, pos, shards_x, m)
    np.testing.assert_array_equal(state.vals, top_v)
    np.testing.assert_array_equal(state.ids, top_i)
    np.testing.assert_array_equal(state.counts, counts)
    assert np.isneginf(state.vals[:, -1]).all()


def test_host_top_m_on_continuous_scores(monkeypatch):
    # Random float32 scores with no grid: filtering, compaction and counting across 30 blocks.
    rng = np.random.default_rng(3)
    q, m, b, n_blocks = 5, 50, 64, 30
    pos = rng.uniform(-0.2, 0.9, (q, 3)).astype(np.float32)
    pos[0, 1] = -0.5  # most scores beat it: this row is counted by comparisons
    compared = []
    count_all = topk.PositiveCounter.count_all
    monkeypatch.setattr(
        topk.PositiveCounter, "count_all", lambda c, r, s: compared.append(r) or count_all(c, r, s)
    )
    top = topk.HostTopM(pos, m)
    blocks = [rng.normal(0.0, 0.3, (q, b)).astype(np.float32) for _ in range(n_blocks)]
    for i, s in enumerate(blocks):
        top.add_scores(s, np.arange(i * b, (i + 1) * b, dtype=np.int64))
    state = topk.sorted_state(top.state())
    allv = np.concatenate(blocks, axis=1)
    np.testing.assert_array_equal(state.vals, -np.sort(-allv, axis=1)[:, :m])
    np.testing.assert_array_equal(state.counts, (allv[:, None, :] > pos[:, :, None]).sum(2))
    assert compared and all(0 in rows for rows in compared)


def test_ordered_keys_are_exact_near_zero_and_for_signed_zero():
    v = np.asarray([-1.0, -1e-30, -0.0, 0.0, 1e-38, 1e-30, 1.0, np.inf], np.float32)
    keys = topk.ordered_keys(np.zeros(v.size, np.int64), v)
    assert keys[2] == keys[3]  # -0.0 == +0.0
    assert (np.diff(np.delete(keys, 2).astype(np.float64)) > 0).all()
    assert topk.ordered_keys(np.asarray([1]), np.asarray([-1.0], np.float32)) > keys.max()


def test_merged_partials_equal_one_search():
    queries, pos, shards, _ = make_problem(seed=2)
    whole, n = run_engine("host", queries, pos, shards)
    parts = [
        run_engine("host", queries, pos, scoring.assign_shards(shards, p, 3)) for p in range(3)
    ]
    merged = parts[0][0]
    for state, _ in parts[1:]:
        merged = topk.merge_states(merged, state)
    for a, b in zip(topk.sorted_state(merged), whole, strict=True):
        np.testing.assert_array_equal(a, b)
    assert sum(k for _, k in parts) == n


class _Interrupt(Exception):
    pass


def test_resume_after_interruption_gives_identical_state(tmp_path):
    queries, pos, shards, _ = make_problem(seed=4)
    ckpt = str(tmp_path / "partial.npz")
    whole, n = run_engine("host", queries, pos, shards)

    calls = {"n": 0}
    original = scoring.HostBackend.add

    def flaky(self, x, ids):
        calls["n"] += 1
        if calls["n"] == 5:  # inside shard 2, after shards 0 and 1 were checkpointed
            raise _Interrupt
        return original(self, x, ids)

    scoring.HostBackend.add = flaky
    try:
        with pytest.raises(_Interrupt):
            run_engine("host", queries, pos, shards, checkpoint=ckpt)
    finally:
        scoring.HostBackend.add = original
    partial, done, _ = scoring.load_checkpoint(ckpt)
    assert done == [0, 1]
    assert partial.floor is not None  # a speculative partial keeps its floor for the resume
    resumed, n2 = run_engine("host", queries, pos, shards, checkpoint=ckpt)
    assert n2 == n
    for a, b in zip(resumed, whole, strict=True):
        np.testing.assert_array_equal(a, b)
    assert scoring.load_checkpoint(ckpt)[0].floor is None  # the final partial is exact


# The pilot draws a real sample of these 4000 rows; with D = 64 the scores (multiples of 1/16 in
# [-4, 4], still exact in any summation order) tie less, so speculation has room to work.
BIG_SHARDS = (1500, 700, 0, 1800)


class SpyHost(scoring.HostBackend):
    """The host backend, recording the query rows of every rescan (`subset`)."""

    rescanned: list

    def subset(self, rows):
        self.rescanned.append(rows)
        return super().subset(rows)


def run_spied(queries, pos, shards, block=400, backend_options=None, **kw):
    """Runs the host engine; returns (state, S, backend, the query rows it rescanned)."""
    backend = SpyHost(queries, M, chunk=block, **(backend_options or {}))
    backend.rescanned = []
    spec = scoring.SearchSpec(1.0, 0, M, "test")
    state, n = scoring.score_shards(backend, pos, shards, spec, block_size=block, **kw)
    return state, n, backend, backend.rescanned


@pytest.mark.parametrize("order", ["as drawn", "best first"])
def test_speculation_cuts_the_buffered_scores_and_stays_exact(order):
    # Buffers barely wider than M: rows that overflow in a chunk take the dense selection.
    narrow = {"floor_spare": 3}
    queries, pos, shards, shards_x = make_problem(seed=6, shard_rows=BIG_SHARDS, dim=64)
    if order == "best first":  # each shard sorted by its mean score: the pilot is drawn anyway
        shards_x = [x[np.argsort(-(queries @ x.T).mean(0), kind="stable")] for x in shards_x]
        shards = [
            dataclasses.replace(s, read_rows=lambda r, x=x: x[r])
            for s, x in zip(shards, shards_x, strict=True)
        ]
    state, n, backend, rescanned = run_spied(
        queries, pos, shards, backend_options=narrow, pilot_rows=3000
    )
    top_v, top_i, counts, s = brute_force(queries, pos, shards_x, M)
    assert n == s
    np.testing.assert_array_equal(state.vals, top_v)
    np.testing.assert_array_equal(state.ids, top_i)
    np.testing.assert_array_equal(state.counts, counts)
    assert state.floor is None and not rescanned
    # The speculative path was taken: every query had a floor and no score below it was
    # buffered; in random order, far fewer than a search without a floor buffers.
    floor = backend.tops[0].floor
    assert np.isfinite(floor).all()
    scores = queries.astype(np.float32) @ np.concatenate(shards_x).astype(np.float32).T
    buffered = lambda b: sum(top.buffered for top in b.tops)
    assert buffered(backend) <= (scores >= floor[:, None]).sum()
    if order == "as drawn":
        plain, _, plain_backend, _ = run_spied(
            queries, pos, shards, backend_options={**narrow, "speculates": False}
        )
        np.testing.assert_array_equal(plain.ids, state.ids)
        assert buffered(backend) < 0.7 * buffered(plain_backend)


def test_a_floor_guessed_too_high_is_rescanned():
    queries, pos, shards, shards_x = make_problem(seed=7, shard_rows=BIG_SHARDS, dim=64)
    top_v, top_i, counts, _ = brute_force(queries, pos, shards_x, M)
    # Even queries: their 3rd best score, far above their M-th; odd queries: no floor.
    floor = np.where(np.arange(Q) % 2 == 0, top_v[:, 2], -np.inf).astype(np.float32)
    state, _, _, rescanned = run_spied(queries, pos, shards, floor=floor)
    np.testing.assert_array_equal(state.vals, top_v)
    np.testing.assert_array_equal(state.ids, top_i)
    np.testing.assert_array_equal(state.counts, counts)
    assert len(rescanned) == 1
    np.testing.assert_array_equal(rescanned[0], np.flatnonzero(top_v[:, -1] < floor))
    assert rescanned[0].size > 0


def test_exact_rows_keeps_ties_at_the_floor():
    vals = np.asarray([[3.0, 2.0, 2.0], [3.0, 2.0, 1.0], [3.0, 2.0, -np.inf]], np.float32)
    state = topk.TopState(vals, np.zeros(vals.shape, np.int64), np.zeros((3, 1), np.int64))
    assert topk.exact_rows(state).all()
    floored = state._replace(floor=np.full(3, 2.0, np.float32))
    np.testing.assert_array_equal(topk.exact_rows(floored), [True, False, False])


def test_checkpoint_of_another_search_is_refused(tmp_path):
    queries, pos, shards, _ = make_problem()
    ckpt = str(tmp_path / "partial.npz")
    run_engine("host", queries, pos, shards, checkpoint=ckpt)
    with pytest.raises(ValueError, match="partial.npz: partial result of a different search"):
        run_engine("host", queries, pos, shards, fraction=0.5, checkpoint=ckpt)


def test_duplicate_id_names_the_shard():
    queries, pos, shards, _ = make_problem()
    bad = scoring.Shard(9, "shard9.hdf5", 2, lambda: np.asarray(["a", "a"]), lambda r: None)
    with pytest.raises(ValueError, match="shard9.hdf5: duplicate distractor id 'a'"):
        run_engine("host", queries, pos, [bad])


def test_peak_memory_does_not_grow_with_the_number_of_shards():
    import tracemalloc

    rng = np.random.default_rng(5)
    queries = ternary(rng, Q, D)
    pos = np.full((Q, 2), 0.5, np.float32)
    x = ternary(rng, 5_000, D)
    shard = lambda i: scoring.Shard(
        i,
        f"s{i}",
        x.shape[0],
        lambda: np.asarray([f"{i}/{j}" for j in range(x.shape[0])]),
        lambda rows: x[rows],
    )
    peaks = []
    for n_shards in (3, 9):
        tracemalloc.start()
        run_engine("host", queries, pos, [shard(i) for i in range(n_shards)], block=4096)
        peaks.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
    # 6 more shards hold 30,000 more ids and rows (~1.7 MB); keeping them would show. The margin
    # absorbs allocator and thread-timing noise (read-ahead keeps up to 2 shards in flight).
    assert peaks[1] < 1.5 * peaks[0], peaks


def test_failures_are_raised_and_blas_threads_are_restored():
    # The host backend scores a block while the next is read: an error in a worker must reach
    # the caller, and the one-thread BLAS limit it holds meanwhile must not outlive a search
    # that failed, whether in a worker or while reading (with a block still being scored).
    import threadpoolctl

    queries, pos, shards, _ = make_problem()
    blas = lambda: [i["num_threads"] for i in threadpoolctl.threadpool_info()]
    before = blas()

    calls = []

    def unreadable(rows):  # read by the pilot, then fails (a disk error mid-run)
        calls.append(rows)
        if len(calls) > 1:
            raise ValueError("bad: unreadable")
        return np.zeros((rows.size, D), np.float16)

    ids = lambda: np.asarray([f"b/{j}" for j in range(60)])
    wrong_dim = lambda rows: np.zeros((rows.size, D + 1), np.float16)
    for read, match in [(wrong_dim, None), (unreadable, "bad: unreadable")]:
        bad = scoring.Shard(9, "bad", 60, ids, read)
        with pytest.raises(ValueError, match=match):
            run_engine("host", queries, pos, [*shards, bad])
        assert blas() == before
    state, _ = run_engine("host", queries, pos, shards)  # the engine is usable afterwards
    assert np.isfinite(state.vals).all()


# ---------------------------------------------------------------------------------------------
# The device pass (`tailaware.device_topk`) against the host pass, and the choice of backend.

TINY = device_topk.Settings(M, capacity=4, chunk=2, spare=1, heavy_rows=2)  # every path taken


@pytest.mark.parametrize("settings", [None, TINY], ids=["default", "tiny"])
@pytest.mark.parametrize("big", [False, True], ids=["small", "speculative"])
def test_device_pass_equals_host_pass(settings, big):
    if big:  # 4000 rows: a pilot floor, and few scores above it per block
        queries, pos, shards, shards_x = make_problem(seed=9, shard_rows=BIG_SHARDS, dim=64)
    else:
        queries, pos, shards, shards_x = make_problem(seed=8)
    block = 400 if big else 40
    host, n = run_engine("host", queries, pos, shards, block=block)
    backend = scoring.JaxBackend(queries, M, block, "float16", settings)
    spec = scoring.SearchSpec(1.0, 0, M, "test")
    state, n_jax = scoring.score_shards(backend, pos, shards, spec, block_size=block)
    assert backend.num_devices == 2 and n_jax == n
    for got, want in [(state.vals, host.vals), (state.ids, host.ids), (state.counts, host.counts)]:
        np.testing.assert_array_equal(got, want)
    top_v, top_i, counts, _ = brute_force(queries, pos, shards_x, M)
    np.testing.assert_array_equal(state.ids, top_i)
    np.testing.assert_array_equal(state.counts, counts)
    assert (counts > M).any()  # positives below the top-M: counts beyond the kept scores
    assert (np.diff(top_v, axis=1) == 0).any()  # ties, broken by id
    if settings is TINY:  # the fallbacks were taken (test_device_topk takes every path)
        buf = jax.device_get(backend.buf)
        assert buf.dense.sum() > 0 and buf.heavy.sum() + buf.cuts.sum() > 0


def test_device_pass_rescans_a_floor_guessed_too_high(monkeypatch):
    queries, pos, shards, shards_x = make_problem(seed=7, shard_rows=BIG_SHARDS, dim=64)
    top_v, top_i, counts, _ = brute_force(queries, pos, shards_x, M)
    floor = np.where(np.arange(Q) % 2 == 0, top_v[:, 2], -np.inf).astype(np.float32)
    rescanned, subset = [], scoring.JaxBackend.subset
    monkeypatch.setattr(
        scoring.JaxBackend,
        "subset",
        lambda self, rows: rescanned.append(rows) or subset(self, rows),
    )
    state, _ = run_engine("jax", queries, pos, shards, block=400, floor=floor)
    np.testing.assert_array_equal(state.vals, top_v)
    np.testing.assert_array_equal(state.ids, top_i)
    np.testing.assert_array_equal(state.counts, counts)
    np.testing.assert_array_equal(rescanned[0], np.flatnonzero(top_v[:, -1] < floor))


def test_device_pass_needs_increasing_ids():
    queries, pos, _, shards_x = make_problem()
    backend = scoring.JaxBackend(queries, M, 64)
    backend.start(pos, topk.empty_state(Q, M, pos.shape[1]))
    backend.add(shards_x[0][:10], scoring.global_ids(1, np.arange(10)))
    with pytest.raises(ValueError, match="increasing order"):
        backend.add(shards_x[0][:10], scoring.global_ids(0, np.arange(10)))


@pytest.mark.parametrize(
    "platform, gpus, m, want",
    [
        ("cpu", 0, 4000, "host"),
        ("cpu", 2, 4000, "host"),  # beyond faiss's GPU k
        ("cpu", 1, 2048, "faiss"),
        ("gpu", 1, 1000, "jax"),
        ("gpu", 0, 4000, "jax"),
        ("tpu", 0, 4000, "jax"),
    ],
)
def test_auto_picks_the_fastest_exact_backend(platform, gpus, m, want):
    assert scoring.choose_backend(platform, gpus, m) == want


class _FakeGpuFaiss:
    """faiss-gpu's Python API over faiss-cpu (a "GPU" index is a CPU one); counts what is made."""

    def __init__(self):
        import faiss

        made = self.made = {"resources": 0, "indexes": 0}
        self.IndexFlatIP = faiss.IndexFlatIP

        class StandardGpuResources:
            def __init__(self):
                made["resources"] += 1

        class GpuIndexFlatConfig:
            device = -1

        def gpu_index_flat_ip(resources, d, config):
            assert isinstance(resources, StandardGpuResources) and config.device == 0
            made["indexes"] += 1
            return faiss.IndexFlatIP(d)

        self.StandardGpuResources = StandardGpuResources
        self.GpuIndexFlatConfig = GpuIndexFlatConfig
        self.GpuIndexFlatIP = gpu_index_flat_ip

    def get_num_gpus(self):
        return 1


def test_faiss_gpu_search_holds_one_resource_for_the_run(monkeypatch):
    fake = _FakeGpuFaiss()
    monkeypatch.setitem(sys.modules, "faiss", fake)
    monkeypatch.setattr(scoring.FaissGpu, "_held", {})
    queries, pos, shards, shards_x = make_problem()
    backend = scoring.make_backend("auto", queries, M, 40, "float16")  # JAX on CPU, faiss GPU
    assert isinstance(backend, scoring.FaissBackend) and backend.gpu is not None
    for _ in range(2):  # two runs of 8 blocks, and a backend for some queries
        state, _ = run_engine("faiss", queries, pos, shards)
    assert backend.subset(np.arange(3)).gpu is backend.gpu
    top_v, top_i, counts, _ = brute_force(queries, pos, shards_x, M)
    np.testing.assert_array_equal(state.vals, top_v)
    np.testing.assert_array_equal(state.ids, top_i)
    np.testing.assert_array_equal(state.counts, counts)
    assert fake.made == {"resources": 1, "indexes": 1}
    assert scoring.FaissBackend(queries, 4000).gpu is None  # k beyond faiss's GPU limit
