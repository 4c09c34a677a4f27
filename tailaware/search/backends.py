"""Scoring backends: score one block of descriptors and fold it into the running top-M state.

Backends (all give the same top-M scores and counts on the same float32 scores):
- "host": numpy (OpenBLAS) matmul and the filtered numpy selection of `tailaware.search.topk`; the
  fastest on CPU, where XLA's matmul and top-k are slower.
- "jax": jit-compiled blocked matmul (float16/bfloat16 inputs, float32 accumulation) with the
  top-M and counts on device, queries sharded over the local devices; for accelerators.
- "faiss": faiss `IndexFlatIP` search of each block's top-M plus a range search for the
  counts of the queries whose positives fall below it (faiss-gpu for the search when present
  and M <= 2048, faiss's GPU limit).

A backend has `scores(x)` (the search's arithmetic, e.g. for the positives), `start(pos, state)`,
`add(x, ids)` per block, `state()` (in canonical order, `topk.sorted_state`) and `subset(rows)`
(a backend for some of the queries). The host backend scores a block while the caller reads
the next (`drain` waits for it; `state` does too) and `speculates`: `score_shards` guesses
each query's final M-th score from a random pilot sample of the rows, the backend filters at
that floor, and queries where the guess proves too high get a second pass.

Shapes: Q queries, D descriptor dims, B block rows, M kept scores, P positive slots.
Distractor ids are `shard << 32 | row` (`global_ids`), so ties order by file position.
"""

import os
import threading
from concurrent import futures

import jax
import jax.numpy as jnp
import numpy as np
import threadpoolctl

from tailaware.search import float16, topk
from tailaware.search.topk import TopState

BACKENDS = ("host", "jax", "faiss")
ROW_BITS = 32


def global_ids(shard: int, rows: np.ndarray) -> np.ndarray:
    """Returns the engine's int64 distractor ids: shard number and row within the file."""
    return (np.int64(shard) << np.int64(ROW_BITS)) | np.asarray(rows, np.int64)


