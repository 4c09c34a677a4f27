"""Comparing two systems evaluated on the same queries: is A better than B at gallery size N?

The queries are shared, so the comparison is paired (paper App. C, ranking resolution): the
bootstrap resamples queries once per replicate and takes the mean AP difference of the two
systems on the same resample, which cancels the between-query variance both share. When the
systems' distractor-sample noise is known (nested bootstrap sds), it is added in quadrature:
the two samples are independent given the queries. When the tail model's threshold
sensitivity of the difference is given (`threshold_deviation`: how far A - B moves when both
estimates are rerun at other tail thresholds), it is added too, as `bootstrap.intervals` adds a
single system's.

Reported: the difference and its intervals, P(A beats B) (the share of replicates with a
positive difference), and the smallest margin the sample can resolve: the difference at which
the 90% interval would just exclude 0, i.e. z_0.95 times the difference's sd.
"""

import jax
import jax.numpy as jnp
import numpy as np
from scipy import stats

from tailaware import bootstrap


def paired(
    aps_a,
    aps_b,
    num_replicates: int = 1000,
    seed: int = 0,
    sd_distractor_a: float = 0.0,
    sd_distractor_b: float = 0.0,
    deviation: float = 0.0,
) -> dict:
    """Returns the paired-bootstrap comparison of systems A and B on the same queries.

    Args:
      aps_a, aps_b: [Q] per-query AP@k of each system at the target N (same query order).
      num_replicates: B.
      seed: PRNG seed.
      sd_distractor_a, sd_distractor_b: distractor-sample sds of each system's mAP (nested
        bootstrap), added in quadrature; 0 for query noise alone.
      deviation: the difference's threshold sensitivity (`threshold_deviation`), added in
        quadrature as a normal error of sd `bootstrap.THRESHOLD_SD` x deviation.

    Returns:
      {"difference", "ci90", "ci95", "sd", "p_a_beats_b", "resolvable_margin", "resolved"}.
    """
    a = np.asarray(aps_a, np.float64)
    b = np.asarray(aps_b, np.float64)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"need two [Q] vectors over the same queries, got {a.shape}, {b.shape}")
    diff = a - b
    reps = bootstrap.query_bootstrap(diff, num_replicates, seed)  # [B]
    sd_model = bootstrap.THRESHOLD_SD * float(deviation)
    extra = float(np.sqrt(sd_distractor_a**2 + sd_distractor_b**2 + sd_model**2))
    if extra > 0:
        noise = jax.random.normal(jax.random.key(seed + 1), reps.shape, jnp.float32)
        reps = reps + extra * np.asarray(jax.device_get(noise), np.float64)
    point = float(diff.mean())
    sd = float(np.std(reps, ddof=1))
    out = {"difference": point, "sd": sd}
    for level in bootstrap.LEVELS:
        lo, hi = bootstrap.percentile_interval(reps, level)
        out[f"ci{int(round(level * 100))}"] = [float(lo), float(hi)]
    out["p_a_beats_b"] = float(np.mean(reps > 0))
    out["resolvable_margin"] = float(stats.norm.ppf(0.95) * sd)
    out["resolved"] = bool(out["ci90"][0] > 0 or out["ci90"][1] < 0)
    return out


def threshold_deviation(prediction_a: dict, prediction_b: dict) -> float:
    """Returns how far the difference A - B moves when both tails' thresholds do, or 0.

    From two prediction.json dicts (`map` and `uncertainty.threshold_maps`: each estimate rerun
    with half and twice the excesses): the larger of |(A_r - B_r) - (A - B)| over the two
    reruns r. A shift that moves both systems alike cancels. 0 when either has no reruns (an
    estimator without a tail model).
    """
    maps = [p.get("uncertainty", {}).get("threshold_maps") for p in (prediction_a, prediction_b)]
    if any(m is None for m in maps):
        return 0.0
    moves = [
        np.asarray(m, np.float64) - p["map"]
        for m, p in zip(maps, (prediction_a, prediction_b), strict=True)
    ]
    return float(np.max(np.abs(moves[0] - moves[1])))
