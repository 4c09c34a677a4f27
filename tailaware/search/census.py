"""A census design on an ILIAS-format folder: the proxies' census scored, the rest split off.

The ILIAS job with proxies (`--config.proxy`) plans a census (`tailaware.core.design`) from
the proxies' top lists (similarity files, or feature folders searched: `tailaware.search.proxy`),
searches the hash sample at the rest's rate pi over the whole folder with room for the census
items it draws (`Plan.extra`), scores the census exactly (`score`), and makes the file's sample
of the whole gallery: the rest's hash sample and each query's systematic sample of the census
at the same rate (`systematic`).

Shapes: Q queries, P positive slots, M kept scores, C census items, N distractors.
"""

import hashlib
import os
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from tailaware.core import design, sampling
from tailaware.io import atomic, errors, similarity
from tailaware.io.ilias_folder import Shard
from tailaware.io.scores import count_above
from tailaware.search import proxy
from tailaware.search.backends import global_ids, split_ids
from tailaware.search.topk import TopState


class Plan(NamedTuple):
    """A census design over a folder's distractors.

    Attributes:
      design: the census and the rest's rate (`design.Design`), over the distractors in shard
        order.
      ids: [C] int64 the census items' engine ids (`backends.global_ids`), ascending.
      drawn: [C] bool, which census items the hash sample at the rest's rate also holds.
      names: [C] str the census items' ids in the folder.
      best: [C] int64 their best ranks over the queries and proxies.
    """

    design: design.Design
    ids: np.ndarray
    drawn: np.ndarray
    names: np.ndarray
    best: np.ndarray

    @property
    def digest(self) -> str:
        """A short digest of the census, so a checkpoint of another census is not resumed."""
        return hashlib.sha256(self.ids.tobytes()).hexdigest()[:16]

    @property
    def extra(self) -> int:
        """How many census items the hash sample draws: the search keeps this many more."""
        return int(self.drawn.sum())


def plan(
    paths: Sequence[str],
    query_ids: np.ndarray,
    positive_ids: np.ndarray,
    shards: Sequence[Shard],
    *,
    fraction: float,
    seed: int,
    census_share: float,
    depth: int = 0,
    search: proxy.FolderSearch | None = None,
) -> Plan:
    """Returns the census design of `fraction` of the distractors from the proxies `paths`:
    similarity files, or feature folders searched as `search` says (`proxy.read`; default
    `proxy.FolderSearch()`).

    Raises:
      InputError: naming a proxy file or folder that is malformed, of other queries or ids, or
        shorter than a fixed `depth`.
    """
    shards = sorted(shards, key=lambda s: s.number)
    names = [np.asarray(s.read_ids()).astype(str) for s in shards]
    gallery = np.concatenate(names) if names else np.zeros(0, str)
    engine = np.concatenate(
        [global_ids(s.number, np.arange(len(n))) for s, n in zip(shards, names, strict=True)]
    )
    lists = []
    for path in paths:
        top = proxy.read(
            path,
            search or proxy.FolderSearch(),
            query_ids=query_ids,
            positive_ids=positive_ids,
            distractor_ids=gallery,
        )
        if depth and top.depth < depth:
            raise errors.field_error(
                path, "ranks", f"lists of k = {top.depth}; the census depth {depth} needs k >= it"
            )
        lists.append(similarity.align(top, query_ids, gallery, positive_ids))
    best = design.best_ranks(lists, gallery.size)
    max_depth = min(x.shape[1] for x in lists)
    # The rule fills its share by fused rank; a fixed depth is the census as asked.
    d = design.plan(
        best,
        fraction,
        census_share=census_share,
        queries=len(query_ids),
        depth=depth,
        max_depth=max_depth,
        priority=design.fused(lists, gallery.size),
    )
    where = np.flatnonzero(d.census)
    order = np.argsort(engine[where])
    where = where[order]
    drawn = sampling.in_sample(gallery[where], d.inclusion, seed) if where.size else where > 0
    return Plan(d, engine[where], drawn, gallery[where], best[where])


