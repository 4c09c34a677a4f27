"""The typed results that travel between the layers (JSON only at the job boundary).

- `Hardness`: an estimator's per-positive hardness (and its posterior, reruns and prior terms),
  with its tail fits' diagnostics (`TailFit`), from `tailaware.tail` to the law and the
  protocol.
- `Prediction` (a `MetricPrediction` per metric, each with its `Interval` of `Bounds` and
  `Curve`; `Diagnostics` of `Budget` and `Drift`): predicted metrics, mAP@k first, from
  `tailaware.protocol` to the jobs, which write it as prediction.json
  (`tailaware.protocol.schema`, which alone writes JSON).
- `Report` (of `ReportValue`s): the official ILIAS report of a prediction or an exact
  evaluation (`tailaware.protocol.ilias_report`), in percent.
- `Comparison` (a `Paired` per metric): two systems compared on the same queries.

Shapes: Q queries, P positive slots (padded; `mask`), A atoms of a hardness posterior, F
threshold reruns, T other priors.
"""

from collections.abc import Iterator, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Generic, NamedTuple, SupportsFloat, TypeVar

import numpy as np

if TYPE_CHECKING:  # only for annotations: results stays importable without the metrics' jax
    import jax

    from tailaware.core.metrics import Metric

# A `TailFit`'s arrays: JAX arrays while traced (`tailaware.tail.evt`), numpy once fetched.
FitArray = TypeVar("FitArray", bound="np.ndarray | jax.Array")


class TailFit(NamedTuple, Generic[FitArray]):
    """Per-query diagnostics of a tail-aware estimate's GPD fits, each a [Q] array.

    The fit fields describe the maximum-likelihood GPD fit (`tailaware.tail.gpd.fit`) to the
    excesses over the threshold at the `threshold_quantile` of the kept scores, and its
    threshold stability; the estimate's fields say how the estimate used it; the posterior's
    are set by the averaged estimator (`evt_averaged`) alone.

    Attributes:
      u: the threshold, in score units.
      n_exceed: excesses over u.
      xi, sigma: the fitted shape (in [-1, 0]) and scale.
      endpoint: the fitted support's upper end in score units, u + sigma / -xi (inf at xi = 0).
      loglik: the maximised log-likelihood.
      at_xi0, at_xi_minus1: the fit sits on the xi = 0 (exponential) or xi = -1 (uniform) bound.
      converged: a proper optimum was found.
      xi_half, xi_double: xi refitted with half and twice the excesses.
      xi_se: xi's asymptotic standard error.
      stable: neither refit moves xi by more than 2 standard errors of the less precise fit
        (bounded score laws drift with the threshold by nature, so the check is no stricter).
      fitted: some stored score lies above u (else every positive keeps its count).
      share_tail_priced: the share of the query's positives the tail priced.
      share_beyond_endpoint: the share priced beyond the plug-in fit's endpoint.
      share_zero: the share priced a hardness of exactly 0 (0 for the averaged estimator).
      n_exceed_posterior: excesses over the averaged estimator's own default threshold (its
        `averaged_quantile`).
      n_exceed_selected: excesses over the threshold it selected (`evt.select_threshold`).
      ad: the Anderson-Darling statistic of its excesses at the default threshold.
      prior_mean, prior_sd: the benchmark's empirical-Bayes prior on xi, the same on every row
        (NaN under the tilt prior).
      newton_converged: every Newton solve behind the estimate's tail converged
        (`tailaware.tail.gpd.NewtonState`): the plug-in fit's refinement (`evt`), or the
        posterior's profile at every shape (`evt_averaged`).
    """

    u: FitArray
    n_exceed: FitArray
    xi: FitArray
    sigma: FitArray
    endpoint: FitArray
    loglik: FitArray
    at_xi0: FitArray
    at_xi_minus1: FitArray
    converged: FitArray
    xi_half: FitArray
    xi_double: FitArray
    xi_se: FitArray
    stable: FitArray
    fitted: FitArray | None = None
    share_tail_priced: FitArray | None = None
    share_beyond_endpoint: FitArray | None = None
    share_zero: FitArray | None = None
    n_exceed_posterior: FitArray | None = None
    n_exceed_selected: FitArray | None = None
    ad: FitArray | None = None
    prior_mean: FitArray | None = None
    prior_sd: FitArray | None = None
    newton_converged: FitArray | None = None

    def items(self) -> Iterator[tuple[str, FitArray]]:
        """Yields (name, [Q] array) of the fields that are set."""
        return ((k, v) for k, v in self._asdict().items() if v is not None)


