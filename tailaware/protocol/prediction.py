"""A prediction from a sampled-scores file: mAP@k at N with its interval, curve and checks.

`predict(scores, settings, n_target)` returns the `Prediction` that prediction.json holds
(paper Sec. 4: "report mAP@k at the target with a query-bootstrap interval and a count/tail
diagnostic"):

- the point: E[AP@k] of the configured estimator's hardness at N (`evaluate.per_query_ap`);
- the interval (`intervals.size_intervals`): the nested bootstrap (`nested.nested_bootstrap`)
  widened by the tail model's moves with its threshold (`threshold_maps`) and with the prior
  on its shape (`prior_maps`);
- the curve for N from 10^3 to 10^9 with its 90% band (and the distractor-sample sd, which the
  hardness artifact keeps);
- recall@k and top-1 at N through the same law (`other_metrics`);
- the baselines: evaluate-at-S, count, homogeneous and the power-law / log-uniform curve fits;
- the diagnostics: the sufficient-budget verdict on nested sub-samples (`budget_check`), the
  drift test over id-hash block files (`drift_check`) and the summary (`diagnostics.summary`).

Shapes: Q queries, P positive slots, G gallery sizes, F threshold reruns, T other priors.
"""

import functools
from concurrent import futures
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from tailaware.core import buckets, evaluate, law, metrics
from tailaware.core.results import (
    Curve,
    Diagnostics,
    Drift,
    Hardness,
    MetricPrediction,
    OtherMetrics,
    Prediction,
)
from tailaware.io.scores import SampledScores, load_scores
from tailaware.protocol import baselines, budget, diagnostics, ilias_report, intervals, nested
from tailaware.protocol.settings import CURVE_RANGE, PredictSettings
from tailaware.tail import estimators, functional
from tailaware.tail.settings import TailSettings


def estimate(scores: SampledScores, settings: PredictSettings) -> Hardness:
    """Returns the configured estimator's `Hardness`, with its threshold reruns and prior terms
    when it has a tail model (what the interval needs)."""
    return estimators.estimate(scores, settings.estimator, settings.tail)


def prior_maps(hardness: Hardness, sizes, k: int, fixed, sample) -> tuple:
    """Returns (per-query AP@k [G, Q] of the estimate, its mAP@k [T, G] under its other priors on
    the tail shape, a flatter and a steeper one, or None without them) at the sizes [G], in one
    E[AP] pass (`evaluate.per_query_aps(..., priors=True)`); `fixed` and `sample` as there."""
    aps, *priors = evaluate.per_query_aps(hardness, sizes, k, fixed, sample, priors=True)
    return aps, (np.mean(priors, axis=-1) if priors else None)


def rerun_maps(reruns, sizes, k: int, fixed, sample) -> np.ndarray | None:
    """Returns mAP@k [F, G] of each of the `reruns` (`Hardness`, a tuple) at the sizes [G], or
    None when there are none; `fixed` and `sample` as in `evaluate.per_query_aps`."""
    if not reruns:
        return None
    sizes = np.asarray(sizes, np.float64)
    maps = lambda h: evaluate.per_query_aps(h, sizes, k, fixed, sample)[0].mean(axis=1)
    # Concurrently: a compiled E[AP] releases the GIL and keeps only part of 2 cores busy.
    with futures.ThreadPoolExecutor(len(reruns)) as pool:
        return np.stack(list(pool.map(maps, reruns)))


def threshold_maps(scores: SampledScores, settings: PredictSettings, sizes, estimated=None):
    """Returns mAP@k [F, G] of the configured estimator rerun at other thresholds, or None.

    The reruns keep half and twice the excesses over the estimator's threshold (`estimate`), one
    row each, at the gallery sizes `sizes` [G]; they are taken from `estimated` when it carries
    them. None for estimators without a tail model (count, homogeneous).
    """
    if estimators.tail_method(settings.estimator) is None:
        return None
    reruns = estimated.reruns if estimated is not None else ()
    reruns = reruns or estimate(scores, settings).reruns
    return rerun_maps(reruns, sizes, settings.k, scores.fixed_counts, scores)


