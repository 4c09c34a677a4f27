"""Scoring backends: score one block of descriptors and fold it into the running top-M state.

Backends (all give the same top-M scores and counts on the same float32 scores):
- "host": numpy (OpenBLAS) matmul and the filtered numpy selection of `tailaware.search.topk`; the
  fastest on CPU, where XLA's matmul and top-k are slower.
- "jax": `device_topk` on the local devices: matmul (float16/bfloat16 inputs, float32
  accumulation), counts and a sort-free compaction of the few scores that can still enter the
  top-M, each block's rows split over the devices; for accelerators.
- "faiss": faiss `IndexFlatIP` search of each block's top-M plus a range search for the
  counts of the queries whose positives fall below it (the search on a GPU when faiss has
  one and M <= 2048, faiss's GPU limit, with one `FaissGpu` held for the run).
"auto" picks one for the machine (`choose_backend`).

A backend plays the `Backend` role: `scores(x)` (the search's arithmetic, e.g. for the
positives), `start(pos, state)`, `add(x, ids)` per block, `state()` (in canonical order,
`topk.sorted_state`) and `subset(rows)` (a backend for some of the queries); `BACKEND_FACTORIES`
registers each by name. The host backend scores a block while the caller reads the next (`drain`
waits for it; `state` does too). The host and JAX backends speculate (`speculates`):
`score_shards` guesses each query's final M-th score from a random pilot sample of the rows, the
backend filters at that floor, and queries where the guess proves too high get a second pass.

Shapes: Q queries, D descriptor dims, B block rows, M kept scores, P positive slots.
Distractor ids are `shard << 32 | row` (`global_ids`), so ties order by file position.
"""

import dataclasses
import functools
import os
import threading
from concurrent import futures
from typing import Any, ClassVar, Protocol

import jax
import jax.numpy as jnp
import numpy as np
import threadpoolctl

from tailaware.search import device_topk, float16, topk
from tailaware.search.topk import TopState

ROW_BITS = 32


class Backend(Protocol):
    """The scoring backend's role: score blocks of descriptors into a running top-M state.

    Attributes:
      speculates: `start` filters at the state's floor, guessed from a pilot sample
        (`scoring.score_shards`); rows the guess got wrong are rescanned.

    Optional, found with `hasattr`: `expect_share(share)` (sizes the device buffers from the
    pilot) and `drain()` (waits for blocks still being scored).
    """

    speculates: bool

    def scores(self, x: np.ndarray) -> np.ndarray:
        """Returns the [Q, B] scores of the queries against rows `x` [B, D] (float16)."""
        ...

    def start(self, pos_scores: np.ndarray, state: TopState) -> None:
        """Starts a pass from `state`, counting scores above the positives' [Q, P]."""
        ...

    def add(self, x: np.ndarray, ids: np.ndarray) -> None:
        """Folds the block `x` [B, D] with engine ids `ids` [B] into the state."""
        ...

    def state(self) -> TopState:
        """Returns the running state, in canonical order (`topk.sorted_state`)."""
        ...

    def subset(self, rows: np.ndarray) -> "Backend":
        """Returns a backend of the same settings for the queries `rows`."""
        ...


class BackendFactory(Protocol):
    """Makes a backend for `queries` [Q, D] keeping the top `m` (`make_backend`)."""

    def __call__(self, queries: np.ndarray, m: int, *, block_size: int, dtype: str) -> Backend: ...


def global_ids(shard: int, rows: np.ndarray) -> np.ndarray:
    """Returns the engine's int64 distractor ids: shard number and row within the file."""
    return (np.int64(shard) << np.int64(ROW_BITS)) | np.asarray(rows, np.int64)


