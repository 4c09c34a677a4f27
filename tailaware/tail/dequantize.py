"""Rounded scores: spreading tied sampled scores over their rounding interval before a tail fit.

Scores computed or stored at low precision (float16 similarities, scores rounded to a few
decimals) sit on a grid: in float16 near 0.8 the grid step is 2^-11 ~ 0.0005, and the top 200 of
a 5% sample of 100M span only tens of steps, so most excesses repeat a neighbour. A GPD fitted
to such excesses reads the pile-up of equal values at the top as a hard edge and extrapolates a
tail far too short (docs/validation.md, "Rounded scores").

A rounded value v stands for a true score in (v - d/2, v + d/2], d the grid step. Where a row's
kept scores are visibly rounded (more than `tie_share` of them equal their neighbour), each run
of t equal values is spread evenly over that interval, at v + d (1/2 - (i + 1/2) / t) for
i = 0 .. t - 1, with d the row's smallest gap between distinct values (its grid step; where
float16 scores cross a power of two, the finer step: a run then covers half its bin). The top
run is spread below its value only, over [v - d/2, v]: a bounded law's endpoint may lie inside
the top bin, and spreading above the rounded maximum lengthens short tails. The descending
order and the stored values' bins are kept; the file and every positive's count are untouched
(the spreading is the estimator's view of the tail only), and continuous scores (float32
similarities tie only occasionally, well under `TIE_SHARE`, the default) are returned as they
are.
"""

import numpy as np

# Share of a row's finite kept scores equal to their neighbour above which the row is treated as
# rounded. float32 similarities of the top 4,000 of millions tie in well under 1% of places;
# float16 ones in most.
TIE_SHARE = 0.05


def spread_ties(tail: np.ndarray, tie_share: float = TIE_SHARE) -> np.ndarray:
    """Returns `tail` [Q, M] (descending, -inf padded) with rounded rows' ties spread.

    Rows with at most a share `tie_share` of ties (inf: every row), and runs without a distinct
    neighbour (a row of one repeated value), are left as they are. float32 in, float32 out.
    """
    tail = np.asarray(tail, np.float32)
    finite = np.isfinite(tail)
    tied = np.zeros_like(finite)
    tied[:, 1:] = finite[:, 1:] & (tail[:, 1:] == tail[:, :-1])
    rounded = tied.sum(axis=1) > tie_share * np.maximum(finite.sum(axis=1), 1)
    if not rounded.any():
        return tail
    rows = np.flatnonzero(rounded)
    t64, fin, tie = tail[rows].astype(np.float64), finite[rows], tied[rows]
    m = tail.shape[1]
    col = np.arange(m)
    run = np.cumsum(~tie, axis=1) - 1 + (np.arange(rows.size) * m)[:, None]  # global run ids
    length = np.bincount(run.ravel(), minlength=rows.size * m)[run]
    start = np.maximum.accumulate(np.where(~tie, col, 0), axis=1)  # first column of the run
    rank = (col - start) / length  # 0 for a run's first (largest) value
    with np.errstate(invalid="ignore"):  # -inf padding: its results are not used
        gaps = np.where(fin[:, 1:] & ~tie[:, 1:], t64[:, :-1] - t64[:, 1:], np.inf)
        step = gaps.min(axis=1, keepdims=True)  # the row's grid: its smallest distinct gap
        new = np.where(
            start == 0,
            t64 - 0.5 * step * rank,  # the top run: over [v - d/2, v], its largest kept at v
            t64 + step * (0.5 - rank - 0.5 / length),  # evenly over (v - d/2, v + d/2)
        )
    spread = fin & (length > 1) & np.isfinite(step)
    out = tail.copy()
    out[rows] = np.where(spread, new, t64).astype(np.float32)
    return out
