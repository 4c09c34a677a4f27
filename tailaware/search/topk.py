"""Running top-M similarities and exact counts above each positive, on the host.

The selection half of the scoring engine (`tailaware.search.scoring` does the matmul and streaming).
After the first blocks almost no score beats a query's running M-th best, so each block is
filtered against a per-query threshold before anything is selected: the survivors are appended
to a per-query buffer, and a row is compacted back to its M best only when its buffer fills.
The same filtered pass yields the counts: every score above the query's lowest positive is a
candidate, and one sorted search per candidate counts it against all the query's positives (a
query whose lowest positive sits deep in its scores compares every score with each positive).

A filter that is only the running M-th best still admits about M ln(S / M) scores per query over
S scores. The final M-th best can instead be guessed from a small random pilot sample
(`guess_floor`): filtering at a cautious guess (the state's `floor`) admits little more than M,
and the guess is checked at the end (`exact_rows`); the caller redoes the rows where it failed.

Shapes: Q queries, M kept scores per query, W buffer slots (2M by default), P positive slots
(NaN-padded), B scores per block, C candidates (a flat list of (row, score, id)).

Tie rule (as in `tailaware.io.scores`): a score counts above a positive only when strictly
greater. Kept scores are ordered by (score descending, id ascending), so ids are deterministic.
"""

import math
from typing import NamedTuple

import numpy as np


class TopState(NamedTuple):
    """The state of a partial search (what checkpoints and merges exchange).

    Attributes:
      vals: [Q, M] float32, the best scores, -inf padded; in canonical order (descending, ties
        by ascending id) only after `sorted_state`.
      ids: [Q, M] int64, their ids, -1 at padding.
      counts: [Q, P] int64, scored distractors strictly above each positive (0 at padding).
      floor: [Q] float32, or None when the state is exact. Set by a speculative search, which
        dropped scores below it without knowing they were out of the top-M: a row is exact
        only where its M-th best is >= floor (`exact_rows`). Counts are exact either way.
    """

    vals: np.ndarray
    ids: np.ndarray
    counts: np.ndarray
    floor: np.ndarray | None = None


def empty_state(num_queries: int, m: int, num_pos: int) -> TopState:
    """Returns the state of a search that has seen nothing."""
    return TopState(
        np.full((num_queries, m), -np.inf, np.float32),
        np.full((num_queries, m), -1, np.int64),
        np.zeros((num_queries, num_pos), np.int64),
    )


def merge_states(a: TopState, b: TopState) -> TopState:
    """Returns the state of the union of two disjoint searches: top-M merge, count sums, the
    higher floor.

    The kept scores come in no particular order; `sorted_state` puts them in canonical order.
    """
    m = a.vals.shape[1]
    width = 2 * m
    ids = np.concatenate([a.ids, b.ids], axis=1)
    vals, ids = _top_rows(
        np.concatenate([a.vals, b.vals], axis=1), lambda r, c: ids.ravel()[r * width + c], m
    )
    if a.floor is None or b.floor is None:
        floor = b.floor if a.floor is None else a.floor
    else:
        floor = np.maximum(a.floor, b.floor)
    return TopState(vals, ids, a.counts + b.counts, floor)


def guess_floor(scores: np.ndarray, m: int, total: int, sds: float = 5.0) -> np.ndarray | None:
    """Returns [Q] float32, a cautious guess of each query's M-th best of `total` scores, or None.

    `scores` [Q, n] are a uniform random sample (a pilot) of the `total` scores per query. The
    M-th best of all is about the lam-th best of the pilot, lam = M n / total (the count of
    pilot scores above it is Binomial(n, M / total)); the guess is the r-th best, with r = lam
    plus `sds` Poisson standard deviations, so the M-th best falls below it with probability
    ~1e-6 per query (5 sd). None when the pilot is too small for that (r > n).
    """
    n = scores.shape[1]
    lam = m * n / max(total, 1)
    r = math.ceil(lam + sds * math.sqrt(lam)) + 1
    if r > n:
        return None
    return -np.partition(-scores, r - 1, axis=1)[:, r - 1]