class Hardness(NamedTuple):
    """Per-positive hardness with its provenance.

    Attributes:
      x: [Q, P] float64 hardness in [0, 1]; 0 at padding.
      mask: [Q, P] bool, real positives.
      tail_priced: [Q, P] bool, positives priced by a fitted tail rather than by the count.
      fit: the tail fits' per-query diagnostics (`TailFit`); None for an estimator without a
        tail, and for the reruns.
      atoms: None, or [Q, P, A] float64 atoms of a posterior over each positive's hardness
        (the law's predictions average over them, `law.expected_map`); `x` is then its mean.
      weights: [Q, A] atom weights (rows sum to 1) when `atoms` is set.
      reruns: the estimate rerun at other tail thresholds, when asked for
        (`tailaware.tail.evt.estimate`); empty otherwise.
      prior_weights: None, or [T, Q, A] the weights of `atoms` under other priors on the tail
        shape (`tailaware.tail.evt.prior_weights`), asked for with the reruns.
    """

    x: np.ndarray
    mask: np.ndarray
    tail_priced: np.ndarray
    fit: TailFit[np.ndarray] | None = None
    atoms: np.ndarray | None = None
    weights: np.ndarray | None = None
    reruns: tuple["Hardness", ...] = ()
    prior_weights: np.ndarray | None = None


class Bounds(NamedTuple):
    """One level's intervals, each (lo, hi) within the metric's range.

    Two questions, two intervals: what will the full evaluation print for these queries (the
    realized value at N: `reported`, the headline), and how good is the system on queries like
    these (`queries`: the same with the query bootstrap's term).

    Attributes:
      reported: the interval for these queries: the distractor sample's part widened by the
        tail model's own error (`Interval.sd_model`); the point alone when neither is measured.
      sampling: the sampling interval: `query` widened by the distractor sample's noise (nested
        bootstrap), or `query` itself without it.
      query: the query bootstrap's percentile interval.
      distractor: the distractor sample's part alone; None without a distractor term.
      queries: the interval over queries like these: `reported` widened on each side, in
        quadrature, by `query` (so it contains `reported`); None in a file written before there
        were two.
    """

    reported: tuple[float, float]
    sampling: tuple[float, float]
    query: tuple[float, float]
    distractor: tuple[float, float] | None = None
    queries: tuple[float, float] | None = None


