"""A prediction from a sampled-scores file: mAP@k at N with its interval, curve and checks.

`predict(scores, settings, n_target)` returns the `Prediction` that prediction.json holds
(paper Sec. 4: "report mAP@k at the target with a query-bootstrap interval and a count/tail
diagnostic"):

- the point: E[AP@k] of the configured estimator's hardness at N (`evaluate.per_query_ap`);
- two intervals (`intervals.item_intervals`): for these queries, the nested bootstrap's
  distractor term (`nested.nested_bootstrap`) widened by the tail model's moves with its
  threshold (`threshold_maps`) and with the prior on its shape (`prior_maps`), and by the
  realized counts' own noise around the law's expectation (`realized_sd`); over queries like
  these, the query bootstrap's term too;
- the curve for N from 10^3 to 10^9 with its 90% band (and the distractor-sample sd, which the
  hardness artifact keeps);
- every other metric of `settings.metrics` (recall@k, MAP@R, top-1, ...) through the same law,
  with its interval and curve;
- the baselines: evaluate-at-S, count, homogeneous and the power-law / log-uniform curve fits;
- the diagnostics: the sufficient-budget verdict on nested sub-samples (`budget_check`), the
  drift test over id-hash block files (`drift_check`) and the summary (`diagnostics.summary`).

Shapes: Q queries, P positive slots, G gallery sizes, F threshold reruns, T other priors.
"""

from collections.abc import Sequence
from concurrent import futures
from typing import NamedTuple

import numpy as np
from numpy.typing import ArrayLike

from tailaware.core import evaluate, metrics, realization
from tailaware.core.results import (
    Budget,
    Curve,
    Diagnostics,
    Drift,
    Hardness,
    Interval,
    MetricPrediction,
    Prediction,
    Report,
    ReportValue,
)
from tailaware.io.artifact import HardnessArtifact
from tailaware.io.scores import SampledScores, load_scores
from tailaware.protocol import baselines, budget, diagnostics, ilias_report, intervals, nested
from tailaware.protocol.settings import CURVE_RANGE, PredictSettings, ProtocolSettings
from tailaware.tail import estimators


def estimate(scores: SampledScores, settings: PredictSettings) -> Hardness:
    """Returns the configured estimator's `Hardness`, with its threshold reruns and prior terms
    when it has a tail model (what the interval needs)."""
    return estimators.estimate(scores, settings.estimator, settings.tail)


def budget_check(
    subsamples: Sequence[SampledScores],
    predictions: Sequence[float],
    settings: PredictSettings,
    n_target: int,
    noise: float,
) -> tuple[Budget, dict[str, float]]:
    """Returns the sufficient-budget `Budget` and the curve-fit baselines {model: mAP@k at N}
    from nested sub-samples [S / 2^L, ..., S] of the sample and the estimator's mAP@k at N from
    each (`nested.nested_bootstrap`'s `extra`)."""
    verdict = budget.verdict([s.n_sample for s in subsamples], predictions, noise)
    fits = baselines.extrapolate(subsamples, settings.k, n_target)
    return verdict, {model: float(v) for model, v in fits.items()}


def drift_check(settings: PredictSettings, n_target: int) -> Drift:
    """Returns the drift test over the per-block sampled-scores files of `settings.protocol`."""
    block_files = tuple(settings.protocol.blocks)
    if len(block_files) < 2:
        return Drift(
            checked=False,
            reason="needs >= 2 id-hash block files (config.protocol.blocks); a sample that "
            "is uniform within itself but curated from the pool (e.g. mini-ILIAS) can only be "
            "recognised from its ids (budget.hash_membership)",
        )
    fn = estimators.get(settings.estimator)
    aps = []
    for path in block_files:
        s = load_scores(path)
        h = fn(s, settings.tail)
        aps.append(evaluate.per_query_ap(h, n_target, settings.k, s.fixed_counts, s))
    return budget.drift(np.stack(aps))


# The nested bootstrap evaluates the target and these sizes (log-spaced over the curve's range,
# two decades apart); the curve's distractor sd in between is interpolated in log N, as an
# artifact's is.
NESTED_ANCHORS = 4
# Each nested replicate keeps each query's heaviest atoms (its own posterior's): the replicates'
# spread, not their values, is what the interval uses, and it moves by less than its own
# sampling noise (benchmarks/README.md, "predict_speed.py").
NESTED_ATOMS = 4
# The threshold reruns' atoms are pruned to this tolerance (`evaluate.prune_atoms`): they enter
# the interval only through their distance from the estimate.
RERUN_ATOM_TOLERANCE = 1e-4


