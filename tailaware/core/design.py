"""A sampling design with a census: the items other models rank high, then a uniform rest.

A proxy (another model's top lists over the same gallery and queries) ranks each item; an item
is embedded once for all queries, so the strata are item-level, by the item's best rank over
every query and proxy. The census holds every item ranked within depth d by some query; the
rest is sampled uniformly by the id hash of `tailaware.core.sampling` at the rate that makes the
total embedded share, census included, the budget f:

    pi = (f N - C) / (N - C)    (C census items of N)

so each embedded item's inclusion probability is 1 (census) or pi (the rest). The hash sample
is drawn over all N ids (`in_sample(ids, pi)`), census included; its items outside the census
are a uniform sample of the rest, and all of it is a uniform sample of the gallery (the
uniform-only prediction beside the pooled one).

The share rule (docs/estimators.md, "Census"): the census may take `census_share` of the budget
where that holds at least `ITEMS_PER_QUERY` items per query, less in proportion where it holds
fewer (`share`). The depth rule: the deepest d whose census fits in that share of the budget
(C(d) <= share f N), and no deeper than the proxies' lists; what
is left of the share is filled from rank d + 1 by a priority (`fused`, reciprocal-rank fusion
over the queries and proxies), so that a census exists where even each query's top-1 does not
fit (many queries per item of budget). The census is a function of the proxies' lists alone,
never of the sample, so every inclusion probability stays known.

Shapes: N gallery items, Q queries, k list entries.
"""

from collections.abc import Iterator, Sequence
from typing import NamedTuple

import numpy as np

# An item no proxy lists: its best rank.
UNRANKED = np.iinfo(np.int64).max

# The census's items per query (share x f N / Q) below which its share of the budget shrinks in
# proportion: so shallow a census finds almost none of the outrankers and costs the rest's
# sample its share (dev figures: docs/validation.md, "The census's share of the budget").
ITEMS_PER_QUERY = 8.0

# The census's systematic sample's start: the middle item of every 1 / pi (dev figures against
# a start drawn from the seed: docs/validation.md, "The systematic sample's start").
MIDPOINT = 0.5


class Design(NamedTuple):
    """A census and a uniform rest.

    Attributes:
      census: [N] bool, the items embedded with certainty.
      inclusion: pi, the rest's inclusion probability (the hash fraction).
      depth: d, the census depth (best rank <= d); 0 without a census.
      best_rank: [N] int64, each item's best (1-based) rank over the queries and proxies,
        `UNRANKED` where no list holds it.
    """

    census: np.ndarray
    inclusion: float
    depth: int
    best_rank: np.ndarray

    @property
    def n_census(self) -> int:
        """C, the census size."""
        return int(self.census.sum())


