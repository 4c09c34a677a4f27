"""Running top-M similarities and exact counts above each positive, on the host.

The selection half of the scoring engine (`tailaware.scoring` does the matmul and streaming).
After the first blocks almost no score beats a query's running M-th best, so each block is
filtered against a per-query threshold before anything is selected: the survivors are appended
to a per-query buffer, and a row is compacted back to its M best only when its buffer fills.
The same filtered pass yields the counts: every score above the query's lowest positive is a
candidate, and one sorted search per candidate counts it against all the query's positives.

Shapes: Q queries, M kept scores per query, W = 2M buffer slots, P positive slots (NaN-padded),
B scores per block, C candidates (a flat list of (row, score, id)).

Tie rule (as in `tailaware.scores`): a score counts above a positive only when strictly
greater. Kept scores are ordered by (score descending, id ascending), so ids are deterministic.
"""

from typing import NamedTuple

import numpy as np


class TopState(NamedTuple):
    """The state of a partial search (what checkpoints and merges exchange).

    Attributes:
      vals: [Q, M] float32, the best scores, -inf padded; in canonical order (descending, ties
        by ascending id) only after `sorted_state`.
      ids: [Q, M] int64, their ids, -1 at padding.
      counts: [Q, P] int64, scored distractors strictly above each positive (0 at padding).
    """

    vals: np.ndarray
    ids: np.ndarray
    counts: np.ndarray


def empty_state(num_queries: int, m: int, num_pos: int) -> TopState:
    """Returns the state of a search that has seen nothing."""
    return TopState(
        np.full((num_queries, m), -np.inf, np.float32),
        np.full((num_queries, m), -1, np.int64),
        np.zeros((num_queries, num_pos), np.int64),
    )


def merge_states(a: TopState, b: TopState) -> TopState:
    """Returns the state of the union of two disjoint searches: top-M merge, count sums.

    The kept scores come in no particular order; `sorted_state` puts them in canonical order.
    """
    m = a.vals.shape[1]
    width = 2 * m
    ids = np.concatenate([a.ids, b.ids], axis=1)
    vals, ids = _top_rows(
        np.concatenate([a.vals, b.vals], axis=1), lambda r, c: ids.ravel()[r * width + c], m
    )
    return TopState(vals, ids, a.counts + b.counts)


def sorted_state(state: TopState) -> TopState:
    """Returns the state with each row ordered by (score desc, id asc), padding last."""
    vals, ids = _sorted_rows(state.vals, state.ids)
    return TopState(vals, ids, state.counts)


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
        """`pos_scores`: [Q, P] float32, NaN at padding (padding is never counted against)."""
        pos = np.asarray(pos_scores, np.float32)
        self.num_queries, self.num_pos = pos.shape
        self.order = np.argsort(np.where(np.isnan(pos), np.inf, pos), axis=1, kind="stable")
        pos_sorted = np.take_along_axis(pos, self.order, axis=1)
        rows = np.repeat(np.arange(self.num_queries), self.num_pos)
        self.keys = ordered_keys(rows, pos_sorted.ravel())  # ascending overall
        self.min_pos = np.where(np.isnan(pos), np.inf, pos).min(axis=1, initial=np.inf)

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


