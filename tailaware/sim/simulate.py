"""A score-level simulator with exact ground truth at web scale (10^8 distractors, no 10^8 draws).

Each query q has a distractor score law on a bounded support with survival G_q(s) = P(score > s),
and positives of known population hardness x_qj = G_q(s_qj). Everything is done in survival
space: a distractor is a uniform U, and it outranks positive j exactly when U < x_j.

Laws (deliberately *not* generalized Pareto, so the EVT fit is tested away from its model):

- ``kumaraswamy``: s = lo + (e - lo) z with G(z) = (1 - z^a)^b; near the endpoint e this is a GPD
  with xi = -1/b only asymptotically (penultimate curvature at practical thresholds).
- ``truncnorm``: a normal law cut at e = mu + c sigma, c in [4.5, 7]: Gumbel-like (xi ~ 0) at the
  sample's threshold, turning into a uniform-like edge (xi = -1) only in the last decades.

Four more families probe the estimators away from the two above (`benchmarks/tail_families.py`):

- ``gpd``: an exact GPD tail from lo to the endpoint e, xi in [-0.8, -0.05] (partly shorter than
  the averaged estimator's prior allows);
- ``beta``: s = lo + (e - lo) z, z ~ Beta(alpha, beta) with beta in [1, 3] (a uniform-like edge at
  beta = 1);
- ``normal``: an untruncated Gaussian (sd 0.05-0.1; the mass above 1, < 1e-9, sits at 1), Gumbel
  domain: no endpoint, so its "immune" positives (placed as below) keep a tiny hardness;
- ``mixture``: a Gaussian bulk plus a 0.1% near-duplicate cluster 4-5.5 sd higher and 3-7 times
  narrower: a tail with a bump.

Hardness is heterogeneous and roughly power law: density ~ x^-alpha on [x_min, x_max] with a
per-query difficulty shift, plus a share of truly immune positives placed above the endpoint
(x = 0, or the law's own tiny survival there when it has no endpoint), as the paper measures
(alpha ~ 1.2, many near-immune).

One *draw* at sample fraction f = S / N:

1. the top M of the S sampled uniforms by exponential spacings, U_(i) = Gamma_i / Gamma_(S+1)
   with Gamma_(S+1) = Gamma_M + Gamma(S + 1 - M), mapped through G^-1 to the stored tail;
2. sampled counts c_j = #{sampled U < x_j}: read off the stored U's when x_j <= U_(M), else
   M plus nested binomials of the remaining S - M uniforms (iid on (U_(M), 1));
3. the full pool's counts K_j = c_j + nested binomials of the N - S unsampled uniforms.

So (sample, realized truth) has exactly the joint law of a uniform S-subset of an N-pool.
Repeated draws are independent pools sharing the benchmark (per-query laws and positives): for
bias, MAE and coverage, which are averages of per-draw quantities, this has the same expectation
as disjoint draws from one pool (only the draws' mutual correlation differs).

Shapes: Q queries, P positive slots (padded, sorted by ascending hardness), M stored tail scores.
"""

from typing import NamedTuple

import numpy as np
from scipy import special

from tailaware.io.scores import SampledScores, make_scores

FAMILIES = ("kumaraswamy", "truncnorm", "gpd", "beta", "normal", "mixture")
BOUNDED = ("kumaraswamy", "truncnorm", "gpd", "beta")  # families with an endpoint
MIXTURE_SHARE = 1e-3  # the near-duplicate cluster's share of the `mixture` family
# Hardness regimes (`make_benchmark` keyword overrides). "paper" is calibrated to the baselines'
# errors the paper measured on real 100M galleries at a 5% sample; "stress" puts half of all
# positives between 1e-8 and 1e-6, where only the tail model can price them, harsher than any
# gallery the paper reports. Their figures: docs/validation.md, "Validation against known truth".
REGIMES = {
    "paper": {"x_range": (2e-7, 0.1), "immune_share": 0.3},
    "stress": {},
}


