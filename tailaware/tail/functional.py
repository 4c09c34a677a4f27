"""One sample's estimator inputs at a fixed shape, shared by every (sub-)sample of a study.

The nested bootstrap reruns the estimator on hundreds of resampled samples inside one compiled
program, and the budget check on nested sub-samples of different sizes; both need the inputs as
fixed-shape arrays (`Core`) that the estimators' traced definitions
(`tailaware.tail.estimators.Estimator.traced`) read, rather than a file.

Shapes: Q queries, P positives (padded), L stored tail scores read.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from tailaware.io.scores import SampledScores
from tailaware.tail import dequantize, evt
from tailaware.tail.settings import TailSettings


@functools.partial(
    jax.tree_util.register_dataclass,
    data_fields=("tail", "pos", "counts", "mask", "fixed", "s"),
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
    """

    tail: jax.Array
    pos: jax.Array
    counts: jax.Array
    mask: jax.Array
    fixed: jax.Array
    s: jax.Array
    threshold_quantile: float


def resample_width(settings: TailSettings, m: int) -> int:
    """Returns L, the stored scores a resampled fit reads: the fit's excesses and a margin.

    A Poisson-resampled top k + 1 comes from the original top k + 1 + O(sqrt(k)) scores; 8 sd
    of margin makes running short a < 1e-12 event.
    """
    k = evt.excess_count(m, settings.threshold_quantile)
    return int(min(m, k + 1 + int(np.ceil(8.0 * np.sqrt(k + 1))) + 16))


def _kept(scores: SampledScores, top_m: int) -> int:
    """Returns m, the real (finite) kept scores per query: a file may store more columns than S
    (-inf padded; every row holds min(S, stored) real scores)."""
    return min(scores.tail_scores.shape[1], int(scores.n_sample), top_m)


def core(
    scores: SampledScores, settings: TailSettings, reference: SampledScores | None = None
) -> Core:
    """Returns the fixed-shape inputs of `scores` for the estimators' traced definitions.

    The estimator sets its threshold at the (k + 1)-th largest of m = min(M, top_m) kept
    scores, k = round((1 - q) m). Here every sample of a study (the `reference` sample and its
    sub-samples) gets the same width L and the same q' = 1 - k_ref / L_ref: a sample with k_s
    excesses keeps its top L_s = round(k_s L / k_ref) scores (padded with -inf), which puts the
    threshold at its own (k_s + 1)-th score. One compiled function then serves them all.
    """
    ref = scores if reference is None else reference
    top_m = int(settings.top_m)
    m_ref = _kept(ref, top_m)
    width = resample_width(settings, m_ref)
    k_ref = max(evt.excess_count(m_ref, settings.threshold_quantile), 1)
    tq = 1.0 - k_ref / width
    m_s = _kept(scores, top_m)
    keep = min(
        int(round(evt.excess_count(m_s, settings.threshold_quantile) * width / k_ref)), m_s, width
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
    )