class Rows(NamedTuple):
    """Which weightings of a prediction's pass (`evaluate.predicted_values`) are what: row 0 is
    the estimate."""

    priors: slice  # the estimate under its other priors on the tail shape
    reruns: slice  # the threshold reruns
    baselines: slice  # the count and homogeneous baselines (empty from an artifact)

    def terms(
        self,
        values: np.ndarray,
        realized: np.ndarray | None = None,
        subsample: np.ndarray | None = None,
        *,
        per_query: np.ndarray | None = None,
        weights: np.ndarray | None = None,
    ) -> "Terms":
        """Returns the interval `Terms` of items whose values under each weighting are `values`
        [W, I] (rows as these), with their realized-value sds `realized` [I] and sub-samples'
        sds `subsample` [I], each or None. Their per-query values `per_query` [W, I, Q] (query
        weights `weights` [I, Q], None: uniform) give the prior's term query by query."""
        spread = None
        if per_query is not None and len(per_query[self.priors]):
            spread = intervals.prior_spread(per_query[self.priors], per_query[0], weights)
        return Terms(
            _terms(values[self.reruns]), _terms(values[self.priors]), realized, subsample, spread
        )


class Terms(NamedTuple):
    """The terms an item's interval adds to its query and distractor terms
    (`intervals.item_intervals`); None where a term is not measured."""

    reruns: np.ndarray | None  # [F, I] the items' values under the threshold reruns
    priors: np.ndarray | None  # [T, I] under the other priors on the tail shape
    realized: np.ndarray | None  # [I] the sd of each realized value around its expectation
    subsample: np.ndarray | None = None  # [I] the sub-samples' sd (`budget.subsample_sd`)
    spread: np.ndarray | None = None  # [I] the prior's term query by query

    def cut(self, part: slice) -> "Terms":
        """Returns the terms of the items `part` alone."""
        return Terms(*(None if t is None else t[..., part] for t in self))


def variants(
    hardness: Hardness, scores: SampledScores | None = None
) -> tuple[list[evaluate.Variant], Rows]:
    """Returns the hardness variants of a prediction's pass and where their rows are: the
    estimate under each of its priors, its threshold reruns and, given the `scores`, the count
    and homogeneous baselines."""
    main = evaluate.variant(hardness, priors=True)
    reruns = [evaluate.variant(r) for r in hardness.reruns]
    reruns = [evaluate.Variant(*evaluate.prune_atoms(*r, RERUN_ATOM_TOLERANCE)[:2]) for r in reruns]
    base = []
    if scores is not None:
        base = [estimators.count(scores), estimators.homogeneous(scores)]
    t, f = len(main.weights) - 1, len(reruns)
    rows = Rows(slice(1, 1 + t), slice(1 + t, 1 + t + f), slice(1 + t + f, 1 + t + f + len(base)))
    return [main, *reruns, *(evaluate.variant(b) for b in base)], rows


def _spread(
    hardness: Hardness,
    sample: SampledScores | HardnessArtifact,
    n: float,
    *,
    k: int,
    metric_list: Sequence[metrics.Metric],
    opts: ProtocolSettings,
    views: np.ndarray | None = None,
) -> realization.Spread:
    """Returns `core.realization.spread` of the estimate at gallery size `n`, conditioned on the
    `sample`'s counts where it has them (a `SampledScores`, or an artifact with `pos_counts`
    and `n_sample`)."""
    counts = sample.pos_counts
    mask = hardness.mask
    return realization.spread(
        hardness.x if hardness.atoms is None else hardness.atoms,
        hardness.weights,
        mask,
        float(n),
        int(k),
        fixed=np.where(mask, sample.fixed_counts, 0),
        counts=None if counts is None else np.where(mask, counts, 0),
        n_sample=None if counts is None else float(sample.n_sample),
        metric_list=tuple(metric_list),
        views=views,
        draws=int(opts.realized_draws),
        seed=int(opts.seed),
    )


def realized_sd(
    hardness: Hardness,
    sample: SampledScores | HardnessArtifact,
    sizes: ArrayLike,
    *,
    k: int,
    metric_list: Sequence[metrics.Metric],
    opts: ProtocolSettings,
) -> np.ndarray | None:
    """Returns [M, G] the sd of each metric's realized mean over the queries around the law's
    expectation at `sizes` [G] (the target first, then the curve's), or None when
    `opts.realized_draws` is 0.

    The counts' own noise (`core.realization`; docs/validation.md, "The two intervals on dev
    (issue #41)"), drawn at the target and at `NESTED_ANCHORS` curve sizes and interpolated in
    log N in between, as the distractor sd is. The same hardness, sample and settings give the
    same sds, from the scores or from the artifact.
    """
    if not opts.realized_draws:
        return None
    sizes = np.asarray(sizes, np.float64)
    anchors = np.geomspace(*CURVE_RANGE, NESTED_ANCHORS)
    at = [sizes[0], *anchors] if sizes.size > 1 else [sizes[0]]
    sds = np.stack(
        [
            realization.mean_sd(
                _spread(hardness, sample, n, k=k, metric_list=metric_list, opts=opts).counts
            )
            for n in at
        ],
        axis=-1,
    )  # [M, len(at)]
    if sizes.size == 1:
        return sds
    return np.concatenate([sds[:, :1], _log_interp(sizes[1:], anchors, sds[:, 1:])], axis=-1)