def exact_rows(state: TopState) -> np.ndarray:
    """Returns [Q] bool: whether each row of a (merged) state is the exact top-M.

    A speculative search kept every score >= its floor, so a row whose M-th best is >= floor
    kept all of its top-M (ties at the floor included); other rows may miss some.
    """
    if state.floor is None:
        return np.ones(state.vals.shape[0], bool)
    return state.vals.min(axis=1, initial=np.inf) >= state.floor


def sorted_state(state: TopState) -> TopState:
    """Returns the state with each row ordered by (score desc, id asc), padding last."""
    vals, ids = _sorted_rows(state.vals, state.ids)
    return TopState(vals, ids, state.counts, state.floor)


def ordered_keys(rows: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Returns uint64 keys ordering (row, value) pairs exactly: row first, then float32 value.

    The float32 bit pattern is mapped to an order-preserving uint32 (-0.0 folded onto +0.0, NaN
    above +inf), so ties and the strict comparisons of the counts stay exact.
    """
    v = np.asarray(values, np.float32) + np.float32(0.0)
    bits = v.view(np.uint32).astype(np.uint64)
    neg = (bits >> np.uint64(31)).astype(bool)
    ordered = np.where(neg, np.uint64(0xFFFFFFFF) - bits, bits | np.uint64(0x80000000))
    ordered = np.where(np.isnan(v), np.uint64(0xFFFFFFFF), ordered)
    return (np.asarray(rows, np.uint64) << np.uint64(32)) | ordered


class PositiveCounter:
    """Counts candidate scores strictly above each positive of their query, exactly."""

    def __init__(self, pos_scores: np.ndarray):
        """Sorts each query's positives `pos_scores` [Q, P] float32 (NaN at padding, which is
        never counted against) into search keys."""
        pos = np.asarray(pos_scores, np.float32)
        self.num_queries, self.num_pos = pos.shape
        self.order = np.argsort(np.where(np.isnan(pos), np.inf, pos), axis=1, kind="stable")
        pos_sorted = np.take_along_axis(pos, self.order, axis=1)
        rows = np.repeat(np.arange(self.num_queries), self.num_pos)
        self.keys = ordered_keys(rows, pos_sorted.ravel())  # ascending overall
        self.min_pos = np.where(np.isnan(pos), np.inf, pos).min(axis=1, initial=np.inf)
        self.pos = pos

    def count(self, rows: np.ndarray, values: np.ndarray) -> np.ndarray:
        """Returns [Q, P] int64: for each positive, how many (row, value) candidates beat it."""
        q, p = self.num_queries, self.num_pos
        below = np.searchsorted(self.keys, ordered_keys(rows, values), side="left")
        below = below.astype(np.int64) - rows.astype(np.int64) * p  # positives strictly below
        hist = np.bincount(rows * (p + 1) + below, minlength=q * (p + 1)).reshape(q, p + 1)
        above_sorted = np.cumsum(hist[:, ::-1], axis=1)[:, ::-1][:, 1:]
        out = np.empty((q, p), np.int64)
        np.put_along_axis(out, self.order, above_sorted, axis=1)
        return out

    def count_all(self, rows: np.ndarray, scores: np.ndarray) -> np.ndarray:
        """Returns [R, P] int64: for each positive of `rows` [R], how many `scores` [R, B] beat it.

        One comparison per score and positive slot: cheaper than `count` once more than a few
        percent of a row's scores are candidates. NaN (padding or score) never counts.
        """
        out = np.empty((rows.size, self.num_pos), np.int64)
        for j in range(self.num_pos):
            out[:, j] = np.count_nonzero(scores > self.pos[rows, j, None], axis=1)
        return out


class HostTopM:
    """Streaming top-M and exact positive counts over score blocks, on the host (numpy).

    Usage: `add_scores` per dense block (or `add_candidates` for pre-selected ones), then
    `state()`. Rows are independent, so callers may shard queries across instances. A `start`
    state with a floor (from `guess_floor`) makes the search speculative: see `TopState`.
    """

    # A row is counted by comparing every score with each of its P positive slots (`count_all`)
    # once more than P / DENSE_COUNT_SHARE of its scores beat its lowest positive: counting one
    # candidate costs as much as dozens of comparisons (benchmarks/README.md, "scoring.py").
    DENSE_COUNT_SHARE = 64

    def __init__(
        self, pos_scores: np.ndarray, m: int, start: TopState | None = None, width: int = 0
    ):
        """Starts from `start` (or nothing) with `width` buffer slots per query.

        `width`: W, by default 2M (as `add_candidates` needs); at least M plus the widest block,
        or wider blocks take a dense selection.
        """
        q = pos_scores.shape[0]
        self.m, self.width = m, width or 2 * m
        self.counter = PositiveCounter(pos_scores)
        self.vals = np.full((q, self.width), -np.inf, np.float32)
        self.ids = np.full((q, self.width), -1, np.int64)
        self.fill = np.zeros(q, np.int64)
        self.tau = np.full(q, -np.inf, np.float32)  # every score >= tau is kept
        self.floor = np.full(q, -np.inf, np.float32)  # and every score >= floor (speculation)
        self.counts = np.zeros(pos_scores.shape, np.int64)
        self.seen = 0  # scores per row added since construction
        self.above_min = np.zeros(q, np.int64)  # of which above the row's lowest positive
        self.buffered = 0  # scores appended to the buffers (the selection's work)
        self.mask = np.empty((0, 0), bool)
        # Instances that search disjoint parts of the same stream: a score below any of their
        # thresholds cannot be in the merged top-M, so their thresholds filter here too.
        self.peers: list[HostTopM] = []
        if start is not None:
            self.counts += start.counts
            if start.floor is not None:
                self.floor[:] = start.floor
            filled = np.flatnonzero(np.isfinite(start.vals).any(axis=1))
            self.vals[filled, :m], self.ids[filled, :m] = start.vals[filled], start.ids[filled]
            self.fill[filled] = m
            self._compact(filled)

    def add_scores(self, scores: np.ndarray, ids: np.ndarray) -> None:
        """Adds a dense block: `scores` [Q, B] float32 against items `ids` [B] int64."""
        q, b = scores.shape
        # Rows without any threshold that cannot buffer this block: nothing can be filtered yet,
        # so select their top-M from the block directly (then only count below).
        dense = np.isneginf(np.maximum(self.tau, self.floor)) & (self.fill + b > self.width)
        if dense.any():
            rows = np.flatnonzero(dense)
            self._select_dense(rows, scores if rows.size == q else scores[rows], ids)
        # One filtering pass serves both jobs: candidates for the top-M (>= tau) and for the
        # counts (> the query's lowest positive), except in rows counted by comparisons.
        tau = self.bound()
        min_pos = self.counter.min_pos
        share = self.DENSE_COUNT_SHARE * self.above_min
        count_all = (min_pos < tau) & (share > self.counter.num_pos * self.seen)
        floor = np.where(dense, np.inf, tau)
        floor = np.where(count_all, floor, np.minimum(floor, min_pos))
        if self.mask.shape != scores.shape:
            self.mask = np.empty(scores.shape, bool)  # reused: fresh pages cost more than this
        np.greater_equal(scores, floor[:, None], out=self.mask)
        flat = np.flatnonzero(self.mask)  # far faster than a 2-D np.nonzero
        if b and b & (b - 1) == 0:  # a power of two (the usual chunk): shifts, not an int64 divide
            rows, cols = flat >> (b.bit_length() - 1), flat & (b - 1)
        else:
            rows, cols = np.divmod(flat, b)
        values = scores.ravel()[flat]
        above_pos = values > min_pos[rows]
        if count_all.any():
            above_pos &= ~count_all[rows]
            full_rows = np.flatnonzero(count_all)
            counted = self.counter.count_all(full_rows, scores[full_rows])
            self.counts[full_rows] += counted
            lowest = self.counter.order[full_rows, :1]
            self.above_min[full_rows] += np.take_along_axis(counted, lowest, axis=1)[:, 0]
        self.counts += self.counter.count(rows[above_pos], values[above_pos])
        self.above_min += np.bincount(rows[above_pos], minlength=q)
        self.seen += b
        if (dense | (floor < tau)).any():  # some candidates are only for the counts
            keep = (values >= tau[rows]) & ~dense[rows]
            rows, cols, values = rows[keep], cols[keep], values[keep]
        new = np.bincount(rows, minlength=q)
        full = np.flatnonzero(self.fill + new > self.width)
        if full.size:
            self._compact(full)
        wide = np.flatnonzero(self.fill + new > self.width)
        if wide.size:
            # Blocks wider than W - M: select from these rows directly.
            self._select_dense(wide, scores[wide], ids)
            sparse = ~np.isin(rows, wide)
            rows, cols, values = rows[sparse], cols[sparse], values[sparse]
            new[wide] = 0
        self._append(rows, values, ids[cols], new)

    def add_candidates(self, rows: np.ndarray, values: np.ndarray, ids: np.ndarray) -> None:
        """Adds pre-selected candidates (a block's own top scores); counts are the caller's."""
        keep = values >= self.tau[rows]
        rows, values, ids = rows[keep], values[keep], ids[keep]
        new = np.bincount(rows, minlength=self.fill.size)
        full = np.flatnonzero(self.fill + new > self.width)
        if full.size:
            self._compact(full)
            if (self.fill + new > self.width).any():
                raise ValueError(f"more than {self.m} candidates for one query in one call")
        self._append(rows, values, ids, new)

    def bound(self) -> np.ndarray:
        """Returns [Q] the filtering threshold: the highest of this and the peers' thresholds.

        Peers may raise theirs concurrently; any value read is a valid (lower) bound, or, for a
        floor, at most the final floor that the merged state is checked against.
        """
        return np.maximum.reduce([t for p in [self, *self.peers] for t in (p.tau, p.floor)])

    @property
    def cold(self) -> bool:
        """Whether some query has no threshold yet (fewer than M scores seen, no floor)."""
        return bool(np.isneginf(np.maximum(self.tau, self.floor)).any())

    def state(self, rows: slice = slice(None)) -> TopState:
        """Returns the state of the queries `rows` (a slice), in canonical order."""
        return merged_state([self], rows)

    def _append(self, rows, values, ids, new):
        """Appends candidates (`rows` sorted, `new` [Q] of them per row) to the buffers."""
        if rows.size == 0:
            return
        # Rows arrive sorted, so a candidate's slot is its offset within its row's run.
        # slot = row * W + fill[row] + (i - first index of the row's run), one gather per entry
        offset = np.arange(self.fill.size) * self.width + self.fill - (np.cumsum(new) - new)
        flat = offset[rows] + np.arange(rows.size)
        self.vals.ravel()[flat] = values
        self.ids.ravel()[flat] = ids
        self.fill += new
        self.buffered += rows.size

    def _compact(self, rows):
        """Keeps the M best of each row's buffer (exact ties by id) and raises its threshold."""
        w = self.width
        vals, ids = _top_rows(
            self.vals[rows], lambda r, c: self.ids.ravel()[rows[r] * w + c], self.m
        )
        self._set_rows(rows, vals, ids)

    def _select_dense(self, rows, scores, block_ids):
        if (self.fill[rows] == 0).all():
            vals, ids = _top_rows(scores, lambda r, c: block_ids[c], self.m)
        else:
            w = self.width

            def id_of(r, c):
                from_buffer = self.ids.ravel()[rows[r] * w + np.minimum(c, w - 1)]
                return np.where(c < w, from_buffer, block_ids[np.maximum(c - w, 0)])

            vals, ids = _top_rows(np.concatenate([self.vals[rows], scores], axis=1), id_of, self.m)
        self._set_rows(rows, vals, ids)

    def _set_rows(self, rows, vals, ids):
        self.vals[rows] = -np.inf
        self.ids[rows] = -1
        self.vals[rows, : self.m] = vals
        self.ids[rows, : self.m] = ids
        self.fill[rows] = self.m
        self.tau[rows] = vals.min(axis=1)  # -inf until M scores were seen


def merged_state(tops: list[HostTopM], rows: slice = slice(None)) -> TopState:
    """Returns the state (canonical order) of instances that searched parts of one stream.

    `rows`: a slice of the queries, so callers can build the state in parallel pieces (slices
    of ~100 queries keep the temporaries in cache). One selection over all the instances'
    buffered scores.
    """
    m = tops[0].m
    # Slots at or beyond a row's fill hold -inf: only the columns up to the fullest row count.
    widths = [int(top.fill[rows].max(initial=0)) for top in tops]
    vals = np.concatenate([top.vals[rows, :w] for top, w in zip(tops, widths, strict=True)], 1)
    ids = np.concatenate([top.ids[rows, :w] for top, w in zip(tops, widths, strict=True)], 1)
    r, w = vals.shape
    if w < m:
        vals = np.pad(vals, ((0, 0), (0, m - w)), constant_values=-np.inf)
        ids = np.pad(ids, ((0, 0), (0, m - w)), constant_values=-1)
        w = m
    vals, ids = _top_rows(vals, lambda i, c: ids.ravel()[i * w + c], m)
    floors = [top.floor[rows] for top in tops if not np.isneginf(top.floor).all()]
    floor = np.maximum.reduce(floors) if floors else None
    counts = np.sum([top.counts[rows] for top in tops], axis=0)
    return sorted_state(TopState(vals, ids, counts, floor))


def _top_rows(vals: np.ndarray, id_of, m: int) -> tuple[np.ndarray, np.ndarray]:
    """Returns each row's m best (vals, ids) by (score desc, id asc), in no particular order.

    `id_of(rows, cols)` gives the ids of entries, so wide blocks never materialise an id matrix.
    """
    r, w = vals.shape
    if w <= m:
        cols = np.broadcast_to(np.arange(w), (r, w))
        return vals, id_of(np.repeat(np.arange(r), w).reshape(r, w), cols)
    # np.partition on the values alone is the cheap part: the kept set is every score at or
    # above the m-th, unless ties at it overflow the m slots (rare; resolved by id per row).
    cut = np.partition(vals, w - m, axis=1)[:, w - m]
    keep = vals >= cut[:, None]
    for row in np.flatnonzero(np.count_nonzero(keep, axis=1) > m):
        above = np.flatnonzero(vals[row] > cut[row])
        tied = np.flatnonzero(vals[row] == cut[row])
        tied_ids = id_of(np.full(tied.size, row), tied)
        keep[row] = False
        keep[row, above] = True
        keep[row, tied[np.argsort(tied_ids, kind="stable")[: m - above.size]]] = True
    flat = np.flatnonzero(keep)
    rows = np.repeat(np.arange(r), m)  # exactly m kept per row: no integer divide needed
    cols = flat - rows * w
    return vals.ravel()[flat].reshape(r, m), id_of(rows, cols).reshape(r, m)


def _sorted_rows(vals: np.ndarray, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sorts each row by (score desc, id asc); padding (-inf, id -1) goes last."""
    r, w = vals.shape
    # Sorting int64 keys (the score's bits in descending order, then the column) is faster than
    # np.argsort, which sorts indirectly, and than building `ordered_keys`' uint64 keys, which
    # also handle -0.0 and NaN (benchmarks/README.md, "scoring.py"). Ties come out by column
    # (fixed below); NaN, never the score of finite descriptors, would come first.
    vals = np.asarray(vals, np.float32)
    bits = vals.view(np.int32)
    ascending = bits ^ ((bits >> 31) & np.int32(0x7FFFFFFF))  # the floats' order as int32
    keys = np.left_shift(~ascending, 32, dtype=np.int64)
    keys |= np.arange(w, dtype=np.int64)
    keys.sort(axis=1)
    order = (keys & 0xFFFFFFFF) + np.arange(r)[:, None] * w  # flat positions, for np.take
    vals, ids = np.take(vals, order), np.take(ids, order)
    # Runs of equal finite scores are contiguous after the sort: reorder only the ids inside
    # them, all rows at once (a small lexsort of the tied entries by run, then id).
    if w < 2:
        return vals, ids
    ties = np.zeros((r, w + 1), bool)
    ties[:, 1:w] = (vals[:, 1:] == vals[:, :-1]) & np.isfinite(vals[:, 1:])
    starts = ties[:, 1:] & ~ties[:, :-1]  # first entry of each tied run (it is not tied back)
    in_run = np.flatnonzero(ties[:, :w] | starts)
    if in_run.size:
        run = np.cumsum(starts.ravel()[in_run])
        flat_ids = ids.ravel()
        flat_ids[in_run] = flat_ids[in_run[np.lexsort((flat_ids[in_run], run))]]
    return vals, ids