def split_ids(ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Returns (shard numbers, rows) of engine ids: the inverse of `global_ids`."""
    ids = np.asarray(ids, np.int64)
    return ids >> np.int64(ROW_BITS), ids & np.int64((1 << ROW_BITS) - 1)


class HostBackend:
    """numpy matmul (float32 from the stored float16) + `topk.HostTopM`, in parallel threads.

    Each block is cut into equal column chunks of at most M (and `chunk`) distractors, queued
    to a pool of worker threads; each worker scores the chunks it takes into its own `HostTopM`
    (single-threaded BLAS per worker, so the filtering of one chunk overlaps the matmul of
    another, and a worker slowed by other work takes fewer chunks), and the workers' states
    merge exactly. Each filters with the highest of all the workers' thresholds and the start
    state's floor. The chunk width is chosen for the per-worker matmul's speed
    (benchmarks/README.md, "scoring.py").

    `add` returns once the block before this one is scored (a pipeline one block deep): the
    workers never wait for the caller to read the next block, nor for each other at the end of
    one, and at most two blocks are held. `state` (or `drain`) waits for the rest.
    """

    def __init__(
        self,
        queries: np.ndarray,
        m: int,
        *,
        threads: int | None = None,
        chunk: int = 4096,
        floor_spare: int = 1024,
        speculates: bool = True,
    ):
        """Holds `queries` [Q, D] and a pool of `threads` workers (default: every core).

        Args:
          chunk: the widest column chunk a worker scores (at most M).
          floor_spare: buffer slots beyond M per query when filtering at a floor.
          speculates: filter at a floor guessed from a pilot sample (`scoring.score_shards`),
            which cuts the selection work several times.
        """
        self.queries = np.ascontiguousarray(queries, np.float32)
        self.m, self.chunk = m, min(chunk, m)
        self.floor_spare, self.speculates = floor_spare, speculates
        self.threads = threads or os.cpu_count() or 1
        self.pool = futures.ThreadPoolExecutor(self.threads)
        self.blas = threadpoolctl.ThreadpoolController()  # found once: each lookup is slow
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
        return type(self)(
            self.queries[rows],
            self.m,
            threads=self.threads,
            chunk=self.chunk,
            floor_spare=self.floor_spare,
            speculates=self.speculates,
        )

    def start(self, pos_scores: np.ndarray, state: TopState) -> None:
        self.drain()
        # Below a floor few scores are buffered (a chunk adds tens per query): room for
        # `floor_spare` beyond M suffices (a row that overflows takes a dense selection of its
        # chunk), and the narrower buffers cost fewer fresh pages (first touches run in parallel).
        spare = min(self.chunk, self.floor_spare)
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
        """Scores rows `x` [n, D] (ids [n]) into the calling worker's own `HostTopM`."""
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
    """Everything on device (`device_topk`), each block's rows split over the devices.

    The matmul, the counts and a sort-free compaction of the few scores that can still enter
    the top-M run on the local devices, each into its own buffer; `state` merges the devices'
    top-M on the host. The backend `speculates` like the host one: a floor from a pilot sample
    lets the first blocks be compacted too.
    """

    speculates: bool = True

    def __init__(
        self,
        queries: np.ndarray,
        m: int,
        block_size: int,
        dtype: str = "float16",
        settings: device_topk.Settings | None = None,
    ):
        self.m, self.requested_block = m, block_size
        self.dtype = jnp.dtype(dtype)
        self.host_queries = queries
        devices = jax.local_devices()
        n = len(devices)
        self.adaptive = settings is None  # C sized from the pilot (`expect_share`)
        settings = settings or device_topk.Settings(m)
        if settings.m != m:
            raise ValueError(f"settings.m = {settings.m} but m = {m}")
        # Equal slices of whole chunks per device; C above a slice's rows buys nothing.
        unit = n * settings.chunk
        self.block_size = -(-block_size // unit) * unit
        self.settings = dataclasses.replace(
            settings, capacity=min(settings.capacity, self.block_size // n)
        )
        mesh = jax.sharding.Mesh(np.asarray(devices), (device_topk.AXIS,))
        self.split = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(device_topk.AXIS))
        self.replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
        self.num_devices = n
        self.queries = jax.device_put(np.asarray(queries).astype(self.dtype), self.replicated)
        # float32 inputs stay float32 on accelerators that would round them for the matmul
        # (TF32 on GPUs, bfloat16 passes on TPUs); float16 products are exact in float32 on GPUs
        # and CPUs, bfloat16 ones everywhere.
        self.precision = jax.lax.Precision.HIGHEST if self.dtype == jnp.float32 else None
        self._scores = jax.jit(functools.partial(device_topk.dot, precision=self.precision))
        self.mesh = mesh
        self.share: float | None = None
        self._step, self._finish = device_topk.sharded(mesh, self.settings, self.precision)

    def scores(self, x: np.ndarray) -> np.ndarray:
        out = self._scores(self.queries, jax.device_put(x.astype(self.dtype), self.replicated))
        return np.asarray(jax.device_get(out))

    def subset(self, rows: np.ndarray) -> "JaxBackend":
        """Returns a backend of the same settings for the queries `rows`."""
        return JaxBackend(
            self.host_queries[rows], self.m, self.requested_block, self.dtype.name, self.settings
        )

    def expect_share(self, share: float) -> None:
        """Takes the largest share of a query's pilot scores at or above its floor.

        Unless settings were given, `start` with that floor sizes the candidate slots from it
        (`device_topk.capacity_for`).
        """
        self.share = share

    def start(self, pos_scores: np.ndarray, state: TopState) -> None:
        self.floor = state.floor  # scores below it are dropped: the state stays speculative
        if self.adaptive and self.share is not None and state.floor is not None:
            c = device_topk.capacity_for(self.share, self.block_size // self.num_devices)
            if c != self.settings.capacity:
                self.settings = dataclasses.replace(self.settings, capacity=c)
                sharded = device_topk.sharded(self.mesh, self.settings, self.precision)
                self._step, self._finish = sharded
        q, p = pos_scores.shape
        pos = np.where(np.isnan(pos_scores), np.inf, pos_scores).astype(np.float32)
        floor = np.full(q, -np.inf, np.float32) if state.floor is None else state.floor
        if np.isfinite(state.vals).any() or state.counts.any():  # a resumed search
            # The state goes to device 0's buffer in canonical order (ties by ascending id, as
            # the buffer keeps them); the other devices start empty.
            bufs = [device_topk.empty(q, p, self.settings) for _ in range(self.num_devices)]
            state = topk.sorted_state(state)
            known = state.ids >= 0
            shard_no, rows = split_ids(np.where(known, state.ids, 0))
            m = self.m
            bufs[0].vals[:, :m] = state.vals
            bufs[0].shard[:, :m] = np.where(known, shard_no, -1)
            bufs[0].row[:, :m] = np.where(known, rows, -1)
            bufs[0].counts[:] = state.counts
            bufs[0].tau[:] = state.vals[:, m - 1]
            stacked = device_topk.Buffer(*(np.stack(f) for f in zip(*bufs, strict=True)))
            self.buf = jax.device_put(stacked, self.split)
        else:  # made on the devices: no host memory to fill and copy
            self.buf = device_topk.empty_on(self.mesh, q, p, self.settings)
        self.pos = jax.device_put(pos, self.replicated)
        self.floor_dev = jax.device_put(np.asarray(floor, np.float32), self.replicated)
        self.last_id = int(state.ids.max(initial=-1))

    def add(self, x: np.ndarray, ids: np.ndarray) -> None:
        n = x.shape[0]
        if n > self.requested_block:
            raise ValueError(f"block of {n} rows exceeds block_size {self.requested_block}")
        if n == 0:
            return
        # Ties are kept by position, which must follow the ids (`score_shards` streams them so).
        if ids[0] <= self.last_id or (np.diff(ids) <= 0).any():
            raise ValueError("the jax backend needs distractor ids in increasing order")
        self.last_id = int(ids[-1])
        # A fixed block shape keeps one compiled step; padding rows have row -1.
        if n == self.block_size and x.dtype == self.dtype:
            xb = x  # a full block needs no copy
        else:
            xb = np.zeros((self.block_size, x.shape[1]), self.dtype)
            xb[:n] = x
        shard_no, rows = split_ids(ids)
        sb = np.full(self.block_size, -1, np.int32)
        rb = np.full(self.block_size, -1, np.int32)
        sb[:n], rb[:n] = shard_no, rows
        put = lambda a: jax.device_put(a, self.split)
        self.buf = self._step(
            self.buf, self.queries, put(xb), put(sb), put(rb), self.pos, self.floor_dev
        )

    def state(self) -> TopState:
        vals, shard_no, rows, counts = jax.device_get(self._finish(self.buf))
        parts = []
        for d in range(self.num_devices):
            known = (rows[d] >= 0) & (vals[d] > -np.inf)
            ids = np.where(known, global_ids(shard_no[d].astype(np.int64), rows[d]), -1)
            parts.append(TopState(vals[d], ids, counts[d].astype(np.int64)))
        if len(parts) == 1:  # in canonical order already (see `device_topk`)
            return parts[0]._replace(floor=self.floor)
        merged = functools.reduce(topk.merge_states, parts)
        return topk.sorted_state(merged._replace(floor=self.floor))


FAISS_GPU_MAX_K = 2048  # the largest k faiss selects on a GPU


def faiss_gpus() -> int:
    """Returns how many GPUs faiss can use here (0 without faiss-gpu, or without faiss)."""
    try:
        import faiss
    except ImportError:
        return 0
    return int(faiss.get_num_gpus()) if hasattr(faiss, "get_num_gpus") else 0


def choose_backend(platform: str, num_faiss_gpus: int, m: int) -> str:
    """Returns the fastest exact backend ("auto") for JAX's `platform` and faiss's GPUs.

    - JAX on an accelerator: "jax", which scores, selects and counts on the device. faiss-gpu
      would select on the GPU too, but it has no GPU range search, so the counts of queries
      whose positives fall below a block's top-k would go through the CPU.
    - JAX on CPU, faiss with a GPU and M <= FAISS_GPU_MAX_K: "faiss" (its search on the GPU).
    - otherwise "host": on CPU it is faster than faiss-cpu's search (benchmarks/README.md,
      "scoring.py").
    """
    if platform != "cpu":
        return "jax"
    if num_faiss_gpus > 0 and m <= FAISS_GPU_MAX_K:
        return "faiss"
    return "host"


class FaissGpu:
    """One GPU's faiss resources and flat inner-product index, held for the whole run.

    `StandardGpuResources` reserves scratch memory and creates streams and handles; making them
    for every block (as `index_cpu_to_all_gpus` does) costs more than searching the block. One
    holder per process and GPU (`shared`) serves every backend, `subset` ones included.
    """

    # Process-wide on purpose (one holder per GPU for every backend): a class-level cache.
    _held: ClassVar[dict[tuple[int, int], "FaissGpu"]] = {}

    def __init__(self, faiss, device: int = 0):
        self.faiss = faiss
        self.resources = faiss.StandardGpuResources()
        self.config = faiss.GpuIndexFlatConfig()
        self.config.device = device
        self.indexes: dict[int, Any] = {}  # dims -> GpuIndexFlatIP, emptied and refilled per block

    @classmethod
    def shared(cls, faiss, device: int = 0) -> "FaissGpu":
        """Returns the process's holder for `device`, made on first use."""
        key = (id(faiss), device)
        if key not in cls._held:
            cls._held[key] = cls(faiss, device)
        return cls._held[key]

    def search(self, x: np.ndarray, queries: np.ndarray, k: int):
        """Returns faiss's (scores [Q, k], rows [Q, k]) of the best rows of `x` [B, D]."""
        d = x.shape[1]
        if d not in self.indexes:
            self.indexes[d] = self.faiss.GpuIndexFlatIP(self.resources, d, self.config)
        index = self.indexes[d]
        index.reset()
        index.add(x)
        return index.search(queries, k)


class FaissBackend:
    """faiss flat inner-product search per block: its top-M feed the running top-M; range
    search counts the rest.

    The search runs on a GPU when faiss has one and M <= FAISS_GPU_MAX_K, with one `FaissGpu`
    for the run; the range search (which faiss has only on CPU) and everything else on the host.
    """

    speculates: bool = False  # faiss searches every block whole

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
        use_gpu = m <= FAISS_GPU_MAX_K and faiss_gpus() > 0
        self.gpu = FaissGpu.shared(faiss) if use_gpu else None

    def scores(self, x: np.ndarray) -> np.ndarray:
        index = self._index(float16.to_float32(x))
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
        x = float16.to_float32(x)
        k = min(self.m, x.shape[0])
        if self.gpu is not None:
            vals, idx = self.gpu.search(x, self.queries, k)
            index = None  # a CPU index only if some query needs a range search
        else:
            index = self._index(x)
            vals, idx = index.search(self.queries, k)
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
            if index is None:
                index = self._index(x)
            radius = float(counter.min_pos[chunk].min())
            lims, dist, _ = index.range_search(self.queries[chunk], radius)
            r = np.repeat(chunk, np.diff(lims).astype(np.int64))
            self.top.counts += counter.count(r, dist)

    def state(self) -> TopState:
        return self.top.state()

    def _index(self, x: np.ndarray):
        index = self.faiss.IndexFlatIP(x.shape[1])
        index.add(np.ascontiguousarray(x, np.float32))
        return index


# The scoring backends by name: a new one is a class playing `Backend` and one line here.
BACKEND_FACTORIES: dict[str, BackendFactory] = {
    "host": lambda queries, m, *, block_size, dtype: HostBackend(queries, m),
    "jax": lambda queries, m, *, block_size, dtype: JaxBackend(queries, m, block_size, dtype),
    "faiss": lambda queries, m, *, block_size, dtype: FaissBackend(queries, m),
}
BACKENDS = tuple(BACKEND_FACTORIES)


def make_backend(name: str, queries: np.ndarray, m: int, block_size: int, dtype: str) -> Backend:
    """Returns the backend `name` ("auto": `choose_backend` for this machine)."""
    if name == "auto":
        name = choose_backend(jax.default_backend(), faiss_gpus(), m)
    if name not in BACKEND_FACTORIES:
        raise ValueError(f"unknown scoring backend {name!r}; expected 'auto' or one of {BACKENDS}")
    return BACKEND_FACTORIES[name](queries, m, block_size=block_size, dtype=dtype)