def split_ids(ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Inverse of `global_ids`: (shard numbers, rows)."""
    ids = np.asarray(ids, np.int64)
    return ids >> np.int64(ROW_BITS), ids & np.int64((1 << ROW_BITS) - 1)


class HostBackend:
    """numpy matmul (float32 from the stored float16) + `topk.HostTopM`, in parallel threads.

    Each block is cut into equal column chunks of at most M (and `chunk`) distractors, queued
    to a pool of worker threads; each worker scores the chunks it takes into its own `HostTopM`
    (single-threaded BLAS per worker, so the filtering of one chunk overlaps the matmul of
    another, and a worker slowed by other work takes fewer chunks), and the workers' states
    merge exactly. Each filters with the highest of all the workers' thresholds and the start
    state's floor. (A chunk of ~4000 runs the per-worker matmul ~10% faster than 2048 here.)

    `add` returns once the block before this one is scored (a pipeline one block deep): the
    workers never wait for the caller to read the next block, nor for each other at the end of
    one, and at most two blocks are held. `state` (or `drain`) waits for the rest.
    """

    speculates = True  # filtering at a guessed floor cuts the selection work several times
    FLOOR_SPARE = 1024  # buffer slots beyond M per query when filtering at a floor

    def __init__(self, queries: np.ndarray, m: int, threads: int | None = None, chunk=4096):
        self.queries = np.ascontiguousarray(queries, np.float32)
        self.m, self.chunk = m, min(chunk, m)
        self.threads = threads or os.cpu_count() or 1
        self.pool = futures.ThreadPoolExecutor(self.threads)
        self.blas = threadpoolctl.ThreadpoolController()  # found once: a lookup costs ~2 ms
        self.limit = None  # the BLAS thread limit, held while chunks are in flight
        self.pending: list[futures.Future] = []  # the chunks of the last block added
        self.workers: dict[int, int] = {}  # thread id -> its slot (`tops`, buffers)
        self.lock = threading.Lock()
        # Per-worker buffers for a chunk's float32 rows [chunk, D] and scores [Q, chunk]:
        # fresh arrays of this size cost page faults on every chunk.
        q, d = self.queries.shape
        self.rows_buf = [np.empty((self.chunk, d), np.float32) for _ in range(self.threads)]
        self.scores_buf = [np.empty((q, self.chunk), np.float32) for _ in range(self.threads)]

    def scores(self, x: np.ndarray) -> np.ndarray:
        return self.queries @ float16.to_float32(x).T

    def subset(self, rows: np.ndarray) -> "HostBackend":
        """Returns a backend of the same settings for the queries `rows`."""
        return HostBackend(self.queries[rows], self.m, self.threads, self.chunk)

    def start(self, pos_scores: np.ndarray, state: TopState) -> None:
        self.drain()
        # Below a floor few scores are buffered (a chunk adds tens per query): room for
        # FLOOR_SPARE beyond M suffices (a row that overflows takes a dense selection of its
        # chunk), and the narrower buffers cost fewer fresh pages (first touches run in parallel).
        spare = min(self.chunk, self.FLOOR_SPARE)
        width = self.m + spare if state.floor is not None else 2 * self.m

        def make(t):
            top = topk.HostTopM(pos_scores, self.m, state if t == 0 else None, width)
            if state.floor is not None:
                top.floor[:] = state.floor
            return top

        self.tops = list(self.pool.map(make, range(self.threads)))
        for top in self.tops:
            top.peers = [other for other in self.tops if other is not top]

    def add(self, x: np.ndarray, ids: np.ndarray) -> None:
        # Chunks of equal width (none much narrower: a thin matmul runs slower).
        k = -(-x.shape[0] // self.chunk)
        edges = [x.shape[0] * i // k for i in range(k + 1)]
        spans = list(zip(edges[:-1], edges[1:], strict=True))
        if any(top.cold for top in self.tops):
            # Until a query has M scores (and without a floor) nothing can be filtered: each
            # worker selects from one wide slab of its share of the chunks instead of many
            # narrow chunks that would all overflow the buffer.
            self.drain()
            slabs = [spans[t :: self.threads] for t in range(self.threads)]
            cols = [np.concatenate([np.arange(a, b) for a, b in s]) for s in slabs if s]
            self._submit([(x[c], ids[c]) for c in cols])
            self.drain()
            return
        previous, self.pending = self.pending, []
        self._submit([(x[a:b], ids[a:b]) for a, b in spans])
        self._wait(previous)

    def drain(self) -> None:
        """Waits until every chunk added is scored (and lets BLAS use all cores again)."""
        pending, self.pending = self.pending, []
        self._wait(pending)

    def state(self) -> TopState:
        self.drain()
        # Rows are independent: the threads build, merge and sort slices of queries, small
        # enough that the temporaries stay in cache and in reused memory.
        q = self.queries.shape[0]
        edges = list(range(0, q, 128)) + [q]

        def part(i):
            return topk.merged_state(self.tops, slice(edges[i], edges[i + 1]))

        parts = list(self.pool.map(part, range(len(edges) - 1)))
        vals, ids, counts = (np.concatenate([p[i] for p in parts]) for i in range(3))
        floor = None if parts[0].floor is None else np.concatenate([p.floor for p in parts])
        return TopState(vals, ids, counts, floor)

    def _submit(self, chunks) -> None:
        if self.limit is None:
            blas_threads = max(1, (os.cpu_count() or 1) // self.threads)
            self.limit = self.blas.limit(limits=blas_threads, user_api="blas")
        self.pending += [self.pool.submit(self._add, x, i) for x, i in chunks]

    def _wait(self, pending) -> None:
        try:
            for f in pending:
                f.result()
        except BaseException:
            for f in self.pending:
                f.cancel()
            futures.wait(self.pending)
            self.pending = []
            raise
        finally:
            if not self.pending and self.limit is not None:
                self.limit.restore_original_limits()
                self.limit = None

    def _add(self, x: np.ndarray, ids: np.ndarray) -> None:
        """A worker scores rows `x` [n, D] (ids [n]) into its own `HostTopM`."""
        t = self.workers.get(threading.get_ident())
        if t is None:
            with self.lock:
                t = self.workers.setdefault(threading.get_ident(), len(self.workers))
        n = x.shape[0]
        if n <= self.chunk:
            xc = float16.to_float32(x, self.rows_buf[t][:n])
            scores = self.scores_buf[t].ravel()[: self.queries.shape[0] * n].reshape(-1, n)
            np.matmul(self.queries, xc.T, out=scores)
        else:
            scores = self.queries @ float16.to_float32(x).T
        self.tops[t].add_scores(scores, ids)


class JaxBackend:
    """Everything on device: blocked matmul, fused counts, top-M by `lax.top_k` (sharded on Q)."""

    def __init__(self, queries: np.ndarray, m: int, block_size: int, dtype: str = "float16"):
        self.m, self.block_size = m, block_size
        self.dtype = jnp.dtype(dtype)
        self.host_queries = queries
        devices = jax.local_devices()
        self.num_queries = queries.shape[0]
        pad = -self.num_queries % len(devices)
        mesh = jax.sharding.Mesh(np.asarray(devices), ("q",))
        self.rows = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("q"))
        self.replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
        q = np.concatenate([queries, np.zeros((pad, queries.shape[1]), queries.dtype)])
        self.queries = jax.device_put(q.astype(self.dtype), self.rows)
        self.pad = pad
        self._scores = jax.jit(_dot)
        self._step = jax.jit(
            _jax_step,
            donate_argnums=(0,),
            out_shardings=(self.rows, self.rows, self.rows, self.rows),
        )

    def scores(self, x: np.ndarray) -> np.ndarray:
        out = self._scores(self.queries, jax.device_put(x.astype(self.dtype), self.replicated))
        return np.asarray(jax.device_get(out))[: self.num_queries]

    def subset(self, rows: np.ndarray) -> "JaxBackend":
        """Returns a backend of the same settings for the queries `rows`."""
        return JaxBackend(self.host_queries[rows], self.m, self.block_size, self.dtype.name)

    def start(self, pos_scores: np.ndarray, state: TopState) -> None:
        self.floor = state.floor  # a speculative state stays one (this backend keeps all above)
        pos = np.where(np.isnan(pos_scores), np.inf, pos_scores).astype(np.float32)
        state = topk.sorted_state(state)  # lax.top_k breaks ties by position: order by id
        shard_no, rows = split_ids(np.where(state.ids >= 0, state.ids, 0))
        arrays = (
            state.vals,
            np.where(state.ids >= 0, shard_no, -1).astype(np.int32),
            np.where(state.ids >= 0, rows, -1).astype(np.int32),
            state.counts.astype(np.int32),
        )
        self.carry = tuple(jax.device_put(self._pad(a), self.rows) for a in arrays)
        self.pos = jax.device_put(self._pad(pos, np.inf), self.rows)

    def add(self, x: np.ndarray, ids: np.ndarray) -> None:
        n = x.shape[0]
        if n > self.block_size:
            raise ValueError(f"block of {n} rows exceeds block_size {self.block_size}")
        # A fixed block shape keeps one compiled step; padding rows are masked out.
        xb = np.zeros((self.block_size, x.shape[1]), self.dtype)
        xb[:n] = x
        shard_no, rows = split_ids(ids)
        sb = np.full(self.block_size, -1, np.int32)
        rb = np.full(self.block_size, -1, np.int32)
        sb[:n], rb[:n] = shard_no, rows
        put = lambda a: jax.device_put(a, self.replicated)
        self.carry = self._step(
            self.carry,
            self.queries,
            put(xb),
            put(sb),
            put(rb),
            put(np.arange(self.block_size) < n),
            self.pos,
        )

    def state(self) -> TopState:
        vals, shard_no, rows, counts = (
            np.asarray(a)[: self.num_queries] for a in jax.device_get(self.carry)
        )
        ids = np.where(shard_no >= 0, global_ids(shard_no.astype(np.int64), rows), -1)
        return topk.sorted_state(TopState(vals, ids, counts.astype(np.int64), self.floor))

    def _pad(self, a, value=0):
        width = [(0, self.pad)] + [(0, 0)] * (a.ndim - 1)
        return np.pad(a, width, constant_values=value)


def _dot(q, x):
    return jax.lax.dot_general(q, x, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)


def _jax_step(carry, queries, x, shard_no, rows, valid, pos):
    """One block on device: [Q, B] scores, count sums, and top-M of (state, block)."""
    vals, s_ids, r_ids, counts = carry
    s = jnp.where(valid[None, :], _dot(queries, x), -jnp.inf)
    counts = counts + (s[:, None, :] > pos[:, :, None]).sum(axis=2, dtype=jnp.int32)
    q = s.shape[0]
    # lax.top_k puts the lower index first among equals: the state (earlier ids) wins ties.
    all_vals = jnp.concatenate([vals, s], axis=1)
    all_s = jnp.concatenate([s_ids, jnp.broadcast_to(shard_no, (q, shard_no.size))], axis=1)
    all_r = jnp.concatenate([r_ids, jnp.broadcast_to(rows, (q, rows.size))], axis=1)
    vals, idx = jax.lax.top_k(all_vals, vals.shape[1])
    take = lambda a: jnp.take_along_axis(a, idx, axis=1)
    return vals, take(all_s), take(all_r), counts


class FaissBackend:
    """faiss `IndexFlatIP` per block: its top-M feed the running top-M; range search counts."""

    def __init__(self, queries: np.ndarray, m: int):
        try:
            import faiss  # optional: the `cpu` or `gpu` extra
        except ImportError as e:
            raise ImportError(
                "backend faiss needs the `cpu` extra (faiss-cpu) or the `gpu` extra "
                "(faiss-gpu-cu12): pip install -e '.[cpu]'"
            ) from e

        self.faiss = faiss
        self.queries = np.ascontiguousarray(queries, np.float32)
        self.m = m
        self.gpu = m <= 2048 and hasattr(faiss, "get_num_gpus") and faiss.get_num_gpus() > 0

    def scores(self, x: np.ndarray) -> np.ndarray:
        index = self._index(x)
        vals, idx = index.search(self.queries, x.shape[0])
        out = np.empty_like(vals)
        np.put_along_axis(out, idx, vals, axis=1)
        return out

    def subset(self, rows: np.ndarray) -> "FaissBackend":
        """Returns a backend of the same settings for the queries `rows`."""
        return FaissBackend(self.queries[rows], self.m)

    def start(self, pos_scores: np.ndarray, state: TopState) -> None:
        self.top = topk.HostTopM(pos_scores, self.m, start=state)
        self.pos_scores = pos_scores

    def add(self, x: np.ndarray, ids: np.ndarray) -> None:
        index = self._index(x)
        search = self.faiss.index_cpu_to_all_gpus(index) if self.gpu else index
        k = min(self.m, x.shape[0])
        vals, idx = search.search(self.queries, k)
        rows = np.repeat(np.arange(vals.shape[0]), k)
        self.top.add_candidates(rows, vals.ravel(), ids[idx.ravel()])
        # Counts: the block's top-k are complete above its k-th score; queries with a positive
        # below it need every block score above their lowest positive (range search).
        counter = self.top.counter
        kth = vals[:, -1] if k == self.m else np.full(vals.shape[0], -np.inf, np.float32)
        easy = counter.min_pos >= kth
        sel = easy[:, None] & (vals > counter.min_pos[:, None])
        r = np.nonzero(sel)[0]
        self.top.counts += counter.count(r, vals[sel])
        for chunk in np.array_split(np.flatnonzero(~easy), max(1, int((~easy).sum()) // 32)):
            if chunk.size == 0:
                continue
            radius = float(counter.min_pos[chunk].min())
            lims, dist, _ = index.range_search(self.queries[chunk], radius)
            r = np.repeat(chunk, np.diff(lims).astype(np.int64))
            self.top.counts += counter.count(r, dist)

    def state(self) -> TopState:
        return self.top.state()

    def _index(self, x):
        index = self.faiss.IndexFlatIP(x.shape[1])
        index.add(np.ascontiguousarray(x, np.float32))
        return index


def make_backend(name: str, queries: np.ndarray, m: int, block_size: int, dtype: str):
    """Returns the backend `name` ("auto": "jax" on an accelerator, else "host")."""
    if name == "auto":
        name = "host" if jax.default_backend() == "cpu" else "jax"
    if name == "host":
        return HostBackend(queries, m)
    if name == "jax":
        return JaxBackend(queries, m, block_size, dtype)
    if name == "faiss":
        return FaissBackend(queries, m)
    raise ValueError(f"unknown scoring backend {name!r}; expected 'auto' or one of {BACKENDS}")