def model_deviations(
    scores: SampledScores, settings: PredictSettings, sizes, points, estimated=None
):
    """Returns ([G], [G]) how far mAP@k moves when the tail threshold does (`threshold_maps`) and
    when the prior on the tail shape does (`prior_maps`; of `estimated` when given, which must
    then carry its reruns, as `estimate`'s do): the larger distance of the reruns from `points`
    [G] at each gallery size of `sizes` [G]; 0 without them."""
    h = estimated if estimated is not None and estimated.reruns else None
    if h is None and estimators.tail_method(settings.estimator) is not None:
        h = estimate(scores, settings)
    maps = threshold_maps(scores, settings, sizes, h)
    priors = None if h is None else prior_maps(h, sizes, settings.k, scores.fixed_counts, scores)[1]
    return intervals.deviation(maps, points), intervals.deviation(priors, points)


@jax.jit
def _other_metrics(x, mask, n, k, fixed):
    recall = jax.vmap(lambda xi, mi, fi: law.recall_at_k(xi, mi, n, k, fi))(x, mask, fixed)
    top1 = jax.vmap(lambda xi, mi, fi: law.top1_accuracy(xi, mi, n, fi))(x, mask, fixed)
    return jnp.mean(recall), jnp.mean(top1)


def other_metrics(hardness: Hardness, fixed, n: float, k: int) -> OtherMetrics:
    """Returns recall@k and top-1 accuracy at gallery size n through the law."""
    fx = jnp.asarray(np.where(hardness.mask, fixed, 0), jnp.float32)
    recall, top1 = _other_metrics(
        jnp.asarray(hardness.x, jnp.float32),
        jnp.asarray(hardness.mask),
        jnp.float32(n),
        jnp.float32(k),
        fx,
    )
    return OtherMetrics(int(k), float(recall), float(top1))


@functools.partial(jax.jit, static_argnames=("k", "traced", "settings"))
def _core_aps(c: functional.Core, sizes, *, table, grouping, k, traced, settings):
    atoms, w = traced(c, settings)
    kw = dict(fixed=c.fixed, weights=w, counts=c.counts, n_sample=c.s, table=table)
    return jax.vmap(lambda n: buckets.expected_map(atoms, c.mask, n, k, grouping=grouping, **kw))(
        sizes
    )


def core_aps(c: functional.Core, estimator: str, settings: TailSettings, k: int, sizes):
    """Returns the per-query AP@k [G, Q] at `sizes` of the estimator's traced definition on the
    fixed-shape inputs `c`: one compiled program for all sub-samples of one width."""
    aps = _core_aps(
        c,
        jnp.asarray(np.asarray(sizes, np.float64), jnp.float32),
        table=law.rank_tables(int(k)),
        grouping=buckets.groups(c.mask),
        k=int(k),
        traced=estimators.get(estimator).traced,
        settings=settings,
    )
    return np.asarray(jax.device_get(aps), np.float64)


def subsample_predictions(subsamples, settings: PredictSettings, sizes) -> np.ndarray:
    """Returns the configured estimator's mAP@k [len(subsamples), G] from each (sub-)sample,
    all at the width of the last (the full sample: `functional.core`)."""
    ref = subsamples[-1]
    out = []
    for s in subsamples:
        c = functional.core(s, settings.tail, ref)
        out.append(core_aps(c, settings.estimator, settings.tail, settings.k, sizes).mean(axis=1))
    return np.stack(out)


def budget_check(scores: SampledScores, settings: PredictSettings, n_target: int, noise: float):
    """Returns the sufficient-budget `Budget` and the curve-fit baselines {model: mAP@k at N},
    both from nested sub-samples of `scores` ({} when it is too small to halve)."""
    levels, seed = settings.protocol.budget_levels, settings.protocol.seed
    try:
        subs = budget.nested_subsamples(scores, int(levels), int(seed))
    except ValueError as e:  # a sample too small to halve (some query keeps no stored score)
        return budget.not_checked(int(levels), scores.n_sample, str(e)), {}
    preds = subsample_predictions(subs, settings, [float(n_target)])[:, 0]
    verdict = budget.verdict([s.n_sample for s in subs], preds, noise)
    return verdict, baselines.extrapolate(subs, settings.k, n_target)


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


# The nested bootstrap evaluates the target and these sizes (a decade apart over the curve's
# range); the curve's distractor sd in between is interpolated in log N, as an artifact's is.
NESTED_ANCHORS = 7
# The atoms each nested replicate keeps (`evaluate.kept_atoms` of the estimate's weights): the
# replicates' spread, not their values, is what the interval uses.
NESTED_ATOM_TOLERANCE = 1e-4


