"""The summary of a prediction: the warnings and notes a reader needs besides the number.

`summary` returns the lines of prediction.json's `diagnostics.summary`, in order (after
`reconciled`'s, counts reconciled with float32 ties on reading): a target smaller than the
sample (SUB-GALLERY), the budget verdict when the sample is too small, a tail that could not be
fitted (TAIL NOT FITTED), tail fits whose solver did not converge (FIT NOT CONVERGED), tails
fitted too low in the sample to extrapolate far (SHALLOW TAIL), tails that the tail-priced
positives' own sampled counts contradict (TAIL VS COUNTS), a prediction that moves with the tail
threshold or the prior on the tail shape beyond the query noise (THRESHOLD SENSITIVE, PRIOR
SENSITIVE), thresholds raised where the excesses are not GPD-shaped (THRESHOLD RAISED), a
non-uniform sample (DRIFT), and last the prediction with its interval.
"""

import numpy as np
from scipy import stats

from tailaware.core.results import Budget, Drift, Hardness, Interval, MetricPrediction

# Above this exceedance rate of the tail threshold (n_u / S) the summary warns (`shallow_tail`).
SHALLOW_RATE = 1e-3
# `tail_counts`' warning: the tail-priced positives' summed sampled counts off the tail's
# prediction by more than this factor (either way) and by more than `TAIL_COUNTS_Z` sds (z alone
# would warn on nearly every real-text draw). Chosen on dev, a margin above the ratios every dev
# draw shows (docs/validation.md, "The tail against the positives' counts").
TAIL_COUNTS_RATIO = 1.4
TAIL_COUNTS_Z = 3.0

# The model terms' warnings: (`Interval` field, name, what moves, what it means).
_SENSITIVE = (
    (
        "threshold_deviation",
        "THRESHOLD SENSITIVE",
        "when the tail threshold keeps half or twice the excesses",
        "the tail model is unsettled here: sample more distractors",
    ),
    (
        "prior_deviation",
        "PRIOR SENSITIVE",
        "under a flatter or a steeper prior on the tail shape",
        "the sample leaves the tails' shape beyond it to the prior: sample more distractors, or "
        "predict at a smaller N",
    ),
)


def sub_gallery(n_sample: int, n_target: int) -> tuple[str, ...]:
    """Returns a note when the target N is smaller than the sample S, else ().

    At N >= S the gallery contains the sample and the law conditions on its counts; below S
    there is no such gallery, and the law predicts a random N-item part of the sampled pool
    (counts K ~ Poisson(N x), `core.law.expected_map`).
    """
    if n_target >= n_sample:
        return ()
    return (
        f"SUB-GALLERY: N = {n_target:,} < S = {n_sample:,}: the prediction is the expected "
        "mAP@k of a random N-item sub-gallery of the sampled pool (counts K ~ Poisson(N x)), "
        "not of a gallery that contains the sample",
    )


def reconciled(count: int) -> tuple[str, ...]:
    """Returns the summary's first line when the sampled-scores file had counts reconciled with
    float32 ties on reading (`io.scores`), else ()."""
    if not count:
        return ()
    whose = "1 positive's count" if count == 1 else f"{count} positives' counts"
    return (
        f"RECONCILED: {whose} exceeded the stored tail scores strictly above by float32 ties "
        "only (counts computed at a higher precision than the stored scores); set to the strict "
        "rule on the stored scores",
    )


def tail_counts(
    hardness: Hardness, counts: np.ndarray, n_sample: int, min_count: int
) -> tuple[float, float, float]:
    """Returns (observed, expected, sd) of the summed sampled counts of the tail-priced positives.

    A positive is priced by the tail when fewer than c = `min_count` sampled distractors beat it,
    so given the tail its count K is Poisson(S x) conditioned on K < c, x drawn from the
    estimate's atoms (`Hardness.atoms`, each weighted by its posterior weight times P(K < c));
    `expected` and `sd` are the sum of those conditional means and the root of the summed
    variances, `observed` the sum of the counts [Q, P] (`SampledScores.pos_counts`). Fed the true
    hardness, the two agree within the noise on the simulator; a tail priced too heavy just beyond
    the sample's top scores expects more sampled outrankers than there are (a near-duplicate bump
    above a Gaussian bulk, fitted as a long tail: a tenth of them). (0, 0, 0) when the tail
    priced none.
    """
    priced = np.asarray(hardness.tail_priced, bool)
    if not priced.any():
        return 0.0, 0.0, 0.0
    if hardness.atoms is None:
        atoms, weights = np.asarray(hardness.x)[..., None], np.ones(priced.shape[:1] + (1,))
    else:
        atoms, weights = np.asarray(hardness.atoms), np.asarray(hardness.weights)
    qs, ps = np.nonzero(priced)
    lam = float(n_sample) * atoms[qs, ps, :]  # [n, A]
    ks = np.arange(min_count)
    pmf = stats.poisson.pmf(ks[:, None, None], lam[None])  # [c, n, A]
    below = pmf.sum(axis=0)
    w = weights[qs] * below
    w = w / np.maximum(w.sum(axis=1, keepdims=True), 1e-300)
    cond = pmf / np.maximum(below, 1e-300)[None]  # P(K = k | K < c) per atom
    mix = np.einsum("kna,na->kn", cond, w)  # [c, n]: the predictive of K given K < c
    mean = (ks[:, None] * mix).sum(axis=0)
    var = (ks[:, None] ** 2 * mix).sum(axis=0) - mean**2
    observed = float(np.asarray(counts)[qs, ps].sum())
    return observed, float(mean.sum()), float(np.sqrt(var.sum()))


