"""Comparing two systems evaluated on the same queries: is A better than B at gallery size N?

Two questions, as for one system (`intervals`). For these queries, the difference the two full
evaluations would print is uncertain through the systems' distractor samples (each system's
sampling sd the larger of its nested and sub-samples' reads, as in its own interval,
`intervals.sampling_sd`; correlated as their nested replicates are where both drew their
weights by distractor id, `sampling_correlation`: two models scored on one sample err together
on the items they share; else independent), their realized counts around the law's
expectation (`Interval.sd_realized`, taken as independent: two systems scoring the same
distractors may move together, and the sum then overstates it), and the tail models (how far
A - B moves when both estimates are rerun at other tail thresholds, `paired_deviation`, both
systems' query-by-query prior terms, `prior_term`, and how far A - B moves under the other
priors, the part the queries share; scaled as a single system's model term,
`intervals.sd_model`); all in quadrature. Over queries like these, the comparison is paired
(paper App. C, ranking resolution): the bootstrap resamples queries once per replicate and
takes the mean difference of the two systems on the same resample, which cancels the
between-query variance both share, and the terms above widen its interval.

A system corrected by a reference model's exact run (`reference`) is compared with that reference
by `against_reference`: the reference's value is exact, so the difference's only uncertainty for
these queries is the corrected estimate's (its joint bootstrap over the sampled items), and the
paired query bootstrap of the per-query differences adds the queries' term; no tail-model term
is added, as the correction carries none.

Reported: the difference and both intervals, P(A beats B) on these queries, and the smallest
margin the sample can resolve: the difference at which the 90% interval would just exclude 0,
i.e. z_0.95 times the difference's sd.
"""

from typing import Any

import numpy as np
from scipy import stats

from tailaware.core.results import Comparison, MetricPrediction, Paired, Prediction
from tailaware.protocol import intervals, reference
from tailaware.protocol.settings import IntervalSettings


def paired(
    aps_a: np.ndarray,
    aps_b: np.ndarray,
    *,
    num_replicates: int = 1000,
    seed: int = 0,
    sd_distractor_a: float = 0.0,
    sd_distractor_b: float = 0.0,
    deviation: float = 0.0,
    prior_deviation: float = 0.0,
    shared_deviation: float = 0.0,
    settings: IntervalSettings = IntervalSettings(),
    sd_realized: float = 0.0,
    correlation: float = 0.0,
) -> dict[str, Any]:
    """Returns the paired comparison of systems A and B on the same queries.

    For these queries (`ci90`, `sd`, `p_a_beats_b`, `resolved`): the difference the two full
    evaluations would print, uncertain through both distractor samples (their errors correlated
    by `correlation`) and the tail models, a normal error of sd `sd`. Over queries like these
    (`ci90_queries`, `sd_queries`): the paired query bootstrap's percentile interval of the
    difference widened by the same terms in quadrature, as a single system's interval is
    (`intervals.widened`).

    Args:
      aps_a, aps_b: [Q] per-query AP@k of each system at the target N (same query order).
      num_replicates: B of the query bootstrap.
      seed: its seed.
      sd_distractor_a, sd_distractor_b: distractor-sample sds of each system's mAP (the larger
        of the nested bootstrap's and the sub-samples', `intervals.sampling_sd`); 0 where not
        measured.
      deviation: the difference's threshold sensitivity (`paired_deviation`).
      prior_deviation: the difference's prior term (`prior_term`).
      shared_deviation: how far the difference moves when both priors do (`paired_deviation`
        of the prior reruns): the part of the tail models' errors the queries share.
      settings: the model terms' factors (as in a single system's interval).
      sd_realized: the sd of the realized difference around its expectation (both systems'
        realized-value sds in quadrature, `Interval.sd_realized`); 0 where not measured.
      correlation: of the two systems' sampling errors (`sampling_correlation`); 0: independent.

    Returns:
      {"difference", "sd", "sd_queries", "ci90", "ci95", "ci90_queries", "ci95_queries",
      "p_a_beats_b", "resolvable_margin", "resolved", "sampling_correlation"}.
    """
    a = np.asarray(aps_a, np.float64)
    b = np.asarray(aps_b, np.float64)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"need two [Q] vectors over the same queries, got {a.shape}, {b.shape}")
    diff = a - b
    point = float(diff.mean())
    reps = intervals.query_bootstrap(diff, num_replicates, seed)  # [B]
    sd_m = intervals.sd_model(deviation, prior_deviation, settings, shared_deviation)
    sa, sb = sd_distractor_a, sd_distractor_b
    var_sampling = max(sa * sa + sb * sb - 2.0 * correlation * sa * sb, 0.0)
    sd = float(np.sqrt(var_sampling + sd_m * sd_m + sd_realized * sd_realized))
    bounds: dict[str, tuple[float, float]] = {}
    for level in intervals.LEVELS:
        z = float(stats.norm.ppf(0.5 + level / 2.0))
        tag = f"ci{int(round(level * 100))}"
        bounds[tag] = intervals.in_range(point - z * sd, point + z * sd, low=-1.0)
        by_queries = intervals.percentile_interval(reps, level)
        bounds[f"{tag}_queries"] = intervals.widened(point, by_queries, z * sd, low=-1.0)
    return {
        "difference": point,
        "sd": sd,
        "sd_queries": float(np.hypot(np.std(reps, ddof=1), sd)),
        **bounds,
        "p_a_beats_b": float(stats.norm.cdf(point / sd)) if sd > 0 else float(point > 0),
        "resolvable_margin": float(stats.norm.ppf(0.95) * sd),
        "resolved": bool(bounds["ci90"][0] > 0 or bounds["ci90"][1] < 0),
        "sampling_correlation": float(correlation),
    }


