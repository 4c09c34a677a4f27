"""Predicted metrics of estimated hardness at any gallery size: the prediction's one pass.

`predicted_values` turns hardness posteriors (`Variant`s: the estimate under each of its priors,
its threshold reruns, the baselines) into every query's E[metric@k] at every gallery size, and
in `views` (subsets of each query's positives, the ILIAS report's groups) at the first size, in
one compiled call: each atom's metrics are computed once (`law.query_metrics`, group by group of
positive width, `buckets.apply`), conditioned on the sample's own counts where the gallery
contains it, and every variant's weightings contract them. A posterior's atoms are pruned first
(`prune_atoms`): the pass costs linearly in the atoms, and under the averaged tail estimator's
empirical-Bayes prior a query's lightest carry next to no weight.

Shapes: Q queries, P positive slots, A atoms, G gallery sizes, M metrics, V views, W weightings.
"""

from collections.abc import Sequence
from typing import NamedTuple, Protocol

import jax
import jax.numpy as jnp
import numpy as np
from numpy.typing import ArrayLike

from tailaware.core import buckets, law, metrics
from tailaware.core.results import Hardness

# The most weight a query may lose to pruning (`prune_atoms`), under each of the weightings: its
# E[AP] then moves by at most this, since AP is in [0, 1] (about float32's resolution near 1).
ATOM_TOLERANCE = 1e-7
# The atom counts pruning keeps (then all): a few static shapes, one compiled pass per count used.
ATOM_COUNTS = (4, 8, 12, 16, 24)


def kept_atoms(weights: ArrayLike, tolerance: float = ATOM_TOLERANCE) -> tuple[np.ndarray, float]:
    """Returns (cols [Q, A'] ascending, the dropped mass): each query's A' heaviest atoms.

    `weights` [Q, A] or [T, Q, A] weigh the same atoms T ways; a query's atoms rank by their
    largest weight under any of them. A' is the smallest of `ATOM_COUNTS` (else A) at which no
    query loses more than `tolerance` of its weight under any weighting (0: every atom); the
    dropped mass returned is the largest such loss.
    """
    w = np.asarray(weights, np.float64)
    a = w.shape[-1]
    every = np.broadcast_to(np.arange(a), w.shape[-2:])
    if tolerance <= 0:
        return every, 0.0
    order = np.argsort(-w.reshape(-1, *w.shape[-2:]).max(axis=0), axis=-1, kind="stable")
    ranked = np.take_along_axis(w, np.broadcast_to(order, w.shape), axis=-1)
    # beyond[i]: the most mass a query loses under a weighting when it keeps its i heaviest atoms.
    beyond = np.cumsum(ranked[..., ::-1], axis=-1)[..., ::-1].reshape(-1, a).max(axis=0)
    keep = next((n for n in ATOM_COUNTS if n < a and beyond[n] <= tolerance), a)
    if keep == a:
        return every, 0.0
    return np.sort(order[:, :keep], axis=-1), float(beyond[keep])


def prune_atoms(
    atoms: np.ndarray, weights: np.ndarray, tolerance: float = ATOM_TOLERANCE
) -> tuple[np.ndarray, np.ndarray, float]:
    """Returns (atoms [Q, P, A'], weights [..., Q, A'], the dropped mass): each query's A' heaviest
    (`kept_atoms`).

    The kept weights are renormalised (float64; rows sum to 1 as `Hardness.weights` do), so a
    query's E[AP] E = (1 - d) E_kept + d E_dropped, with d its dropped mass, moves by
    |E - E_kept| = d |E_dropped - E_kept| <= d. The kept atoms stay in their order. Nothing
    dropped: the inputs returned.
    """
    cols, dropped = kept_atoms(weights, tolerance)
    if cols.shape[-1] == np.shape(weights)[-1]:
        return atoms, weights, 0.0
    w = np.asarray(weights, np.float64)
    keep = cols.shape[-1]
    kept = np.take_along_axis(w, np.broadcast_to(cols, w.shape[:-1] + (keep,)), axis=-1)
    kept = kept / kept.sum(axis=-1, keepdims=True)
    return np.take_along_axis(np.asarray(atoms), cols[:, None, :], axis=-1), kept, dropped


class Variant(NamedTuple):
    """One hardness posterior to evaluate: atoms [Q, P, A] and its weightings [W, Q, A] (rows
    summing to 1 over the atoms; a point estimate is one atom of weight 1)."""

    atoms: np.ndarray
    weights: np.ndarray


