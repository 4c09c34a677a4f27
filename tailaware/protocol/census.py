"""The pooled prediction of a census design: the census counted exactly, the rest estimated.

A census design (`tailaware.core.design`) embeds C items with certainty and a uniform sample of
the other N - C. Each positive's outranking count is then

    (exact census items above it) + (the estimate over the rest, N - C items)

and the tail machinery supplies the second term unchanged: a uniform sample of N - C items is
what it always models, with N - C as its N. The census count joins the always-indexed database
items the sampled-scores file already carries (`fixed_counts`), so every metric, the curve, the
ILIAS report, the nested bootstrap and the budget check flow through one hook (`fold`), and
the interval carries only the sampled stratum's terms (the census is exact). Whatever the
proxy, the estimate stays unbiased: a bad proxy only makes the census hold fewer outrankers.

The curve's sizes are the census plus the rest (`N - C` on the estimator's grid, shifted by C).
"""

import dataclasses
from typing import NamedTuple

import numpy as np

from tailaware.core.results import Curve, Hardness, MetricPrediction, Prediction
from tailaware.io.scores import SampledScores
from tailaware.protocol import ilias_report, prediction
from tailaware.protocol.settings import PredictSettings


class Census(NamedTuple):
    """What the summary says about a census.

    Attributes:
      n_census: C.
      share_of_n: C / N.
      per_query_k: C / (Q k), the census as a multiple of k per query.
      found: the share of the outrankers of the positives estimated within the top k
        (estimated over the gallery) that the census holds: the proxy's quality.
    """

    n_census: int
    share_of_n: float
    per_query_k: float
    found: float


def fold(scores: SampledScores, n_target: int) -> SampledScores:
    """Returns the sampled stratum as a uniform sample whose always-indexed counts include the
    census counts (the file's census fields cleared): what the estimator reads, with the
    census's share of the rest's N - C above each positive (`SampledScores.depleted`: the tail
    fitted below the census extrapolates a tail the census is part of)."""
    if scores.census_counts is None:
        return scores
    mask = scores.mask
    before = scores.fixed_counts if scores.fixed_counts is not None else 0
    fixed = np.where(mask, before + scores.census_counts, -1)
    n_rest = max(int(n_target) - int(scores.n_census), 1)
    depleted = np.where(mask, scores.census_counts, 0) / n_rest
    return dataclasses.replace(
        scores,
        fixed_counts=fixed,
        census_counts=None,
        n_census=0,
        inclusion=None,
        depleted=depleted,
    )


def describe(scores: SampledScores, n_target: int, k: int) -> Census:
    """Returns the census's size and the share of outrankers it holds (a Horvitz-Thompson
    estimate of the rest's: sampled counts over the sampling rate S / (N - C))."""
    assert scores.census_counts is not None, "describe needs a census design's scores"
    c = int(scores.n_census)
    rate = scores.n_sample / max(n_target - c, 1)
    census = np.where(scores.mask, scores.census_counts, 0).astype(np.float64)
    total = census + np.where(scores.mask, scores.pos_counts, 0) / rate
    # Only positives that can score at k decide the metric; the far ones' outrankers would
    # swamp the share (their counts are in the thousands).
    near = scores.mask & (total < k)
    in_census, all_found = float(census[near].sum()), float(total[near].sum())
    q = scores.num_queries
    found = in_census / all_found if all_found > 0 else float("nan")
    return Census(c, c / n_target, c / (q * k), found)


def predict(
    scores: SampledScores,
    settings: PredictSettings,
    n_target: int,
    *,
    report: ilias_report.ReportSpec | None = None,
    uniform: SampledScores | None = None,
) -> tuple[Hardness, Prediction]:
    """Returns (the hardness of the rest, the pooled `Prediction` at gallery size `n_target`).

    `scores` is a census design's file (`n_census` > 0); `uniform`, the same hash sample over
    the whole gallery (census items included), adds the uniform-only mAP@k beside the pooled
    one (`baselines["uniform_only"]`). N, the curve and the summary speak of the whole gallery.
    """
    c = int(scores.n_census)
    if c >= n_target:
        raise ValueError(f"the census ({c:,}) must be smaller than the gallery N = {n_target:,}")
    hardness, p = prediction.estimate_and_predict(
        fold(scores, n_target), settings, n_target - c, report=report
    )
    metrics = {label: _shift(m, c) for label, m in p.metrics.items()}
    info = describe(scores, n_target, settings.k)
    baselines = dict(p.baselines)
    lines = [
        f"CENSUS: {c:,} items embedded with certainty ({100 * info.share_of_n:.2f}% of N = "
        f"{n_target:,}; {info.per_query_k:.2f} x k per query), a uniform sample of "
        f"{scores.n_sample:,} of the other {n_target - c:,} (inclusion {scores.inclusion:.4g}); "
        f"the census holds {100 * info.found:.1f}% of the outrankers of the positives within "
        f"k. The lines below speak of the rest (N - C = {n_target - c:,}) beside the census."
    ]
    if uniform is not None:
        h_u = prediction.estimate(uniform, settings)
        label = next(iter(p.metrics))
        u = prediction.at_target(uniform, settings, h_u, float(n_target))[label]
        baselines["uniform_only"] = float(u.value)
        lo, hi = prediction.predicted_interval(u).ci90.reported
        lines.append(
            f"UNIFORM ONLY: {label} at N = {n_target:,}: {u.value:.4f} [{lo:.4f}, {hi:.4f}] "
            f"from the {uniform.n_sample:,} hash-sampled items alone; pooled: "
            f"{p.metrics[label].value:.4f}"
        )
    diag = p.diagnostics
    if diag is not None:
        diag = diag._replace(summary=(*lines, *diag.summary))
    return hardness, p._replace(
        n_target=int(n_target), metrics=metrics, baselines=baselines, diagnostics=diag
    )


def _shift(m: MetricPrediction, c: int) -> MetricPrediction:
    """Returns `m` with its curve's sizes moved from the rest's to the whole gallery's."""
    if m.curve is None:
        return m
    curve: Curve = m.curve._replace(n=tuple(float(n) + c for n in m.curve.n))
    return m._replace(curve=curve)
