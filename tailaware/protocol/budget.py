"""Is the sample big enough, and is it uniform? Sub-sample convergence and block drift.

Sufficient budget (paper App. D): predict from nested sub-samples S/8, S/4, S/2 and S of the
sample; the budget suffices when the last doubling moved the prediction by no more than the
query-sampling noise. Otherwise the trend of the successive moves (roughly geometric: each
doubling resolves a further slice of the tail) says how many more doublings it needs.

Drift (paper Sec. 4): the law assumes a uniform random sample. Split the sample into disjoint
blocks by id hash (`sampling.hash_block`; each block of a uniform sample is itself uniform),
predict per block, and test whether the block predictions differ by more than sampling noise.
The queries are shared, so the test is paired: for block b the per-query deviation
d_qb = AP_qb - mean_b' AP_qb' has mean 0 without drift, and
chi2 = sum_b mean_q(d_qb)^2 / (var_q(d_qb) / Q) is ~ chi2(B - 1) (the B deviations sum to 0).
A sample that is uniform *within* itself but not of the pool (a curated list such as
mini-ILIAS) looks consistent across its own blocks: only the ids can reveal it
(`hash_membership`).

The same moves give the interval a term (`subsample_sd`): a halving from S' to S'/2 moves the
prediction by its sampling noise at S'/2 (variance about 2 var(S') - var(S') = var(S') for
nested samples, var(S') ~ 2^i var(S) for the i-th halving from the top) plus the drift of
the tail's extrapolation with the sample size, which no resampling of one sample sees.

Sub-samples are made by thinning: each sampled distractor is kept independently with
probability p, which is a uniform sub-sample (binomial, not fixed size) of the uniform sample.
"""

import dataclasses
import math
from collections.abc import Sequence

import numpy as np
from scipy import stats

from tailaware.core import sampling
from tailaware.core.results import Budget, Drift
from tailaware.io.errors import InputError
from tailaware.io.scores import SampledScores, count_above, make_scores

# The smallest sample S whose 90% interval held the truth on dev; below it the interval is not
# established and a job that draws the sample itself refuses (docs/validation.md, "The
# smallest sample").
MIN_SAMPLE = 10_000


def require_sample(fraction: float, n_distractors: int, min_sample: int = MIN_SAMPLE) -> None:
    """Raises the one-line `InputError` naming the smallest fraction that samples `min_sample`
    distractors when `fraction` of `n_distractors` samples fewer (an exact run, fraction 1,
    needs no interval and passes).

    Raises:
      InputError: names `--config.sample_fraction`, the sample it expects, and the fraction
        that reaches `min_sample` (or that no fraction does: too few distractors).
    """
    expected = fraction * n_distractors
    if fraction >= 1.0 or expected >= min_sample:
        return
    flag = f"--config.sample_fraction={fraction:g}"
    why = (
        f"samples ~{expected:,.0f} of {n_distractors:,} distractors; the interval's coverage "
        f"is established from S = {min_sample:,} sampled distractors on (docs/validation.md)"
    )
    need = _raise_to(min_sample / n_distractors)
    raise InputError(f"{flag}: {why}; {need}, or set --config.min_sample=0 to predict anyway")


