"""Identifiability floors: errors no estimator can avoid on two laws whose samples agree.

Take a benchmark A and another, B, such that for every query q the sample the estimator sees
has the same law under both except with probability at most TV_q, while the truth moves by
gap_q = E[AP_B] - E[AP_A] >= 0. An estimator whose prediction for q depends only on q's sample,
positives, N and k, with AP in [0, 1], moves its expected prediction by at most TV_q, so the
bias of its mAP@k moves by at least mean_q (gap_q - TV_q), and

    max(|bias_A|, |bias_B|) >= mean_q max(0, max over cuts (gap_q - TV_q)) / 2    (`floor`)

(each query's B chosen to make its term largest; "no change", gap = TV = 0, is always allowed).
The bound holds for per-query estimators; one that pools queries (tailaware's empirical-Bayes
shape prior is fitted to all of a benchmark's queries) sees every query's cut at once, and only
the per-query part of it is covered.

B here cuts each query's law *lower*, which works for any law and for a fixed gallery:

- a law with survival G: B = A conditioned on a score <= t, p = G(t); a positive of hardness x
  gets (x - p) / (1 - p) below the cut and 0 above it (`cut_below`; in survival space the cut
  is the same for every family). S iid scores from A, given that none lands above t, *are* S iid
  scores from B, so TV = 1 - (1 - p)^S exactly (`hit_probability(p, S)`);
- a fixed gallery sampled by id hash (each id kept with probability f): B moves the query's m
  highest-scoring distractors below every positive and every other distractor, so N, the ids
  and the sample's size are unchanged and each positive's count becomes max(K - m, 0)
  (`cut_counts`; the other instances' positives, always indexed, stay). The two galleries give
  the same sample of that query whenever none of the m moved ids is drawn, so TV <= 1 -
  (1 - f)^m (`hit_probability(f, m)`; the bound suffices for the floor). The estimand is B's
  realized mAP@k, as the validation's is A's.

Shapes: Q queries, P positive slots, C cuts.
"""

import numpy as np

from tailaware.core import metrics
from tailaware.io.scores import SCORE_BOUND, SampledScores, make_scores
from tailaware.protocol import validation
from tailaware.sim import simulate

# Cuts as m, the distractors above the cut (a law's expected count N p, or, rounded down, a
# fixed gallery's count): 1% apart from 0.01 to 2^15, where a 0.05% sample hits them with
# probability 1 - e^-16 (and gap - TV <= 1 - TV). Integers are all there up to ~100; the floor
# moves by < 1e-4 on a grid twice as fine.
CUTS = np.geomspace(0.01, 2.0**15, 1500)


def hit_probability(p, n):
    """Returns 1 - (1 - p)^n: the chance that n independent trials of probability p hit at
    least once (the TV of the law cut lower for n = S draws and p the mass above the cut; the
    fixed gallery's TV bound for n = m moved distractors and p = f). Broadcasts; float64."""
    p, n = np.asarray(p, np.float64), np.asarray(n, np.float64)
    return -np.expm1(n * np.log1p(-p))


def margins(gaps, tvs) -> np.ndarray:
    """Returns [Q]: each query's largest gap - TV over the cuts [C, Q] (broadcast), at least 0."""
    return np.maximum(np.max(np.asarray(gaps) - np.asarray(tvs), axis=0), 0.0)


def best_cuts(gaps, tvs, cuts) -> np.ndarray:
    """Returns [Q]: the cut of `cuts` [C] at each query's margin (`margins`), 0 where none
    helps (the first of equal ones)."""
    diff = np.asarray(gaps) - np.asarray(tvs)
    i = np.argmax(diff, axis=0)
    return np.where(np.take_along_axis(diff, i[None], 0)[0] > 0, np.asarray(cuts)[i], 0)


def floor(gaps, tvs) -> float:
    """Returns the floor on max(|bias_A|, |bias_B|): the mean of `margins` over queries, / 2."""
    return float(margins(gaps, tvs).mean() / 2)