def _sd_distractor(m: MetricPrediction) -> float:
    """Returns a prediction's sampling sd as its interval uses it (`intervals.sampling_sd`; 0
    where it has no interval)."""
    if m.interval is None:
        return 0.0
    return intervals.sampling_sd(m.interval.sd_distractor, m.interval.sd_subsample)


def sampling_correlation(a: MetricPrediction, b: MetricPrediction) -> float:
    """Returns the correlation of two predictions' distractor-sampling errors: that of their
    nested replicates where both drew the weights by distractor id with one seed and count
    (`Interval.distractor_replicates`; an item both samples hold got one weight in both, items
    only one holds independent ones), else 0 (independent)."""
    reps = [None if p.interval is None else p.interval.distractor_replicates for p in (a, b)]
    if reps[0] is None or reps[1] is None or len(reps[0]) != len(reps[1]) or len(reps[0]) < 3:
        return 0.0
    x, y = (np.asarray(r, np.float64) for r in reps)
    if np.std(x) == 0.0 or np.std(y) == 0.0:
        return 0.0
    return float(np.corrcoef(x, y)[0, 1])


def _sd_realized(m: MetricPrediction) -> float:
    """Returns a prediction's realized-value sd (0 where it has no interval)."""
    return 0.0 if m.interval is None else float(m.interval.sd_realized)


def paired_deviation(
    a: MetricPrediction, b: MetricPrediction, field: str = "threshold_maps"
) -> float:
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


def prior_term(a: MetricPrediction, b: MetricPrediction) -> float:
    """Returns the difference's prior term: the two systems' query-by-query prior terms
    (`Interval.prior_spread`) in quadrature, their errors taken as independent. From files
    written before those terms, the paired move under the other priors (`paired_deviation`)."""
    sa, sb = (0.0 if p.interval is None else p.interval.prior_spread for p in (a, b))
    if not (sa or sb):
        return paired_deviation(a, b, "prior_maps")
    return float(np.hypot(sa, sb))


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


def compare(
    a: Prediction,
    b: Prediction,
    *,
    num_replicates: int = 1000,
    seed: int = 0,
    settings: IntervalSettings = IntervalSettings(),
) -> Comparison:
    """Returns the `Comparison` of two predictions, with every term, for every metric both
    predict (mAP@k first).

    The per-query values, the distractor-sample sds (when the nested bootstrap ran) and the
    difference's threshold and prior sensitivities (`paired_deviation`) come from the
    predictions. They must be of the same queries in the same order (`query_ids`, when both have
    them), at the same N and k; every metric is paired on the same query resamples (seed).

    Raises:
      ValueError: naming the field in which the two predictions disagree.
    """
    _check_pair(a, b)
    ma, mb = a.metrics, b.metrics
    out = {}
    for label in (name for name in ma if name in mb):
        x, y = ma[label], mb[label]
        dev, dev_prior = paired_deviation(x, y), paired_deviation(x, y, "prior_maps")
        got = paired(
            x.per_query,
            y.per_query,
            num_replicates=num_replicates,
            seed=seed,
            sd_distractor_a=_sd_distractor(x),
            sd_distractor_b=_sd_distractor(y),
            deviation=dev,
            prior_deviation=prior_term(x, y),
            shared_deviation=dev_prior,
            settings=settings,
            sd_realized=float(np.hypot(_sd_realized(x), _sd_realized(y))),
            correlation=sampling_correlation(x, y),
        )
        out[label] = Paired(
            value_a=x.value,
            value_b=y.value,
            threshold_deviation=dev,
            prior_deviation=dev_prior,
            **got,
        )
    return Comparison(n_target=a.n_target, k=a.k, metrics=out)


def against_reference(
    correction: reference.Correction,
    *,
    k: int,
    num_replicates: int = 1000,
    seed: int = 0,
    reference_first: bool = False,
) -> Comparison:
    """Returns the `Comparison` of a prediction corrected by a reference's exact run with that
    reference: target - reference (reference - target with `reference_first`), every metric of
    the correction, on the same query resamples.

    For these queries the difference is the corrected value minus the reference's exact one,
    with the corrected value's joint bootstrap sd (the reference adds none); over queries like
    these, the paired query bootstrap of the per-query differences, widened by it (`paired`).
    The correction is at N = `correction.n_distractors`, the reference run's N.
    """
    out = {}
    for label, m in correction.metrics.items():
        sides = (m.per_query, m.exact_per_query)
        values = (m.value, m.exact)
        sds = (m.sd, 0.0)
        if reference_first:
            sides, values, sds = sides[::-1], values[::-1], sds[::-1]
        got = paired(
            aps_a=sides[0],
            aps_b=sides[1],
            num_replicates=num_replicates,
            seed=seed,
            sd_distractor_a=sds[0],
            sd_distractor_b=sds[1],
        )
        out[label] = Paired(value_a=values[0], value_b=values[1], **got)
    return Comparison(n_target=correction.n_distractors, k=k, metrics=out)