class Interval(NamedTuple):
    """The reported uncertainty of a predicted metric (mAP@k, ...) at one gallery size.

    Attributes:
      method: "nested" (queries, distractor sample and refits) or "query" (queries alone).
      sd_query: sd of the query-bootstrap replicates.
      sd_distractor: the distractor sample's sd; None for a query interval.
      sd_combined: sd of the nested replicates (queries and distractors); None without them.
      threshold_deviation: how far the prediction moves when the tail threshold keeps half or
        twice the excesses (0 without a tail model).
      prior_deviation: how far it moves under a flatter or a steeper prior on the tail shape.
      sd_model: the tail model's error, the quadrature sum of threshold_sd x
        threshold_deviation, prior_sd x prior_spread and shared_sd x prior_deviation
        (`IntervalSettings`; prior_sd x prior_deviation in a file written before prior_spread
        was, and no shared part in one written before shared_sd).
      ci90, ci95: the `Bounds` at 90% and 95%.
      threshold_maps: the threshold reruns' values of the metric (half, twice the excesses), or
        None (the name is mAP@k's, kept in prediction.json).
      prior_maps: the prior reruns' values (flatter, steeper prior), or None.
      sd_realized: the sd of the realized value around the law's expectation on these queries
        (`tailaware.core.realization`): in the interval for these queries; 0 when not measured
        (and in a file written before it was).
      sd_subsample: the prediction's moves between the budget check's nested sub-samples,
        read as the sampling sd at S (`tailaware.protocol.budget.subsample_sd`): in the interval
        for these queries; 0 when not measured (and in a file written before it was).
      prior_spread: each query's move under the other priors, combined over the queries as
        independent errors (`intervals.prior_spread`); 0 when not measured (and in a file
        written before it was).
      distractor_replicates: [B] the nested bootstrap's distractor replicates of the value when
        its weights were drawn by distractor id (`nested.Nested.by_id`), else None: two
        predictions of one sample pair them (`comparison.sampling_correlation`).
    """

    method: str
    sd_query: float
    sd_distractor: float | None
    sd_combined: float | None
    threshold_deviation: float
    prior_deviation: float
    sd_model: float
    ci90: Bounds
    ci95: Bounds
    threshold_maps: tuple[float, ...] | None = None
    prior_maps: tuple[float, ...] | None = None
    sd_realized: float = 0.0
    sd_subsample: float = 0.0
    prior_spread: float = 0.0
    distractor_replicates: tuple[float, ...] | None = None


class Curve(NamedTuple):
    """A predicted metric@k over gallery sizes, with its 90% band.

    Attributes:
      n: [G] gallery sizes, ascending.
      values: [G] the predicted metric.
      ci90: [G] reported 90% intervals (lo, hi), for these queries (`Bounds.reported`).
      sd_distractor: [G] the distractor sample's sd at each size, or None (no nested bootstrap).
      ci90_queries: [G] the 90% intervals over queries like these (`Bounds.queries`), or None.
      sd_subsample: [G] the sub-samples' sd at each size (`Interval.sd_subsample`), or None.
    """

    n: tuple[float, ...]
    values: tuple[float, ...]
    ci90: tuple[tuple[float, float], ...]
    sd_distractor: tuple[float, ...] | None = None
    ci90_queries: tuple[tuple[float, float], ...] | None = None
    sd_subsample: tuple[float, ...] | None = None


class MetricPrediction(NamedTuple):
    """One metric (`tailaware.core.metrics.METRICS`) predicted, or measured, at the target N.

    Attributes:
      label: the key outputs report it under, e.g. "recall@1000", "map_at_r" (`Metric.label`).
      metric: its name in `tailaware.core.metrics.METRICS`, e.g. "recall".
      cutoff: its cut-off: the global k, or the name of its per-query one ("R", "1").
      value: the prediction (a fraction).
      per_query: [Q] each query's predicted value.
      interval: its reported uncertainty at N, or None (an exact evaluation).
      curve: the prediction over N = 1e3..1e9 with its band, or None.
    """

    label: str
    metric: str
    cutoff: int | str
    value: float
    per_query: np.ndarray
    interval: Interval | None = None
    curve: Curve | None = None

    @classmethod
    def of(
        cls,
        metric: "Metric",
        k: int,
        value: SupportsFloat,
        per_query: np.ndarray,
        interval: Interval | None = None,
        curve: Curve | None = None,
    ) -> "MetricPrediction":
        """Returns the entry of `metric` (a `core.metrics.Metric`) at the global cut-off `k`."""
        label, cutoff = metric.label(k), metric.cutoff_value(k)
        return cls(label, metric.name, cutoff, float(value), per_query, interval, curve)