def realized_items(
    hardness: Hardness,
    sample: SampledScores | HardnessArtifact,
    spec: ilias_report.ReportSpec,
    n_target: float,
    *,
    k: int,
    metric_list: Sequence[metrics.Metric],
    opts: ProtocolSettings,
) -> np.ndarray | None:
    """Returns [I] the realized-value sd of each item of the ILIAS report `spec` at the target
    (`realized_sd`, in the item's view and over its query weights), or None when off."""
    if not opts.realized_draws:
        return None
    views = np.asarray(spec.views, bool)
    got = _spread(
        hardness, sample, n_target, k=k, metric_list=metric_list, opts=opts, views=views
    ).counts
    view, metric = _item_index(spec, metric_list)
    var = got[view, metric]  # [I, Q]
    return realization.mean_sd(var, spec.weights)


def _log_interp(n: ArrayLike, at: ArrayLike, values: np.ndarray) -> np.ndarray:
    """Returns `values` [..., A] known at ascending sizes `at` [A], at sizes `n` [G] (linear in
    log N, constant beyond the ends)."""
    return np.apply_along_axis(lambda v: np.interp(np.log(n), np.log(at), v), -1, values)


def _terms(values: np.ndarray) -> np.ndarray | None:
    """Returns the [F, ...] values of a pass's model reruns, or None when there are none."""
    return values if len(values) else None


def _over_queries(unc: Interval) -> tuple[float, float]:
    """Returns the 90% interval over queries like these, which every computed `Interval` has
    (only one read from an old file lacks it)."""
    if unc.ci90.queries is None:
        raise ValueError("an interval computed without its interval over queries")
    return unc.ci90.queries


def combined_intervals(
    per_query: np.ndarray,
    settings: PredictSettings,
    terms: Terms,
    *,
    weights: np.ndarray | None = None,
    nested: tuple[np.ndarray, np.ndarray] | None = None,
    sd_distractor: np.ndarray | None = None,
) -> list[Interval]:
    """Returns the `Interval` of each item [I, Q] of a prediction (`intervals.item_intervals`
    under its settings, with its `terms`): the one way every predicted value's terms combine."""
    opts = settings.protocol
    return intervals.item_intervals(
        per_query,
        settings=settings.intervals,
        query_replicates=opts.query_replicates,
        seed=opts.seed,
        weights=weights,
        reruns=terms.reruns,
        priors=terms.priors,
        nested=nested,
        sd_distractor=sd_distractor,
        sd_realized=terms.realized,
        sd_subsample=terms.subsample,
        spread=terms.spread,
    )


def metric_predictions(
    values: np.ndarray,
    rows: Rows,
    metric_list: Sequence[metrics.Metric],
    settings: PredictSettings,
    grid: np.ndarray,
    *,
    reps: nested.Nested | None = None,
    sd: np.ndarray | None = None,
    realized: np.ndarray | None = None,
    subsample: np.ndarray | None = None,
) -> dict[str, MetricPrediction]:
    """Returns label -> `MetricPrediction` of every metric from a prediction's pass.

    Args:
      values: [W, G, M, Q] the pass's per-query values at the target and the curve's sizes.
      rows: where the weightings are (`variants`).
      metric_list: the M metrics; settings: the prediction's; grid: [G - 1] the curve's sizes
        (empty: the target alone, no curve).
      reps: the nested bootstrap (`nested.Nested`, at the target and its anchor sizes): the
        target's interval from its replicates, the curve's from their sd interpolated in log N.
      sd: [M, G] the distractor sd where only it is known (an artifact's; NaN: unknown);
        ignored with `reps`.
      realized: [M, G] the sd of each metric's realized value around its expectation
        (`realized_sd`), or None.
      subsample: [M, G] each metric's sub-samples' sd (`subsample_sds`), or None.
    """
    means = values.mean(axis=-1)  # [W, G, M]
    out = {}
    for m, metric in enumerate(metric_list):
        per_query = values[0, :, m, :]  # [G, Q]
        terms = rows.terms(
            means[:, :, m],
            None if realized is None else realized[m],
            None if subsample is None else subsample[m],
            per_query=values[:, :, m, :],
        )
        if reps is None:
            sd_m = None if sd is None else sd[m]
            uncs = combined_intervals(per_query, settings, terms, sd_distractor=sd_m)
            sd_curve = None if sd_m is None else sd_m[1:]
        else:
            uncs, sd_curve = _nested_intervals(per_query, settings, terms, reps, m, grid)
        sub_curve = None if subsample is None else subsample[m, 1:]
        curve = _curve(grid, means[0, 1:, m], uncs[1:], sd_curve, sub_curve) if len(grid) else None
        got = MetricPrediction.of(metric, settings.k, means[0, 0, m], per_query[0], uncs[0], curve)
        out[got.label] = got
    return out