class Rows(NamedTuple):
    """Which weightings of a prediction's pass (`evaluate.predicted_values`) are what: row 0 is
    the estimate."""

    priors: slice  # the estimate under its other priors on the tail shape
    reruns: slice  # the threshold reruns
    baselines: slice  # the count and homogeneous baselines (empty from an artifact)


def variants(hardness: Hardness, scores: SampledScores | None = None) -> tuple[list, Rows]:
    """Returns the hardness variants of a prediction's pass and where their rows are: the
    estimate under each of its priors, its threshold reruns and, given the `scores`, the count
    and homogeneous baselines."""
    main = evaluate.variant(hardness, priors=True)
    reruns = [evaluate.variant(r) for r in hardness.reruns]
    base = []
    if scores is not None:
        base = [estimators.count(scores), estimators.homogeneous(scores)]
    t, f = len(main.weights) - 1, len(reruns)
    rows = Rows(slice(1, 1 + t), slice(1 + t, 1 + t + f), slice(1 + t + f, 1 + t + f + len(base)))
    return [main, *reruns, *(evaluate.variant(b) for b in base)], rows


def _log_interp(n, at, values) -> np.ndarray:
    """Returns `values` [..., A] known at ascending sizes `at` [A], at sizes `n` [G] (linear in
    log N, constant beyond the ends)."""
    return np.apply_along_axis(lambda v: np.interp(np.log(n), np.log(at), v), -1, values)


def metric_predictions(
    values, rows: Rows, metric_list, settings: PredictSettings, grid, *, reps=None, sd=None
) -> dict:
    """Returns label -> `MetricPrediction` of every metric from a prediction's pass.

    Args:
      values: [W, G, M, Q] the pass's per-query values at the target and the curve's sizes.
      rows: where the weightings are (`variants`).
      metric_list: the M metrics; settings: the prediction's; grid: [G - 1] the curve's sizes.
      reps: the nested bootstrap (`nested.Nested`, at the target and its anchor sizes): the
        target's interval from its replicates, the curve's from their sd interpolated in log N.
      sd: [M, G] the distractor sd where only it is known (an artifact's; NaN: unknown).
    """
    opts = settings.protocol
    means = values.mean(axis=-1)  # [W, G, M]
    common = (settings.intervals, opts.query_replicates, opts.seed)
    out = {}
    for m, metric in enumerate(metric_list):
        per_query = values[0, :, m, :]  # [G, Q]
        reruns, priors = means[rows.reruns, :, m], means[rows.priors, :, m]
        model = dict(reruns=reruns if len(reruns) else None, priors=priors if len(priors) else None)
        part = lambda cut, model=model: {
            name: None if v is None else v[:, cut] for name, v in model.items()
        }
        sd_curve = None if sd is None else sd[m, 1:]
        if reps is None:
            sd_m = None if sd is None else sd[m]
            uncs = intervals.item_intervals(per_query, *common, sd_distractor=sd_m, **model)
        else:  # the target's own replicates; the curve's sd interpolated between the anchors
            sd_curve = _log_interp(grid, reps.sizes[1:], reps.sd(m)[1:])
            at_n = (reps.distractor[:1, m], reps.combined[:1, m])
            uncs = intervals.item_intervals(per_query[:1], *common, nested=at_n, **part(slice(1)))
            uncs += intervals.item_intervals(
                per_query[1:], *common, sd_distractor=sd_curve, **part(slice(1, None))
            )
        known = sd_curve is not None and not np.isnan(sd_curve).any()
        curve = Curve(
            n=tuple(grid.tolist()),
            values=tuple(means[0, 1:, m].tolist()),
            ci90=tuple(u.ci90.reported for u in uncs[1:]),
            sd_distractor=tuple(sd_curve.tolist()) if known else None,
        )
        label = metric.label(settings.k)
        out[label] = MetricPrediction(label, float(means[0, 0, m]), per_query[0], uncs[0], curve)
    return out


