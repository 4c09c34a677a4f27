"""The pooled prediction of a census design: the census counted exactly, the rest estimated.

A census design (`tailaware.core.design`) embeds C items with certainty and hashes the rest at
the rate pi that makes the budget. Its file's sample is a sample of the whole gallery at rate
pi: the rest's hashed items and each query's systematic sample of the census
(`design.systematic_ranks`; D of them above a positive, U = C - D of the census not). Each
positive's outranking count is

    (the census items above it, exact) + (the estimate over the rest)

where the rest's estimate is the sample's estimate of the gallery's count less the census's:
the tail fitted to a sample of the whole gallery extrapolates the gallery's tail, census
included, however deep the census lies (a tail fitted to the rest alone sees the census's
depletion only where the census reaches into the sampled scores). `fold` hands the estimator
that sample as a uniform one at N: the census items it does not hold join the always-indexed
items (`fixed_counts`) and their share U / (N - S) of the unsampled items is taken from every
estimate of the positive's hardness, at least 0 (`functional.deplete`). So every metric, the
curve, the ILIAS report, the nested bootstrap and the budget check flow through one hook. A
positive's count is never below the census's. (docs/estimators.md, "Census".)
"""

import dataclasses
from typing import Any, NamedTuple

import numpy as np

from tailaware.core.results import Hardness, Prediction
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
    """Returns the file as the estimator reads it at the gallery size N = `n_target`: its
    sample of the whole gallery as a uniform sample whose always-indexed counts include the
    census items it does not hold (U = census less drawn above each positive), and their share
    of the N - S unsampled items (`SampledScores.depleted` = U / (N - S), taken from every
    estimate). The file's census fields are cleared."""
    if scores.census_counts is None or scores.drawn_counts is None:
        return scores
    mask = scores.mask
    before = scores.fixed_counts if scores.fixed_counts is not None else 0
    undrawn = np.where(mask, scores.census_counts - scores.drawn_counts, 0)
    fixed = np.where(mask, before + undrawn, -1)
    depleted = undrawn / float(max(int(n_target) - int(scores.n_sample), 1))
    return dataclasses.replace(scores, fixed_counts=fixed, depleted=depleted, **_UNIFORM)


# A census file's fields cleared: what is left is its hash sample, a uniform one.
_UNIFORM: dict[str, Any] = dict(
    census_counts=None, n_census=0, inclusion=None, drawn_counts=None, n_drawn=0
)


def uniform_part(scores: SampledScores) -> SampledScores:
    """Returns the file's sample of the whole gallery (the rest's hashed items and the census's
    systematic ones) read as a uniform sample: the uniform-only prediction beside the pooled
    one."""
    return dataclasses.replace(scores, **_UNIFORM)


def describe(scores: SampledScores, n_target: int, k: int) -> Census:
    """Returns the census's size and the share of outrankers it holds (a Horvitz-Thompson
    estimate of the rest's: the rest's sampled counts over its sampling rate)."""
    assert scores.census_counts is not None, "describe needs a census design's scores"
    c = int(scores.n_census)
    assert scores.drawn_counts is not None, "a census without its drawn counts"
    rate = (scores.n_sample - scores.n_drawn) / max(n_target - c, 1)
    census = np.where(scores.mask, scores.census_counts, 0).astype(np.float64)
    rest = np.where(scores.mask, scores.pos_counts - scores.drawn_counts, 0)
    total = census + rest / rate
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
) -> tuple[Hardness, Prediction]:
    """Returns (the hardness the estimator read from `fold`, the pooled `Prediction` at gallery
    size `n_target`).

    `scores` is a census design's file (`n_census` > 0); the uniform-only mAP@k from its sample
    alone joins the pooled one (`baselines["uniform_only"]`). N, the curve and the summary
    speak of the whole gallery.
    """
    c = int(scores.n_census)
    if c >= n_target:
        raise ValueError(f"the census ({c:,}) must be smaller than the gallery N = {n_target:,}")
    hardness, p = prediction.estimate_and_predict(
        fold(scores, n_target), settings, n_target, report=report
    )
    info = describe(scores, n_target, settings.k)
    baselines = dict(p.baselines)
    lines = [
        f"CENSUS: {c:,} items embedded with certainty ({100 * info.share_of_n:.2f}% of N = "
        f"{n_target:,}; {info.per_query_k:.2f} x k per query), a uniform sample of "
        f"{scores.n_sample - scores.n_drawn:,} of the other {n_target - c:,} (inclusion "
        f"{scores.inclusion:.4g}); "
        f"the census holds {100 * info.found:.1f}% of the outrankers of the positives within "
        f"k."
    ]
    uniform = uniform_part(scores)
    h_u = prediction.estimate(uniform, settings)
    label = next(iter(p.metrics))
    u = prediction.at_target(uniform, settings, h_u, float(n_target))[label]
    baselines["uniform_only"] = float(u.value)
    lo, hi = prediction.predicted_interval(u).ci90.reported
    lines.append(
        f"UNIFORM ONLY: {label} at N = {n_target:,}: {u.value:.4f} [{lo:.4f}, {hi:.4f}] "
        f"from the {uniform.n_sample:,} sampled items alone; pooled: "
        f"{p.metrics[label].value:.4f}"
    )
    diag = p.diagnostics
    if diag is not None:
        diag = diag._replace(summary=(*lines, *diag.summary))
    return hardness, p._replace(baselines=baselines, diagnostics=diag)
