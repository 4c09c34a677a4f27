"""Comparing two systems evaluated on the same queries: is A better than B at gallery size N?

The queries are shared, so the comparison is paired (paper App. C, ranking resolution): the
bootstrap resamples queries once per replicate and takes the mean AP difference of the two
systems on the same resample, which cancels the between-query variance both share. When the
systems' distractor-sample noise is known (nested bootstrap sds), it is added in quadrature:
the two samples are independent given the queries.

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
) -> dict:
    """Returns the paired-bootstrap comparison of systems A and B on the same queries.

    Args:
      aps_a, aps_b: [Q] per-query AP@k of each system at the target N (same query order).
      num_replicates: B.
      seed: PRNG seed.
      sd_distractor_a, sd_distractor_b: distractor-sample sds of each system's mAP (nested
        bootstrap), added in quadrature; 0 for query noise alone.

    Returns:
      {"difference", "ci90", "ci95", "sd", "p_a_beats_b", "resolvable_margin", "resolved"}.
    """
    a = np.asarray(aps_a, np.float64)
    b = np.asarray(aps_b, np.float64)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"need two [Q] vectors over the same queries, got {a.shape}, {b.shape}")
    diff = a - b
    reps = bootstrap.query_bootstrap(diff, num_replicates, seed)  # [B]
    extra = float(np.hypot(sd_distractor_a, sd_distractor_b))
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
