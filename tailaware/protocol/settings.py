"""Settings of the protocol around a prediction: frozen objects that jobs build from a config.

`PredictSettings` bundles what a prediction needs: the estimator, k, the tail settings, the
protocol (intervals, curve, budget and drift checks) and the interval's model terms.
"""

import dataclasses
import importlib
from typing import TYPE_CHECKING

from tailaware.tail.settings import TailSettings

if TYPE_CHECKING:
    from tailaware.core import metrics as core_metrics

# The curve of a prediction spans these gallery sizes (log-spaced; `ProtocolSettings`).
CURVE_RANGE = (1e3, 1e9)


@dataclasses.dataclass(frozen=True)
class ProtocolSettings:
    """The protocol around a prediction (paper Sec. 4, App. C-D).

    Attributes:
      query_replicates: B of the query bootstrap.
      nested_replicates: replicates of the nested bootstrap (resample the distractor sample and
        refit); 0 switches it off (the interval then has no distractor term).
      curve_points: gallery sizes of the curve over `CURVE_RANGE`.
      budget_levels: nested sub-samples S / 2^L, ..., S / 2 for the sufficient-budget verdict.
      realized_draws: draws of each query's realized counts around the law's expectation
        (`core.realization`), whose spread enters the interval for these queries; 0 leaves it
        out.
      seed: seed of every resampling.
      blocks: sampled-scores files of disjoint id-hash blocks of the same sample, for the drift
        test (at least two; () skips it).
    """

    query_replicates: int = 1000
    nested_replicates: int = 50
    curve_points: int = 25
    budget_levels: int = 3
    realized_draws: int = 128
    seed: int = 0
    blocks: tuple[str, ...] = ()

    def __post_init__(self):
        for name, low in (
            ("query_replicates", 2),
            ("nested_replicates", 0),
            ("curve_points", 2),
            ("budget_levels", 0),
            ("realized_draws", 0),
            ("seed", 0),
        ):
            if getattr(self, name) < low:
                raise ValueError(f"{name} must be >= {low}, got {getattr(self, name)}")
        if self.realized_draws == 1:
            raise ValueError("realized_draws must be 0 (off) or >= 2, got 1")


@dataclasses.dataclass(frozen=True)
class IntervalSettings:
    """The tail model's error in the reported interval, as standard deviations per unit of its
    two measured parts, added in quadrature to the sampling interval.

    Attributes:
      threshold_sd: per unit of threshold deviation (how far the prediction moves when the tail
        threshold keeps half or twice the excesses).
      prior_sd: per unit of the prior's term query by query (each query's largest move under
        a flatter and a steeper prior on the tail shape, `TailSettings.prior_spread`, combined
        over the queries as independent errors: `intervals.prior_spread`).
      shared_sd: per unit of the aggregate prior move (`Interval.prior_deviation`, how far the
        mean over the queries moves under those priors): the part of the shape's error the
        queries share. One pooled prior prices every query's tail beyond the sample's top, where
        a benchmark's bias sits, so that part does not shrink with the query count.

    A factor of 0 leaves its term out of the interval (each is still measured and
    reported: THRESHOLD SENSITIVE, PRIOR SENSITIVE). The defaults are chosen on the dev split
    for the default estimator: threshold_sd as the narrowest factor that held every dev draw
    (`benchmarks/interval_factors.py`; docs/validation.md, "The interval on dev and test");
    prior_sd as the smallest whose 40-query intervals cover 90% on dev real text
    (docs/validation.md, "The prior's term, query by query"); shared_sd as the smallest whose
    whole query sets cover 90% on dev real text (docs/validation.md, "The queries' shared prior
    term"). The plug-in `evt` has no prior
    term, so at these factors it reports its sampling interval alone (set `threshold_sd` to
    widen it).
    """

    threshold_sd: float = 0.0
    prior_sd: float = 1.5
    shared_sd: float = 0.2

    def __post_init__(self):
        for name in ("threshold_sd", "prior_sd", "shared_sd"):
            if not 0.0 <= getattr(self, name) < float("inf"):
                raise ValueError(f"{name} must be finite and >= 0, got {getattr(self, name)}")


@dataclasses.dataclass(frozen=True)
class PredictSettings:
    """Everything a prediction from a sampled-scores file needs besides the file and N.

    Attributes:
      estimator: a name of `tailaware.tail.estimators.ESTIMATORS`.
      k: the metrics' cut-off (mAP@k).
      tail: the estimators' `TailSettings`.
      protocol: the `ProtocolSettings`.
      intervals: the `IntervalSettings`.
      metrics: names of `tailaware.core.metrics.METRICS` predicted with their intervals and
        curves; mAP@k is always predicted (it leads the outputs).
    """

    estimator: str = "evt_averaged"
    k: int = 1000
    tail: TailSettings = TailSettings()
    protocol: ProtocolSettings = ProtocolSettings()
    intervals: IntervalSettings = IntervalSettings()
    metrics: tuple[str, ...] = ("map", "recall")

    def __post_init__(self):
        if self.k < 1:
            raise ValueError(f"k must be >= 1, got {self.k}")
        for name in self.metrics:
            _metrics().get(name)

    def metric_list(self) -> "tuple[core_metrics.Metric, ...]":
        """Returns the metrics to predict: mAP first, then the others in the given order."""
        names = dict.fromkeys(("map", *self.metrics))
        return tuple(_metrics().METRICS[n] for n in names)


def _metrics():
    """Returns `tailaware.core.metrics`, imported on first use: the configs import these settings,
    and the `tailaware` command logs its first line before JAX's import (which it brings)."""
    return importlib.import_module("tailaware.core.metrics")
