"""Exact evaluation of an ILIAS-format folder: the positives' scores and the ranked lists.

`positive_scores` reads each query's positives off the query-by-positive score matrix, with the
other instances' positives above each (always in the database, non-relevant); `ranked_lists`
writes the official pickle layout of the top-k database items of every query.

Shapes: Q queries, T positives in the database, P positive slots per query (padded).
"""

import numpy as np

from tailaware.search import backends


def positive_scores(all_scores, slots, relevant):
    """Returns (pos_scores [Q, P] NaN-padded, fixed_counts [Q, P] -1 padded).

    `fixed_counts` counts the other instances' positives strictly above each positive.
    """
    mask = slots >= 0
    pos = np.where(mask, np.take_along_axis(all_scores, np.maximum(slots, 0), axis=1), np.nan)
    nonrel = np.where(relevant, -np.inf, all_scores)
    fixed = np.zeros(pos.shape, np.int64)
    for s in range(0, pos.shape[0], 64):  # chunks keep the [q, P, T] comparison small
        fixed[s : s + 64] = (nonrel[s : s + 64, None, :] > pos[s : s + 64, :, None]).sum(axis=2)
    return pos.astype(np.float32), np.where(mask, fixed, -1).astype(np.int64)


def ranked_lists(state, all_scores, relevant, positive_ids, shards, *, k):
    """Returns the official pickle layout of the top-k database items of every query.

    The database is positives + distractors; order: score descending, and among equal scores
    the query's own positives, then other positives, then distractors (our tie rule), each by
    file position. `db_ids` lists the positives, then the distractors that appear in some list.

    Returns:
      dict with `db_ids` [n], `sims` [Q, k] float32 and `ranks` [Q, k] int64 (indices into
      `db_ids`; -1 past the end of a list: fewer than k items, or k > M and the list stops
      where the kept distractors run out).
    """
    q, t = all_scores.shape
    dist_ids = np.unique(state.ids[:, :k][state.ids[:, :k] >= 0])
    # Candidates per query: every positive and its k best distractors, as columns.
    vals = np.concatenate([all_scores.astype(np.float32), state.vals[:, :k]], axis=1)
    group = np.concatenate([np.where(relevant, 0, 1), np.full(state.vals[:, :k].shape, 2)], 1)
    col = np.concatenate(
        [np.broadcast_to(np.arange(t), (q, t)), t + np.searchsorted(dist_ids, state.ids[:, :k])],
        axis=1,
    )
    # With k > M the kept distractors run out: a positive below the M-th kept score may have
    # unkept distractors above it, so each list stops there (never an issue for k <= M).
    floor = np.where(np.isfinite(state.vals[:, -1]), state.vals[:, -1], -np.inf)
    valid = np.isfinite(vals) & ((group == 2) | (vals >= floor[:, None]))
    order = np.lexsort((col, group, np.where(valid, -vals, np.inf)), axis=1)[:, :k]
    sims = np.take_along_axis(vals, order, axis=1)
    ranks = np.where(
        np.take_along_axis(valid, order, axis=1), np.take_along_axis(col, order, axis=1), -1
    )
    db_ids = list(map(str, positive_ids)) + _distractor_id_strings(dist_ids, shards)
    return {"db_ids": db_ids, "sims": sims.astype(np.float32), "ranks": ranks.astype(np.int64)}


def _distractor_id_strings(ids, shards) -> list[str]:
    by_number = {s.number: s for s in shards}
    shard_no, rows = backends.split_ids(ids)
    out: list[str] = []
    for number in np.unique(shard_no):
        names = by_number[int(number)].read_ids()
        out.extend(str(names[r]) for r in rows[shard_no == number])
    return out