def _nested_intervals(
    per_query: np.ndarray,
    settings: PredictSettings,
    terms: Terms,
    reps: nested.Nested,
    m: int,
    grid: np.ndarray,
) -> tuple[list[Interval], np.ndarray | None]:
    """Returns (the intervals [G] of metric `m` from its values `per_query` [G, Q], the curve's
    distractor sd [G - 1] or None without a curve): at the target from its own nested
    replicates `reps`, on the curve `grid` from their sd interpolated in log N between them."""
    target, rest = slice(1), slice(1, None)
    at_n = (reps.distractor[:1, m], reps.combined[:1, m])
    uncs = combined_intervals(per_query[target], settings, terms.cut(target), nested=at_n)
    if reps.by_id:
        uncs[0] = uncs[0]._replace(distractor_replicates=tuple(at_n[0][0].tolist()))
    if not len(grid):
        return uncs, None
    sd_curve = _log_interp(grid, reps.sizes[1:], reps.sd(m)[1:])
    curve = combined_intervals(per_query[rest], settings, terms.cut(rest), sd_distractor=sd_curve)
    return uncs + curve, sd_curve


def _curve(
    grid: np.ndarray,
    values: np.ndarray,
    uncs: list[Interval],
    sd_distractor: np.ndarray | None,
    sd_subsample: np.ndarray | None = None,
) -> Curve:
    """Returns a metric's `Curve`: its `values` [G] and intervals `uncs` at the sizes `grid` [G],
    with the distractor sd [G] where it is known at every size and the sub-samples' sd [G] or
    None."""
    if sd_distractor is not None and np.isnan(sd_distractor).any():
        sd_distractor = None
    return Curve(
        n=tuple(np.asarray(grid, np.float64).tolist()),
        values=tuple(values.tolist()),
        ci90=tuple(u.ci90.reported for u in uncs),
        sd_distractor=None if sd_distractor is None else tuple(sd_distractor.tolist()),
        ci90_queries=tuple(_over_queries(u) for u in uncs),
        sd_subsample=None if sd_subsample is None else tuple(sd_subsample.tolist()),
    )


def at_target(
    scores: SampledScores,
    settings: PredictSettings,
    hardness: Hardness,
    n_target: float,
    *,
    metric_list: Sequence[metrics.Metric] | None = None,
    reps: nested.Nested | None = None,
) -> dict[str, MetricPrediction]:
    """Returns label -> `MetricPrediction` at `n_target` alone (no curve) of an estimate with its
    reruns, each with its interval: the prediction's pass and intervals
    (`metric_predictions`) for studies that need only the target; `reps` the nested bootstrap at
    [n_target] or None; `metric_list` defaults to the settings'."""
    metric_list = settings.metric_list() if metric_list is None else tuple(metric_list)
    every, rows = variants(hardness, scores)
    values, _ = evaluate.predicted_values(
        every,
        scores.mask,
        [float(n_target)],
        settings.k,
        scores.fixed_counts,
        scores,
        metric_list=metric_list,
    )
    realized = realized_sd(
        hardness, scores, [n_target], k=settings.k, metric_list=metric_list, opts=settings.protocol
    )
    return metric_predictions(
        values, rows, metric_list, settings, np.zeros(0), reps=reps, realized=realized
    )


def predict(
    scores: SampledScores,
    settings: PredictSettings,
    n_target: int,
    hardness: Hardness | None = None,
    *,
    report: ilias_report.ReportSpec | None = None,
) -> Prediction:
    """Returns the `Prediction` of `settings.estimator` at gallery size `n_target`
    (`estimate_and_predict`, given the estimate or not)."""
    return estimate_and_predict(scores, settings, n_target, hardness, report=report)[1]


