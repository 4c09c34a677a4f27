"""Exact running top-M and counts above each positive, on accelerators, one score block at a time.

The device half of the JAX scoring backend (`backends.JaxBackend`), the counterpart of the host's
`topk`. Per block of B distractors, on each device:

1. the scores S = queries x block, [Q, B] float32 (float32 accumulation);
2. the counts: S compared with each of the query's P positives and summed (one pass over S);
3. the candidates: scores >= thr = max(tau, floor), where tau is the query's M-th best at the
   last cut and floor the speculative guess (`topk.guess_floor`). Few scores pass (about
   B M / S per block after the first), so they are compacted into C slots per query without
   any sort: first the chunks of G scores whose maximum reaches thr, then the candidates inside
   them, each time by prefix counts (a matmul with a triangular 0/1 matrix, exact in float32)
   and a binary search for the 1st, 2nd, ... C-th;
4. they are appended to a buffer of W = M + spare C slots per query; when it is full, it is cut
   back to its top-M (`lax.top_k`) and tau rises.

A query with more than C candidates in a block is cut alone (the top-M of its buffer and the
block's scores by `lax.top_k`); a block where more than `heavy_rows` queries have (the first
blocks of a search without a floor) takes the dense path: the same for every query. The dense
path is kept for those blocks because `lax.top_k` over M + B scores is costly: on CPU it runs
single-threaded at several times the matmul's cost. Which path a block takes is decided on the
device (`lax.switch`); on a GPU that reads one flag back per block, so blocks of ~100k rows
keep the round trip small against the block's matmul.

Exactness: the kept scores are the same float32 values as the host's (same products and
float32 sums; the tests use scores that are exact in any summation order), and ties are broken
by ascending id, as on the host: blocks arrive in increasing id order and candidates keep their
column order, so a buffer slot further right never holds a smaller id among equal scores, and
`lax.top_k` keeps the leftmost of equal scores. Counts compare every score with every positive.

Sharding: each device takes an equal slice of every block's rows (`jax.shard_map` over the mesh
axis "d") and keeps its own buffer, with no communication; `finish` cuts each to its top-M, and
the devices' states merge exactly on the host (`topk.merge_states`), counts summed.

Shapes: Q queries, D dims, B block rows on one device, M kept scores, W buffer slots, C
candidate slots per block, G scores per chunk, P positive slots.
"""

import dataclasses
import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import PartitionSpec

AXIS = "d"  # the mesh axis the block rows are split over
TILE = 128  # prefix counts: the width of the triangular matrix


@dataclasses.dataclass(frozen=True)
class Settings:
    """The static sizes of the device pass (each set compiles its own step).

    Attributes:
      m: M, the scores kept per query.
      capacity: C, the candidates per query one block may add without the dense path. About
        B M / S pass per block once tau or a floor is near the final M-th best (S scores in
        all); a speculative floor (5 pilot standard deviations low) lets a few times more pass.
      chunk: G, the scores per chunk of the first compaction.
      spare: the buffer holds M + spare C slots; a cut every ~spare C / (candidates per block)
        blocks.
      heavy_rows: queries with more than C candidates in a block are cut one by one (the
        top-M of their buffer and block by `lax.top_k`) when there are at most this many;
        more take the dense path for the whole block.
    """

    m: int
    capacity: int = 1024
    chunk: int = 8
    spare: int = 4
    heavy_rows: int = 64

    def __post_init__(self):
        if min(self.spare, self.capacity, self.chunk, self.heavy_rows) < 1:
            raise ValueError(f"capacity, chunk, spare and heavy_rows must be positive: {self}")

    @property
    def width(self) -> int:
        """W, the buffer slots per query."""
        return self.m + self.spare * self.capacity