def require_census_sample(
    fraction: float,
    inclusion: float,
    n_census: int,
    n_distractors: int,
    census_share: float,
    min_sample: int = MIN_SAMPLE,
) -> None:
    """Raises the one-line `InputError` of `require_sample` for a census design whose sample of
    the whole gallery, the one its tail is fitted to (the rest hashed at `inclusion` and the
    census sampled systematically at that rate), holds fewer than `min_sample` distractors: the
    floor holds for the sample the estimator reads, not for the budget the census shares.

    The fraction it names reaches the floor whatever the census takes, up to `census_share` of
    the budget (the rest's rate is then at least (1 - census_share) x the fraction), and with a
    census of the same size (a fixed depth).
    """
    expected = inclusion * n_distractors
    if expected >= min_sample:
        return
    flag = f"--config.sample_fraction={fraction:g} with --config.proxy"
    why = (
        f"the census takes {n_census:,} of the ~{fraction * n_distractors:,.0f} embedded "
        f"distractors and the rest is sampled at {inclusion:.4g}, so the tail is fitted to "
        f"~{expected:,.0f} of {n_distractors:,}; the interval's coverage is established from "
        f"S = {min_sample:,} sampled distractors on (docs/validation.md)"
    )
    n, c = float(n_distractors), float(n_census)
    least = max(min_sample / ((1.0 - census_share) * n), (c + min_sample * (n - c) / n) / n)
    raise InputError(
        f"{flag}: {why}; {_raise_to(least)} or shrink the census (--config.census_share, "
        "--config.census_depth), or set --config.min_sample=0 to predict anyway"
    )


def _raise_to(least: float) -> str:
    """Returns the advice for a sample below the floor: the smallest fraction `least` that
    reaches it, rounded up to two significant digits, or an exact run where none below 1 does."""
    if least > 1.0:
        return "use 1.0 (exact)"
    scale = 10.0 ** (1 - math.floor(math.log10(least)))
    return f"raise it to at least {math.ceil(least * scale - 1e-9) / scale:g}"


def thin(scores: SampledScores, p: float, rng: np.random.Generator) -> SampledScores:
    """Returns a uniform sub-sample keeping each sampled distractor with probability p.

    A file that names its distractors (`tail_ids`) is thinned as the gallery would be: one coin
    per distractor, shared by every query that stores it (a sub-sample of one sample serves all
    queries, and its errors are correlated across them as the sample's are); a census design's
    rows also hold their own census items, so its S' is S times the kept share. Without ids each
    stored score gets its own coin. A positive's count is the kept stored scores above it plus
    a nested binomial of its unstored ones (counts of the positives sorted by count grow by
    binomial increments, so they stay consistent with each other). The stored width shrinks to
    the fewest kept scores of any query so that every row is complete.
    """
    if not 0.0 < p <= 1.0:
        raise ValueError(f"keep probability must be in (0, 1], got {p}")
    tail, mask = scores.tail_scores, scores.mask
    finite = np.isfinite(tail)
    n_stored = finite.sum(axis=1)
    if scores.tail_ids is None:
        keep = finite & (rng.uniform(size=tail.shape) < p)
        # S' is one number for all rows, but each row keeps its own stored scores by its own
        # coins (rows are different distractors' scores); row 0's total stands for all, off by
        # ~sqrt(M p (1 - p)) distractors in the others, negligible against S'.
        s_new = int(keep[0].sum() + rng.binomial(scores.n_sample - int(n_stored[0]), p))
    else:
        distinct, index = np.unique(scores.tail_ids[finite], return_inverse=True)
        coin = rng.uniform(size=distinct.size) < p
        keep = np.zeros_like(finite)
        keep[finite] = coin[index]
        if scores.depleted is None:
            unstored = max(int(scores.n_sample) - int(distinct.size), 0)  # in no query's row
            s_new = int(coin.sum() + rng.binomial(unstored, p))
        else:
            # A census design's rows also hold their own census items (`census.fold`): the
            # rows share the rest's items, not those, so S' is S times the kept share.
            s_new = int(round(scores.n_sample * keep.sum() / max(int(finite.sum()), 1)))
    n_kept_stored = keep.sum(axis=1)

    order = np.argsort(~keep, axis=1, kind="stable")  # kept first, in descending score order
    kept_first = np.take_along_axis(keep, order, axis=1)
    new_tail = np.where(kept_first, np.take_along_axis(tail, order, axis=1), -np.inf)
    width = max(int(n_kept_stored.min()), 1)
    new_tail = new_tail[:, :width]
    new_ids = None
    if scores.tail_ids is not None:
        new_ids = np.where(kept_first, np.take_along_axis(scores.tail_ids, order, axis=1), -1)
        new_ids = new_ids[:, :width]

    # The stored scores above a positive are a prefix of its descending row: a sorted search
    # finds it, and the kept ones among them are a prefix sum of `keep` (memory [Q, P], not
    # [Q, P, M]).
    above_stored = count_above(tail, scores.pos_scores)
    kept_cum = np.concatenate([np.zeros((keep.shape[0], 1), np.int64), keep.cumsum(axis=1)], 1)
    kept_above = np.take_along_axis(kept_cum, above_stored, axis=1)
    rest = np.where(mask, scores.pos_counts - above_stored, 0)
    order_p = np.argsort(rest, axis=1, kind="stable")
    rest_sorted = np.take_along_axis(rest, order_p, axis=1)
    inc = np.diff(rest_sorted, axis=1, prepend=0)
    drawn = np.cumsum(rng.binomial(inc, p), axis=1)
    rest_new = np.empty_like(drawn)
    np.put_along_axis(rest_new, order_p, drawn, axis=1)
    counts = kept_above + rest_new
    # Positives at or above the new last stored score must count exactly the stored above them.
    last = new_tail[:, -1:]
    seen = count_above(new_tail, scores.pos_scores)
    counts = np.where(mask & (scores.pos_scores >= last), seen, counts)
    s_new = max(s_new, width)
    thinned = make_scores(
        new_tail,
        scores.pos_scores,
        np.where(mask, np.minimum(counts, s_new), -1),
        s_new,
        fixed_counts=np.where(mask, scores.fixed_counts, -1),
        query_ids=scores.query_ids,
        tail_ids=new_ids,
        source=f"thin(p={p})",
    )
    return dataclasses.replace(thinned, depleted=scores.depleted)


