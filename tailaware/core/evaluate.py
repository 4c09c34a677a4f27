"""E[AP@k] of an estimated hardness at any gallery size: the prediction's one E[AP] pass.

`per_query_ap` turns a `Hardness` (a point estimate, or atoms of a posterior with weights) into
the predicted AP@k of every query at one or many gallery sizes, in one compiled call: the law's
E[AP] under Poisson counts (`law.expected_map`), group by group of positive width
(`buckets.expected_map`), conditioned on the sample's own counts when the gallery contains it.
A posterior's atoms are pruned first (`prune_atoms`): the E[AP] costs linearly in the atoms, and
under the averaged tail estimator's empirical-Bayes prior a query's lightest carry next to no
weight.

Shapes: Q queries, P positive slots, A atoms, G gallery sizes, T other priors.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from tailaware.core import buckets, law
from tailaware.core.results import Hardness

# The most weight a query may lose to pruning (`prune_atoms`), under each of the weightings: its
# E[AP] then moves by at most this, since AP is in [0, 1] (about float32's resolution near 1).
ATOM_TOLERANCE = 1e-7
# The atom counts pruning keeps (then all): a few static shapes, one compiled E[AP] per count used.
ATOM_COUNTS = (4, 8, 12, 16, 24)


def prune_atoms(atoms, weights, tolerance: float = ATOM_TOLERANCE):
    """Returns (atoms [Q, P, A'], weights [..., Q, A'], the dropped mass): each query's A' heaviest.

    `weights` [Q, A] or [T, Q, A] weigh the same `atoms` [Q, P, A] T ways; a query's atoms rank
    by their largest weight under any of them. A' is the smallest of `ATOM_COUNTS` (else A) at
    which no query loses more than `tolerance` of its weight under any weighting; the dropped mass
    returned is the largest such loss. The kept weights are renormalised (float64; rows sum to 1
    as `Hardness.weights` do), so a query's E[AP] E = (1 - d) E_kept + d E_dropped, with d its
    dropped mass, moves by |E - E_kept| = d |E_dropped - E_kept| <= d. The kept atoms stay in
    their order. `tolerance` 0: every atom kept (the inputs returned).
    """
    if tolerance <= 0:
        return atoms, weights, 0.0
    w = np.asarray(weights, np.float64)
    a = w.shape[-1]
    order = np.argsort(-w.reshape(-1, *w.shape[-2:]).max(axis=0), axis=-1, kind="stable")
    ranked = np.take_along_axis(w, np.broadcast_to(order, w.shape), axis=-1)
    # beyond[i]: the most mass a query loses under a weighting when it keeps its i heaviest atoms.
    beyond = np.cumsum(ranked[..., ::-1], axis=-1)[..., ::-1].reshape(-1, a).max(axis=0)
    keep = next((n for n in ATOM_COUNTS if n < a and beyond[n] <= tolerance), a)
    if keep == a:
        return atoms, weights, 0.0
    cols = np.sort(order[:, :keep], axis=-1)
    kept = np.take_along_axis(w, np.broadcast_to(cols, w.shape[:-1] + (keep,)), axis=-1)
    kept = kept / kept.sum(axis=-1, keepdims=True)
    return np.take_along_axis(np.asarray(atoms), cols[:, None, :], axis=-1), kept, beyond[keep]


@functools.partial(jax.jit, static_argnames=("k",))
def _expected_map(x, mask, sizes, k, *, fixed, weights, counts, n_sample, table, grouping):
    """Returns E[AP@k] [W, G, Q] for weights [W, Q, A] (or [G, Q] for a point estimate)."""

    def over_sizes(w):
        kw = dict(fixed=fixed, weights=w, counts=counts, n_sample=n_sample, table=table)
        one = lambda n: buckets.expected_map(x, mask, n, k, grouping=grouping, **kw)
        return jax.vmap(one)(sizes)

    if weights is None:
        return over_sizes(None)
    return jax.vmap(over_sizes)(weights)  # the atoms' E[AP] do not batch over weightings


def per_query_aps(
    hardness: Hardness,
    sizes,
    k: int,
    fixed: np.ndarray,
    sample=None,
    *,
    priors: bool = False,
    max_share: float = buckets.MAX_SHARE,
    atom_tolerance: float = ATOM_TOLERANCE,
) -> np.ndarray:
    """Returns the predicted AP@k [W, G, Q] of every query at each of the gallery sizes [G].

    W = 1 + T: the prediction and then, with `priors`, the predictions under the estimate's T
    other priors on the tail shape (`Hardness.prior_weights`; T = 0 without `priors` or without
    them), in the same pass: E[AP] is linear in the atom weights, so each atom's is computed
    once. One compiled call (float64 numpy out).

    The prediction is E[AP@k] under K_j ~ Poisson(n x_j) (`law.expected_map`), averaged over the
    estimator's hardness atoms when it has them; given the `sample` the hardness came from (a
    `SampledScores`, or anything with `pos_counts` and `n_sample`) and n >= S, it conditions on
    the sample's own counts (the gallery contains the sample). Queries with many more positives
    than the rest are evaluated in groups of their own width (`buckets.groups`, with `max_share`;
    0: never, the padded arrays in one call). A posterior's atoms are pruned to each query's
    heaviest under all the weightings at once (`prune_atoms` with `atom_tolerance`; 0: never), so
    every query's E[AP] moves by at most `atom_tolerance`.
    """
    mask = hardness.mask
    x = hardness.x if hardness.atoms is None else hardness.atoms
    w = hardness.weights
    if w is not None:
        others = () if not priors or hardness.prior_weights is None else hardness.prior_weights
        x, w = prune_atoms(x, np.stack([w, *others]), atom_tolerance)[:2]
        w = jnp.asarray(w, jnp.float32)
    counts, s = jnp.zeros(mask.shape, jnp.float32), jnp.float32(np.inf)
    if sample is not None:
        counts = jnp.asarray(np.where(mask, sample.pos_counts, 0), jnp.float32)
        s = jnp.float32(sample.n_sample)
    aps = _expected_map(
        jnp.asarray(x, jnp.float32),
        jnp.asarray(mask),
        jnp.asarray(np.asarray(sizes, np.float64).reshape(-1), jnp.float32),
        int(k),
        fixed=jnp.asarray(np.where(mask, fixed, 0), jnp.float32),
        weights=w,
        counts=counts,
        n_sample=s,
        table=law.rank_table(int(k)),
        grouping=buckets.groups(mask, max_share),
    )
    aps = np.asarray(jax.device_get(aps), np.float64)
    return aps[None] if w is None else aps


def per_query_ap(hardness: Hardness, n: float, k: int, fixed: np.ndarray, sample=None):
    """Returns the predicted AP@k [Q] of every query at gallery size `n` (`per_query_aps`)."""
    return per_query_aps(hardness, [n], k, fixed, sample)[0, 0]
