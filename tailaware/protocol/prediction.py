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

import jax
import jax.numpy as jnp
import numpy as np

from tailaware.core import buckets, evaluate, law, metrics
from tailaware.core.results import (
    Curve,
    Diagnostics,
    Drift,
    Hardness,
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
        table=law.rank_table(int(k)),
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


def predict(
    scores: SampledScores,
    settings: PredictSettings,
    n_target: int,
    hardness: Hardness | None = None,
) -> Prediction:
    """Returns the `Prediction` of `settings.estimator` at gallery size `n_target`.

    `hardness` is the estimate to predict from (`estimate(scores, settings)` when None: the
    configured estimator with its threshold reruns, which the interval needs).
    """
    if n_target < 1:
        raise ValueError(f"n_target must be a positive gallery size, got {n_target}")
    k, opts = settings.k, settings.protocol
    if hardness is None:
        hardness = estimate(scores, settings)
    fixed = scores.fixed_counts
    grid = np.geomspace(*CURVE_RANGE, int(opts.curve_points))
    sizes = np.concatenate([[float(n_target)], grid])
    aps, priors = prior_maps(hardness, sizes, k, fixed, scores)  # [G, Q], [T, G] or None
    points = aps.mean(axis=1)

    reps = None
    if int(opts.nested_replicates) > 0:
        reps = nested.nested_bootstrap(
            scores,
            settings.estimator,
            settings.tail,
            k,
            sizes,
            opts.nested_replicates,
            seed=opts.seed,
        )
    maps = threshold_maps(scores, settings, sizes, hardness)
    unc, *bands = intervals.size_intervals(
        aps, settings.intervals, opts.query_replicates, opts.seed, maps, reps, priors=priors
    )
    verdict, fits = budget_check(scores, settings, n_target, unc.sd_query)
    drift = drift_check(settings, n_target)
    checked = None
    if hardness.fit is not None:  # a tail-aware estimate: its tail against the counts
        counts = np.where(scores.mask, scores.pos_counts, 0)
        min_count = settings.tail.min_count
        checked = diagnostics.tail_counts(hardness, counts, scores.n_sample, min_count)
    summary, raised = diagnostics.summary(
        float(points[0]),
        unc,
        hardness,
        budget=verdict,
        drift=drift,
        k=k,
        n_sample=scores.n_sample,
        n_target=n_target,
        checked=checked,
    )
    summary = diagnostics.reconciled(scores.reconciled) + summary
    count = estimators.count(scores)
    mask = scores.mask
    shared = float(hardness.tail_priced[mask].mean())
    return Prediction(
        map=float(points[0]),
        estimator=settings.estimator,
        n_target=int(n_target),
        n_sample=int(scores.n_sample),
        k=k,
        per_query_ap=aps[0],
        baselines={
            "at_sample": baselines.at_sample_map(scores, k),
            "count": float(evaluate.per_query_ap(count, n_target, k, fixed, scores).mean()),
            "homogeneous": _homogeneous(scores, n_target, k),
            **fits,
        },
        query_ids=scores.query_ids,
        share_tail_priced=shared,
        interval=unc,
        curve=Curve(
            n=tuple(grid.tolist()),
            map=tuple(points[1:].tolist()),
            ci90=tuple(b.ci90.reported for b in bands),
            sd_distractor=None if reps is None else tuple(b.sd_distractor for b in bands),
        ),
        other_metrics=other_metrics(hardness, fixed, n_target, k),
        diagnostics=Diagnostics(summary, verdict, drift, shared, raised, checked),
    )


def _homogeneous(scores: SampledScores, n_target: int, k: int) -> float:
    h = estimators.homogeneous(scores)
    return float(evaluate.per_query_ap(h, n_target, k, scores.fixed_counts, scores).mean())


def exact(
    scores: SampledScores, k: int, n_target: int, report: ilias_report.ReportSpec | None = None
) -> Prediction:
    """Returns the `Prediction` of an exact evaluation (every distractor scored): the official
    mAP@k of the gallery, from its counts, with the official ILIAS report of `report`'s groups
    when given (`ilias_report.exact_report`)."""
    mask = scores.mask
    counts = np.where(mask, scores.pos_counts + scores.fixed_counts, -1)
    aps = metrics.ap_at_k_from_counts(counts, mask, k)
    return Prediction(
        map=float(aps.mean()),
        estimator="exact",
        n_target=int(n_target),
        n_sample=int(scores.n_sample),
        k=int(k),
        per_query_ap=np.asarray(aps, np.float64),
        baselines={},
        query_ids=scores.query_ids,
        report=None if report is None else ilias_report.exact_report(report, counts, mask, k),
    )


def distractor_sd(prediction: Prediction) -> tuple | None:
    """Returns (sizes [G], sds [G], k) of a prediction's distractor-sample sd at the target and
    on its curve (ascending sizes; what a hardness artifact stores), or None without one (no
    nested bootstrap)."""
    curve, unc = prediction.curve, prediction.interval
    if curve is None or curve.sd_distractor is None or unc is None or unc.sd_distractor is None:
        return None
    n = np.asarray([prediction.n_target, *curve.n], np.float64)
    sds = np.asarray([unc.sd_distractor, *curve.sd_distractor], np.float64)
    n, first = np.unique(n, return_index=True)
    return n, sds[first], int(prediction.k)