class Benchmark(NamedTuple):
    """A simulated benchmark: per-query distractor laws and positives of known hardness.

    Attributes:
      family: the law family (one of `FAMILIES`).
      x: [Q, P] float64 population hardness, ascending per query; 0 at padding and for immune
        positives.
      mask: [Q, P] bool, real positives.
      pos_scores: [Q, P] float64 positive scores (NaN at padding).
      law: per-query law parameters, name -> [Q] float64.
      n_pool: N, the full distractor pool.
    """

    family: str
    x: np.ndarray
    mask: np.ndarray
    pos_scores: np.ndarray
    law: dict
    n_pool: int


class Draw(NamedTuple):
    """One uniform sample of the pool and the pool's realized truth.

    Attributes:
      scores: the `SampledScores` a user would have (S = round(f N)).
      truth_counts: [Q, P] int64 distractors of the full pool strictly above each positive
        (-1 at padding): the realized web-scale gallery.
    """

    scores: SampledScores
    truth_counts: np.ndarray


def inverse_survival(law: dict, family: str, u: np.ndarray) -> np.ndarray:
    """Returns the score s with G(s) = u, row-wise ([Q, ...] u against [Q] laws), float64."""
    u = np.clip(np.asarray(u, np.float64), 0.0, 1.0)
    col = lambda name: law[name].reshape((-1,) + (1,) * (u.ndim - 1))
    if family == "kumaraswamy":
        # G(z) = (1 - z^a)^b  =>  z = (1 - u^(1/b))^(1/a); -expm1 keeps u^(1/b) near 1 exact.
        z = (-np.expm1(np.log(np.maximum(u, 1e-300)) / col("b"))) ** (1.0 / col("a"))
        z = np.where(u <= 0.0, 1.0, z)
        return col("lo") + (col("e") - col("lo")) * z
    if family == "truncnorm":
        # Upper-tail normal probabilities avoid cancellation near the endpoint.
        q_e, q_lo = special.ndtr(-col("c")), special.ndtr(col("c_lo"))
        z = -special.ndtri(q_e + u * (q_lo - q_e))
        return col("mu") + col("sd") * z
    if family == "gpd":  # G(s) = ((e - s) / (e - lo))^(-1 / xi)
        return col("e") - (col("e") - col("lo")) * u ** (-col("xi"))
    if family == "beta":  # G(s) = I_{1 - z}(beta, alpha)
        return col("e") - (col("e") - col("lo")) * special.betaincinv(col("beta"), col("alpha"), u)
    if family == "normal":  # in log space: ndtri loses digits for u near 1e-12
        with np.errstate(divide="ignore"):
            return np.minimum(col("mu") - col("sd") * special.ndtri_exp(np.log(u)), 1.0)
    if family == "mixture":  # no closed form: bisection on log G (2^-70 of the bracket)
        lo = np.broadcast_to(col("mu") - 12.0 * col("sd"), u.shape).copy()
        hi = np.ones_like(u)
        with np.errstate(divide="ignore"):
            log_u = np.log(u)
        for _ in range(70):
            mid = 0.5 * (lo + hi)
            above = _mixture_log_survival(law, mid) > log_u
            lo, hi = np.where(above, mid, lo), np.where(above, hi, mid)
        return 0.5 * (lo + hi)
    raise ValueError(f"unknown family {family!r}; choose one of {FAMILIES}")


def _mixture_log_survival(law: dict, s: np.ndarray) -> np.ndarray:
    col = lambda name: law[name].reshape((-1,) + (1,) * (s.ndim - 1))
    bulk = np.log1p(-MIXTURE_SHARE) + special.log_ndtr(-(s - col("mu")) / col("sd"))
    dup = np.log(MIXTURE_SHARE) + special.log_ndtr(-(s - col("mu2")) / col("sd2"))
    return np.where(s >= 1.0, -np.inf, np.logaddexp(bulk, dup))


