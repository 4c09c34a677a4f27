"""How the tail-aware estimators read a sample and price beyond it: one frozen settings object.

Jobs build it from a config's `evt` block (`tailaware.jobs.config`); the numerics take it as an
argument (hashable, so jitted functions take it as a static argument) and never read a config or
a module global that someone else may have changed.
"""

import dataclasses
import math

from tailaware.tail import dequantize

PRIORS = ("tilt", "empirical_bayes")


@dataclasses.dataclass(frozen=True)
class TailSettings:
    """Settings of the tail-aware (EVT) hardness estimators (paper, Appendix B).

    Every default marked "chosen on dev" was chosen on the frozen dev split; its figures, and
    those of the alternatives, are in docs/validation.md, "Choosing the estimator on dev".

    Attributes:
      top_m: M, the sampled scores kept per query (the paper's 4,000).
      threshold_quantile: q, the tail threshold u sits at this quantile of the kept scores (the
        paper's 0.95): the plug-in `evt`, the fit diagnostics, and which positives the tail
        prices.
      min_count: a positive that fewer sampled distractors beat is priced by the fitted tail; the
        others keep their count K / S (the paper's 5).
      xi_tilt: the "tilt" prior over the GPD shape is proportional to exp(xi_tilt xi), a lean
        towards longer tails; unused by the default empirical-Bayes prior. Chosen on the
        simulator (docs/estimators.md, "The shape prior").
      prior_spread: the interval's prior term re-weights the posterior under the leans
        exp(-/+ prior_spread xi) times the prior in force: a flatter and a steeper prior.
      ad_critical: threshold selection: a threshold whose excesses have an Anderson-Darling A^2
        above this fails (about the 99.5th percentile of A^2 of exact GPD samples against their
        grid fit; tests/test_evt.py checks the false-alarm rate).
      tie_share: a query's kept scores with more than this share of ties are taken as rounded
        and spread over their rounding bins before the fit (`dequantize.spread_ties`; inf:
        never).
      xi_max: the averaged estimator's grid of shapes spans [-0.95, xi_max]; above 0 it admits
        tails heavier than exponential (`gpd.profile_in_xi_heavy`), which an unbiased fit of a
        near-exponential tail needs. Chosen on dev.
      prior: the averaged estimator's prior over the shape grid: "empirical_bayes" (a normal
        whose mean, in [-0.95, 0], and sd maximise the marginal likelihood of all the
        benchmark's queries' excesses, `evt.empirical_bayes_prior`) or "tilt" (exp(xi_tilt xi),
        one lean for every benchmark). Chosen on dev.
      averaged_quantile: the averaged estimator fits the excesses over this quantile instead of
        q: the pooled prior lets each query afford fewer, deeper excesses, nearer the tail it
        extrapolates into. Its threshold reruns and goodness-of-fit candidates scale with it.
        Chosen on dev.
      score_bound: the averaged estimator's tail is conditioned on scores at or below this bound
        (cosine similarities: 1; inf: the GPD's own support): a positive at s is priced
        P(s < D <= bound | the atom), renormalised (`gpd.log_survival_below`); at or above it,
        hardness 0. The fit ignores the bound. Chosen on dev.
      eb_shift: the empirical-Bayes prior's fitted mean moves this much towards longer tails
        before it weighs each query's shapes: the shape read at the threshold is shorter than the
        tail deeper in, where positives beyond the sample are priced (the penultimate effect and
        the shape's small-sample bias). The reported `prior_mean` is the fitted one. Chosen on
        dev.
    """

    top_m: int = 4000
    threshold_quantile: float = 0.95
    min_count: int = 5
    xi_tilt: float = 6.0
    prior_spread: float = 6.0
    ad_critical: float = 2.0
    tie_share: float = dequantize.TIE_SHARE
    xi_max: float = 0.5
    prior: str = "empirical_bayes"
    averaged_quantile: float = 0.975
    score_bound: float = 1.0
    eb_shift: float = 0.02

    def __post_init__(self) -> None:
        if self.top_m < 2:
            raise ValueError(f"top_m must be >= 2, got {self.top_m}")
        if not 0.0 < self.threshold_quantile < 1.0:
            raise ValueError(f"threshold_quantile must be in (0, 1), got {self.threshold_quantile}")
        if not 0.0 < self.averaged_quantile < 1.0:
            raise ValueError(f"averaged_quantile must be in (0, 1), got {self.averaged_quantile}")
        if self.min_count < 0:
            raise ValueError(f"min_count must be >= 0, got {self.min_count}")
        if not 0.0 <= self.xi_max <= 0.9:
            raise ValueError(f"xi_max must be in [0, 0.9], got {self.xi_max}")
        if not self.score_bound > 0:
            raise ValueError(f"score_bound must be > 0 (inf: unbounded), got {self.score_bound}")
        if self.prior not in PRIORS:
            raise ValueError(f"prior must be one of {PRIORS}, got {self.prior!r}")
        if not math.isfinite(self.xi_tilt):
            raise ValueError(f"xi_tilt must be finite, got {self.xi_tilt}")
        if not math.isfinite(self.eb_shift):
            raise ValueError(f"eb_shift must be finite, got {self.eb_shift}")
        if not 0.0 <= self.prior_spread < math.inf:
            raise ValueError(f"prior_spread must be finite and >= 0, got {self.prior_spread}")
        if not self.ad_critical > 0:
            raise ValueError(f"ad_critical must be > 0 (inf: never raise), got {self.ad_critical}")
        if not self.tie_share > 0:
            raise ValueError(f"tie_share must be > 0 (inf: never spread), got {self.tie_share}")


def averaged_share(settings: TailSettings) -> float:
    """Returns the averaged estimator's excess count as a share of the q-quantile's: (1 -
    `averaged_quantile`) / (1 - `threshold_quantile`)."""
    return (1.0 - settings.averaged_quantile) / (1.0 - settings.threshold_quantile)
