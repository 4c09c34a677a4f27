"""Comparing two systems evaluated on the same queries: is A better than B at gallery size N?

The queries are shared, so the comparison is paired (paper App. C, ranking resolution): the
bootstrap resamples queries once per replicate and takes the mean AP difference of the two
systems on the same resample, which cancels the between-query variance both share. When the
systems' distractor-sample noise is known (nested bootstrap sds), it is added in quadrature:
the two samples are independent given the queries. When the tail model's sensitivities of the
difference are given (`paired_deviation`: how far A - B moves when both estimates are rerun at
other tail thresholds, and under other priors on the tail shape), they are added too, as a
single system's interval adds them (`intervals.sd_model`).

Reported: the difference and its intervals, P(A beats B) (the share of replicates with a
positive difference), and the smallest margin the sample can resolve: the difference at which
the 90% interval would just exclude 0, i.e. z_0.95 times the difference's sd.
"""

import jax
import jax.numpy as jnp
import numpy as np
from scipy import stats

from tailaware.core.results import Comparison, MetricPrediction, Prediction
from tailaware.protocol import intervals
from tailaware.protocol.settings import IntervalSettings


def paired(
    aps_a,
    aps_b,
    num_replicates: int = 1000,
    seed: int = 0,
    sd_distractor_a: float = 0.0,
    sd_distractor_b: float = 0.0,
    deviation: float = 0.0,
    prior_deviation: float = 0.0,
    settings: IntervalSettings = IntervalSettings(),
) -> dict:
    """Returns the paired-bootstrap comparison of systems A and B on the same queries.

    Args:
      aps_a, aps_b: [Q] per-query AP@k of each system at the target N (same query order).
      num_replicates: B.
      seed: PRNG seed.
      sd_distractor_a, sd_distractor_b: distractor-sample sds of each system's mAP (nested
        bootstrap), added in quadrature; 0 for query noise alone.
      deviation: the difference's threshold sensitivity (`paired_deviation`).
      prior_deviation: the difference's sensitivity to the prior on the tail shape.
      settings: the model terms' factors (as in a single system's interval).

    Returns:
      {"difference", "sd", "ci90", "ci95", "p_a_beats_b", "resolvable_margin", "resolved"}.
    """
    a = np.asarray(aps_a, np.float64)
    b = np.asarray(aps_b, np.float64)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"need two [Q] vectors over the same queries, got {a.shape}, {b.shape}")
    diff = a - b
    reps = intervals.query_bootstrap(diff, num_replicates, seed)  # [B]
    sd_model = intervals.sd_model(deviation, prior_deviation, settings)
    extra = float(np.sqrt(sd_distractor_a**2 + sd_distractor_b**2 + sd_model**2))
    if extra > 0:
        noise = jax.random.normal(jax.random.key(seed + 1), reps.shape, jnp.float32)
        reps = reps + extra * np.asarray(jax.device_get(noise), np.float64)
    point = float(diff.mean())
    sd = float(np.std(reps, ddof=1))
    out = {"difference": point, "sd": sd}
    for level in intervals.LEVELS:
        lo, hi = intervals.percentile_interval(reps, level)
        out[f"ci{int(round(level * 100))}"] = intervals.in_range(lo, hi, low=-1.0)
    out["p_a_beats_b"] = float(np.mean(reps > 0))
    out["resolvable_margin"] = float(stats.norm.ppf(0.95) * sd)
    out["resolved"] = bool(out["ci90"][0] > 0 or out["ci90"][1] < 0)
    return out


def paired_deviation(a: MetricPrediction, b: MetricPrediction, field: str = "threshold_maps"):
    """Returns how far the difference A - B of one metric moves when both tails' thresholds (or
    priors) do.

    From the two predictions' reruns (`Interval.threshold_maps`: each estimate rerun with half
    and twice the excesses): the larger of |(A_r - B_r) - (A - B)| over the two reruns r. A
    shift that moves both systems alike cancels. 0 when either has no reruns (an estimator
    without a tail model). `field="prior_maps"` pairs the reruns under a flatter and a steeper
    prior on the tail shape the same way.
    """
    maps = [None if p.interval is None else getattr(p.interval, field) for p in (a, b)]
    if any(m is None for m in maps):
        return 0.0
    moves = [np.asarray(m, np.float64) - p.value for m, p in zip(maps, (a, b), strict=True)]
    return float(np.max(np.abs(moves[0] - moves[1])))


def _check_pair(a: Prediction, b: Prediction) -> None:
    """Raises a ValueError naming the field in which two predictions cannot be paired."""
    for field in ("n_target", "k"):
        if getattr(a, field) != getattr(b, field):
            raise ValueError(
                f"field {field!r}: {getattr(a, field)} in a, {getattr(b, field)} in b; compare "
                "at one N and k"
            )
    if len(a.per_query_ap) != len(b.per_query_ap):
        raise ValueError(
            f"field 'per_query_ap': {len(a.per_query_ap)} queries in a, {len(b.per_query_ap)} "
            "in b; a paired comparison needs the same queries"
        )
    ids_a, ids_b = a.query_ids, b.query_ids
    if ids_a is not None and ids_b is not None and list(ids_a) != list(ids_b):
        first = next(i for i, (x, y) in enumerate(zip(ids_a, ids_b, strict=True)) if x != y)
        raise ValueError(
            f"field 'query_ids': query {first} is {str(ids_a[first])!r} in a, "
            f"{str(ids_b[first])!r} in b; a paired comparison needs the same queries in the same "
            "order"
        )


def _metrics(p: Prediction) -> dict:
    """Returns label -> `MetricPrediction` of a prediction, mAP@k alone for one made before there
    were several."""
    if p.metrics:
        return p.metrics
    label = f"map@{p.k}"
    return {label: MetricPrediction(label, p.map, p.per_query_ap, p.interval, p.curve)}


def compare(
    a: Prediction,
    b: Prediction,
    num_replicates: int = 1000,
    seed: int = 0,
    settings: IntervalSettings = IntervalSettings(),
) -> Comparison:
    """Returns the `Comparison` of two predictions, with every term, for mAP@k and (under
    `metrics`) every metric both predict.

    The per-query values, the distractor-sample sds (when the nested bootstrap ran) and the
    difference's threshold and prior sensitivities (`paired_deviation`) come from the
    predictions. They must be of the same queries in the same order (`query_ids`, when both have
    them), at the same N and k; every metric is paired on the same query resamples (seed).

    Raises:
      ValueError: naming the field in which the two predictions disagree.
    """
    _check_pair(a, b)
    sd = lambda m: 0.0 if m.interval is None else float(m.interval.sd_distractor or 0.0)
    ma, mb = _metrics(a), _metrics(b)
    out = {}
    for label in (name for name in ma if name in mb):
        x, y = ma[label], mb[label]
        dev, dev_prior = paired_deviation(x, y), paired_deviation(x, y, "prior_maps")
        got = paired(
            x.per_query,
            y.per_query,
            num_replicates,
            seed,
            sd(x),
            sd(y),
            dev,
            dev_prior,
            settings,
        )
        out[label] = Comparison(
            n_target=a.n_target,
            k=a.k,
            map_a=x.value,
            map_b=y.value,
            threshold_deviation=dev,
            prior_deviation=dev_prior,
            **got,
        )
    first = out[f"map@{a.k}"]
    return first._replace(metrics=out if len(out) > 1 or a.metrics else {})