def variant(hardness: Hardness, priors: bool = False) -> Variant:
    """Returns the `Variant` of an estimate: its atoms under its own weights and, with `priors`,
    under its other priors on the tail shape (`Hardness.prior_weights`) too."""
    if hardness.atoms is None:
        return Variant(hardness.x[..., None], np.ones((1, *hardness.x.shape[:1], 1)))
    if hardness.weights is None:
        raise ValueError("a hardness posterior's atoms come with their weights")
    others = () if not priors or hardness.prior_weights is None else tuple(hardness.prior_weights)
    return Variant(hardness.atoms, np.stack([hardness.weights, *others]))


class Sample(Protocol):
    """What a prediction conditions on: the sample's counts above each positive and its size
    (a `tailaware.io.scores.SampledScores`)."""

    @property
    def pos_counts(self) -> np.ndarray:
        """[Q, P] sampled distractors above each positive."""
        ...

    @property
    def n_sample(self) -> int:
        """S, the sampled distractors."""
        ...


class Counts(NamedTuple):
    """A `Sample` from stored counts alone (a hardness artifact's)."""

    pos_counts: np.ndarray
    n_sample: int


def traced_values(
    atoms: jax.Array,
    weights: jax.Array,
    mask: jax.Array,
    sizes: jax.Array,
    views: jax.Array | None,
    *,
    k: int,
    metric_list: tuple[metrics.Metric, ...],
    gains: tuple[str, ...],
    tables: jax.Array,
    fixed: jax.Array,
    counts: jax.Array,
    n_sample: jax.Array,
    grouping: tuple[buckets.Group, ...] | None,
) -> tuple[jax.Array, jax.Array | None]:
    """Returns (E[metric] [W, G, M, Q], in the views at sizes[0] [W, V, M, Q] or None), traced.

    `atoms` [Q, P, A] and their weightings [W, Q, A]; `mask`, `fixed`, `counts` [Q, P]; `sizes`
    [G]; `views` [V, Q, P] or None; `tables` = `law.rank_tables(k, gains)`; `grouping` =
    `buckets.groups(mask)`. The body of `predicted_values`, for jitted callers (the nested
    bootstrap).
    """

    def at(
        n: jax.Array,
        x: jax.Array,
        mask_g: jax.Array,
        fixed_g: jax.Array,
        counts_g: jax.Array,
        views_g: jax.Array | None,
    ) -> jax.Array:
        n_c, fixed_c = law.conditioned(n, fixed_g, mask_g, counts_g, n_sample)

        def one(a: jax.Array, m: jax.Array, f: jax.Array, v: jax.Array | None) -> jax.Array:
            return law.query_metrics(
                a, m, n_c, k, metric_list=metric_list, gains=gains, tables=tables, fixed=f, views=v
            )

        v_in = None if views_g is None else jnp.moveaxis(views_g, 2, 0)  # [V, Q_g, W_g]
        return jax.vmap(one, in_axes=(0, 0, 0, None if v_in is None else 1))(
            x, mask_g, fixed_c, v_in
        )  # [Q_g, V, M]

    def one_atom(x: jax.Array) -> tuple[jax.Array, jax.Array | None]:  # x [Q, P]
        def curve(
            x_g: jax.Array, mask_g: jax.Array, fixed_g: jax.Array, counts_g: jax.Array
        ) -> jax.Array:
            got = jax.vmap(lambda n: at(n, x_g, mask_g, fixed_g, counts_g, None))(sizes)
            return jnp.moveaxis(got[:, :, 0, :], 1, 2)  # [G, M, Q_g]

        slots = (x, mask, fixed, counts)
        out = buckets.apply(curve, grouping, slots)
        if views is None:
            return out, None

        def in_views(
            x_g: jax.Array,
            mask_g: jax.Array,
            fixed_g: jax.Array,
            counts_g: jax.Array,
            views_g: jax.Array,
        ) -> jax.Array:
            return jnp.transpose(at(sizes[0], x_g, mask_g, fixed_g, counts_g, views_g), (1, 2, 0))

        return out, buckets.apply(in_views, grouping, (*slots, jnp.moveaxis(views, 0, 2)))

    per_atom, per_atom_views = jax.lax.map(one_atom, jnp.moveaxis(atoms, 2, 0))  # [A, ...]

    def contract(v: jax.Array) -> jax.Array:
        return jnp.einsum("a...q,wqa->w...q", v, weights)

    return contract(per_atom), None if per_atom_views is None else contract(per_atom_views)


_values = jax.jit(traced_values, static_argnames=("k", "metric_list", "gains"))


