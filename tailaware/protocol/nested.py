"""The nested bootstrap: resample the distractor sample, rerun the estimator, in one jit call.

The S sampled distractors are a sample of the pool, and the tail fits inherit their noise
(paper App. C). `nested_bootstrap` resamples the distractor sample with Poisson(1) weights (the
Poisson bootstrap of all S distractors, restricted to what the estimator reads: the top L stored
scores and the counts; one weight per distractor, shared by every query that stores it, when
the file names them) and reruns the estimator from scratch
(`estimators.Estimator.traced`), vmapped over replicates in one compiled program. Resampled stored
scores keep their order; a positive's resampled count is the weight of the stored scores above
it plus a nested Poisson draw for the unstored distractors above it, so counts and tail stay
consistent. Each replicate also resamples queries, so it carries both sources; averaging the
same replicates over all queries gives the distractor-only part.

Shapes: Q queries, P positives (padded), L stored tail scores resampled, B replicates, G gallery
sizes.
"""

import dataclasses
import functools
import zlib
from concurrent import futures
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from tailaware.core import buckets, evaluate, law, metrics
from tailaware.io.scores import SampledScores
from tailaware.tail import estimators, functional
from tailaware.tail.settings import TailSettings

# CDF of Poisson(1) at 0..19; the mass beyond (< 1e-18) is folded into 19.
_POISSON1_CDF = np.cumsum(np.exp(-1.0) / np.cumprod(np.r_[1.0, np.arange(1.0, 20.0)]))[:-1]
# Folded into the seed's key for the replicates' weights by id, apart from its other streams.
_ID_STREAM = 0x1D5
# Below this mean, Poisson draws invert the CDF term by term; above it, a rounded normal (whose
# error in the bootstrap's variance is O(1 / mean)).
_SMALL_MEAN = 24


class Items(NamedTuple):
    """Linear functionals of per-query metrics that the replicates also report (the ILIAS
    report's values): item i is sum_q weights[i, q] v_q, v_q the query's metric
    `metric_index[i]` (into the metrics) in view `view_index[i]` of `views` [V, Q, P] at the
    first gallery size."""

    views: np.ndarray
    view_index: np.ndarray
    metric_index: np.ndarray
    weights: np.ndarray


