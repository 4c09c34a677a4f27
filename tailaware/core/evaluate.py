"""E[AP@k] of an estimated hardness at any gallery size: the prediction's one E[AP] pass.

`per_query_ap` turns a `Hardness` (a point estimate, or atoms of a posterior with weights) into
the predicted AP@k of every query at one or many gallery sizes, in one compiled call: the law's
E[AP] under Poisson counts (`law.expected_map`), group by group of positive width
(`buckets.expected_map`), conditioned on the sample's own counts when the gallery contains it.

Shapes: Q queries, P positive slots, A atoms, G gallery sizes, T other priors.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from tailaware.core import buckets, law
from tailaware.core.results import Hardness


@functools.partial(jax.jit, static_argnames=("k",))
def _expected_map(x, mask, sizes, k, fixed, weights, counts, n_sample, table, grouping):
    def over_sizes(w):
        one = lambda n: buckets.expected_map(
            x, mask, n, k, fixed, w, counts, n_sample, table, grouping
        )
        return jax.vmap(one)(sizes)

    if weights is not None and weights.ndim == 3:  # [T, Q, A]: the atoms' E[AP] do not batch
        return jax.vmap(over_sizes)(weights)
    return over_sizes(weights)


def per_query_ap(
    hardness: Hardness,
    n,
    k: int,
    fixed: np.ndarray,
    sample=None,
    priors: bool = False,
    max_share: float = buckets.MAX_SHARE,
) -> np.ndarray:
    """Returns the predicted AP@k [Q] of every query at gallery size n (float64 numpy).

    `n` may also be a 1-D array of [G] sizes (one compiled call): the result is then [G, Q].
    With `priors`, a leading axis [1 + T] holds the prediction and then the predictions under
    the estimate's other priors on the tail shape (`Hardness.prior_weights`; T = 0 without
    them), in the same pass: E[AP] is linear in the atom weights, so each atom's is computed
    once.

    The prediction is E[AP@k] under K_j ~ Poisson(n x_j) (`law.expected_map`), averaged over the
    estimator's hardness atoms when it has them; given the `sample` the hardness came from (a
    `SampledScores`, or anything with `pos_counts` and `n_sample`) and n >= S, it conditions on
    the sample's own counts (the gallery contains the sample). Queries with many more positives
    than the rest are evaluated in groups of their own width (`buckets.groups`, with `max_share`;
    0: never, the padded arrays in one call).
    """
    mask = hardness.mask
    x = hardness.x if hardness.atoms is None else hardness.atoms
    fixed = jnp.asarray(np.where(mask, fixed, 0), jnp.float32)
    w = hardness.weights
    if priors and w is not None:
        others = () if hardness.prior_weights is None else tuple(hardness.prior_weights)
        w = np.stack([w, *others])
    w = None if w is None else jnp.asarray(w, jnp.float32)
    counts, s = jnp.zeros(mask.shape, jnp.float32), jnp.float32(np.inf)
    if sample is not None:
        counts = jnp.asarray(np.where(mask, sample.pos_counts, 0), jnp.float32)
        s = jnp.float32(sample.n_sample)
    sizes = np.asarray(n, np.float64)
    aps = _expected_map(
        jnp.asarray(x, jnp.float32),
        jnp.asarray(mask),
        jnp.asarray(np.atleast_1d(sizes), jnp.float32),
        int(k),
        fixed,
        w,
        counts,
        s,
        law.rank_table(int(k)),
        buckets.groups(mask, max_share),
    )
    aps = np.asarray(jax.device_get(aps), np.float64)
    if priors and w is None:  # a point estimate: no other priors
        aps = aps[None]
    return aps if sizes.ndim else aps[..., 0, :]