def estimate_and_predict(
    scores: SampledScores,
    settings: PredictSettings,
    n_target: int,
    hardness: Hardness | None = None,
    *,
    report: ilias_report.ReportSpec | None = None,
) -> tuple[Hardness, Prediction]:
    """Returns (the estimate, the `Prediction` of `settings.estimator` at gallery size
    `n_target`): every metric of `settings.metrics` with its interval and curve.

    `hardness` is the estimate to predict from (`estimate(scores, settings)` when None: the
    configured estimator with its threshold reruns, which the interval needs); it is returned
    with the prediction. With a `report` spec, the official ILIAS report is predicted too, every
    value with its interval (`predicted_report`). The stages: the nested bootstrap, which needs
    no estimate, runs beside the estimate and its one pass over every metric at the target and
    on the curve (`_start_nested`, `_evaluate`); the intervals combine the two
    (`_predict_metrics`); then the budget check, the diagnostics and the baselines.
    """
    if n_target < 1:
        raise ValueError(f"n_target must be a positive gallery size, got {n_target}")
    metric_list = _evaluated_metrics(settings, report)
    grid = np.geomspace(*CURVE_RANGE, int(settings.protocol.curve_points))
    sizes = np.concatenate([[float(n_target)], grid])
    subs, too_small = _subsamples(scores, settings)
    with futures.ThreadPoolExecutor(1) as pool:  # the nested bootstrap beside the estimate
        job = _start_nested(
            pool, scores, settings, n_target, metric_list=metric_list, report=report, subs=subs
        )
        if hardness is None:
            hardness = estimate(scores, settings)
        evaluated = _evaluate(
            scores, settings, hardness, sizes, metric_list=metric_list, report=report
        )
        # The realized counts' draws need only the estimate: they run beside the bootstrap.
        realized = _realized(scores, settings, hardness, evaluated, report=report)
        reps, extra = (None, None) if job is None else job.result()
    reps = reps if int(settings.protocol.nested_replicates) else None
    out, predicted = _predict_metrics(
        settings,
        evaluated,
        reps=reps,
        realized=realized,
        subsample=subsample_sds(evaluated, extra, report),
        report=report,
    )
    ap = out[metric_list[0].label(settings.k)]
    sub_values = np.zeros((0, 1, 1)) if extra is None else extra.values
    verdict, fits = _budget(
        scores, settings, n_target, ap=ap, subs=subs, sub_values=sub_values, too_small=too_small
    )
    return hardness, Prediction(
        estimator=settings.estimator,
        n_target=int(n_target),
        n_sample=int(scores.n_sample),
        k=settings.k,
        query_ids=scores.query_ids,
        metrics=out,
        baselines=_baselines(scores, settings.k, evaluated, fits),
        diagnostics=_diagnose(
            scores, settings, n_target, hardness, out=out, verdict=verdict, predicted=predicted
        ),
        report=predicted,
    )


def _evaluated_metrics(
    settings: PredictSettings, report: ilias_report.ReportSpec | None
) -> tuple[metrics.Metric, ...]:
    """Returns the metrics the pass evaluates: `settings.metric_list()` (mAP@k first), then
    those the ILIAS `report` needs besides (its oracle is recall)."""
    metric_list = settings.metric_list()
    if report is None:
        return metric_list
    extra = (metrics.METRICS[m] for _, m in report.pairs())
    return tuple(dict.fromkeys((*metric_list, *extra)))


def _subsamples(
    scores: SampledScores, settings: PredictSettings
) -> tuple[tuple[SampledScores, ...], str]:
    """Returns (the budget check's nested sub-samples [S / 2^L, ..., S], why there are none):
    none, and the reason, for a sample too small to halve (some query keeps no stored score)."""
    opts = settings.protocol
    try:
        subs = budget.nested_subsamples(scores, int(opts.budget_levels), int(opts.seed))
    except ValueError as e:
        return (), str(e)
    return tuple(subs), ""


def subsample_sds(
    evaluated: "_Pass", extra: nested.Extra | None, report: ilias_report.ReportSpec | None
) -> tuple[np.ndarray | None, np.ndarray | None]:
    """Returns (the sub-samples' sd [M, G] of each metric at the pass's sizes, of each item [I]
    of the `report`), each None where not measured: `budget.subsample_sd` of the estimator on
    the budget check's sub-samples (`extra`) and on the sample (the pass), at the target and
    the `NESTED_ANCHORS` curve sizes, interpolated in log N in between as the distractor sd is.
    """
    if extra is None or not extra.values.shape[0]:
        return None, None
    sizes, means = evaluated.sizes, evaluated.values[0].mean(axis=-1)  # [G], [G, M]
    anchors = np.geomspace(*CURVE_RANGE, NESTED_ANCHORS)
    at = means[:1]
    if sizes.size > 1:
        at = np.concatenate([at, _log_interp(anchors, sizes[1:], means[1:].T).T])
    sd = budget.subsample_sd(np.concatenate([extra.values, at[None, : extra.values.shape[1]]])).T
    if sizes.size > 1:
        sd = np.concatenate([sd[:, :1], _log_interp(sizes[1:], anchors, sd[:, 1:])], axis=-1)
    items = None
    if report is not None and extra.items is not None and evaluated.in_views is not None:
        names = [m.name for m in evaluated.metric_list]
        point = _report_items(report, evaluated.in_views[0], names)
        items = budget.subsample_sd(np.concatenate([extra.items, point[None]]))
    return sd, items


def _start_nested(
    pool: futures.Executor,
    scores: SampledScores,
    settings: PredictSettings,
    n_target: int,
    *,
    metric_list: tuple[metrics.Metric, ...],
    report: ilias_report.ReportSpec | None,
    subs: tuple[SampledScores, ...],
) -> "futures.Future[tuple[nested.Nested, nested.Extra]] | None":
    """Starts the nested bootstrap on `pool` and returns its future, or None when it has
    neither replicates nor budget sub-samples to evaluate.

    It needs no estimate, so it runs beside the estimate and its pass: one program draws the
    replicates at the target and the `NESTED_ANCHORS` curve sizes, and evaluates the
    estimator on every sub-sample but the last (the sample itself: its value is the point).
    """
    replicates = int(settings.protocol.nested_replicates)
    if not replicates and len(subs) <= 1:
        return None
    return pool.submit(
        nested.nested_bootstrap,
        scores,
        settings.estimator,
        settings.tail,
        settings.k,
        np.concatenate([[float(n_target)], np.geomspace(*CURVE_RANGE, NESTED_ANCHORS)]),
        replicates,
        seed=settings.protocol.seed,
        metric_list=metric_list,
        num_atoms=NESTED_ATOMS,
        items=None if report is None or not replicates else _items(report, metric_list),
        extra=subs[:-1],
    )