def predict(
    scores: SampledScores,
    settings: PredictSettings,
    n_target: int,
    hardness: Hardness | None = None,
) -> Prediction:
    """Returns the `Prediction` of `settings.estimator` at gallery size `n_target`: every metric
    of `settings.metrics` with its interval and curve.

    One pass (`evaluate.predicted_values`) evaluates every metric at the target and on the curve
    for the estimate, its other priors, its threshold reruns and the baselines; the nested
    bootstrap reruns the estimator at the target and at `NESTED_ANCHORS` curve sizes.
    `hardness` is the estimate to predict from (`estimate(scores, settings)` when None: the
    configured estimator with its threshold reruns, which the interval needs).
    """
    if n_target < 1:
        raise ValueError(f"n_target must be a positive gallery size, got {n_target}")
    k, opts = settings.k, settings.protocol
    if hardness is None:
        hardness = estimate(scores, settings)
    metric_list = settings.metric_list()
    fixed, mask = scores.fixed_counts, scores.mask
    grid = np.geomspace(*CURVE_RANGE, int(opts.curve_points))
    sizes = np.concatenate([[float(n_target)], grid])
    every, rows = variants(hardness, scores)
    values, _ = evaluate.predicted_values(
        every, mask, sizes, k, fixed, scores, metric_list=metric_list
    )  # [W, G, M, Q]
    reps = None
    if int(opts.nested_replicates) > 0:
        anchors = np.geomspace(*CURVE_RANGE, NESTED_ANCHORS)
        keep, _ = evaluate.kept_atoms(every[0].weights, NESTED_ATOM_TOLERANCE)
        reps = nested.nested_bootstrap(
            scores,
            settings.estimator,
            settings.tail,
            k,
            np.concatenate([[float(n_target)], anchors]),
            opts.nested_replicates,
            seed=opts.seed,
            metric_list=metric_list,
            keep=keep,
        )
    out = metric_predictions(values, rows, metric_list, settings, grid, reps=reps)
    ap = out[metric_list[0].label(k)]
    unc = ap.interval
    verdict, fits = budget_check(scores, settings, n_target, unc.sd_query)
    drift = drift_check(settings, n_target)
    checked = None
    if hardness.fit is not None:  # a tail-aware estimate: its tail against the counts
        counts = np.where(mask, scores.pos_counts, 0)
        min_count = settings.tail.min_count
        checked = diagnostics.tail_counts(hardness, counts, scores.n_sample, min_count)
    summary, raised = diagnostics.summary(
        ap.value,
        unc,
        hardness,
        budget=verdict,
        drift=drift,
        k=k,
        n_sample=scores.n_sample,
        n_target=n_target,
        checked=checked,
        others=tuple(out.values())[1:],
    )
    summary = diagnostics.reconciled(scores.reconciled) + summary
    shared = float(hardness.tail_priced[mask].mean())
    return Prediction(
        map=ap.value,
        estimator=settings.estimator,
        n_target=int(n_target),
        n_sample=int(scores.n_sample),
        k=k,
        per_query_ap=ap.per_query,
        baselines={
            "at_sample": baselines.at_sample_map(scores, k),
            "count": float(values[rows.baselines.start, 0, 0].mean()),
            "homogeneous": float(values[rows.baselines.start + 1, 0, 0].mean()),
            **fits,
        },
        query_ids=scores.query_ids,
        share_tail_priced=shared,
        interval=unc,
        curve=ap.curve,
        other_metrics=other_metrics(hardness, fixed, n_target, k),
        diagnostics=Diagnostics(summary, verdict, drift, shared, raised, checked),
        metrics=out,
    )


def exact(
    scores: SampledScores,
    k: int,
    n_target: int,
    metric_list=(metrics.METRICS["map"],),
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
        out[metric.label(k)] = MetricPrediction(metric.label(k), float(per_query.mean()), per_query)
    ap = next(iter(out.values()))
    return Prediction(
        map=ap.value,
        estimator="exact",
        n_target=int(n_target),
        n_sample=int(scores.n_sample),
        k=int(k),
        per_query_ap=ap.per_query,
        baselines={},
        query_ids=scores.query_ids,
        metrics=out,
        report=None if report is None else ilias_report.exact_report(report, counts, mask, k),
    )


def distractor_sd(prediction: Prediction) -> tuple | None:
    """Returns (sizes [G], sds [M, G], k, metric names [M]) of a prediction's distractor-sample
    sd of each metric at the target and on its curve (ascending sizes; what a hardness artifact
    stores), or None without one (no nested bootstrap)."""
    known = [
        m
        for m in prediction.metrics.values()
        if m.curve is not None
        and m.curve.sd_distractor is not None
        and m.interval is not None
        and m.interval.sd_distractor is not None
    ]
    if not known:
        return None
    n = np.asarray([prediction.n_target, *known[0].curve.n], np.float64)
    sds = np.asarray([[m.interval.sd_distractor, *m.curve.sd_distractor] for m in known])
    n, first = np.unique(n, return_index=True)
    names = tuple(m.label.split("@")[0] for m in known)
    return n, sds[:, first], int(prediction.k), names