def tail_counts_warning(observed: float, expected: float, sd: float) -> str:
    """Returns a warning when the tail-priced positives' sampled counts contradict the tail
    (`tail_counts`; `TAIL_COUNTS_RATIO`, `TAIL_COUNTS_Z`), else ""."""
    if expected <= 0 or sd <= 0:
        return ""
    ratio = observed / expected
    if max(ratio, 1.0 / max(ratio, 1e-12)) <= TAIL_COUNTS_RATIO:
        return ""
    if abs(observed - expected) <= TAIL_COUNTS_Z * sd:
        return ""
    side = "heavier" if ratio < 1 else "lighter"
    return (
        f"TAIL VS COUNTS: the tail-priced positives are beaten by {observed:,.0f} sampled "
        f"distractors in all, where the fitted tails predict {expected:,.1f} (sd {sd:.1f}): the "
        f"tails are {side} just above the sample's top scores than the positives' own counts say "
        "(e.g. a near-duplicate cluster fitted as a long tail), so their extrapolation is "
        "unreliable here: sample more distractors, or check the distractor scores"
    )


def fits_not_converged(hardness: Hardness) -> int | None:
    """Returns the number of fitted queries whose tail fit's Newton solves did not converge
    (`TailFit.newton_converged`, `tailaware.tail.gpd.NewtonState`); None without a tail fit (an
    estimator without a tail, or an artifact written before the field existed)."""
    fit = hardness.fit
    if fit is None or fit.newton_converged is None:
        return None
    fitted = np.ones_like(fit.newton_converged, bool) if fit.fitted is None else fit.fitted
    return int(np.sum(np.asarray(fitted, bool) & ~np.asarray(fit.newton_converged, bool)))


def shallow_tail(hardness: Hardness, n_sample: int, n_target: int) -> str:
    """Returns a warning when the tails are fitted too low in the sample to extrapolate far.

    The threshold's exceedance rate n_u / S (median over queries) above `SHALLOW_RATE` means
    the "tail" is the top tenth of a percent of the sample or more: a GPD there is a poor
    model of the decades beyond it (on the simulator, S = 50k for N = 10^8 errs by 0.03-0.1).
    """
    if hardness.fit is None or n_target <= n_sample:
        return ""
    rate = float(np.median(hardness.fit.n_exceed)) / float(n_sample)
    if rate <= SHALLOW_RATE:
        return ""
    return (
        f"SHALLOW TAIL: the tails are fitted to the top {rate:.2%} of the sample (median n_u / S) "
        f"and extrapolated to 1 / N = {1.0 / n_target:.0e}; predictions from thresholds this low "
        "are biased by several points on simulated laws: sample more distractors"
    )


def raised_thresholds(hardness: Hardness) -> tuple[float, str]:
    """Returns the share of queries whose tail threshold was raised, and a note when any was.

    `evt_averaged` raises a query's threshold where its excesses over the default one fail a
    goodness-of-fit test for the GPD (`evt.select_threshold`), e.g. a near-duplicate cluster far
    above the rest of the excesses.
    """
    fit = hardness.fit
    if fit is None or fit.n_exceed_selected is None:
        return 0.0, ""
    # Artifacts written before `n_exceed_posterior` existed compare with the q-quantile's count.
    default = fit.n_exceed if fit.n_exceed_posterior is None else fit.n_exceed_posterior
    raised = np.asarray(fit.n_exceed_selected) < np.asarray(default)
    if not raised.any():
        return 0.0, ""
    return float(raised.mean()), (
        f"THRESHOLD RAISED for {int(raised.sum())} of {raised.size} queries: their excesses over "
        "the default threshold are not GPD-shaped (e.g. a near-duplicate cluster above the rest); "
        "their tails are fitted to the top half or quarter"
    )


