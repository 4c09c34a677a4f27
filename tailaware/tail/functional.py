"""A sample's estimator inputs as arrays: the one place a sampled-scores file becomes them.

The estimators' traced definitions (`tailaware.tail.estimators.Estimator.traced`) read fixed-
shape arrays (`Core`), not a file: the nested bootstrap reruns them on hundreds of resampled
samples inside one compiled program, the budget check on nested sub-samples of different sizes,
and the tail-aware estimate with its fit diagnostics (`evt.estimate`) on the whole kept tail.
`core` builds them for all three, and `tail_settings` moves the tail settings to the threshold
quantile a `Core` is built at.

Shapes: Q queries, P positives (padded), L stored tail scores read.
"""

import dataclasses
import functools
from types import ModuleType
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from tailaware.io.scores import SampledScores
from tailaware.tail import dequantize
from tailaware.tail.settings import TailSettings, averaged_share

# Excess counts round half up with this slack: a count at exactly k + 1/2 in exact arithmetic
# (e.g. half of 25) must round the same way in float32 and float64, on the full sample and on
# the nested bootstrap's re-expressed one (`core`).
ROUND_SLACK = 1e-3


def excess_count(m: int, threshold_quantile: float, factor: float = 1.0) -> int:
    """Returns round((1 - q) factor m), half up with `ROUND_SLACK`: `evt.excesses`' count for m
    kept scores before its clip, as a Python int (static shapes)."""
    return int(np.floor((1.0 - float(threshold_quantile)) * factor * m + 0.5 + ROUND_SLACK))


@functools.partial(
    jax.tree_util.register_dataclass,
    data_fields=("tail", "pos", "counts", "mask", "fixed", "s", "prior", "depleted"),
    meta_fields=("threshold_quantile",),
)
@dataclasses.dataclass(frozen=True)
class Core:
    """The estimator's inputs at a fixed shape, shared by every (sub-)sample of one study.

    Attributes:
      tail: [Q, L] top stored scores, -inf padded past each sample's own L_s (see `core`).
      pos, counts, fixed: [Q, P] float32 (0 at padding); mask [Q, P].
      s: S.
      threshold_quantile: q' (static, not traced): the (k + 1)-th of L_s kept scores is the
        threshold the estimator puts at its q-quantile of min(M, top_m).
      prior: [2] a given empirical-Bayes prior's fitted (mean, sd) on xi, used instead of the
        one the sample would fit (`evt.posterior_atoms`); None fits it.
      depleted: [Q, P] the hardness a census took out of the rest above each positive, taken
        from every estimate (`deplete`); None for a uniform sample.
    """

    tail: jax.Array
    pos: jax.Array
    counts: jax.Array
    mask: jax.Array
    fixed: jax.Array
    s: jax.Array
    threshold_quantile: float
    prior: jax.Array | None = None
    depleted: jax.Array | None = None


def deplete(atoms: Any, depleted: Any, xp: ModuleType = jnp) -> Any:
    """Returns the hardness atoms [Q, P, A] less a census's share `depleted` [Q, P] of the rest
    above each positive, at least 0 (`atoms` as they are where `depleted` is None).

    A census design's file is the hash sample of the whole gallery, census items included, so
    every estimate from it (count or fitted tail) is of the gallery; the rest's is that less the
    census, which the file counts exactly (`tailaware.protocol.census.fold`). `xp`: jax.numpy
    when traced, numpy on the host.
    """
    if depleted is None:
        return atoms
    return xp.maximum(atoms - depleted[..., None], 0.0)


def resample_width(settings: TailSettings, m: int) -> int:
    """Returns L, the stored scores a resampled fit reads: the fit's excesses and a margin.

    A Poisson-resampled top k + 1 comes from the original top k + 1 + O(sqrt(k)) scores; 8 sd
    of margin makes running short a < 1e-12 event.
    """
    k = excess_count(m, settings.threshold_quantile)
    return int(min(m, k + 1 + int(np.ceil(8.0 * np.sqrt(k + 1))) + 16))


def _kept(scores: SampledScores, top_m: int) -> int:
    """Returns m, the real (finite) kept scores per query: a file may store more columns than S
    (-inf padded; every row holds min(S, stored) real scores)."""
    return min(int(scores.tail_scores.shape[1]), int(scores.n_sample), top_m)


def core(
    scores: SampledScores,
    settings: TailSettings,
    reference: SampledScores | None = None,
    *,
    full: bool = False,
    prior: np.ndarray | None = None,
) -> Core:
    """Returns the fixed-shape inputs of `scores` for the estimators' traced definitions.

    The estimator sets its threshold at the (k + 1)-th largest of m = min(M, top_m) kept
    scores, k = round((1 - q) m). Here every sample of a study (the `reference` sample and its
    sub-samples) gets the same width L and the same q' = 1 - k_ref / L_ref: a sample with k_s
    excesses keeps its top L_s = round(k_s L / k_ref) scores (padded with -inf), which puts the
    threshold at its own (k_s + 1)-th score. One compiled function then serves them all.

    With `full` (no `reference`), the tail-aware estimate's own inputs instead: every stored
    score up to `top_m`, at q itself, as its fit diagnostics and threshold reruns (twice the
    excesses) read them. Either way ties are spread first (`dequantize.spread_ties`). `prior`:
    the (mean, sd) of an empirical-Bayes prior to use instead of fitting one (`Core.prior`).
    """
    top_m = int(settings.top_m)
    if full:
        tail = dequantize.spread_ties(scores.tail_scores[:, :top_m], settings.tie_share)
        tq = settings.threshold_quantile
    else:
        ref = scores if reference is None else reference
        m_ref = _kept(ref, top_m)
        width = resample_width(settings, m_ref)
        k_ref = max(excess_count(m_ref, settings.threshold_quantile), 1)
        tq = 1.0 - k_ref / width
        m_s = _kept(scores, top_m)
        keep = min(
            int(round(excess_count(m_s, settings.threshold_quantile) * width / k_ref)), m_s, width
        )
        tail = np.full((scores.num_queries, width), -np.inf, np.float32)
        tail[:, :keep] = dequantize.spread_ties(scores.tail_scores[:, :m_s], settings.tie_share)[
            :, :keep
        ]
    mask = scores.mask
    return Core(
        tail=jnp.asarray(tail),
        pos=jnp.asarray(np.where(mask, scores.pos_scores, 0.0), jnp.float32),
        counts=jnp.asarray(np.where(mask, scores.pos_counts, 0), jnp.float32),
        mask=jnp.asarray(mask),
        fixed=jnp.asarray(np.where(mask, scores.fixed_counts, 0), jnp.float32),
        s=jnp.float32(scores.n_sample),
        threshold_quantile=tq,
        prior=None if prior is None else jnp.asarray(prior, jnp.float32),
        depleted=None
        if scores.depleted is None
        else jnp.asarray(np.where(mask, scores.depleted, 0.0), jnp.float32),
    )


def tail_settings(c: Core, settings: TailSettings) -> TailSettings:
    """Returns `settings` at the threshold quantile q' that `c` was built at (`core`): the
    threshold at q', the averaged estimator's at the same share of its excesses as on the full
    sample (`averaged_share`). `settings` itself at q' = q."""
    if c.threshold_quantile == settings.threshold_quantile:
        return settings
    averaged = 1.0 - averaged_share(settings) * (1.0 - c.threshold_quantile)
    return dataclasses.replace(
        settings, threshold_quantile=c.threshold_quantile, averaged_quantile=averaged
    )