def survival(law: dict, family: str, s: np.ndarray) -> np.ndarray:
    """Returns G(s) = P(distractor score > s), row-wise, float64 (0 above the endpoint)."""
    s = np.asarray(s, np.float64)
    col = lambda name: law[name].reshape((-1,) + (1,) * (s.ndim - 1))
    if family == "kumaraswamy":
        z = np.clip((s - col("lo")) / (col("e") - col("lo")), 0.0, 1.0)
        return (-np.expm1(col("a") * np.log(np.maximum(z, 1e-300)))) ** col("b")
    if family == "truncnorm":
        z = np.clip((s - col("mu")) / col("sd"), -col("c_lo"), col("c"))
        q_e, q_lo = special.ndtr(-col("c")), special.ndtr(col("c_lo"))
        return (special.ndtr(-z) - q_e) / (q_lo - q_e)
    if family == "gpd":
        r = np.clip((col("e") - s) / (col("e") - col("lo")), 0.0, 1.0)
        return r ** (-1.0 / col("xi"))
    if family == "beta":
        r = np.clip((col("e") - s) / (col("e") - col("lo")), 0.0, 1.0)
        return special.betainc(col("beta"), col("alpha"), r)
    if family == "normal":
        return np.where(s >= 1.0, 0.0, np.exp(special.log_ndtr(-(s - col("mu")) / col("sd"))))
    if family == "mixture":
        return np.exp(_mixture_log_survival(law, s))
    raise ValueError(f"unknown family {family!r}; choose one of {FAMILIES}")


def _law(family: str, q: int, rng: np.random.Generator) -> dict:
    e = rng.uniform(0.55, 0.9, q)
    if family == "kumaraswamy":
        return dict(
            e=e,
            lo=np.full(q, -0.2),
            a=rng.uniform(2.0, 6.0, q),
            b=rng.uniform(2.0, 8.0, q),
        )
    if family == "truncnorm":
        c = rng.uniform(4.5, 7.0, q)
        sd = rng.uniform(0.05, 0.1, q)
        mu = e - c * sd
        return dict(e=e, mu=mu, sd=sd, c=c, c_lo=(mu + 1.0) / sd)
    if family == "gpd":
        return dict(e=e, lo=np.full(q, -0.2), xi=rng.uniform(-0.8, -0.05, q))
    if family == "beta":
        b = rng.uniform(1.0, 3.0, q)
        return dict(e=e, lo=np.full(q, -1.0), beta=b, alpha=b * rng.uniform(1.5, 4.0, q))
    # No endpoint: e only places the "immune" positives (4.5-7 sd above the top component).
    if family == "normal":
        mu, sd = rng.uniform(0.1, 0.4, q), rng.uniform(0.05, 0.1, q)
        return dict(mu=mu, sd=sd, e=np.minimum(mu + rng.uniform(4.5, 7.0, q) * sd, 0.999))
    if family == "mixture":
        mu, sd = rng.uniform(0.1, 0.3, q), rng.uniform(0.05, 0.08, q)
        mu2, sd2 = mu + rng.uniform(4.0, 5.5, q) * sd, sd * rng.uniform(0.15, 0.3, q)
        top = np.minimum(mu2 + rng.uniform(4.5, 7.0, q) * sd2, 0.999)
        return dict(mu=mu, sd=sd, mu2=mu2, sd2=sd2, e=top)
    raise ValueError(f"unknown family {family!r}; choose one of {FAMILIES}")