class Budget(NamedTuple):
    """The sufficient-budget verdict (paper App. D): predictions from nested sub-samples.

    Attributes:
      converged: the last doubling moved the prediction by no more than the query noise.
      message: one line for the summary.
      checked: False when the sample was too small to halve (`reason` says why).
      sizes, predictions: the sub-sample sizes S / 2^L .. S and the prediction from each.
      last_change: the last doubling's move of the prediction.
      noise: the query noise it is held to.
      needed_sample: the sample the trend of the moves needs (None if converged or unknown).
      reason: why it was not checked.
    """

    converged: bool
    message: str
    checked: bool = True
    sizes: tuple[int, ...] = ()
    predictions: tuple[float, ...] = ()
    last_change: float | None = None
    noise: float | None = None
    needed_sample: int | None = None
    reason: str = ""


class Drift(NamedTuple):
    """The paired test of per-block predictions for a non-uniform sample (paper Sec. 4).

    Attributes:
      checked: whether it ran (it needs >= 2 id-hash block files; `reason` otherwise).
      block_map: [B] each block's predicted mAP@k.
      chi2, dof, p_value: the test statistic, its degrees of freedom and p-value.
      flag: p < the test's level.
      max_deviation: the largest |block mAP - mean|.
      reason: why it did not run.
    """

    checked: bool
    block_map: tuple[float, ...] = ()
    chi2: float | None = None
    dof: int | None = None
    p_value: float | None = None
    flag: bool = False
    max_deviation: float | None = None
    reason: str = ""


class Diagnostics(NamedTuple):
    """What a reader of a prediction should know besides the number.

    Attributes:
      summary: warnings and notes, one line each, the prediction's own line last.
      budget: the sufficient-budget verdict (None from an artifact).
      drift: the drift test (None from an artifact).
      share_tail_priced: the share of positives the tail priced.
      share_threshold_raised: the share of queries whose tail threshold was raised.
      tail_counts: (observed, expected, sd): the tail-priced positives' summed sampled counts
        and what the fitted tails predict for them (`protocol.diagnostics.tail_counts`; None
        without a tail or a sample).
      fits_not_converged: the fitted queries whose tail fit's solver did not converge
        (`protocol.diagnostics.fits_not_converged`; None without a tail fit).
    """

    summary: tuple[str, ...]
    budget: Budget | None = None
    drift: Drift | None = None
    share_tail_priced: float | None = None
    share_threshold_raised: float | None = None
    tail_counts: tuple[float, float, float] | None = None
    fits_not_converged: int | None = None


class ReportValue(NamedTuple):
    """One value of the ILIAS report.

    Attributes:
      section: "map", "oracle", "scale", "clutter", "categories" or "subcategories".
      key: the value's key in its section: a group ("0-18"), a category, a label
        ("category-subcategory"); "" for map and oracle.
      value: percent.
      num_queries: the queries it averages (those whose instance has a positive in the group).
      num_instances: their instances.
      ci90: its 90% interval in percent for these queries, or None (an exact evaluation).
      ci90_queries: its 90% interval over queries like these, or None.
    """

    section: str
    key: str
    value: float
    num_queries: int
    num_instances: int
    ci90: tuple[float, float] | None = None
    ci90_queries: tuple[float, float] | None = None


class Report(NamedTuple):
    """The official ILIAS report (`evaluate(..., report=True)`), in percent.

    Attributes:
      values: map and oracle, then the scale, clutter, category and subcategory values, each
        section in its groups' order.
      query_ids: [Q] the queries (the official `queries`).
      aps: [Q] each query's AP@k in percent (the official `aps`).
      notes: what was skipped and why, one line each.
    """

    values: tuple[ReportValue, ...]
    query_ids: tuple[str, ...]
    aps: np.ndarray
    notes: tuple[str, ...] = ()


# The headline metric's name: `Prediction.ap` is its entry at the global k.
MAP = "map"