class _Pass(NamedTuple):
    """A prediction's pass (`_evaluate`): values [W, G, M, Q] of the metrics `metric_list` at
    `sizes` [G] (the target, then the curve's), the report's views' [W, V, M, Q] (None without
    a report) and which weighting each row W is."""

    values: np.ndarray
    in_views: np.ndarray | None
    rows: Rows
    sizes: np.ndarray
    metric_list: tuple[metrics.Metric, ...]


def _evaluate(
    scores: SampledScores,
    settings: PredictSettings,
    hardness: Hardness,
    sizes: np.ndarray,
    *,
    metric_list: tuple[metrics.Metric, ...],
    report: ilias_report.ReportSpec | None,
) -> _Pass:
    """Returns the pass: every metric of `metric_list` at `sizes` [G] (the target, then the
    curve's) for each weighting of `variants` (the estimate, its priors and reruns, the
    baselines), and in each view of the `report`."""
    every, rows = variants(hardness, scores)
    views = None if report is None else report.views
    values, in_views = evaluate.predicted_values(
        every,
        scores.mask,
        sizes,
        settings.k,
        scores.fixed_counts,
        scores,
        metric_list=metric_list,
        views=views,
    )
    return _Pass(values, in_views, rows, sizes, metric_list)


def _realized(
    scores: SampledScores,
    settings: PredictSettings,
    hardness: Hardness,
    evaluated: _Pass,
    *,
    report: ilias_report.ReportSpec | None,
) -> tuple[np.ndarray | None, np.ndarray | None]:
    """Returns (the sd [M, G] of each metric's realized value around its expectation at the
    pass's sizes (`realized_sd`), the same for the `report`'s items or None without one)."""
    k, opts = settings.k, settings.protocol
    sizes, metric_list = evaluated.sizes, evaluated.metric_list
    realized = realized_sd(hardness, scores, sizes, k=k, metric_list=metric_list, opts=opts)
    real = None
    if report is not None:
        real = realized_items(
            hardness, scores, report, float(sizes[0]), k=k, metric_list=metric_list, opts=opts
        )
    return realized, real


def _predict_metrics(
    settings: PredictSettings,
    evaluated: _Pass,
    *,
    reps: nested.Nested | None,
    realized: tuple[np.ndarray | None, np.ndarray | None],
    subsample: tuple[np.ndarray | None, np.ndarray | None] = (None, None),
    report: ilias_report.ReportSpec | None,
) -> tuple[dict[str, MetricPrediction], Report | None]:
    """Returns (label -> `MetricPrediction` of each metric of `settings.metrics`, in its order,
    with its interval and curve; the ILIAS report predicted, or None without a `report`).

    The intervals combine the pass's reruns and priors, the nested bootstrap's `reps`, the
    realized counts' noise (`_realized`) and the sub-samples' sds (`subsample_sds`); the
    report's extra metrics are dropped after.
    """
    sizes, metric_list = evaluated.sizes, evaluated.metric_list
    out = metric_predictions(
        evaluated.values,
        evaluated.rows,
        metric_list,
        settings,
        sizes[1:],
        reps=reps,
        realized=realized[0],
        subsample=subsample[0],
    )
    predicted = None
    if report is not None:
        if evaluated.in_views is None:
            raise ValueError("a report to predict from a pass without its views")
        predicted = predicted_report(
            report,
            evaluated.in_views,
            evaluated.rows,
            metric_list,
            settings,
            reps,
            realized=realized[1],
            subsample=subsample[1],
        )
    wanted = {m.label(settings.k) for m in settings.metric_list()}
    return {label: m for label, m in out.items() if label in wanted}, predicted


def _budget(
    scores: SampledScores,
    settings: PredictSettings,
    n_target: int,
    *,
    ap: MetricPrediction,
    subs: tuple[SampledScores, ...],
    sub_values: np.ndarray,
    too_small: str,
) -> tuple[Budget, dict[str, float]]:
    """Returns the sufficient-budget `Budget` and the curve-fit baselines (`budget_check`) from
    the estimator's values on the sub-samples `sub_values` [L - 1, G, M] and the point `ap`;
    not checked, and no fits, without sub-samples (`too_small` says why)."""
    if not subs:
        levels = int(settings.protocol.budget_levels)
        return budget.not_checked(levels, scores.n_sample, too_small), {}
    preds = [*sub_values[:, 0, 0], ap.value]
    return budget_check(subs, preds, settings, n_target, predicted_interval(ap).sd_query)