def predicted_values(
    variants: Sequence[Variant],
    mask: np.ndarray,
    sizes: ArrayLike,
    k: int,
    fixed: np.ndarray,
    sample: Sample | None = None,
    *,
    metric_list: tuple[metrics.Metric, ...] = (metrics.METRICS["map"],),
    views: np.ndarray | None = None,
    max_share: float = buckets.MAX_SHARE,
    atom_tolerance: float = ATOM_TOLERANCE,
) -> tuple[np.ndarray, np.ndarray | None]:
    """Returns every query's predicted metrics@k, in one compiled call (float64 numpy out).

    The prediction is E[metric@k] under K_j ~ Poisson(n x_j) (`law.query_metrics`), averaged over
    each variant's hardness atoms under each of its weightings; given the `sample` the hardness
    came from (a `Sample`: a `SampledScores`, or `Counts`) and n >= S, it
    conditions on the sample's own counts (the gallery contains the sample). Queries with many
    more positives than the rest are evaluated in groups of their own width (`buckets.groups`,
    with `max_share`; 0: never). Each variant's atoms are pruned to each query's heaviest under
    all its weightings at once (`prune_atoms` with `atom_tolerance`; 0: never), so every value
    moves by at most `atom_tolerance` times its range.

    Args:
      variants: the posteriors; their weightings are the rows W, in order.
      mask: [Q, P] real positives; fixed: [Q, P] always-indexed non-relevant items above each.
      sizes: [G] gallery sizes.
      k: the cut-off.
      sample: the sample the hardness came from, or None.
      metric_list: the metrics (`core.metrics.METRICS`).
      views: [V, Q, P] bool subsets of each query's positives, evaluated at sizes[0]; or None.

    Returns:
      ([W, G, M, Q], [W, V, M, Q] or None).
    """
    atoms, rows = [], []
    start = 0
    for v in variants:
        a, w = prune_atoms(v.atoms, v.weights, atom_tolerance)[:2]
        atoms.append(np.asarray(a, np.float32))
        rows.append((start, w))
        start += a.shape[-1]
    weights = np.zeros((sum(len(w) for _, w in rows), mask.shape[0], start), np.float32)
    r = 0
    for first, w in rows:
        weights[r : r + len(w), :, first : first + w.shape[-1]] = w
        r += len(w)
    counts, s = np.zeros(mask.shape, np.float32), np.float32(np.inf)
    if sample is not None:
        counts = np.where(mask, sample.pos_counts, 0).astype(np.float32)
        s = np.float32(sample.n_sample)
    metric_list = tuple(metric_list)
    gains = law.table_gains(metric_list)
    got = _values(
        jnp.asarray(np.concatenate(atoms, axis=-1)),
        jnp.asarray(weights),
        jnp.asarray(mask),
        jnp.asarray(np.asarray(sizes, np.float64).reshape(-1), jnp.float32),
        None if views is None else jnp.asarray(views),
        k=int(k),
        metric_list=metric_list,
        gains=gains,
        tables=law.rank_tables(int(k), gains),
        fixed=jnp.asarray(np.where(mask, fixed, 0), jnp.float32),
        counts=jnp.asarray(counts),
        n_sample=jnp.float32(s),
        grouping=buckets.groups(mask, max_share),
    )
    values, in_views = jax.device_get(got)
    return np.asarray(values, np.float64), (
        None if in_views is None else np.asarray(in_views, np.float64)
    )


def per_query_aps(
    hardness: Hardness,
    sizes: ArrayLike,
    k: int,
    fixed: np.ndarray,
    sample: Sample | None = None,
    *,
    priors: bool = False,
    max_share: float = buckets.MAX_SHARE,
    atom_tolerance: float = ATOM_TOLERANCE,
) -> np.ndarray:
    """Returns the predicted AP@k [W, G, Q] of every query at each of the gallery sizes [G]:
    the estimate's, then with `priors` its other priors' (`predicted_values` for mAP)."""
    values, _ = predicted_values(
        [variant(hardness, priors)],
        hardness.mask,
        sizes,
        k,
        fixed,
        sample,
        max_share=max_share,
        atom_tolerance=atom_tolerance,
    )
    return values[:, :, 0, :]


def per_query_ap(
    hardness: Hardness, n: float, k: int, fixed: np.ndarray, sample: Sample | None = None
) -> np.ndarray:
    """Returns the predicted AP@k [Q] of every query at gallery size `n` (`per_query_aps`)."""
    return np.asarray(per_query_aps(hardness, [n], k, fixed, sample)[0, 0])