class Prediction(NamedTuple):
    """Predicted (or exactly measured) metrics at gallery size N: what prediction.json holds.

    Attributes:
      estimator: the estimator's name; "exact" for an exact evaluation.
      n_target: N.
      n_sample: S, the sampled distractors it came from.
      k: the global cut-off.
      query_ids: [Q] or None.
      metrics: label -> `MetricPrediction` of every configured metric, mAP@k first (`MAP`).
      baselines: name -> mAP@k of the baselines from the same sample (evaluate-at-S, count,
        homogeneous, power-law and log-uniform curve fits), in the order they are reported.
      diagnostics: the summary and the checks, or None.
      report: the official ILIAS report (an ILIAS job's exact evaluation), or None.
      artifact: (path, metadata) of the hardness artifact it was predicted from, or None.
      queries: which query set an ILIAS job scored ("image" or "text"), or None.

    `ap`, and its views `map`, `per_query_ap`, `interval`, `curve`, read mAP@k's entry.
    """

    estimator: str
    n_target: int
    n_sample: int
    k: int
    query_ids: np.ndarray | None
    metrics: Mapping[str, MetricPrediction]
    baselines: Mapping[str, float] = MappingProxyType({})
    diagnostics: Diagnostics | None = None
    report: Report | None = None
    artifact: tuple[str, dict[str, Any]] | None = None
    queries: str | None = None

    @property
    def ap(self) -> MetricPrediction:
        """mAP@k's entry of `metrics` (the headline)."""
        return self.metrics[f"{MAP}@{int(self.k)}"]

    @property
    def map(self) -> float:
        """mAP@k (a fraction, not percent)."""
        return self.ap.value

    @property
    def per_query_ap(self) -> np.ndarray:
        """[Q] AP@k of every query."""
        return self.ap.per_query

    @property
    def interval(self) -> Interval | None:
        """mAP@k's reported uncertainty at N, or None (an exact evaluation)."""
        return self.ap.interval

    @property
    def curve(self) -> Curve | None:
        """mAP@k over N = 1e3..1e9, or None."""
        return self.ap.curve

    @property
    def share_tail_priced(self) -> float | None:
        """The share of positives the tail priced (`Diagnostics`; None without)."""
        return None if self.diagnostics is None else self.diagnostics.share_tail_priced


class Paired(NamedTuple):
    """One metric of two systems compared on the same queries at one N (A - B).

    Attributes:
      value_a, value_b: each system's predicted value.
      difference: mean per-query difference A - B.
      sd: its sd for these queries (both systems' distractor samples and tail models).
      ci90, ci95: its intervals for these queries, within [-1, 1].
      p_a_beats_b: the probability that A > B on these queries (normal, sd `sd`).
      resolvable_margin: the difference at which the 90% interval would just exclude 0.
      resolved: the 90% interval excludes 0.
      threshold_deviation, prior_deviation: how far A - B moves when both tails' thresholds or
        priors do (a shift shared by both cancels).
      sd_queries, ci90_queries, ci95_queries: the same over queries like these (the paired query
        bootstrap added); None in a file written before there were two.
      sampling_correlation: the correlation taken between the two systems' sampling errors
        (`comparison.sampling_correlation`; 0: independent).
    """

    value_a: float
    value_b: float
    difference: float
    sd: float
    ci90: tuple[float, float]
    ci95: tuple[float, float]
    p_a_beats_b: float
    resolvable_margin: float
    resolved: bool
    threshold_deviation: float = 0.0
    prior_deviation: float = 0.0
    sd_queries: float | None = None
    ci90_queries: tuple[float, float] | None = None
    ci95_queries: tuple[float, float] | None = None
    sampling_correlation: float = 0.0


class Comparison(NamedTuple):
    """A paired comparison of two systems on the same queries at one N and k (A - B).

    Attributes:
      n_target, k: where they are compared.
      metrics: label -> `Paired` of every metric both predictions carry, mAP@k first.

    `ap` is mAP@k's entry.
    """

    n_target: int
    k: int
    metrics: Mapping[str, Paired]

    @property
    def ap(self) -> Paired:
        """mAP@k's entry of `metrics`."""
        return self.metrics[f"{MAP}@{int(self.k)}"]