class HostTopM:
    """Streaming top-M and exact positive counts over score blocks, on the host (numpy).

    Usage: `add_scores` per dense block (or `add_candidates` for pre-selected ones), then
    `state()`. Rows are independent, so callers may shard queries across instances.
    """

    def __init__(self, pos_scores: np.ndarray, m: int, start: TopState | None = None):
        q = pos_scores.shape[0]
        self.m, self.width = m, 2 * m
        self.counter = PositiveCounter(pos_scores)
        self.vals = np.full((q, self.width), -np.inf, np.float32)
        self.ids = np.full((q, self.width), -1, np.int64)
        self.fill = np.zeros(q, np.int64)
        self.tau = np.full(q, -np.inf, np.float32)  # every score >= tau is kept
        self.counts = np.zeros(pos_scores.shape, np.int64)
        # Instances that search disjoint parts of the same stream: a score below any of their
        # thresholds cannot be in the merged top-M, so their thresholds filter here too.
        self.peers: list[HostTopM] = []
        if start is not None:
            self.counts += start.counts
            filled = np.flatnonzero(np.isfinite(start.vals).any(axis=1))
            self.vals[filled, :m], self.ids[filled, :m] = start.vals[filled], start.ids[filled]
            self.fill[filled] = m
            self._compact(filled)

    def add_scores(self, scores: np.ndarray, ids: np.ndarray) -> None:
        """Adds a dense block: `scores` [Q, B] float32 against items `ids` [B] int64."""
        q, b = scores.shape
        # Rows that have not seen M scores and cannot buffer this block: nothing can be filtered
        # yet, so select their top-M from the block directly (then only count below).
        dense = np.isneginf(self.tau) & (self.fill + b > self.width)
        if dense.any():
            rows = np.flatnonzero(dense)
            self._select_dense(rows, scores if rows.size == q else scores[rows], ids)
        # One filtering pass serves both jobs: candidates for the top-M (>= tau) and for the
        # counts (> the query's lowest positive).
        tau = self.bound()
        floor = np.where(dense, self.counter.min_pos, np.minimum(tau, self.counter.min_pos))
        flat = np.flatnonzero(scores >= floor[:, None])  # far faster than a 2-D np.nonzero
        if b and b & (b - 1) == 0:  # a power of two (the usual chunk): shifts, not an int64 divide
            rows, cols = flat >> (b.bit_length() - 1), flat & (b - 1)
        else:
            rows, cols = np.divmod(flat, b)
        values = scores.ravel()[flat]
        above_pos = values > self.counter.min_pos[rows]
        self.counts += self.counter.count(rows[above_pos], values[above_pos])
        keep = values >= tau[rows]
        if dense.any():
            keep &= ~dense[rows]
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
        self._append(rows, values, ids[cols])

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
        self._append(rows, values, ids)

    def bound(self) -> np.ndarray:
        """Returns [Q] the filtering threshold: the highest of this and the peers' thresholds.

        Peers may raise theirs concurrently; any value read is a valid (lower) bound.
        """
        return np.maximum.reduce([self.tau] + [p.tau for p in self.peers])

    @property
    def cold(self) -> bool:
        """Whether some query has not yet seen M scores (its threshold is still -inf)."""
        return bool(np.isneginf(self.tau).any())

    def state(self, rows: slice = slice(None)) -> TopState:
        """Returns each row's M best (exact ties by id; not sorted, see `sorted_state`).

        `rows`: a slice of the queries, so callers can build the state in parallel pieces.
        """
        buf_ids = self.ids[rows]
        vals, ids = _top_rows(
            self.vals[rows], lambda r, c: buf_ids.ravel()[r * self.width + c], self.m
        )
        return TopState(vals.copy(), ids.copy(), self.counts[rows].copy())

    def _append(self, rows, values, ids):
        if rows.size == 0:
            return
        # Rows arrive sorted, so a candidate's slot is its offset within its row's run.
        new = np.bincount(rows, minlength=self.fill.size)
        # slot = row * W + fill[row] + (i - first index of the row's run), one gather per entry
        offset = np.arange(self.fill.size) * self.width + self.fill - (np.cumsum(new) - new)
        flat = offset[rows] + np.arange(rows.size)
        self.vals.ravel()[flat] = values
        self.ids.ravel()[flat] = ids
        self.fill += new

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
    order = np.argsort(-vals, axis=1)  # numpy's SIMD quicksort; ties are fixed below
    vals = np.take_along_axis(vals, order, axis=1)
    ids = np.take_along_axis(ids, order, axis=1)
    # Runs of equal finite scores are contiguous after the sort: reorder only the ids inside
    # them, all rows at once (a small lexsort of the tied entries by run, then id).
    r, w = vals.shape
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
