"""A related model's exact run as a control variate for a new model's sampled prediction.

Reference model A was run exactly over the gallery of N distractors: its count K_A of
distractors strictly above each positive is known (`io.reference_counts`). The new model B is
scored on a uniform sample of m = S of them, and A's scores of the same sampled items are free.
With c_B, c_A the sampled counts above a positive under B and A, the difference estimator

    D = K_A + (N / m) (c_B - c_A)

is unbiased for B's count K_B under uniform sampling (E[c_B - c_A] = (m / N)(K_B - K_A)), and
its variance is that of (N / m) sum_i (u_i - v_i) over the sampled items, u_i = 1[s_B,i > b],
v_i = 1[s_A,i > a]: small when A ranks the gallery as B does. Each metric of D is the realized
metric of those counts (`metrics.value_from_counts`, B's fixed counts added).

`correct` combines, per metric, today's prediction V_T (the configured estimator through the
law, what `prediction.predict` reports) with the difference estimator's V_D:

    V = V_T + lambda (V_D - V_T),

lambda in [0, 1] chosen per benchmark from the sample to minimise the estimated mean squared
error: (b^2 + var_T - cov) / (b^2 + var_T + var_D - 2 cov), with the variances and the
covariance from a joint bootstrap of the sampled items and b^2 today's squared bias, read off
V_T - V_D less its noise (clipped at 0). A reference as good as the target gives var_D = 0 and
lambda = 1 (the exact metric when A = B); a useless one, whose D noise matches or exceeds
today's error, gives lambda ~ 0 (today's prediction). Why the metric level and this form:
docs/estimators.md ("Correcting with a reference model's exact run"); the
PPI form (the default, `ReferenceSettings.form`) instead takes lambda times today's known error
on the reference, V_T^A - V_A, off V_T, lambda = Cov / Var of the joint replicates (PPI++),
shrunk to 0 where the replicates do not resolve that slope (`ppi_lambda`).
V_T^A runs under B's empirical-Bayes prior (in each replicate, that replicate's): the prior is a
grid choice that one sampled item can move, and where it moved for one model only, the two
errors parted (docs/validation.md, "Correcting with a reference model's exact run").

The joint bootstrap gives every sampled item one Poisson(1) weight per replicate, a hash of its
distractor id (`SampledScores.tail_ids`), so B's and A's files, scored on the same id-hash
sample, resample the same items without being joined: c_B and c_A move together, B's tail is
resampled with the same weights and the configured estimator rerun on it. Positives below
either model's M-th stored score resample only their stored part (their rank is far past any
k <= M N / S). The interval (fixed queries, lambda fixed) is the replicates' spread of the
corrected value: for the PPI form about the point itself (`ppi_sd`), with lambda times the
discordances the sample did not draw in quadrature (`discordance_sd`); for the difference form
about their mean.

Shapes: Q queries, P positive slots, M stored scores, R replicates.
"""

import dataclasses
from typing import NamedTuple, NoReturn

import numpy as np

from tailaware.core import evaluate, metrics
from tailaware.io import errors, reference_counts
from tailaware.io.reference_counts import ReferenceCounts
from tailaware.io.scores import SampledScores, count_above, load_scores
from tailaware.protocol import nested
from tailaware.protocol.settings import PredictSettings
from tailaware.tail import dequantize, estimators

_Z90 = 1.6448536269514722
# Positives ranked within this many times k by A give the discordance rate: deeper, in the bulk
# of the scores, a flip per item above is rarer (docs/validation.md, "Discordance the sample
# did not draw").
_DISCORDANCE_DEPTH = 20
FORMS = ("ppi", "difference")


@dataclasses.dataclass(frozen=True)
class ReferenceSettings:
    """The correction's settings.

    Attributes:
      replicates: joint bootstrap replicates (each reruns the configured estimator once per
        model).
      seed: the bootstrap's hash seed.
      form: "ppi" (today's estimator's known error on the reference, scaled by lambda, taken
        off today's prediction) or "difference" (the difference estimator's metric, mixed in
        by lambda); the module docstring.
    """

    replicates: int = 50
    seed: int = 0
    form: str = "ppi"

    def __post_init__(self):
        if self.replicates < 2:
            raise ValueError(f"replicates must be >= 2, got {self.replicates}")
        if self.form not in FORMS:
            raise ValueError(f"form must be one of {FORMS}, got {self.form!r}")