def cut_below(x, p):
    """Returns the hardness [..., P] of positives of hardness `x` against the law cut lower,
    conditioned on a score <= t where p = G(t): max(x - p, 0) / (1 - p) (order kept)."""
    return np.maximum(np.asarray(x, np.float64) - p, 0.0) / (1.0 - p)


def cut_counts(counts, m):
    """Returns the distractor counts [Q, P] above each positive once the query's m highest
    distractors are moved below everything: max(K - m, 0), -1 kept at padding."""
    counts = np.asarray(counts)
    return np.where(counts >= 0, np.maximum(counts - m, 0), -1)


def law_gaps(bench: simulate.Benchmark, k: int, cuts=CUTS) -> tuple:
    """Returns (E[AP@k] [Q] of A, gaps [C, Q], masses p [C]) for the cuts m of `cuts` with at
    most N / 2 distractors above them, p = m / N (E[AP] as the validation's Poisson oracle,
    `validation.expected_aps`)."""
    masses = np.asarray(cuts, np.float64)
    masses = masses[masses <= bench.n_pool / 2] / bench.n_pool
    ap = validation.expected_aps(bench, k)
    gaps = [
        validation.expected_aps(bench._replace(x=cut_below(bench.x, p)), k) - ap for p in masses
    ]
    return ap, np.stack(gaps), masses


def gallery_aps(counts, fixed, k: int, m=0) -> np.ndarray:
    """Returns the realized AP@k [Q] of a gallery with each query's m highest distractors moved
    below everything (m: a scalar or [Q, 1]); `counts` [Q, P] distractors above each positive
    (-1 at padding), `fixed` [Q, P] the always-indexed non-relevant items above each."""
    counts = np.asarray(counts)
    mask = counts >= 0
    total = np.where(mask, cut_counts(counts, m) + fixed, -1)
    return np.asarray(metrics.ap_at_k_from_counts(total, mask, k))  # numpy in, numpy out


def gallery_gaps(counts, fixed, k: int, cuts=CUTS) -> tuple:
    """Returns (realized AP@k [Q] of the gallery, gaps [C, Q], m [C]) for the integer cuts of
    `cuts` up to the largest count (`gallery_aps`)."""
    moved = np.unique(np.floor(np.asarray(cuts))).astype(np.int64)
    moved = moved[moved <= max(int(np.max(counts)), 0)]
    ap = gallery_aps(counts, fixed, k)
    return ap, np.stack([gallery_aps(counts, fixed, k, m) - ap for m in moved]), moved


def cut_sample(sample: SampledScores, top, m) -> SampledScores:
    """Returns the sample the lower-cut gallery gives for the same ids: each query's sampled
    distractors among its m highest (`top` [Q, M'], the full gallery's highest scores,
    descending; m [Q] < M') moved to -SCORE_BOUND, below every score a file holds, and the
    positives' sampled counts lowered by those that were above them.

    Raises:
      ValueError: when the sample's stored scores are not all of it (S > M), or a query's cut
        falls on a tie of the gallery's scores.
    """
    if sample.n_sample > sample.tail_scores.shape[1]:
        raise ValueError(f"S = {sample.n_sample} > M: the stored scores are not the whole sample")
    top, m = np.asarray(top, np.float64), np.asarray(m, np.int64)
    rows = np.arange(len(m))
    cut = np.where(m > 0, top[rows, np.maximum(m - 1, 0)], np.inf)  # the m-th highest
    if (top[rows, m] >= cut).any():
        raise ValueError("a cut falls on a tie of the gallery's scores")
    tail = sample.tail_scores.astype(np.float64)
    moved = tail >= cut[:, None]
    above = (tail[:, None, :] > sample.pos_scores[:, :, None]) & moved[:, None, :]
    counts = np.where(sample.mask, sample.pos_counts - above.sum(axis=2), -1)
    tail = -np.sort(-np.where(moved, -SCORE_BOUND, tail), axis=1)  # above the -inf padding
    return make_scores(
        tail,
        sample.pos_scores,
        counts,
        sample.n_sample,
        fixed_counts=sample.fixed_counts,
        query_ids=sample.query_ids,
    )