def _entries(lists: Sequence[np.ndarray]) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Yields (items, ranks) of every list's real entries: item indices and their 1-based
    ranks, flat."""
    for ranks in lists:
        ranks = np.asarray(ranks, np.int64)
        if ranks.size == 0:
            continue
        rank = np.broadcast_to(np.arange(1, ranks.shape[1] + 1), ranks.shape)
        real = ranks >= 0
        yield ranks[real], rank[real]


def best_ranks(lists: Sequence[np.ndarray], n: int) -> np.ndarray:
    """Returns [N] int64 each item's best 1-based rank over every row of `lists`.

    Args:
      lists: each [Q, k] int64 item indices in [0, N), best first; -1 where a list names no
        gallery item (padding, or an item always in the database).
      n: N.
    """
    best = np.full(n, UNRANKED, np.int64)
    for items, rank in _entries(lists):
        np.minimum.at(best, items, rank)
    return best


def fused(lists: Sequence[np.ndarray], n: int) -> np.ndarray:
    """Returns [N] float64 each item's reciprocal-rank fusion score: the sum of 1 / rank over
    every row of `lists` that holds it (0 where none does); `lists` as in `best_ranks`."""
    score = np.zeros(n, np.float64)
    for items, rank in _entries(lists):
        np.add.at(score, items, 1.0 / rank)
    return score


def share(census_share: float, fraction: float, n: int, queries: int) -> float:
    """Returns the census's share of the budget by the share rule: `census_share` where it holds
    at least `ITEMS_PER_QUERY` items per query (census_share x f N / Q), in proportion below."""
    if queries < 1:
        raise ValueError(f"the share rule needs the number of queries >= 1, got {queries}")
    per_query = census_share * fraction * n / queries
    return census_share * min(1.0, per_query / ITEMS_PER_QUERY)


def plan(
    best_rank: np.ndarray,
    fraction: float,
    *,
    census_share: float = 0.5,
    queries: int = 0,
    depth: int = 0,
    max_depth: int | None = None,
    priority: np.ndarray | None = None,
) -> Design:
    """Returns the census and the rest's rate for a total budget of `fraction` of N.

    Args:
      best_rank: [N] from `best_ranks`.
      fraction: f, the total embedded share in (0, 1), census included.
      census_share: the most of the budget the census may take (the depth rule); in [0, 1).
      queries: Q, the number of queries: the share shrinks by `share` where the census would
        hold fewer than `ITEMS_PER_QUERY` items per query (0: `census_share` as given).
      depth: a fixed census depth d (0: by the rule).
      max_depth: the proxies' list depth, the deepest a rule can go (None: no cap).
      priority: [N] (e.g. `fused`): by the rule, the items of best rank d + 1 with the highest
        priority (ties by index) fill the share the depth-d census leaves (None: no fill).

    Raises:
      ValueError: a fixed depth whose census exceeds the budget, or an argument out of range.
    """
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"fraction must be in (0, 1) for a census design, got {fraction}")
    if not 0.0 <= census_share < 1.0:
        raise ValueError(f"census_share must be in [0, 1), got {census_share}")
    n = int(best_rank.size)
    budget = fraction * n
    if queries and not depth:
        census_share = share(census_share, fraction, n, queries)
    ranked = np.sort(best_rank[best_rank != UNRANKED])
    if depth:
        d = int(depth)
        c = int(np.searchsorted(ranked, d, side="right"))
        if c >= budget:
            raise ValueError(
                f"a census of depth {d} holds {c:,} items, more than the budget "
                f"{fraction} x {n:,} = {budget:,.0f}"
            )
    else:
        # C(d) = items of best rank <= d; the deepest d with C(d) <= share * budget.
        cap = census_share * budget
        m = int(np.floor(cap))
        # The rank of the first item that does not fit, minus one (all of them when all fit).
        if ranked.size == 0:
            d = 0
        else:
            d = int(ranked[-1]) if m >= ranked.size else int(ranked[m]) - 1
        if max_depth is not None:
            d = min(d, int(max_depth))
        c = int(np.searchsorted(ranked, d, side="right"))
    census = best_rank <= d if d else np.zeros(n, bool)
    if priority is not None and not depth and (max_depth is None or d < max_depth):
        # The next level by priority: a stable sort keeps ties in index order.
        level = np.flatnonzero(best_rank == d + 1)
        room = max(int(np.floor(census_share * budget)) - c, 0)
        if level.size and room:
            order = np.argsort(-np.asarray(priority, np.float64)[level], kind="stable")
            census[level[order[:room]]] = True
            c = int(census.sum())
    pi = (budget - c) / (n - c) if n > c else 1.0
    return Design(census, float(pi), int(d), best_rank)


def systematic_ranks(n_census: int, rate: float, start: float = MIDPOINT) -> np.ndarray:
    """Returns the 1-based ranks of a query's systematic sample of the census at `rate`: its
    census items by descending score, every (1 / rate)-th from the start u in (0, 1],
    ceil((i - u) / rate) <= C for i = 1, 2, ...

    Beside the rest's hash sample at the same rate, these make each query's sample of the whole
    gallery, so the tail fitted to it is the gallery's, not the depleted rest's. At the default
    start (`MIDPOINT`) the sample holds floor(rate c + 1/2) of any query's first c census items:
    the census's expected share of the sample, rounded, at every score at once. (A start drawn
    uniformly would include each item with probability `rate` exactly, but one start serves
    every query: where rate x C < 1 it puts each query's own top census items in the sample at
    weight 1 / rate together, a shared error of the whole benchmark; docs/validation.md, "The
    systematic sample's start".)
    """
    if not 0.0 < start <= 1.0:
        raise ValueError(f"the systematic sample's start must be in (0, 1], got {start}")
    count = int(np.floor(rate * n_census + start))
    ranks = np.ceil((np.arange(1, count + 1) - start) / rate).astype(np.int64)
    return np.asarray(np.clip(ranks, 1, n_census), np.int64)


def systematic_sample(
    census_scores: np.ndarray, rate: float, start: float = MIDPOINT
) -> tuple[np.ndarray, np.ndarray]:
    """Returns (the columns [Q, n] of `census_scores` [Q, C] each query's systematic sample
    holds, their ranks [n]): `systematic_ranks` of each row's census items by descending score
    (ties by column). The sample holds searchsorted(ranks, C_j, "right") of the C_j census
    items above a positive."""
    ranks = systematic_ranks(census_scores.shape[1], rate, start)
    order = np.argsort(-census_scores, axis=1, kind="stable")
    return order[:, ranks - 1], ranks