def predicted_interval(m: MetricPrediction) -> Interval:
    """Returns `m`'s interval, which every predicted metric has (an exact evaluation has none)."""
    if m.interval is None:
        raise ValueError(f"{m.label}: a prediction without its interval")
    return m.interval


def _tail_check(
    scores: SampledScores, settings: PredictSettings, hardness: Hardness
) -> tuple[float, float, float] | None:
    """Returns the tail against the tail-priced positives' counts (`diagnostics.tail_counts`),
    or None for an estimate without a tail."""
    if hardness.fit is None:
        return None
    counts = np.where(scores.mask, scores.pos_counts, 0)
    return diagnostics.tail_counts(hardness, counts, scores.n_sample, settings.tail.min_count)


def _diagnose(
    scores: SampledScores,
    settings: PredictSettings,
    n_target: int,
    hardness: Hardness,
    *,
    out: dict[str, MetricPrediction],
    verdict: Budget,
    predicted: Report | None,
) -> Diagnostics:
    """Returns the prediction's `Diagnostics`: the budget `verdict`, the drift test, the tail
    check and the summary of every metric of `out` (mAP@k first, its headline last), headed by
    the file's reconciliation and the report's few-query notes."""
    ap, *others = out.values()
    drift = drift_check(settings, n_target)
    checked = _tail_check(scores, settings, hardness)
    summary, raised = diagnostics.summary(
        ap.value,
        predicted_interval(ap),
        hardness,
        budget=verdict,
        drift=drift,
        k=settings.k,
        n_sample=scores.n_sample,
        n_target=n_target,
        checked=checked,
        others=tuple(others),
    )
    if predicted is not None:
        summary = few_queries(predicted) + summary
    summary = diagnostics.reconciled(scores.reconciled) + summary
    shared = float(hardness.tail_priced[scores.mask].mean())
    not_converged = diagnostics.fits_not_converged(hardness)
    return Diagnostics(
        summary, verdict, drift, shared, raised, checked, fits_not_converged=not_converged
    )


def _baselines(
    scores: SampledScores, k: int, evaluated: _Pass, fits: dict[str, float]
) -> dict[str, float]:
    """Returns the baselines' mAP@k at the target: evaluate-at-S, the count and homogeneous
    estimators' (their rows of the pass) and the curve fits `fits`."""
    start = evaluated.rows.baselines.start
    return {
        "at_sample": baselines.at_sample_map(scores, k),
        "count": float(evaluated.values[start, 0, 0].mean()),
        "homogeneous": float(evaluated.values[start + 1, 0, 0].mean()),
        **fits,
    }


# A report value resting on fewer queries than this is named in the summary: its query
# bootstrap's percentile interval is unreliable on so few (a textbook rule of thumb, not tuned).
MIN_REPORT_QUERIES = 20


def _item_index(
    spec: ilias_report.ReportSpec, metric_list: Sequence[metrics.Metric]
) -> tuple[np.ndarray, np.ndarray]:
    """Returns ([I] view, [I] metric) indices of the report's items among the views and
    `metric_list`: `a[view, metric]` is [I, Q] from per-query values a [V, M, Q]."""
    names = [m.name for m in metric_list]
    return (
        np.asarray([it.view for it in spec.items], np.int32),
        np.asarray([names.index(it.metric) for it in spec.items], np.int32),
    )


def _items(spec: ilias_report.ReportSpec, metric_list: Sequence[metrics.Metric]) -> nested.Items:
    """Returns the report's items as the nested bootstrap evaluates them."""
    view_index, metric_index = _item_index(spec, metric_list)
    return nested.Items(
        views=spec.views, view_index=view_index, metric_index=metric_index, weights=spec.weights
    )


def predicted_report(
    spec: ilias_report.ReportSpec,
    in_views: np.ndarray,
    rows: Rows,
    metric_list: Sequence[metrics.Metric],
    settings: PredictSettings,
    reps: nested.Nested | None,
    *,
    realized: np.ndarray | None = None,
    subsample: np.ndarray | None = None,
) -> Report:
    """Returns the predicted ILIAS `Report` (percent), every value with its 90% interval.

    Args:
      spec: the report's views and items (`ilias_report.build_spec`).
      in_views: [W, V, M, Q] the pass's per-query values in the views at the target.
      rows: where the pass's weightings are; metric_list: its M metrics.
      settings: the prediction's; reps: its nested bootstrap (with the items) or None.
      realized: [I] each item's realized-value sd (`realized_items`), or None.
      subsample: [I] each item's sub-samples' sd (`subsample_sds`), or None.
    """
    names = [m.name for m in metric_list]
    points = np.stack([_report_items(spec, in_view, names) for in_view in in_views])  # [W, I]
    view, metric = _item_index(spec, metric_list)
    uncs = combined_intervals(
        in_views[0, view, metric],
        settings,
        rows.terms(
            points,
            realized,
            subsample,
            per_query=in_views[:, view, metric],
            weights=np.asarray(spec.weights),
        ),
        weights=spec.weights,
        nested=_items_nested(reps),
    )
    return _report(spec, points[0], uncs, aps=in_views[0, 0, names.index("map")])