def nested_subsamples(scores: SampledScores, levels: int = 3, seed: int = 0) -> list[SampledScores]:
    """Returns [S / 2^levels, ..., S / 2, S] nested sub-samples (each thins the next)."""
    rng = np.random.default_rng(seed)
    out = [scores]
    for _ in range(levels):
        out.append(thin(out[-1], 0.5, rng))
    return out[::-1]


def subsample_sd(predictions: np.ndarray) -> np.ndarray:
    """Returns [...] the sampling sd at S that predictions [L + 1, ...] from nested sub-samples
    S / 2^L, ..., S / 2, S (the last the sample itself) imply: var(S) ~ mean_i(move_i^2 / 2^i)
    over the L moves, the i-th halving from the top; zeros when L = 0. The same rule chose on
    dev (docs/validation.md, "The sub-samples' term (issue #41)")."""
    moves = np.diff(np.asarray(predictions, np.float64), axis=0)[::-1]
    if not moves.shape[0]:
        return np.zeros(moves.shape[1:])
    scale = (2.0 ** np.arange(moves.shape[0])).reshape((-1,) + (1,) * (moves.ndim - 1))
    return np.asarray(np.sqrt(np.mean(moves**2 / scale, axis=0)), np.float64)


def verdict(sizes: Sequence[int], predictions: Sequence[float], noise: float) -> Budget:
    """Returns the sufficient-budget verdict from predictions at doubling sample sizes.

    Args:
      sizes: ascending sample sizes, each about twice the previous.
      predictions: the prediction (at the target N) from each.
      noise: the query-sampling noise (sd of the query bootstrap) the last move is held to.

    Returns:
      The `Budget`; `needed_sample` is the sample the geometric trend of the moves needs (None
      if converged, or if the moves are not shrinking, when the message asks for at least 4x
      more).
    """
    sizes = tuple(int(s) for s in sizes)
    preds = tuple(float(v) for v in predictions)
    moves = np.diff(preds)
    last = float(moves[-1]) if moves.size else 0.0
    out = Budget(
        converged=bool(abs(last) <= noise),
        message="",
        sizes=sizes,
        predictions=preds,
        last_change=last,
        noise=float(noise),
    )
    if out.converged:
        return out._replace(
            message=f"budget sufficient: doubling the sample to S = {sizes[-1]:,} moved the "
            f"prediction by {last:+.4f}, within query noise {noise:.4f}"
        )
    ratio = moves[-1] / moves[-2] if moves.size >= 2 and moves[-2] != 0 else np.nan
    needed = None
    if not noise > 0:
        message = (
            f"SAMPLE TOO SMALL: the last doubling moved the prediction by {last:+.4f}; with no "
            "query noise to hold it to (the query bootstrap has no spread: one query, or all "
            f"per-query APs equal) no sample size can be advised; sample at least "
            f"{4 * sizes[-1]:,} distractors"
        )
    elif np.isfinite(ratio) and 0.0 < ratio < 0.9:
        doublings = int(np.ceil(np.log(noise / abs(last)) / np.log(ratio)))
        needed = int(sizes[-1] * 2.0 ** max(doublings, 1))
        message = (
            f"SAMPLE TOO SMALL: the last doubling moved the prediction by {last:+.4f} "
            f"(query noise {noise:.4f}); the trend (x{ratio:.2f} per doubling) needs about "
            f"S = {needed:,} sampled distractors"
        )
    else:
        message = (
            f"SAMPLE TOO SMALL: the last doubling moved the prediction by {last:+.4f} "
            f"(query noise {noise:.4f}) and the moves are not shrinking; sample at least "
            f"{4 * sizes[-1]:,} distractors"
        )
    return out._replace(message=message, needed_sample=needed)