def model_sensitive(interval: Interval, k: int) -> list[str]:
    """Returns warnings when the prediction moves with the tail threshold or with the prior on
    the tail shape beyond query noise.

    The interval already includes the moves; the warnings say why it is wide and what would
    narrow it.
    """
    sd_q = interval.sd_query
    return [
        f"{name}: mAP@{k} moves by {getattr(interval, key):.4f} {how}, more than the query noise "
        f"(sd {sd_q:.4f}; the interval's model term: sd {interval.sd_model:.4f}): {why}"
        for key, name, how, why in _SENSITIVE
        if getattr(interval, key) > sd_q
    ]


def metric_line(label: str, point: float, interval: Interval | None, n_target: int) -> str:
    """Returns a metric's line of the summary: its prediction and both 90% intervals (none for
    an exact evaluation, `interval` None)."""
    if interval is None:
        return f"{label} at N = {n_target:,}: {point:.4f}"
    lo, hi = interval.ci90.reported
    line = f"{label} at N = {n_target:,}: {point:.4f} [{lo:.4f}, {hi:.4f}] for these queries"
    if interval.ci90.queries is not None:
        line += "; [{:.4f}, {:.4f}] over queries like these (90%)".format(*interval.ci90.queries)
    return line


def headline(point: float, interval: Interval, k: int, n_target: int) -> str:
    """Returns the summary's last line: the predicted mAP@k and its intervals, with their terms."""
    sd_d = "not measured" if interval.sd_distractor is None else f"{interval.sd_distractor:.4f}"
    return (
        metric_line(f"mAP@{k}", point, interval, n_target) + f" (distractor sample sd {sd_d}; "
        f"the tail model's error sd {interval.sd_model:.4f}: it moves by "
        f"{interval.threshold_deviation:.4f} with its threshold and by "
        f"{interval.prior_deviation:.4f} with the prior on its shape, "
        f"{interval.prior_spread:.4f} query by query; queries sd "
        f"{interval.sd_query:.4f})"
    )


def summary(
    point: float,
    interval: Interval,
    hardness: Hardness,
    *,
    budget: Budget,
    drift: Drift,
    k: int,
    n_sample: int,
    n_target: int,
    checked: tuple[float, float, float] | None = None,
    others: tuple[MetricPrediction, ...] = (),
) -> tuple[tuple[str, ...], float]:
    """Returns (the summary lines, the share of queries whose threshold was raised).

    `checked`: the tail against the tail-priced positives' counts, `tail_counts`' (observed,
    expected, sd); None leaves the check out (no tail, or no sample: from an artifact).
    `others`: the metrics besides mAP@k, one line each before the headline."""
    num_queries = hardness.mask.shape[0]
    lines = list(sub_gallery(n_sample, n_target))
    if not budget.converged:
        lines.append(budget.message)
    fitted = None if hardness.fit is None else hardness.fit.fitted  # tail-aware estimators only
    unfitted = 0 if fitted is None else int(np.sum(~fitted))
    if unfitted:
        lines.append(
            f"TAIL NOT FITTED for {unfitted} of {num_queries} queries (no stored score "
            "above the threshold: ties or too few scores); their positives are priced by counts"
        )
    not_converged = fits_not_converged(hardness)
    if not_converged:
        lines.append(
            f"FIT NOT CONVERGED for {not_converged} of {num_queries} queries: a Newton solve of "
            "their tail fit ran out of steps before it met its tolerance, so their tails, and "
            "the prediction, may be off: check their scores (e.g. a pathological tail)"
        )
    shallow = shallow_tail(hardness, n_sample, n_target)
    if shallow:
        lines.append(shallow)
    misfit = "" if checked is None else tail_counts_warning(*checked)
    if misfit:
        lines.append(misfit)
    lines += model_sensitive(interval, k)
    raised, note = raised_thresholds(hardness)
    if note:
        lines.append(note)
    if drift.flag:
        lines.append(
            f"DRIFT: block predictions differ beyond sampling noise (p = {drift.p_value:.1e}); "
            "the sample is not uniform, the law's prediction is not reliable"
        )
    lines += [metric_line(m.label, m.value, m.interval, n_target) for m in others]
    lines.append(headline(point, interval, k, n_target))
    return tuple(lines), raised
