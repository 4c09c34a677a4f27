"""The baselines a prediction is reported beside: evaluate-at-S and the paper's curve fits.

- evaluate-at-S (`at_sample_ap`): the exact mAP@k of the sampled gallery itself, an upper bound
  on the full gallery's (mAP@k never increases with N).
- curve fits (`extrapolate`): the exact mAP@k of nested sub-samples of the sample (S/8, S/4,
  S/2, S: evaluate-at-n on each, `budget.nested_subsamples`) extrapolated to the target N with a
  power law, mAP(n) = a n^-b (a straight line in log mAP versus log n), or a
  log-uniform-hardness law, mAP(n) = a - b log n (the logarithmic decay that log-uniform
  hardness implies, paper Sec. 3), clipped to [0, 1]. Both are least-squares fits. The paper
  reports they do no better than counting (Sec. 5); the validate job shows it on known truth.

Shapes: Q queries, G measured sizes.
"""

from collections.abc import Sequence

import numpy as np
from numpy.typing import ArrayLike

from tailaware.core import metrics
from tailaware.io.scores import SampledScores

MODELS = ("power_law", "log_uniform")


def at_sample_ap(scores: SampledScores, k: int) -> np.ndarray:
    """Returns the exact AP@k [Q] of the sampled gallery itself (evaluate-at-S)."""
    mask = scores.mask
    counts = np.where(mask, scores.pos_counts + scores.fixed_counts, -1)
    return np.asarray(metrics.ap_at_k_from_counts(counts, mask, k))  # numpy in, numpy out


def at_sample_map(scores: SampledScores, k: int) -> float:
    """Returns the exact mAP@k of the sampled gallery itself (evaluate-at-S)."""
    return float(at_sample_ap(scores, k).mean())


def fit(sizes: ArrayLike, values: ArrayLike, model: str) -> tuple[float, float]:
    """Returns the least-squares (a, b) of `model` through measured (size, mAP) points [G]."""
    logn = np.log(np.asarray(sizes, np.float64))
    v = np.asarray(values, np.float64)
    if model == "power_law":
        slope, intercept = np.polyfit(logn, np.log(np.maximum(v, 1e-12)), 1)
        return float(np.exp(intercept)), float(-slope)
    if model == "log_uniform":
        slope, intercept = np.polyfit(logn, v, 1)
        return float(intercept), float(-slope)
    raise ValueError(f"unknown model {model!r}; choose one of {MODELS}")


def evaluate(params: tuple[float, float], n: ArrayLike, model: str) -> np.ndarray:
    """Returns the fitted curve at gallery sizes n (clipped to [0, 1])."""
    a, b = params
    n = np.asarray(n, np.float64)
    if model == "power_law":
        out = a * n ** (-b)
    elif model == "log_uniform":
        out = a - b * np.log(n)
    else:
        raise ValueError(f"unknown model {model!r}; choose one of {MODELS}")
    return np.asarray(np.clip(out, 0.0, 1.0))


def extrapolate(
    subsamples: Sequence[SampledScores], k: int, n_target: ArrayLike
) -> dict[str, np.ndarray]:
    """Returns {model: mAP@k at n_target} from the measured curve of nested sub-samples.

    Args:
      subsamples: `SampledScores` of ascending sizes (e.g. `budget.nested_subsamples`).
      k: the cut-off.
      n_target: gallery size(s) to extrapolate to.
    """
    sizes = [s.n_sample for s in subsamples]
    values = [at_sample_map(s, k) for s in subsamples]
    out = {}
    for model in MODELS:
        params = fit(sizes, values, model)
        out[model] = evaluate(params, n_target, model).tolist()
    return out