def not_checked(levels: int, n_sample: int, reason: str) -> Budget:
    """Returns the `Budget` of a sample too small to halve `levels` times."""
    message = (
        f"BUDGET NOT CHECKED: the sample (S = {n_sample:,}) is too small to halve {levels} times "
        "(a sub-sample leaves some query without a stored score); treat the prediction as "
        "unverified and sample more distractors"
    )
    return Budget(converged=False, message=message, checked=False, reason=reason)


def drift(block_aps: np.ndarray, alpha: float = 0.01) -> Drift:
    """Returns the paired test of block predictions for inconsistency beyond sampling noise.

    Args:
      block_aps: [B, Q] predicted AP@k of every query from each block alone.
      alpha: the test's level; `flag` is p < alpha.

    Returns:
      The `Drift` test.
    """
    block_aps = np.asarray(block_aps, np.float64)
    b, q = block_aps.shape
    d = block_aps - block_aps.mean(axis=0, keepdims=True)  # [B, Q]
    mean_d = d.mean(axis=1)
    var_d = np.maximum(d.var(axis=1, ddof=1), 1e-18) / q
    # The B deviations sum to zero, so their quadratic form has B - 1 degrees of freedom.
    chi2 = float(np.sum(mean_d**2 / var_d) * (b - 1) / b)
    p_value = float(stats.chi2.sf(chi2, b - 1))
    return Drift(
        checked=True,
        block_map=tuple(float(v) for v in block_aps.mean(axis=1)),
        chi2=chi2,
        dof=b - 1,
        p_value=p_value,
        flag=bool(p_value < alpha),
        max_deviation=float(np.abs(mean_d).max()),
    )


def hash_membership(
    distractor_ids: np.ndarray, fraction: float, seed: int = 0
) -> dict[str, object]:
    """Returns how many of a sample's ids its claimed id-hash rule (fraction, seed) selects.

    A genuine `sampling.in_sample` sample selects all of them; a curated list (mini-ILIAS)
    about `fraction` of them, which flags it as not a uniform sample of the pool.
    """
    inside = sampling.in_sample(distractor_ids, fraction, seed)
    share = float(inside.mean()) if inside.size else float("nan")
    return {"share_in_hash_sample": share, "uniform": bool(share == 1.0)}