class Nested(NamedTuple):
    """Nested-bootstrap replicates of every metric at each of its gallery sizes.

    Attributes:
      sizes: [G] the gallery sizes.
      distractor: [G, M, B] each metric over all queries (distractor and fit noise only).
      combined: [G, M, B] over resampled queries (queries, distractors and fits).
      items_distractor, items_combined: [I, B] the `Items`' values likewise; None without items.
      by_id: the weights were drawn by distractor id (`id_weights`): replicate r of another
        file of the same seed weighted each shared item alike, so the two pair.
    """

    sizes: np.ndarray
    distractor: np.ndarray
    combined: np.ndarray
    items_distractor: np.ndarray | None = None
    items_combined: np.ndarray | None = None
    by_id: bool = False

    def at(self, g: int, m: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """Returns (distractor [B], combined [B]) of metric m at the g-th gallery size."""
        return self.distractor[g, m], self.combined[g, m]

    def sd(self, m: int = 0) -> np.ndarray:
        """Returns [G] the distractor replicates' sd of metric m at each size."""
        return np.std(self.distractor[:, m], axis=-1, ddof=1)


class Extra(NamedTuple):
    """The estimator on the `extra` samples of `nested_bootstrap`, as they are (no resampling).

    Attributes:
      values: [E, G, M] each metric over all queries at each gallery size.
      items: [E, I] the `Items`' values at the first size; None without items.
    """

    values: np.ndarray
    items: np.ndarray | None = None


def poisson_one(key, shape):
    """Returns Poisson(1) draws by inverting the CDF (much faster on CPU than rejection)."""
    u = jax.random.uniform(key, shape)
    return jnp.searchsorted(jnp.asarray(_POISSON1_CDF, jnp.float32), u, side="right")


def poisson(key, lam):
    """Returns approximate Poisson(lam) draws (float32), exact in law for lam < 24."""
    k_u, k_z = jax.random.split(key)
    u = jax.random.uniform(k_u, lam.shape)
    small = lam < _SMALL_MEAN
    lam_s = jnp.where(small, lam, 0.0)

    def term(k, carry):
        n, pmf, cdf = carry
        pmf = pmf * lam_s / k
        return n + (u > cdf).astype(n.dtype), pmf, cdf + pmf

    pmf = jnp.exp(-lam_s)
    # 2 * 24 + 24 terms: the Poisson(24) mass beyond is < 1e-12.
    n, _, _ = jax.lax.fori_loop(1, 3 * _SMALL_MEAN, term, (jnp.zeros_like(lam), pmf, pmf))
    big = jnp.maximum(jnp.round(lam + jnp.sqrt(lam) * jax.random.normal(k_z, lam.shape)), 0.0)
    return jnp.where(small, n, big)


def _repeat(tail, w, cw):
    """Returns tail[i] repeated w[i] times, cut or padded (with the last copy) to len(tail).

    Slot p holds the item whose copies start at or before p: a scatter of each item's first
    slot and a running max, O(L) where `searchsorted` is O(L log L) and slower on CPU.
    Fewer than L copies pad with the last score; the threshold sits far above them (see
    `functional.resample_width`), so they never reach the fit.
    """
    width = tail.shape[0]
    first = jnp.where(w > 0, cw - w, width)  # out of range -> dropped
    item = jnp.full((width,), -1, jnp.int32).at[first].max(jnp.arange(width, dtype=jnp.int32))
    item = jax.lax.cummax(item)
    return tail[jnp.clip(item, 0, width - 1)]


@jax.jit
def id_weights(key, ids_hi, ids_lo):
    """Returns Poisson(1) weights [U] of distractors by id (its halves, `id_halves`): a hash of
    (key, id), so every file that stores an item gives it the same weight under one key."""
    one = lambda hi, lo: poisson_one(jax.random.fold_in(jax.random.fold_in(key, hi), lo), ())
    return jax.vmap(one)(ids_hi, ids_lo)


def id_halves(ids: np.ndarray) -> tuple[jax.Array, jax.Array]:
    """Returns the uint32 high and low halves of ids >= 0 (int64), as `id_weights` takes them."""
    ids = np.asarray(ids, np.int64)
    return (
        jnp.asarray((ids >> 32).astype(np.uint32)),
        jnp.asarray((ids & 0xFFFFFFFF).astype(np.uint32)),
    )


def id_key(seed: int, replicate):
    """Returns replicate `replicate`'s key for weights by id: a function of (seed, replicate)
    alone, so files with other extras or replicate counts pair."""
    return jax.random.fold_in(jax.random.fold_in(jax.random.key(seed), _ID_STREAM), replicate)


def resample(key, tail, pos, counts, mask, item=None, item_weights=None):
    """Returns a Poisson-bootstrap (tail [Q, L], counts [Q, P]) of every query's sample.

    Args:
      key: PRNG key.
      tail: [Q, L] stored scores, descending (-inf padded when S < L).
      pos: [Q, P] positive scores (padding arbitrary).
      counts: [Q, P] float sampled distractors above each positive (>= the stored ones above).
      mask: [Q, P] real positives.
      item: [Q, L] int32 index into `item_weights` of each stored score's distractor, or None.
        With it, a distractor's Poisson weight is drawn once and shared by every query that
        stores it, as the sample itself is: one item drawn into (or out of) the sample moves
        every query it is near. Without it each stored score gets its own weight.
      item_weights: [U] the distinct distractors' weights (`id_weights`); with `item`.
    """
    k_tail, k_rest = jax.random.split(key)
    finite = jnp.isfinite(tail)
    width = tail.shape[1]
    if item is None:
        w = jnp.where(finite, poisson_one(k_tail, tail.shape), 0)
    else:
        w = jnp.where(finite, item_weights[item], 0)
    cw = jnp.cumsum(w, axis=1)
    new_tail = jax.vmap(_repeat)(tail, w, cw)
    n_finite = jnp.sum(finite, axis=1)[:, None]
    new_tail = jnp.where(jnp.arange(width)[None, :] < n_finite, new_tail, -jnp.inf)

    # Stored scores above each positive [Q, P]: a binary search of the descending tail (a
    # comparison of every pair costs Q x P x L, too much for queries with hundreds of positives).
    n_above = jax.vmap(lambda t, p: jnp.searchsorted(-t, -p, side="left"))(tail, pos)
    w_above = jnp.where(
        n_above > 0, jnp.take_along_axis(cw, jnp.maximum(n_above - 1, 0), axis=1), 0
    )
    # Distractors above a positive but not among the L stored ones: nested Poisson draws.
    rest = jnp.where(mask, counts - n_above.astype(counts.dtype), 0.0)
    order = jnp.argsort(rest, axis=1)
    rest_sorted = jnp.take_along_axis(rest, order, axis=1)
    inc = jnp.diff(rest_sorted, axis=1, prepend=jnp.zeros_like(rest_sorted[:, :1]))
    drawn = jnp.cumsum(poisson(k_rest, inc), axis=1)
    rest_new = jnp.zeros_like(rest).at[jnp.arange(rest.shape[0])[:, None], order].set(drawn)
    new_counts = w_above.astype(counts.dtype) + rest_new
    return new_tail, jnp.where(mask, new_counts, 0.0)


@functools.partial(
    jax.jit,
    static_argnames=(
        "k",
        "traced",
        "settings",
        "metric_list",
        "gains",
        "batch_size",
        "num_atoms",
    ),
)
def _nested(
    keys,
    rows,
    id_keys,
    cores: functional.Core,
    sizes,
    items,
    shared,
    *,
    tables,
    grouping,
    k,
    traced,
    settings,
    metric_list,
    gains,
    batch_size,
    num_atoms,
):
    q = cores.tail.shape[1]

    def one(args):
        # row 0: the sample, resampled; row i > 0: extra sample i, as it is
        key, row, id_key = args
        c = jax.tree.map(lambda a: a[row], cores)
        drawn_again = row == 0
        k_q, k_d = jax.random.split(key)
        if shared is None:
            tail, counts = resample(k_d, c.tail, c.pos, c.counts, c.mask)
        else:
            # The stored items' weights pair across files; the unstored counts' draws are this
            # file's own (its salt), as their items are unknown.
            w_items = id_weights(id_key, shared.hi, shared.lo)
            k_d = jax.random.fold_in(k_d, shared.salt)
            tail, counts = resample(k_d, c.tail, c.pos, c.counts, c.mask, shared.item, w_items)
        tail = jnp.where(drawn_again, tail, c.tail)
        counts = jnp.where(drawn_again, counts, c.counts)
        atoms, w = traced(dataclasses.replace(c, tail=tail, counts=counts), settings)
        atoms = functional.deplete(atoms, c.depleted)

        def law_values(atoms, w):
            return evaluate.traced_values(
                atoms,
                w[None],
                c.mask,
                sizes,
                None if items is None else items.views,
                k=k,
                metric_list=metric_list,
                gains=gains,
                tables=tables,
                fixed=c.fixed,
                counts=counts,
                n_sample=c.s,
                grouping=grouping,
            )

        if num_atoms < w.shape[1]:
            # A replicate keeps each query's heaviest atoms (its spread is what it is for); an
            # extra sample keeps them all, as its level is what the budget check reads.
            def heaviest(atoms, w):
                w, keep = jax.lax.top_k(w, num_atoms)
                atoms = jnp.take_along_axis(atoms, keep[:, None, :], axis=2)
                return law_values(atoms, w / jnp.sum(w, axis=1, keepdims=True))

            values, in_views = jax.lax.cond(drawn_again, heaviest, law_values, atoms, w)
        else:
            values, in_views = law_values(atoms, w)
        values = values[0]  # [G, M, Q]
        drawn = jnp.zeros(q, values.dtype).at[jax.random.randint(k_q, (q,), 0, q)].add(1.0)
        out = (jnp.mean(values, axis=-1), values @ drawn / q)
        if items is None:
            return out
        per_item = in_views[0][items.view_index, items.metric_index]  # [I, Q]
        w_i = items.weights * drawn[None, :]
        return (
            *out,
            jnp.sum(per_item * items.weights, -1),
            jnp.sum(per_item * w_i, -1) / jnp.sum(w_i, -1),
        )

    # One at a time without `batch_size`: lax.map vmaps a batch, and under vmap the `cond` above
    # becomes a select that evaluates both branches (every atom of every replicate).
    xs = (keys, rows, id_keys)
    return jax.lax.map(one, xs, batch_size=batch_size if batch_size > 1 else None)


class SharedItems(NamedTuple):
    """The stored scores' distractors, for weights drawn by id (`id_weights`).

    Attributes:
      item: [Q, L] int32 index of each stored score's distractor among the distinct ones
        (padding takes 0; its weight is never read).
      hi, lo: [U] uint32 high and low halves of the distinct ids.
      salt: uint32 hash of the file's positives and ids, keying its own unstored draws.
    """

    item: jax.Array
    hi: jax.Array
    lo: jax.Array
    salt: jax.Array


def shared_items(scores: SampledScores, width: int) -> SharedItems | None:
    """Returns the `SharedItems` of the first `width` stored scores, or None for a file without
    `tail_ids`."""
    if scores.tail_ids is None:
        return None
    ids = scores.tail_ids[:, :width]
    distinct, index = np.unique(np.where(ids >= 0, ids, ids.max(initial=0)), return_inverse=True)
    # Padded to a power of two (entries no score indexes), so that files of nearby sizes, two
    # models' of one sample say, share one compiled program.
    padded = 1 << (int(distinct.size) - 1).bit_length()
    hi, lo = id_halves(np.pad(distinct.astype(np.int64), (0, padded - distinct.size)))
    salt = zlib.crc32(ids.tobytes() + np.asarray(scores.pos_scores).tobytes())
    return SharedItems(
        item=jnp.asarray(index.reshape(ids.shape), jnp.int32),
        hi=hi,
        lo=lo,
        salt=jnp.asarray(np.uint32(salt)),
    )


def id_keys(seed: int, count: int) -> jax.Array:
    """Returns the keys of replicates 0 .. count - 1 for weights by id (`id_key`)."""
    return jax.vmap(lambda r: id_key(seed, r))(jnp.arange(count, dtype=jnp.uint32))


def nested_bootstrap(
    scores: SampledScores,
    estimator: str,
    settings: TailSettings,
    k: int,
    sizes,
    num_replicates: int,
    *,
    seed: int = 0,
    metric_list: tuple[metrics.Metric, ...] = (metrics.METRICS["map"],),
    num_atoms: int | None = None,
    items: Items | None = None,
    extra: tuple = (),
    batch_size: int = 1,
    max_share: float = buckets.MAX_SHARE,
    threads: int = 2,
) -> tuple[Nested, Extra]:
    """Returns (nested-bootstrap replicates of every metric@k at each gallery size, the
    estimator's metrics and items on each of the `extra` samples, `Extra`).

    Every replicate resamples the distractor sample (Poisson weights, one per distractor shared
    by every query that stores it when the file names them, `SampledScores.tail_ids`; else one
    per stored score), reruns the estimator and evaluates the law (`evaluate.traced_values`); it
    also draws a resample of queries.

    Args:
      scores: the sample.
      estimator: a registered estimator's name (`tailaware.tail.estimators.ESTIMATORS`).
      settings: the estimator's `TailSettings`.
      k: the cut-off.
      sizes: [G] gallery sizes.
      num_replicates: B.
      seed: PRNG seed.
      metric_list: the metrics.
      num_atoms: each replicate keeps each query's this many heaviest atoms, its weights
        renormalised over them; None keeps them all.
      items: `Items` the replicates also report, or None.
      extra: sub-samples of `scores` (the budget check's) the same program evaluates as they
        are, with every atom, at the width of `scores` (`functional.core`): one compiled
        program for both.
      batch_size: replicates vmapped together (memory ~ batch_size * G * Q * P * atoms floats).
        One at a time is the fastest as well as the leanest on 2 cores (benchmarks/README.md,
        "protocol.py"); results do not depend on it.
      max_share: queries are evaluated in groups of their own positive width (`buckets.groups`;
        0: never); results do not depend on it.
      threads: the replicates run in this many equal parts at once (each replicate depends on
        its own key alone, so the results do not depend on it): XLA runs the program on one
        core, and the parts fill the others.
    """
    est = estimators.get(estimator)
    metric_list = tuple(metric_list)
    gains = law.table_gains(metric_list)
    b = int(num_replicates)
    cores = [functional.core(scores, settings)]
    cores += [functional.core(x, settings, reference=scores) for x in extra]
    cores = jax.tree.map(lambda *a: jnp.stack(a), *cores)  # [1 + len(extra), ...]
    rows = np.concatenate([np.zeros(b, np.int32), np.arange(1, 1 + len(extra), dtype=np.int32)])
    total = rows.size
    if total == 0:
        raise ValueError("nothing to evaluate: no replicate and no extra sample")
    parts = max(1, min(int(threads), total))
    size = -(-total // parts)  # equal parts share one compiled program
    keys = jax.random.split(jax.random.key(seed), total)
    pad = size * parts - total  # rows evaluated and dropped
    keys = jnp.concatenate([keys, jnp.repeat(keys[-1:], pad, axis=0)])
    padded = jnp.asarray(np.concatenate([rows, np.repeat(rows[-1:], pad)]))
    run = functools.partial(
        _nested,
        cores=cores,
        shared=shared_items(scores, int(cores.tail.shape[2])),
        sizes=jnp.asarray(np.asarray(sizes, np.float64), jnp.float32),
        items=None if items is None else jax.tree.map(jnp.asarray, items),
        tables=law.rank_tables(int(k), gains),
        grouping=buckets.groups(scores.mask, max_share),
        k=int(k),
        traced=est.traced,
        settings=settings,
        metric_list=metric_list,
        gains=gains,
        batch_size=int(max(1, min(batch_size, size))),
        num_atoms=int(num_atoms or 1 << 30),
    )
    by_id = id_keys(seed, size * parts)
    part = lambda i: tuple(x[i * size : (i + 1) * size] for x in (keys, padded, by_id))
    with futures.ThreadPoolExecutor(parts) as pool:
        done = list(pool.map(lambda i: jax.device_get(run(*part(i))), range(parts)))
    got = [np.concatenate(p) for p in zip(*done, strict=True)]
    got = [np.moveaxis(np.asarray(a, np.float64), 0, -1) for a in got]
    at_b = [a[..., :b] for a in got]
    reps = Nested(
        sizes=np.asarray(sizes, np.float64),
        distractor=at_b[0],
        combined=at_b[1],
        items_distractor=at_b[2] if items is not None else None,
        items_combined=at_b[3] if items is not None else None,
        by_id=scores.tail_ids is not None,
    )
    on_extra = [np.moveaxis(a[..., b:total], -1, 0) for a in got]
    return reps, Extra(on_extra[0], on_extra[2] if items is not None else None)