class MetricCorrection(NamedTuple):
    """One metric@k corrected by the reference.

    Attributes:
      label: e.g. "map@1000".
      value: the corrected prediction, V_T + lambda (V_D - V_T).
      uncorrected: V_T, today's prediction from the sample alone.
      difference: V_D, the difference estimator's metric (lambda = 1), bootstrap-bias-corrected.
      lam: lambda.
      sd: the joint bootstrap's sd of the corrected value (fixed queries); for the PPI form
        its root mean squared error (`ppi_sd`) and lambda times `discordance_sd`, in
        quadrature.
      ci90: value -/+ z sd, cut to [0, 1].
      sd_uncorrected, sd_difference: the replicates' sds of V_T and V_D.
      bias: V_T - V_D, today's estimated bias.
      per_query: [Q] the corrected per-query values (PPI form: not cut to [0, 1]).
      reference_error: form "ppi": today's estimator's error on the reference, V_T^A - V_A.
      exact, exact_per_query: the reference's exact value V_A and its [Q] per-query values:
        what `value` and `per_query` are compared against (`comparison.against_reference`).
    """

    label: str
    value: float
    uncorrected: float
    difference: float
    lam: float
    sd: float
    ci90: tuple[float, float]
    sd_uncorrected: float
    sd_difference: float
    bias: float
    per_query: np.ndarray
    reference_error: float = float("nan")
    exact: float = float("nan")
    exact_per_query: np.ndarray | None = None


class Correction(NamedTuple):
    """A prediction corrected by a reference's exact run: every metric (mAP@k first)."""

    metrics: dict
    n_distractors: int
    n_sample: int
    replicates: int
    share_paired: float  # positives at or above both models' M-th stored score


def check_pair(target: SampledScores, reference: SampledScores, *, source: str) -> None:
    """Checks that `reference` (read from `source`) holds A's scores of `target`'s sample.

    Raises:
      InputError: naming `source` and the field that does not match.
    """

    def fail(field: str, msg: str) -> NoReturn:
        raise errors.field_error(source, field, msg)

    if int(reference.n_sample) != int(target.n_sample):
        fail("n_sample", f"S = {reference.n_sample}, the target's sample has {target.n_sample}")
    for name, sc in (("target", target), ("reference", reference)):
        if sc.tail_ids is None:
            fail("tail_ids", f"the {name}'s sampled scores have no ids to pair items with")
    if target.query_ids is not None and (
        reference.query_ids is None
        or reference.query_ids.shape != target.query_ids.shape
        or (reference.query_ids != target.query_ids).any()
    ):
        fail("query_ids", "not the target's queries in their order")
    if reference.mask.shape != target.mask.shape or (reference.mask != target.mask).any():
        fail("pos_scores", "not the target's positive slots")


def poisson_weights(ids: np.ndarray, seed: int, replicate: int) -> np.ndarray:
    """Returns Poisson(1) weights [same shape] of distractor ids (0 at -1 padding): the nested
    bootstrap's weight of each id in that replicate (`nested.id_weights`), a hash of (seed,
    replicate, id), so every file holding an item gives it the same weight."""
    ids = np.asarray(ids, np.int64)
    key = nested.id_key(seed, replicate)
    w = np.asarray(nested.id_weights(key, *nested.id_halves(np.maximum(ids, 0).ravel())))
    return np.where(ids >= 0, w.reshape(ids.shape), 0).astype(np.int64)


def _stored_above(sc: SampledScores) -> np.ndarray:
    """Returns [Q, P] the stored tail scores strictly above each positive (0 at padding)."""
    return count_above(sc.tail_scores, np.where(sc.mask, sc.pos_scores, np.nan))