def make_benchmark(
    num_queries: int = 1200,
    n_pool: int = 100_000_000,
    family: str = "kumaraswamy",
    *,
    alpha: float = 1.2,
    x_range: tuple[float, float] = (3e-9, 0.1),
    difficulty_sd: float = 0.7,
    immune_share: float = 0.15,
    mean_positives: float = 4.0,
    max_positives: int = 10,
    seed: int = 0,
) -> Benchmark:
    """Returns a simulated benchmark.

    Args:
      num_queries: Q.
      n_pool: N, the full pool the truth is realized at.
      family: distractor law family, one of `FAMILIES`.
      alpha: power-law exponent of the hardness density x^-alpha (paper: ~1.2).
      x_range: (x_min, x_max) of the power law before the per-query shift.
      difficulty_sd: sd of a per-query shift of log10 x (some queries are harder throughout).
      immune_share: probability that a positive sits above its query's endpoint (x = 0).
      mean_positives: positives per query are 1 + Poisson(mean_positives - 1), capped.
      max_positives: P.
      seed: everything is a function of it.
    """
    rng = np.random.default_rng(seed)
    q, p = num_queries, max_positives
    law = _law(family, q, rng)
    n_pos = np.minimum(1 + rng.poisson(mean_positives - 1.0, q), p)
    mask = np.arange(p)[None, :] < n_pos[:, None]

    lo, hi = (np.log(v) for v in x_range)
    v = rng.uniform(size=(q, p))
    if np.isclose(alpha, 1.0):
        logx = lo + v * (hi - lo)
    else:  # inverse CDF of the density x^-alpha on [x_min, x_max], in logs
        a1 = 1.0 - alpha
        logx = np.log(np.exp(a1 * lo) + v * (np.exp(a1 * hi) - np.exp(a1 * lo))) / a1
    logx = logx + np.log(10.0) * difficulty_sd * rng.standard_normal((q, 1))
    x = np.minimum(np.exp(logx), 0.5)
    x = np.where(rng.uniform(size=(q, p)) < immune_share, 0.0, x)
    x = np.where(mask, x, np.inf)
    x = np.sort(x, axis=1)
    x = np.where(mask, x, 0.0)

    pos = inverse_survival(law, family, x)
    # Immune positives: strictly above the endpoint, at most a little beyond it.
    gap = rng.uniform(0.002, 0.08, (q, p)) * (1.0 - law["e"][:, None])
    pos = np.where(x == 0.0, law["e"][:, None] + gap, pos)
    pos = np.where(mask, pos, np.nan)
    bench = Benchmark(family, x, mask, pos, law, int(n_pool))
    # Their hardness is 0 above a real endpoint; a law without one keeps a tiny survival there.
    return bench if family in BOUNDED else with_law(bench, law)


def with_law(bench: Benchmark, law: dict) -> Benchmark:
    """Returns the benchmark's positives against other distractor laws (e.g. a curated source).

    Hardness is recomputed as G'(s_j) and positives re-sorted by it. Used to simulate a
    non-uniform (convenience) block whose distractors are harder than the pool's.
    """
    pos = np.where(bench.mask, bench.pos_scores, np.inf)
    x = np.where(bench.mask, survival(law, bench.family, pos), np.inf)
    order = np.argsort(x, axis=1, kind="stable")
    x = np.take_along_axis(x, order, axis=1)
    return bench._replace(
        law=law,
        x=np.where(bench.mask, x, 0.0),
        pos_scores=np.take_along_axis(bench.pos_scores, order, axis=1),
    )


def second_system(bench: Benchmark, seed: int, shift: float = 0.3, spread: float = 0.5):
    """Returns another system's benchmark on the same queries and positives (a paired study).

    Its hardness is the first's times a lognormal factor (log mean `shift`: harder on average
    when > 0; log sd `spread`), against distractor laws of its own (a different model scores
    the pool differently); immune positives stay immune.
    """
    rng = np.random.default_rng(seed)
    law = _law(bench.family, bench.x.shape[0], np.random.default_rng(seed))
    factor = np.exp(shift + spread * rng.standard_normal(bench.x.shape))
    x = np.where(bench.mask, np.minimum(bench.x * factor, 0.5), np.inf)
    x = np.where(bench.mask, np.sort(x, axis=1), 0.0)
    # Immune positives keep their place above the endpoint, relative to the room above it.
    e_a, e_b = bench.law["e"][:, None], law["e"][:, None]
    immune = e_b + (bench.pos_scores - e_a) / (1.0 - e_a) * (1.0 - e_b)
    pos = np.where(x > 0, inverse_survival(law, bench.family, x), immune)
    other = bench._replace(x=x, pos_scores=np.where(bench.mask, pos, np.nan), law=law)
    return other if bench.family in BOUNDED else with_law(other, law)