def _report_items(
    spec: ilias_report.ReportSpec, in_view: np.ndarray, names: list[str]
) -> np.ndarray:
    """Returns [I] the report's items from one weighting's per-query values [V, M, Q] of the
    metrics `names` [M]."""
    per_query = {(v, m): in_view[v, names.index(m)] for v, m in spec.pairs()}
    return np.asarray(ilias_report.apply(spec, per_query), np.float64)


def _items_nested(reps: nested.Nested | None) -> tuple[np.ndarray, np.ndarray] | None:
    """Returns the report items' nested replicates (distractor [I, B], combined [I, B]), or None
    without a nested bootstrap."""
    if reps is None:
        return None
    if reps.items_distractor is None or reps.items_combined is None:
        raise ValueError("a nested bootstrap without the report's items")
    return reps.items_distractor, reps.items_combined


def _report(
    spec: ilias_report.ReportSpec, points: np.ndarray, uncs: list[Interval], *, aps: np.ndarray
) -> Report:
    """Returns the `Report` (percent) of the items' `points` [I] and intervals `uncs`, with the
    per-query AP@k `aps` [Q]."""
    values = (
        ReportValue(
            it.section,
            it.key,
            100.0 * float(point),
            it.num_queries,
            it.num_instances,
            _percent(unc.ci90.reported),
            _percent(_over_queries(unc)),
        )
        for it, point, unc in zip(spec.items, points, uncs, strict=True)
    )
    return Report(
        values=tuple(values),
        query_ids=spec.query_ids,
        aps=100.0 * np.asarray(aps, np.float64),
        notes=spec.notes,
    )


def _percent(bounds: tuple[float, float]) -> tuple[float, float]:
    return 100.0 * bounds[0], 100.0 * bounds[1]


def few_queries(report: Report) -> tuple[str, ...]:
    """Returns a note naming the report's values that rest on fewer than `MIN_REPORT_QUERIES`
    queries, else ()."""
    few = [f"{v.section} {v.key}" for v in report.values if v.num_queries < MIN_REPORT_QUERIES]
    if not few:
        return ()
    return (
        f"FEW QUERIES: {len(few)} report value{'s' * (len(few) > 1)} rest on fewer than "
        f"{MIN_REPORT_QUERIES} queries each, too few for a stable number or interval: "
        + ", ".join(few[:12])
        + (", ..." if len(few) > 12 else ""),
    )


def exact(
    scores: SampledScores,
    k: int,
    n_target: int,
    metric_list: Sequence[metrics.Metric] = (metrics.METRICS["map"],),
    report: ilias_report.ReportSpec | None = None,
) -> Prediction:
    """Returns the `Prediction` of an exact evaluation (every distractor scored): the official
    metrics@k of the gallery, from its counts (mAP@k first), with the official ILIAS report of
    `report`'s groups when given (`ilias_report.exact_report`)."""
    mask = scores.mask
    counts = np.where(mask, scores.pos_counts + scores.fixed_counts, -1)
    out = {}
    for metric in dict.fromkeys((metrics.METRICS["map"], *metric_list)):
        per_query = np.asarray(metrics.value_from_counts(metric, counts, mask, k), np.float64)
        got = MetricPrediction.of(metric, k, per_query.mean(), per_query)
        out[got.label] = got
    return Prediction(
        estimator="exact",
        n_target=int(n_target),
        n_sample=int(scores.n_sample),
        k=int(k),
        query_ids=scores.query_ids,
        metrics=out,
        report=None if report is None else ilias_report.exact_report(report, counts, mask, k),
    )


def distractor_sd(
    prediction: Prediction,
) -> tuple[np.ndarray, np.ndarray, int, tuple[str, ...], np.ndarray | None] | None:
    """Returns (sizes [G], sds [M, G], k, metric names [M], the sub-samples' sds [M, G] or None)
    of a prediction's distractor-sample sd of each metric at the target and on its curve
    (ascending sizes; what a hardness artifact stores), or None without one (no nested
    bootstrap)."""
    names, sizes, rows, subs = [], [], [], []
    for m in prediction.metrics.values():
        curve, unc = m.curve, m.interval
        if curve is None or curve.sd_distractor is None or unc is None:
            continue
        if unc.sd_distractor is not None:
            names.append(m.metric)
            sizes.append(curve.n)
            rows.append([unc.sd_distractor, *curve.sd_distractor])
            if curve.sd_subsample is not None:
                subs.append([unc.sd_subsample, *curve.sd_subsample])
    if not names:
        return None
    n = np.asarray([prediction.n_target, *sizes[0]], np.float64)
    sds = np.asarray(rows)
    n, first = np.unique(n, return_index=True)
    sub = np.asarray(subs)[:, first] if len(subs) == len(rows) else None
    return n, sds[:, first], int(prediction.k), tuple(names), sub