def _resampled_counts(sc: SampledScores, above: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Returns [Q, P] the counts with their stored part reweighted by `w` [Q, M]."""
    cum = np.concatenate([np.zeros((w.shape[0], 1), np.int64), np.cumsum(w - 1, axis=1)], axis=1)
    return np.where(sc.mask, sc.pos_counts + np.take_along_axis(cum, above, axis=1), -1)


def _resampled_tail(tail: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Returns [Q, M] each row's scores repeated w times, in order, cut or -inf padded to M."""
    q, m = tail.shape
    flat = np.cumsum(w.ravel())  # item i's copies end before flat[i]
    start = np.concatenate([[0], flat[m - 1 :: m][:-1]])  # copies before each row
    total = w.sum(axis=1)
    slot = start[:, None] + np.arange(m)[None, :]
    item = np.searchsorted(flat, slot, side="right")
    vals = tail.ravel()[np.minimum(item, q * m - 1)]
    return np.where(np.arange(m)[None, :] < total[:, None], vals, -np.inf).astype(np.float32)


def _difference_counts(target, reference, counts: ReferenceCounts, c_b, c_a) -> np.ndarray:
    """Returns [Q, P] int64 D = K_A + (N / m)(c_B - c_A), rounded, cut at 0, plus B's fixed
    counts; -1 at padding."""
    width = target.mask.shape[1]
    ratio = counts.n_distractors / float(target.n_sample)
    d = counts.counts[:, :width] + ratio * (c_b - c_a)
    total = np.rint(np.maximum(d, 0.0)).astype(np.int64) + target.fixed_counts
    return np.where(target.mask, total, -1)


def _realized(metric_list, total, mask, k) -> np.ndarray:
    """Returns [M, Q] every metric's realized value from counts (`metrics.value_from_counts`)."""
    return np.stack(
        [np.asarray(metrics.value_from_counts(m, total, mask, k), np.float64) for m in metric_list]
    )


def today(
    sc: SampledScores, settings: PredictSettings, n, metric_list, prior: np.ndarray | None = None
) -> np.ndarray:
    """Returns [M, Q] the configured estimator's predicted metrics at n: today's point, as
    `prediction.predict` reports it (the estimate under its own prior, sample-conditioned), or
    under another sample's empirical-Bayes `prior` (mean, sd)."""
    return _today(sc, settings, n, metric_list, prior)[0]


def _today(sc, settings, n, metric_list, prior=None) -> tuple[np.ndarray, np.ndarray | None]:
    """Returns `today`'s [M, Q] and the empirical-Bayes prior's (mean, sd) it ran under (None
    for an estimator without one)."""
    hardness = estimators.estimate(sc, settings.estimator, settings.tail, reruns=False, prior=prior)
    fit, eb = hardness.fit, None
    if fit is not None and fit.prior_mean is not None and fit.prior_sd is not None:
        eb = np.array([fit.prior_mean[0], fit.prior_sd[0]], np.float32)
        eb = eb if np.isfinite(eb).all() else None  # NaN under the tilt prior
    values, _ = evaluate.predicted_values(
        [evaluate.variant(hardness)],
        sc.mask,
        [float(n)],
        settings.k,
        sc.fixed_counts,
        sc,
        metric_list=metric_list,
    )
    return values[0, 0], eb


def choose_lambda(bias, var_t, var_d, cov) -> float:
    """Returns lambda in [0, 1] minimising the estimated MSE of V_T + lambda (V_D - V_T).

    `bias` = V_T - V_D; its own noise var_t + var_d - 2 cov is taken off its square (clipped at
    0) to estimate today's squared bias b^2; then lambda = (b^2 + var_t - cov) /
    (b^2 + var_t + var_d - 2 cov). A noiseless difference estimator (var_d = 0) gives 1.
    """
    noise = max(var_t + var_d - 2.0 * cov, 0.0)
    b2 = max(bias**2 - noise, 0.0)
    den = b2 + noise
    if var_d <= 0.0 or den <= 0.0:
        return 1.0
    return float(np.clip((b2 + var_t - cov) / den, 0.0, 1.0))


def ppi_lambda(t_b: np.ndarray, t_a: np.ndarray) -> float:
    """Returns PPI++'s lambda = Cov(V_T^B, V_T^A) / Var(V_T^A) over the joint replicates [R],
    cut to [0, 1] and shrunk by max(0, 1 - z^2 / t^2) (0 when A's replicates do not move).

    Cov / Var is how much of today's error on A carries over to B when the same sampled items
    move both (Angelopoulos et al. 2023, PPI++). t^2 = (R - 2) rho^2 / (1 - rho^2) is the
    squared t statistic of that slope (rho the replicates' correlation) and z the interval's
    90% quantile: a slope the replicates do not resolve at the interval's own level gives 0
    (today's estimate), a well resolved one is left as it is (a positive-part shrinkage, as
    James & Stein's, of one coefficient).
    """
    var_a, var_b = float(np.var(t_a, ddof=1)), float(np.var(t_b, ddof=1))
    if var_a <= 0.0 or var_b <= 0.0:
        return 0.0
    cov = float(np.cov(t_b, t_a)[0, 1])
    rho2 = min(cov**2 / (var_a * var_b), 1.0)
    if rho2 >= 1.0:
        return float(np.clip(cov / var_a, 0.0, 1.0))
    t2 = (len(t_a) - 2) * rho2 / (1.0 - rho2)
    shrink = max(1.0 - _Z90**2 / t2, 0.0) if t2 > 0.0 else 0.0
    return float(np.clip(cov / var_a, 0.0, 1.0)) * shrink


def ppi_sd(t_b: np.ndarray, t_a: np.ndarray, point_b: float, point_a: float, lam: float) -> float:
    """Returns the bootstrap's root mean squared error of the PPI form: the replicates [R] of
    V_T^B - lambda V_T^A about the point's own value, not about their mean.

    Their spread about their mean is the sampling noise alone. Their shift from the point, the
    bootstrap's estimate of the corrected value's bias (Efron & Tibshirani 1993, ch. 10),
    is the part of today's error that A does not share; it enters squared, as of unknown sign.
    """
    return float(np.sqrt(np.mean((t_b - lam * t_a - (point_b - lam * point_a)) ** 2)))


def discordance_sd(target, reference, counts: ReferenceCounts, metric_list, k: int) -> np.ndarray:
    """Returns [M] each metric's sd from the discordances that the sample did not draw.

    An item is discordant for a positive when it is above the positive under one model and not
    the other. Over the positives the sample pairs (each model's M-th stored score below the
    positive) and ranked within `_DISCORDANCE_DEPTH` k by A, the sampled discordances per
    sampled item above the positive, r = sum(c_B + c_A - 2 c_both) / sum((c_B + c_A) / 2),
    estimate the gallery's rate; K_B - K_A then has variance about r (K_A + 1) per positive
    (independent flips either way; + 1: the top positive's flips come from items below it).
    Through each metric's slope in one count at A's exact counts,
    h = V_q(K_A) - V_q(K_A + 1), the metric's variance is sum_q sum_p h^2 r (K_A + 1) / Q^2.
    A near copy of B ranks the top alike but for a few items the sample rarely draws; the
    bootstrap of the pair then barely moves, and this term is what its interval lacks.
    """
    mask = target.mask
    c_b, c_a = _stored_above(target), _stored_above(reference)
    paired = mask & (c_b == target.pos_counts) & (c_a == reference.pos_counts)
    q, m = target.tail_scores.shape
    # A's score of each of B's stored items (-inf where A did not store it: below A's M-th).
    key_a = np.where(reference.tail_ids >= 0, reference.tail_ids, -1).astype(np.int64)
    offset = (np.arange(q, dtype=np.int64) * (int(max(key_a.max(), 0)) + 2))[:, None]
    flat_a, flat_b = (key_a + 1 + offset).ravel(), (target.tail_ids + 1 + offset).ravel()
    order = np.argsort(flat_a, kind="stable")
    at = np.minimum(np.searchsorted(flat_a, flat_b, sorter=order), flat_a.size - 1)
    hit = (flat_a[order[at]] == flat_b) & (target.tail_ids.ravel() >= 0)
    a_of_b = np.where(hit, reference.tail_scores.ravel()[order[at]], -np.inf).reshape(q, m)
    pos_b = np.where(mask, target.pos_scores, np.inf)[:, :, None]
    pos_a = np.where(mask, reference.pos_scores, np.inf)[:, :, None]
    both = ((target.tail_scores[:, None, :] > pos_b) & (a_of_b[:, None, :] > pos_a)).sum(axis=2)
    k_a = counts.counts[:, : mask.shape[1]]
    near = paired & (k_a < _DISCORDANCE_DEPTH * k)
    exposure = 0.5 * float((c_b + c_a)[near].sum())
    if exposure <= 0.0:
        return np.zeros(len(metric_list))
    rate = float((c_b + c_a - 2 * both)[near].sum()) / exposure
    exact_a = np.where(mask, k_a + reference.fixed_counts, -1)
    base = _realized(metric_list, exact_a, mask, k)  # [M, Q]
    var = np.zeros(len(metric_list))
    for p in range(mask.shape[1]):
        moved = exact_a.copy()
        moved[:, p] = np.where(mask[:, p], moved[:, p] + 1, -1)
        h = base - _realized(metric_list, moved, mask, k)
        var += (h**2 * np.where(mask[:, p], rate * (k_a[:, p] + 1.0), 0.0)).sum(axis=1)
    return np.sqrt(var) / q


def correct(
    target: SampledScores,
    reference: SampledScores,
    counts: ReferenceCounts,
    settings: PredictSettings,
    ref_settings: ReferenceSettings = ReferenceSettings(),
    *,
    metric_list=None,
    cache: dict | None = None,
) -> Correction:
    """Returns every metric@k of `target` at N = `counts.n_distractors`, corrected by the
    reference's exact `counts` and its sampled scores `reference` of the same sample.

    Callers check the inputs first (`check_pair`, `reference_counts.check`). `cache`: a dict
    kept across calls with the same target, settings and seed (several references of one
    sample): today's point and replicates are computed once.
    """
    metric_list = settings.metric_list() if metric_list is None else tuple(metric_list)
    n, k, mask = counts.n_distractors, settings.k, target.mask
    ids_b, ids_a = target.tail_ids, reference.tail_ids
    if ids_b is None or ids_a is None:
        raise ValueError("both sampled scores need their tail ids to pair items (`check_pair`)")
    above_b, above_a = _stored_above(target), _stored_above(reference)
    paired = (
        mask
        & (above_b == np.where(mask, target.pos_counts, 0))
        & (above_a == np.where(mask, reference.pos_counts, 0))
    )
    c_b = np.where(mask, target.pos_counts, 0)
    c_a = np.where(mask, reference.pos_counts, 0)
    cache = {} if cache is None else cache
    if "today" not in cache:
        cache["today"] = _today(target, settings, n, metric_list)  # [M, Q], B's prior
    v_t, prior_t = cache["today"]
    v_d = _realized(metric_list, _difference_counts(target, reference, counts, c_b, c_a), mask, k)

    # Ties are spread once on the original tail (as the nested bootstrap does); the replicates'
    # repeated items are copies, not rounding.
    spread = dequantize.spread_ties(target.tail_scores, settings.tail.tie_share)
    no_spread = dataclasses.replace(
        settings, tail=dataclasses.replace(settings.tail, tie_share=float("inf"))
    )
    exact_a = np.where(mask, counts.counts[:, : mask.shape[1]] + reference.fixed_counts, -1)
    v_a = _realized(metric_list, exact_a, mask, k)  # A's exact metric
    ppi = ref_settings.form == "ppi"
    if ppi:  # today's estimator on A's sample under B's prior, so that its choice cancels
        v_ta = today(reference, settings, n, metric_list, prior_t)
        unseen = discordance_sd(target, reference, counts, metric_list, k)
        spread_a = dequantize.spread_ties(reference.tail_scores, settings.tail.tie_share)
    rep_t, rep_d, rep_ta = [], [], []
    for r in range(ref_settings.replicates):
        w_b = poisson_weights(ids_b, ref_settings.seed, r)
        w_a = poisson_weights(ids_a, ref_settings.seed, r)
        cb_r = _resampled_counts(target, above_b, w_b)
        ca_r = _resampled_counts(reference, above_a, w_a)
        if r not in cache:
            resampled = dataclasses.replace(
                target, tail_scores=_resampled_tail(spread, w_b), pos_counts=cb_r
            )
            cache[r] = _today(resampled, no_spread, n, metric_list)
        rep_t.append(cache[r][0])
        d_r = _difference_counts(
            target, reference, counts, np.maximum(cb_r, 0), np.maximum(ca_r, 0)
        )
        rep_d.append(_realized(metric_list, d_r, mask, k))
        if ppi:
            resampled_a = dataclasses.replace(
                reference, tail_scores=_resampled_tail(spread_a, w_a), pos_counts=ca_r
            )
            rep_ta.append(today(resampled_a, no_spread, n, metric_list, cache[r][1]))
    reps_t, reps_d = np.stack(rep_t), np.stack(rep_d)  # [R, M, Q]

    out = {}
    for i, metric in enumerate(metric_list):
        t_q, d_q = v_t[i], v_d[i] - (reps_d[:, i].mean(axis=0) - v_d[i])  # bias-corrected D
        t_r, d_r = reps_t[:, i].mean(axis=1), reps_d[:, i].mean(axis=1)
        cov = np.cov(t_r, d_r)
        bias = float(t_q.mean() - d_q.mean())
        ref_error = float("nan")
        if ppi:
            ta_r = np.stack(rep_ta)[:, i].mean(axis=1)
            lam = ppi_lambda(t_r, ta_r)
            error_q = v_ta[i] - v_a[i]  # today's error on A, known exactly
            ref_error = float(error_q.mean())
            # Not cut per query: a cut at 0 or 1 would bias the mean (only the mean is cut).
            per_query = t_q - lam * error_q
            sd = ppi_sd(t_r, ta_r, float(t_q.mean()), float(v_ta[i].mean()), lam)
            sd = float(np.hypot(sd, lam * unseen[i]))
        else:
            lam = choose_lambda(bias, cov[0, 0], cov[1, 1], cov[0, 1])
            per_query = np.clip(t_q + lam * (d_q - t_q), 0.0, 1.0)
            sd = float(np.std(t_r + lam * (d_r - t_r), ddof=1))
        value = float(np.clip(per_query.mean(), 0.0, 1.0))
        out[metric.label(k)] = MetricCorrection(
            label=metric.label(k),
            value=value,
            uncorrected=float(t_q.mean()),
            difference=float(d_q.mean()),
            lam=lam,
            sd=sd,
            ci90=(max(value - _Z90 * sd, 0.0), min(value + _Z90 * sd, 1.0)),
            sd_uncorrected=float(np.sqrt(cov[0, 0])),
            sd_difference=float(np.sqrt(cov[1, 1])),
            bias=bias,
            per_query=per_query,
            reference_error=ref_error,
            exact=float(v_a[i].mean()),
            exact_per_query=v_a[i],
        )
    return Correction(
        metrics=out,
        n_distractors=int(n),
        n_sample=int(target.n_sample),
        replicates=int(ref_settings.replicates),
        share_paired=float(paired.sum() / max(mask.sum(), 1)),
    )


class Inputs(NamedTuple):
    """A reference's files, read and checked against a target (`load_inputs`)."""

    scores: SampledScores
    counts: ReferenceCounts
    scores_path: str
    counts_path: str
    settings: ReferenceSettings


def load_inputs(
    counts_path: str,
    scores_path: str,
    target: SampledScores,
    *,
    k: int,
    n_target: int,
    settings: ReferenceSettings = ReferenceSettings(),
) -> Inputs:
    """Reads a reference's exact counts and its sampled scores of `target`'s sample and checks
    them against `target`, k and N (`n_target` must be the reference run's N).

    Raises:
      InputError: naming the file and the field that does not match.
    """
    counts = reference_counts.load(counts_path)
    reference_counts.check(counts, target, k=k, source=counts_path)
    if counts.n_distractors != int(n_target):
        raise errors.field_error(
            counts_path,
            "n_distractors",
            f"the run's N = {counts.n_distractors}, the prediction's n_target = {n_target}",
        )
    scores = load_scores(scores_path)
    check_pair(target, scores, source=scores_path)
    return Inputs(scores, counts, scores_path, counts_path, settings)


def summary(c: Correction, inputs: Inputs) -> str:
    """Returns the summary lines of a correction: the reference, and per metric lambda, the
    corrected and the uncorrected value."""
    lines = [
        f"REFERENCE {inputs.counts_path} (exact, N = {c.n_distractors:,}) with its scores of the "
        f"same sample {inputs.scores_path}: {c.share_paired:.0%} of positives paired, "
        f"{c.replicates} joint bootstrap replicates"
    ]
    for m in c.metrics.values():
        lines.append(
            f"  {m.label}: corrected {m.value:.4f} [{m.ci90[0]:.4f}, {m.ci90[1]:.4f}] "
            f"(lambda {m.lam:.2f}); uncorrected {m.uncorrected:.4f}, difference estimator "
            f"{m.difference:.4f}"
        )
    return "\n".join(lines)