class Scored(NamedTuple):
    """The census scored against the queries.

    Attributes:
      counts: [Q, P] int64 census items strictly above each positive (-1 at padding).
      drawn_counts: [Q, P] int64 those of them the hash sample holds (0 at padding).
      scores: [Q, C] float32 every census item's score, in the plan's order (`Plan.ids`).
    """

    counts: np.ndarray
    drawn_counts: np.ndarray
    scores: np.ndarray


# Census rows scored per block.
BLOCK = 8192


def score(backend, plan_: Plan, shards: Sequence[Shard], pos: np.ndarray) -> Scored:
    """Returns the census's exact counts above each positive (`pos` [Q, P], NaN padded) and its
    scores, by `backend` with the search's arithmetic (memory Q x C float32)."""
    by_number = {s.number: s for s in shards}
    scores = np.empty((pos.shape[0], plan_.ids.size), np.float32)
    shard_no, rows = split_ids(plan_.ids)
    for number in np.unique(shard_no):
        here = np.flatnonzero(shard_no == number)
        for start in range(0, here.size, BLOCK):
            part = here[start : start + BLOCK]
            x = by_number[int(number)].read_rows(rows[part])
            scores[:, part] = backend.scores(x).astype(np.float32)
    above = lambda cols: count_above(-np.sort(-scores[:, cols], axis=1), pos)
    mask = ~np.isnan(pos)
    counts, drawn = above(slice(None)), above(plan_.drawn)
    return Scored(np.where(mask, counts, -1), np.where(mask, drawn, 0), scores)


class Sample(NamedTuple):
    """A census design's sample of the whole gallery, as its sampled-scores file holds it.

    Attributes:
      state: the top-M scores (ids: engine ids) and counts above each positive of the rest's
        hash sample and each query's systematic sample of the census.
      n_sample: S, the rest's hashed items plus the census's systematic ones.
      drawn_counts: [Q, P] int64 the census's systematic items above each positive.
      n_drawn: how many census items each query's systematic sample holds.
    """

    state: TopState
    n_sample: int
    drawn_counts: np.ndarray
    n_drawn: int


def systematic(state: TopState, n_sample: int, plan_: Plan, scored: Scored, m: int) -> Sample:
    """Returns the file's sample: the search's hash sample at the rest's rate (`state`, S =
    `n_sample`, with `m + plan_.extra` kept scores) without the census items the hash drew,
    plus each query's systematic sample of the census at the same rate
    (`design.systematic_ranks`): the tail fitted to it is the gallery's, census included, and
    the census's share of it is its expected share rounded rather than a hash's draw."""
    keep = ~np.isin(state.ids, plan_.ids)
    rest_vals = np.where(keep, state.vals, -np.inf)
    rest_ids = np.where(keep, state.ids, -1)
    cols, ranks = design.systematic_sample(scored.scores, plan_.design.inclusion)
    vals = np.concatenate([rest_vals, np.take_along_axis(scored.scores, cols, 1)], 1)
    ids = np.concatenate([rest_ids, plan_.ids[cols]], 1)
    top = np.argsort(-vals, axis=1, kind="stable")[:, :m]
    vals, ids = np.take_along_axis(vals, top, 1), np.take_along_axis(ids, top, 1)
    mask = scored.counts >= 0
    drawn = np.where(mask, np.searchsorted(ranks, scored.counts, side="right"), 0)
    counts = np.where(mask, state.counts - scored.drawn_counts + drawn, 0)
    ids = np.where(np.isfinite(vals), ids, -1)
    n = int(n_sample) - plan_.extra + ranks.size
    return Sample(TopState(vals.astype(np.float32), ids, counts), n, drawn, int(ranks.size))


def save(path: str | os.PathLike, plan_: Plan, n: int, seed: int) -> None:
    """Writes the design's record (docs/outputs.md, "design.npz"): every census item with its
    stratum (0) and inclusion probability (1), and the rest's rule (stratum 1: the ids whose
    hash at `seed` is below `inclusion`, outside the census)."""
    d = plan_.design
    atomic.write_npz(
        path,
        census_ids=plan_.names.astype(str),
        census_best_rank=plan_.best,
        stratum=np.zeros(plan_.names.size, np.int64),
        inclusion_probability=np.ones(plan_.names.size, np.float64),
        inclusion=np.float64(d.inclusion),
        depth=np.int64(d.depth),
        n_distractors=np.int64(n),
        seed=np.int64(seed),
    )