def capacity_for(share: float, rows: int) -> int:
    """Returns C for blocks of `rows` rows per device where a query keeps at most `share`.

    1.5x the rows the share predicts plus 32 (a query beyond is cut alone), rounded up to 128
    and at most `rows`: slots cost compaction work on every block, and too few send whole
    blocks to the dense path.
    """
    return min(rows, -(-int(1.5 * share * rows + 32) // 128) * 128)


class Buffer(NamedTuple):
    """One device's running state; in `JaxBackend` every field has a leading device axis.

    Attributes:
      vals: [Q, W] float32, kept scores then candidates, -inf at empty slots.
      shard: [Q, W] int32, the shard of each slot's distractor, -1 at empty slots.
      row: [Q, W] int32, its row in the shard, -1 at empty slots.
      counts: [Q, P] int32, scored distractors strictly above each positive.
      tau: [Q] float32, the M-th best at the last cut (-inf before M scores).
      fill: [] int32, slots in use (the same for every query: a block appends to all).
      dense: [] int32, blocks that took the dense path (for tests and benchmarks).
      cuts: [] int32, cuts of a full buffer (likewise).
      heavy: [] int32, queries cut alone for holding more than C candidates (likewise).
    """

    vals: jax.Array | np.ndarray
    shard: jax.Array | np.ndarray
    row: jax.Array | np.ndarray
    counts: jax.Array | np.ndarray
    tau: jax.Array | np.ndarray
    fill: jax.Array | np.ndarray
    dense: jax.Array | np.ndarray
    cuts: jax.Array | np.ndarray
    heavy: jax.Array | np.ndarray


def empty(num_queries: int, num_pos: int, settings: Settings, xp=np) -> Buffer:
    """Returns the buffer of a device that has seen nothing (numpy arrays, or `xp`'s)."""
    w = settings.width
    zero = lambda: xp.int32(0)  # one array each: a step donates them all
    return Buffer(
        xp.full((num_queries, w), -np.inf, xp.float32),
        xp.full((num_queries, w), -1, xp.int32),
        xp.full((num_queries, w), -1, xp.int32),
        xp.zeros((num_queries, num_pos), xp.int32),
        xp.full(num_queries, -np.inf, xp.float32),
        xp.int32(settings.m),
        zero(),
        zero(),
        zero(),
    )


def empty_on(mesh, num_queries: int, num_pos: int, settings: Settings) -> Buffer:
    """Returns `empty` buffers made on each device of `mesh` (leading device axis, split)."""
    return _maker(mesh, num_queries, num_pos, settings)()


@functools.cache  # compiled once per mesh and sizes
def _maker(mesh, num_queries: int, num_pos: int, settings: Settings):
    n = mesh.devices.size
    stack = lambda a: jnp.broadcast_to(a, (n, *a.shape))
    make = lambda: jax.tree.map(stack, empty(num_queries, num_pos, settings, jnp))
    return jax.jit(make, out_shardings=jax.sharding.NamedSharding(mesh, PartitionSpec(AXIS)))


def dot(queries, x, precision=None):
    """Returns [Q, B] float32 scores of `queries` [Q, D] against rows `x` [B, D]."""
    dims = (((1,), (1,)), ((), ()))
    return lax.dot_general(
        queries, x, dims, precision=precision, preferred_element_type=jnp.float32
    )


def prefix_count(mask):
    """Returns [R, L] int32, the inclusive running count of True along each row of `mask`.

    Tiles of TILE columns times a triangular 0/1 matrix (a matmul, which accelerators run at
    full speed and which is exact: 0/1 inputs are exact in every matmul precision and the sums
    stay below 2^24), plus the running total of the tiles before.
    """
    r, n = mask.shape
    pad = -n % TILE
    m = jnp.pad(mask, ((0, 0), (0, pad))).astype(jnp.float32).reshape(r, -1, TILE)
    tri = (jnp.arange(TILE)[:, None] <= jnp.arange(TILE)[None, :]).astype(jnp.float32)
    within = jnp.einsum("rnt,ts->rns", m, tri, preferred_element_type=jnp.float32)
    totals = within[:, :, -1]
    before = jnp.cumsum(totals, axis=1) - totals  # [R, L / TILE]: a short scan
    return (within + before[:, :, None]).reshape(r, -1)[:, :n].astype(jnp.int32)


def first_true(mask, c: int):
    """Returns [R, c] int32: the columns of each row's first c True entries, in order.

    Slots beyond a row's last True entry hold L (the row length). A binary search over the
    prefix counts for each rank 1..c: a loop of fixed trip count, faster on CPU than unrolled
    (benchmarks/README.md, "scoring.py"); XLA knows the trip count, so a GPU need not report
    back after each step.
    """
    rank = prefix_count(mask)
    targets = jnp.arange(1, c + 1, dtype=jnp.int32)
    search = lambda r: jnp.searchsorted(r, targets, side="left", method="scan")
    return jax.vmap(search)(rank).astype(jnp.int32)


def candidates(s, thr, c: int, g: int):
    """Returns the scores `s` [Q, B] >= `thr` [Q], at most `c` per row, in column order.

    Returns (vals [Q, c] with -inf in unused slots, cols [Q, c] int32). Exact when no row has
    more than c candidates (the caller checks). B must be a multiple of `g`.
    """
    q, b = s.shape
    nc = b // g
    chunks = s.reshape(q, nc, g)
    hit = jnp.max(chunks, axis=2) >= thr[:, None]  # [Q, NC]: chunks holding a candidate
    c1 = min(c, nc)  # no row has more than c of them, nor more than NC
    ci = first_true(hit, c1)  # [Q, c1], NC past the last
    got = jnp.take_along_axis(chunks, jnp.minimum(ci, nc - 1)[:, :, None], axis=1)  # [Q, c1, G]
    cols = ci[:, :, None] * g + jnp.arange(g, dtype=jnp.int32)[None, None, :]
    ok = ((ci < nc)[:, :, None] & (got >= thr[:, None, None])).reshape(q, c1 * g)
    k = first_true(ok, c)  # [Q, c], c1 G past the last
    kk = jnp.minimum(k, c1 * g - 1)
    vals = jnp.take_along_axis(got.reshape(q, c1 * g), kk, axis=1)
    vals = jnp.where(k < c1 * g, vals, -jnp.inf)
    return vals, jnp.take_along_axis(cols.reshape(q, c1 * g), kk, axis=1)


def tally(s, levels, strict: int):
    """Returns [Q] int32 per level [Q]: the scores of each row of `s` [Q, B] above it.

    The first `strict` levels count scores strictly above, the others scores at or above. One
    variadic reduction reads `s` once for all levels; on CPU it is also far faster than as many
    separate sums, because XLA vectorises the variadic form and not the separate ones
    (benchmarks/README.md, "scoring.py").
    """
    ops = [
        (s > v[:, None] if i < strict else s >= v[:, None]).astype(jnp.int32)
        for i, v in enumerate(levels)
    ]
    add = lambda a, b: [x + y for x, y in zip(a, b, strict=True)]
    return lax.reduce(ops, [jnp.int32(0)] * len(ops), add, (1,))


def _top(vals, shard, row, m: int, w: int):
    """Returns the top-M of `vals` [R, n] and their ids, padded to W slots, and their minimum."""
    top, idx = lax.top_k(vals, m)  # the leftmost of equal scores first: ascending ids
    pad = lambda a, v: jnp.pad(a, ((0, 0), (0, w - m)), constant_values=v)
    take = lambda a: jnp.take_along_axis(a, idx, axis=1)
    # Not top[:, m - 1]: XLA rewrites `lax.top_k` followed by a slice of its values into a full
    # sort of each row, slower on CPU (benchmarks/README.md, "scoring.py"). The minimum is the
    # same value.
    return pad(top, -jnp.inf), pad(take(shard), -1), pad(take(row), -1), jnp.min(top, axis=1)


def _cut(buf: Buffer, vals, shard, row, m: int) -> Buffer:
    """Returns `buf` holding the top-M of `vals` [Q, n] (with ids) in its first M slots."""
    vals, shard, row, tau = _top(vals, shard, row, m, buf.vals.shape[1])
    return buf._replace(vals=vals, shard=shard, row=row, tau=tau, fill=jnp.int32(m))


def _wide(ids, block_ids, rows: int):
    """Returns [rows, W + B]: buffer ids [rows, W] then the block's [B], for each row."""
    return jnp.concatenate([ids, jnp.broadcast_to(block_ids, (rows, block_ids.size))], axis=1)


def _cut_heavy(buf: Buffer, s, shard, row, heavy, *, r: int, m: int) -> Buffer:
    """Cuts the rows `heavy` [Q] bool (at most r) to the top-M of their buffer and block `s`."""
    q = s.shape[0]
    which = first_true(heavy[None, :], r)[0]  # [r], Q past the last (dropped below)
    at = jnp.minimum(which, q - 1)
    vals, sh, rw, tau = _top(
        jnp.concatenate([buf.vals[at], s[at]], axis=1),
        _wide(buf.shard[at], shard, r),
        _wide(buf.row[at], row, r),
        m,
        buf.vals.shape[1],
    )
    put = lambda a, v: a.at[which].set(v, mode="drop")
    return buf._replace(
        vals=put(buf.vals, vals),
        shard=put(buf.shard, sh),
        row=put(buf.row, rw),
        tau=put(buf.tau, tau),
        heavy=buf.heavy + jnp.sum(heavy, dtype=jnp.int32),
    )


def step(buf: Buffer, queries, x, shard, row, pos, floor, *, settings: Settings, precision=None):
    """Scores one block on one device; returns the new buffer.

    Args:
      buf: the device's `Buffer`.
      queries: [Q, D] (float16, bfloat16 or float32).
      x: [B, D] the block's rows on this device, same dtype; B a multiple of G.
      shard: [B] int32, each row's shard, -1 at padding rows.
      row: [B] int32, each row's row number in its shard, -1 at padding rows.
      pos: [Q, P] float32 positive scores, +inf at padding (never beaten).
      floor: [Q] float32, the speculative floor (-inf: none).
      settings: the static sizes.
      precision: of the matmul (`lax.Precision.HIGHEST` keeps float32 inputs float32 on
        accelerators that would round them).
    """
    m, c, w = settings.m, settings.capacity, settings.width
    s = jnp.where(row[None, :] >= 0, dot(queries, x, precision), -jnp.inf)  # [Q, B]
    thr = jnp.maximum(buf.tau, floor)
    tallies = tally(s, [pos[:, j] for j in range(pos.shape[1])] + [thr], strict=pos.shape[1])
    if pos.shape[1]:
        buf = buf._replace(counts=buf.counts + jnp.stack(tallies[:-1], axis=1))
    heavy = tallies[-1] > c  # queries with more candidates than slots: cut one by one
    most = jnp.max(jnp.where(heavy, 0, tallies[-1]))  # the most candidates of another query

    def sparse(cut: bool, cut_heavy: bool):
        def branch(buf):
            if cut:  # the buffer is full
                buf = _cut(buf, buf.vals, buf.shard, buf.row, m)._replace(cuts=buf.cuts + 1)
            if cut_heavy:
                buf = _cut_heavy(buf, s, shard, row, heavy, r=settings.heavy_rows, m=m)
            vals, cols = candidates(s, thr, c, settings.chunk)
            new = (vals > -jnp.inf) & ~heavy[:, None]
            vals = jnp.where(new, vals, -jnp.inf)
            ids = [jnp.where(new, jnp.take(a, cols), -1) for a in (shard, row)]
            at = (jnp.int32(0), buf.fill)
            # C slots are written but only `most` taken: the next block overwrites the -inf tail.
            return buf._replace(
                vals=lax.dynamic_update_slice(buf.vals, vals, at),
                shard=lax.dynamic_update_slice(buf.shard, ids[0], at),
                row=lax.dynamic_update_slice(buf.row, ids[1], at),
                fill=buf.fill + most,
            )

        return branch

    def dense(buf):
        q = s.shape[0]
        vals = jnp.concatenate([buf.vals, s], axis=1)
        cut = _cut(buf, vals, _wide(buf.shard, shard, q), _wide(buf.row, row, q), m)
        return cut._replace(dense=buf.dense + 1)

    num_heavy = jnp.sum(heavy, dtype=jnp.int32)
    full = (buf.fill + c > w).astype(jnp.int32)
    some_heavy = (num_heavy > 0).astype(jnp.int32)
    branch = jnp.where(num_heavy > settings.heavy_rows, 4, 2 * some_heavy + full)
    branches = [sparse(False, False), sparse(True, False), sparse(False, True), sparse(True, True)]
    return lax.switch(branch, [*branches, dense], buf)


def finish(buf: Buffer, m: int):
    """Returns one device's (vals [Q, M], shard [Q, M], row [Q, M], counts [Q, P])."""
    cut = _cut(buf, buf.vals, buf.shard, buf.row, m)
    return cut.vals[:, :m], cut.shard[:, :m], cut.row[:, :m], cut.counts


@functools.cache  # one compilation per mesh and settings, however many backends use them
def sharded(mesh, settings: Settings, precision=None):
    """Returns jit-compiled (step, finish) over `mesh`'s axis AXIS.

    `step(buf, queries, x, shard, row, pos, floor)`: `buf` fields carry a leading device axis
    split over AXIS, as do the block's `x` [n B, D], `shard` and `row` [n B] (each device its
    own slice of rows); `queries`, `pos` and `floor` are replicated. `buf` is donated.
    `finish(buf)` returns `finish`'s arrays with a leading device axis.
    """
    split, rep = PartitionSpec(AXIS), PartitionSpec()
    # No collectives: every device works alone, so shard_map's varying-axis checks (which reject
    # constants such as a branch's fresh `fill`) have nothing to protect.
    local = lambda f: lambda buf, *a: jax.tree.map(lambda v: v[None], f(_local(buf), *a))
    step_fn = local(lambda buf, *a: step(buf, *a, settings=settings, precision=precision))
    step_map = jax.shard_map(
        step_fn,
        mesh=mesh,
        in_specs=(split, rep, split, split, split, rep, rep),
        out_specs=split,
        check_vma=False,
    )
    finish_map = jax.shard_map(
        local(lambda buf: finish(buf, settings.m)),
        mesh=mesh,
        in_specs=(split,),
        out_specs=split,
        check_vma=False,
    )
    return jax.jit(step_map, donate_argnums=(0,)), jax.jit(finish_map)


def _local(buf: Buffer) -> Buffer:
    """Drops the device axis (of length 1 inside `shard_map`)."""
    return jax.tree.map(lambda v: v[0], buf)