def _nested_binomial(rng, x, mask, n_total, *, start_count, start_lower):
    """Returns cumulative counts [Q, P] of n_total iid U(0,1) below each ascending x_j.

    Starts from `start_count` [Q] uniforms already known below `start_lower` [Q]; the remaining
    n_total - start_count are iid uniform on (start_lower, 1). Positives with x_j <= start_lower
    get 0 added (their count is the caller's business).
    """
    q, p = x.shape
    below = start_count.astype(np.int64).copy()
    lower = start_lower.astype(np.float64).copy()
    out = np.zeros((q, p), np.int64)
    for j in range(p):
        xj = x[:, j]
        step = mask[:, j] & (xj > lower)
        prob = np.where(step, (xj - lower) / np.maximum(1.0 - lower, 1e-300), 0.0)
        inc = rng.binomial(np.maximum(n_total - below, 0), np.clip(prob, 0.0, 1.0))
        below = below + np.where(step, inc, 0)
        lower = np.where(step, xj, lower)
        out[:, j] = below
    return out


def draw(bench: Benchmark, fraction: float, top_m: int = 4000, seed: int = 0) -> Draw:
    """Returns one uniform sample of S = round(fraction N) distractors and the realized truth."""
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"fraction must be in (0, 1], got {fraction}")
    rng = np.random.default_rng(seed)
    n, x, mask = bench.n_pool, bench.x, bench.mask
    q = x.shape[0]
    s = max(int(round(fraction * n)), 1)
    m = min(int(top_m), s)

    gam = np.cumsum(rng.standard_exponential((q, m)), axis=1)
    u = gam / (gam[:, -1] + rng.standard_gamma(s + 1 - m, q))[:, None]
    tail = inverse_survival(bench.law, bench.family, u).astype(np.float32)
    tail = -np.sort(-tail, axis=1)  # float32 rounding can tie neighbours; keep descending
    pos32 = np.where(mask, bench.pos_scores, np.nan).astype(np.float32)

    # Sampled counts: exact from the stored U's inside the tail, nested binomials beyond it.
    u_m = u[:, -1]
    in_tail = (u[:, None, :] < x[:, :, None]).sum(axis=2)
    beyond = _nested_binomial(rng, x, mask, s, start_count=np.full(q, m), start_lower=u_m)
    counts = np.where(x <= u_m[:, None], in_tail, beyond)
    # float32 rounding may move a positive across a neighbouring tail score: the stored file
    # must agree with itself (scores.py validates it), so recount what the user would see.
    counts = _recount(tail, pos32, mask, counts)

    unsampled = _nested_binomial(
        rng, x, mask, n - s, start_count=np.zeros(q, np.int64), start_lower=np.zeros(q)
    )
    truth = np.where(mask, counts + unsampled, -1)
    scores = make_scores(
        tail,
        pos32,
        np.where(mask, counts, -1),
        s,
        source=f"simulate.draw({bench.family}, f={fraction})",
    )
    return Draw(scores, truth)


def _recount(tail, pos, mask, counts):
    """Returns `counts` [Q, P] as a file of the stored `tail` holds them: recounted (strictly
    greater scores) for positives at or above the M-th stored score, and at least the stored
    scores above for the others (rounding can lift a stored score over a positive)."""
    covered = mask & (pos >= tail[:, -1:])
    seen = (tail[:, None, :] > pos[:, :, None]).sum(axis=2)
    return np.where(covered, seen, np.maximum(counts, seen))


def rounded(
    scores: SampledScores, dtype=np.float16, positives: bool = False, step: float = 0.0
) -> SampledScores:
    """Returns the sample as a file of rounded scores would hold it: the tail scores (and with
    `positives` the positives' scores) rounded to `dtype`, or to multiples of `step` when it is
    > 0; the counts recounted where the stored tail decides them."""

    def cut(a):
        if step > 0:
            return (np.round(np.asarray(a, np.float64) / step) * step).astype(np.float32)
        return np.asarray(a).astype(dtype).astype(np.float32)

    tail = cut(scores.tail_scores)
    pos = scores.pos_scores
    if positives:
        pos = np.where(scores.mask, cut(pos), np.nan)
    counts = _recount(tail, pos, scores.mask, scores.pos_counts)
    counts = np.where(scores.mask, counts, -1)
    return make_scores(
        tail,
        pos,
        counts,
        scores.n_sample,
        fixed_counts=scores.fixed_counts,
        query_ids=scores.query_ids,
    )
