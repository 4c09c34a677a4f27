"""Queries grouped by their number of positives, so padded work follows each query's own count.

Positives live in [Q, P] arrays padded to the widest query, and the law's E[AP]
(`law.expected_map`) costs Q x P x atoms x gallery sizes: a few wide queries make every query pay
for their width (a landmark-style query of hundreds of positives among queries of a few: several
times the time and memory, `benchmarks/wide_queries.py`). `groups(mask)` splits the queries by
their positive count rounded up to a power of two (at least `MIN_WIDTH`), each group with its
real positives packed first, where that saves at least half the padded slots; `expected_map`
runs the law group by group and puts the queries back in order. Each group is one more
compiled shape, so a benchmark without wide queries (the usual case) stays one call of the
unchanged program.

Shapes: Q queries, P positive slots; a group holds Q_g queries in W_g <= P slots.
"""

from collections.abc import Callable, Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from tailaware.core import law
from tailaware.core.metrics import Array

# The narrowest group: queries with up to this many positives share one.
MIN_WIDTH = 16
# Split only when the groups' slots are at most this share of the padded Q x P.
MAX_SHARE = 0.5


class Group(NamedTuple):
    """One group of queries.

    Attributes:
      rows: [Q_g] int32 query indices, ascending.
      cols: [Q_g, W_g] int32 positive slots of each: its real positives first, then padding.
    """

    rows: jax.Array
    cols: jax.Array


def groups(mask: ArrayLike, max_share: float = MAX_SHARE) -> tuple[Group, ...] | None:
    """Returns the groups of queries of the [Q, P] positives `mask`, or None for one group.

    A query with n positives goes to the group of width min(P, max(MIN_WIDTH, 2^ceil(log2 n))).
    None (no split) when every query falls into one group or the groups would keep more than
    `max_share` of the Q x P slots (0: never split).
    """
    mask = np.asarray(mask, bool)
    q, p = mask.shape
    n = np.maximum(mask.sum(axis=1), 1)
    width = np.minimum(p, np.maximum(MIN_WIDTH, 2 ** np.ceil(np.log2(n)).astype(np.int64)))
    values = np.unique(width)
    if len(values) < 2 or width.sum() > max_share * q * p:
        return None
    order = np.argsort(~mask, axis=1, kind="stable")  # real positives first, in their order
    out = []
    for w in values:
        rows = np.flatnonzero(width == w)
        out.append(Group(jnp.asarray(rows, jnp.int32), jnp.asarray(order[rows, :w], jnp.int32)))
    return tuple(out)


def take(a: ArrayLike, group: Group) -> jax.Array:
    """Returns the group's part [Q_g, W_g, ...] of a [Q, P, ...] array."""
    a = jnp.asarray(a)[group.rows]
    idx = group.cols.reshape(group.cols.shape + (1,) * (a.ndim - 2))
    return jnp.take_along_axis(a, idx, axis=1)


def apply(
    fn: Callable[..., jax.Array],
    grouping: tuple[Group, ...] | None,
    slots: Sequence[Array | None] = (),
    rows: Sequence[Array | None] = (),
) -> jax.Array:
    """Returns fn(*slots, *rows) [..., Q], computed group by group.

    `slots` are [Q, P, ...] arrays (or None, passed through), cut to each group's positives;
    `rows` are [Q, ...] arrays, cut to its queries; `fn` maps a group's parts to [..., Q_g].
    `grouping`: `groups(mask)`, where None is one call on the padded arrays. Traceable: the
    groups' shapes are static under `jit`.
    """
    if grouping is None:
        return fn(*slots, *rows)
    parts = []
    for g in grouping:
        cut = [None if a is None else take(a, g) for a in slots]
        parts.append(fn(*cut, *(None if a is None else a[g.rows] for a in rows)))
    index = jnp.concatenate([g.rows for g in grouping])
    out = jnp.concatenate(parts, axis=-1)
    return jnp.zeros(out.shape[:-1] + (index.shape[0],), out.dtype).at[..., index].set(out)


def expected_map(
    x: jax.Array,
    mask: jax.Array,
    n: law.Scalar,
    k: int,
    *,
    fixed: jax.Array,
    weights: jax.Array | None,
    counts: jax.Array,
    n_sample: law.Scalar,
    table: jax.Array,
    grouping: tuple[Group, ...] | None = None,
) -> jax.Array:
    """Returns `law.expected_map`'s per-query E[AP@k] [Q], computed group by group (`apply`).

    Arguments as in `law.expected_map` (`fixed` and `counts` [Q, P] arrays, `weights` [Q, A] or
    None).
    """

    def fn(
        x_g: jax.Array,
        mask_g: jax.Array,
        fixed_g: jax.Array,
        counts_g: jax.Array,
        w_g: jax.Array | None,
    ) -> jax.Array:
        return law.expected_map(
            x_g,
            mask_g,
            n,
            k,
            fixed=fixed_g,
            weights=w_g,
            counts=counts_g,
            n_sample=n_sample,
            table=table,
        )[1]

    return apply(fn, grouping, (x, mask, fixed, counts), (weights,))
