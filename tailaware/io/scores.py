"""The sampled-scores file: the interface between search and estimation.

One `.npz` per (model, query set, distractor sample) with the fields below; shapes use
Q queries, M stored tail scores per query and P positives per query (padded).

- `tail_scores` float32 [Q, M]: the M highest similarities to the sampled distractors,
  descending, padded with -inf when fewer than M were scored.
- `pos_scores` float32 [Q, P]: similarities to the query's positives, NaN-padded.
- `pos_counts` int64 [Q, P]: sampled distractors scoring strictly above each positive (exact,
  also beyond the M-th tail score); -1 at padding.
- `n_sample` int64 []: S, the number of sampled distractors.
- `fixed_counts` int64 [Q, P], optional: non-relevant items of the always-indexed database
  (e.g. other instances' positives) strictly above each positive; default 0.
- `query_ids` str [Q], optional.
- `tail_ids` int64 [Q, M], optional: the distractor ids of `tail_scores` (-1 at padding). Two
  models scored on the same id-hash sample then pair item by item (a reference's correction,
  `tailaware.protocol.reference`).
- `census_counts` int64 [Q, P], `n_census` int64 [], `inclusion` float64 [], `drawn_counts`
  int64 [Q, P] and `n_drawn` int64 [], optional, all five or none: a census design
  (`tailaware.core.design`). C = `n_census` items were embedded with certainty and
  `census_counts` counts those strictly above each positive (exact, -1 at padding); every other
  field describes a sample of the whole gallery at rate `inclusion`: the rest's id-hash sample
  and each query's systematic sample of the census (`tailaware.core.design.systematic_ranks`),
  `n_drawn` census items a query, `drawn_counts` of them strictly above each positive (0 at
  padding). Without them the file is a uniform sample of the whole gallery
  (`n_census` 0). (A census file of the first layout, which held the rest alone, lacks the
  drawn fields and is refused: rerun its job.)

Tie rule (ours, stated because the official code's unstable sort leaves it arbitrary): an item
outranks a positive only when its score is strictly greater.

Reading checks every field (`InputError` naming the file, the field and what was expected). A
positive's count must agree with the stored tail: at least the stored scores strictly above it,
and exactly that many when it is at or above the last stored score. Counts computed at a higher
precision than the stored float32 scores can exceed that by ties the rounding made: a
distractor just above the positive rounds to the positive's own float32 value (rounding never
reverses an order, it can only make two values equal). A count that exceeds the stored scores
strictly above it by no more than the stored scores equal to it is such a tie; it is reconciled
to the strict rule applied to the stored values, and `SampledScores.reconciled` counts the
positives so changed (the prediction's summary says how many). Any other disagreement is an
error.
"""

import dataclasses
import os
from typing import Literal, NoReturn

import numpy as np

from tailaware.io import atomic, errors

# float16 descriptors can give cosine similarities slightly outside [-1, 1].
SCORE_BOUND = 1.01


@dataclasses.dataclass(frozen=True)
class SampledScores:
    """Validated contents of a sampled-scores file (see the module docstring for fields)."""

    tail_scores: np.ndarray
    pos_scores: np.ndarray
    pos_counts: np.ndarray
    n_sample: int
    fixed_counts: np.ndarray
    query_ids: np.ndarray | None = None
    reconciled: int = 0  # positives whose count was reconciled with a float32 tie on reading
    tail_ids: np.ndarray | None = None  # [Q, M] int64 ids of tail_scores, -1 at padding
    census_counts: np.ndarray | None = None  # [Q, P] exact census items above each positive
    n_census: int = 0  # C, the census size (0: a uniform sample of the whole gallery)
    inclusion: float | None = None  # the sample's rate in a census design
    drawn_counts: np.ndarray | None = None  # [Q, P] census items of the sample above each positive
    n_drawn: int = 0  # census items each query's sample holds
    # [Q, P] the census's share of the unsampled items above each positive, taken from every
    # estimate (`tailaware.protocol.census.fold`); not a file field.
    depleted: np.ndarray | None = None

    @property
    def mask(self) -> np.ndarray:
        """[Q, P] bool: which positive slots are real (not padding)."""
        return self.pos_counts >= 0

    @property
    def num_queries(self) -> int:
        return self.tail_scores.shape[0]

    def subset(self, queries: np.ndarray) -> "SampledScores":
        """Returns the same file restricted to `queries` (indices into Q)."""
        return dataclasses.replace(
            self,
            tail_scores=self.tail_scores[queries],
            pos_scores=self.pos_scores[queries],
            pos_counts=self.pos_counts[queries],
            fixed_counts=self.fixed_counts[queries],
            query_ids=None if self.query_ids is None else self.query_ids[queries],
            tail_ids=None if self.tail_ids is None else self.tail_ids[queries],
            census_counts=None if self.census_counts is None else self.census_counts[queries],
            drawn_counts=None if self.drawn_counts is None else self.drawn_counts[queries],
            depleted=None if self.depleted is None else self.depleted[queries],
        )


def make_scores(
    tail_scores,
    pos_scores,
    pos_counts,
    n_sample,
    *,
    fixed_counts=None,
    query_ids=None,
    tail_ids=None,
    census_counts=None,
    n_census=None,
    inclusion=None,
    drawn_counts=None,
    n_drawn=None,
    source: str = "<arrays>",
) -> SampledScores:
    """Builds a validated `SampledScores` from arrays, casting to the file's dtypes.

    Raises:
      InputError: naming `source`, the field and the problem.
    """
    fields = {
        "tail_scores": np.asarray(tail_scores, dtype=np.float32),
        "pos_scores": np.asarray(pos_scores, dtype=np.float32),
        "pos_counts": np.asarray(pos_counts, dtype=np.int64),
        "n_sample": np.asarray(n_sample, dtype=np.int64),
    }
    if fixed_counts is not None:
        fields["fixed_counts"] = np.asarray(fixed_counts, dtype=np.int64)
    if query_ids is not None:
        fields["query_ids"] = np.asarray(query_ids, dtype=str)
    if tail_ids is not None:
        fields["tail_ids"] = np.asarray(tail_ids, dtype=np.int64)
    if census_counts is not None:
        fields["census_counts"] = np.asarray(census_counts, dtype=np.int64)
    if n_census is not None:
        fields["n_census"] = np.asarray(n_census, dtype=np.int64)
    if inclusion is not None:
        fields["inclusion"] = np.asarray(inclusion, dtype=np.float64)
    if drawn_counts is not None:
        fields["drawn_counts"] = np.asarray(drawn_counts, dtype=np.int64)
    if n_drawn is not None:
        fields["n_drawn"] = np.asarray(n_drawn, dtype=np.int64)
    return _validate(fields, source)


def concatenate(samples, source: str = "<concatenated>") -> SampledScores:
    """Returns the queries of several `SampledScores` of one distractor sample in one.

    Positive slots are padded to the widest (NaN scores, -1 counts); every sample must have the
    same S and the same M stored scores. Query ids are kept when all have them.

    Raises:
      InputError: naming `source` and the field, when the samples' S or M differ.
    """
    for name, sizes in (
        ("n_sample", {int(sc.n_sample) for sc in samples}),
        ("tail_scores", {sc.tail_scores.shape[1] for sc in samples}),
    ):
        if len(sizes) != 1:
            raise errors.field_error(source, name, f"the samples differ ({sorted(sizes)})")
    if any(sc.n_census for sc in samples):
        raise errors.field_error(source, "n_census", "census designs cannot be concatenated")
    p = max(sc.pos_scores.shape[1] for sc in samples)
    cat = lambda name, width, fill: np.concatenate(
        [
            np.pad(a, ((0, 0), (0, width - a.shape[1])), constant_values=fill)
            for a in (getattr(sc, name) for sc in samples)
        ]
    )
    ids = [sc.query_ids for sc in samples]
    whole = make_scores(
        np.concatenate([sc.tail_scores for sc in samples]),
        cat("pos_scores", p, np.nan),
        cat("pos_counts", p, -1),
        samples[0].n_sample,
        fixed_counts=cat("fixed_counts", p, -1),
        query_ids=None if any(i is None for i in ids) else np.concatenate(ids),
        source=source,
    )
    return dataclasses.replace(whole, reconciled=sum(sc.reconciled for sc in samples))


def save_scores(path: str | os.PathLike, scores: SampledScores) -> None:
    """Writes a sampled-scores `.npz` atomically."""
    arrays = dict(
        tail_scores=scores.tail_scores,
        pos_scores=scores.pos_scores,
        pos_counts=scores.pos_counts,
        n_sample=np.asarray(scores.n_sample, dtype=np.int64),
        fixed_counts=scores.fixed_counts,
    )
    if scores.query_ids is not None:
        arrays["query_ids"] = np.asarray(scores.query_ids, dtype=str)
    if scores.tail_ids is not None:
        arrays["tail_ids"] = scores.tail_ids
    if scores.census_counts is not None:
        arrays["census_counts"] = scores.census_counts
        arrays["n_census"] = np.asarray(scores.n_census, dtype=np.int64)
        arrays["inclusion"] = np.asarray(scores.inclusion, dtype=np.float64)
        assert scores.drawn_counts is not None, "a census without its drawn counts"
        arrays["drawn_counts"] = scores.drawn_counts
        arrays["n_drawn"] = np.asarray(scores.n_drawn, dtype=np.int64)
    atomic.write_npz(path, **arrays)


def load_scores(path: str | os.PathLike) -> SampledScores:
    """Reads and validates a sampled-scores `.npz`.

    Raises:
      MissingInput: no such file.
      InputError: naming the file, the field and what was expected.
    """
    fields = atomic.read_npz(path, "a sampled-scores .npz file (docs/outputs.md)")
    return _validate(fields, os.fspath(path))


def count_above(tail: np.ndarray, pos: np.ndarray, strict: bool = True) -> np.ndarray:
    """Returns [Q, P] the stored tail scores of each query above each positive's score.

    A sorted search per query (the tail is descending): memory [Q, P], never [Q, P, M].

    Args:
      tail: [Q, M] descending, -inf padded.
      pos: [Q, P]; NaN (padding) counts 0.
      strict: count the scores strictly above (the tie rule); else at or above.
    """
    neg = -np.asarray(tail)  # ascending, +inf padded
    key = np.where(np.isnan(pos), np.inf, -np.asarray(pos))
    side: Literal["left", "right"] = "left" if strict else "right"
    out = np.empty(key.shape, np.int64)
    for q in range(neg.shape[0]):
        out[q] = np.searchsorted(neg[q], key[q], side=side)
    return np.where(np.isnan(pos), 0, out)


def _validate(fields: dict, src: str) -> SampledScores:
    def fail(field: str, msg: str) -> NoReturn:
        raise errors.field_error(src, field, msg)

    for name in ("tail_scores", "pos_scores", "pos_counts", "n_sample"):
        if name not in fields:
            fail(name, "missing (required)")
    unknown = set(fields) - set(FIELDS)
    if unknown:
        fail(sorted(unknown)[0], f"unknown field; expected only {', '.join(FIELDS)}")

    tail, pos, counts = fields["tail_scores"], fields["pos_scores"], fields["pos_counts"]
    _check_dtype(tail, np.float32, "tail_scores", fail)
    _check_dtype(pos, np.float32, "pos_scores", fail)
    _check_dtype(counts, np.int64, "pos_counts", fail)
    if tail.ndim != 2 or 0 in tail.shape:
        fail("tail_scores", f"expected [Q, M] with Q, M >= 1, got shape {tail.shape}")
    q, m = tail.shape
    if pos.ndim != 2 or pos.shape[0] != q:
        fail("pos_scores", f"expected [Q, P] with Q = {q}, got shape {pos.shape}")
    if counts.shape != pos.shape:
        fail("pos_counts", f"expected the shape of pos_scores {pos.shape}, got {counts.shape}")

    n_sample = fields["n_sample"]
    if n_sample.shape != () or n_sample.dtype.kind not in "iu":
        fail("n_sample", f"expected an integer scalar, got {n_sample.dtype} {n_sample.shape}")
    s = int(n_sample)
    if s < 1:
        fail("n_sample", f"expected S >= 1, got {s}")

    if np.isnan(tail).any():
        fail("tail_scores", "holds NaN (padding must be -inf)")
    finite = np.isfinite(tail)
    if np.isposinf(tail).any():
        fail("tail_scores", "holds +inf")
    if np.abs(np.where(finite, tail, 0.0)).max(initial=0.0) > SCORE_BOUND:
        fail("tail_scores", f"scores outside [-{SCORE_BOUND}, {SCORE_BOUND}] (cosine expected)")
    rising = tail[:, 1:] > tail[:, :-1]  # -inf padding compares cleanly, unlike np.diff
    if rising.any():
        row = int(np.argwhere(rising)[0, 0])
        fail("tail_scores", f"row {row} is not sorted in descending order")
    n_finite = finite.sum(axis=1)
    if s < m and (n_finite > s).any():
        fail("n_sample", f"S = {s} is smaller than the {int(n_finite.max())} stored tail scores")
    bad = np.flatnonzero(n_finite != min(s, m))
    if bad.size:
        fail(
            "tail_scores",
            f"row {int(bad[0])} has {int(n_finite[bad[0]])} finite scores; expected "
            f"min(S, M) = {min(s, m)}",
        )

    valid = counts >= 0
    if (counts < -1).any():
        fail("pos_counts", "negative counts (only -1 is allowed, as padding)")
    if (np.isnan(pos) != ~valid).any():
        fail("pos_counts", "padding (-1) must be exactly where pos_scores is NaN")
    if np.isinf(pos).any():
        fail("pos_scores", "holds infinite values")
    if np.abs(np.where(valid, pos, 0.0)).max(initial=0.0) > SCORE_BOUND:
        fail("pos_scores", f"scores outside [-{SCORE_BOUND}, {SCORE_BOUND}] (cosine expected)")
    if (counts > s).any():
        fail("pos_counts", f"a count exceeds n_sample = {s}")
    if not valid.any(axis=1).all():
        row = int(np.flatnonzero(~valid.any(axis=1))[0])
        fail("pos_scores", f"query {row} has no positives")
    counts, reconciled = _agree_with_tail(tail, pos, counts, valid, full=n_finite == m, fail=fail)

    if "fixed_counts" in fields:
        fixed = fields["fixed_counts"]
        _check_dtype(fixed, np.int64, "fixed_counts", fail)
        if fixed.shape != pos.shape:
            fail("fixed_counts", f"expected the shape of pos_scores {pos.shape}, got {fixed.shape}")
        if (valid & (fixed < 0)).any():
            fail("fixed_counts", "negative counts at a real positive")
        fixed = np.where(valid, fixed, -1)
    else:
        fixed = np.where(valid, 0, -1).astype(np.int64)

    query_ids = fields.get("query_ids")
    if query_ids is not None:
        check_ids(query_ids, q, fail)
    tail_ids = fields.get("tail_ids")
    if tail_ids is not None:
        _check_dtype(tail_ids, np.int64, "tail_ids", fail)
        if tail_ids.shape != tail.shape:
            fail(
                "tail_ids", f"expected the shape of tail_scores {tail.shape}, got {tail_ids.shape}"
            )
        if ((tail_ids < 0) != ~finite).any() or (tail_ids < -1).any():
            fail("tail_ids", "expected ids >= 0 at the finite scores and -1 exactly at padding")
        ordered = np.sort(tail_ids, axis=1)
        if ((ordered[:, 1:] == ordered[:, :-1]) & (ordered[:, 1:] >= 0)).any():
            fail("tail_ids", "an id repeats within a query's row")
    census, n_census, inclusion, drawn, n_drawn = _census(fields, valid, counts, s, fail)
    return SampledScores(
        tail,
        pos,
        counts,
        s,
        fixed,
        query_ids,
        reconciled,
        tail_ids,
        census,
        n_census,
        inclusion,
        drawn,
        n_drawn,
    )


FIELDS: tuple[str, ...] = (
    "tail_scores",
    "pos_scores",
    "pos_counts",
    "n_sample",
    "fixed_counts",
    "query_ids",
)
CENSUS_FIELDS = ("census_counts", "n_census", "inclusion", "drawn_counts", "n_drawn")
FIELDS += ("tail_ids", *CENSUS_FIELDS)


def _census(
    fields: dict, valid: np.ndarray, counts: np.ndarray, s: int, fail
) -> tuple[np.ndarray | None, int, float | None, np.ndarray | None, int]:
    """Returns the census fields (counts, C, inclusion, drawn counts, drawn items) checked, or
    (None, 0, None, None, 0)."""
    present = [n in fields for n in CENSUS_FIELDS]
    if not any(present):
        return None, 0, None, None, 0
    if not all(present):
        fail(
            CENSUS_FIELDS[present.index(False)],
            "missing: a census needs all of " + ", ".join(CENSUS_FIELDS),
        )
    census, n_census, inclusion, drawn, n_drawn = (fields[n] for n in CENSUS_FIELDS)
    for name, a in (("census_counts", census), ("drawn_counts", drawn)):
        _check_dtype(a, np.int64, name, fail)
        if a.shape != valid.shape:
            fail(name, f"expected the shape of pos_scores {valid.shape}, got {a.shape}")
    for name, a in (("n_census", n_census), ("n_drawn", n_drawn)):
        if a.shape != () or a.dtype.kind not in "iu" or int(a) < 0:
            fail(name, f"expected an integer scalar >= 0, got {a.dtype} {a}")
    if (valid & ((census < 0) | (census > int(n_census)))).any():
        fail("census_counts", f"expected counts in [0, n_census = {int(n_census)}] at positives")
    if inclusion.shape != () or inclusion.dtype.kind != "f" or not 0.0 < float(inclusion) <= 1.0:
        fail("inclusion", f"expected a probability in (0, 1], got {inclusion}")
    if int(n_drawn) > min(int(n_census), s):
        fail("n_drawn", f"expected at most min(n_census, n_sample), got {int(n_drawn)}")
    over = (drawn < 0) | (drawn > census) | (drawn > counts) | (drawn > int(n_drawn))
    if (valid & over).any():
        fail("drawn_counts", "expected counts in [0, min(census_counts, pos_counts, n_drawn)]")
    return (
        np.where(valid, census, -1),
        int(n_census),
        float(inclusion),
        np.where(valid, drawn, 0),
        int(n_drawn),
    )


def _agree_with_tail(tail, pos, counts, valid, *, full, fail) -> tuple[np.ndarray, int]:
    """Returns (the counts, how many were reconciled) after checking them against the tail.

    A count is at least the stored scores strictly above its positive, and exactly that many
    when the positive is at or above the last stored score (`full` [Q]: the row holds M scores;
    a shorter row holds the whole sample). Above that, a count may exceed it by stored scores
    equal to the positive (float32 ties of higher-precision counts): reconciled to the strict
    rule on the stored values (the module docstring).
    """
    above = count_above(tail, pos)
    ties = count_above(tail, pos, strict=False) - above
    last = np.where(full, tail[:, -1], -np.inf)
    covered = valid & (pos >= last[:, None])
    tie = covered & (counts > above) & (counts <= above + ties)
    wrong = valid & (counts < above) | covered & ~tie & (counts != above)
    if wrong.any():
        qi, pi = np.argwhere(wrong)[0]
        fail(
            "pos_counts",
            f"query {qi} positive {pi}: count {counts[qi, pi]} is inconsistent with the "
            f"{above[qi, pi]} stored tail scores above its score {pos[qi, pi]:.6f} (and "
            f"{ties[qi, pi]} equal to it); expected at least that many, and exactly that many "
            "at or above the last stored score",
        )
    return np.where(tie, above, counts), int(tie.sum())


def check_ids(ids, q: int, fail) -> None:
    """Checks query ids: [Q] strings, none empty, none repeated (`fail(field, message)`)."""
    if ids.dtype.kind != "U" or ids.shape != (q,):
        fail("query_ids", f"expected [Q] = [{q}] strings, got {ids.dtype} {ids.shape}")
    if (np.char.str_len(np.char.strip(ids)) == 0).any():
        fail(
            "query_ids", f"query {int(np.flatnonzero(np.char.strip(ids) == '')[0])} has an empty id"
        )
    uniq, n = np.unique(ids, return_counts=True)
    if (n > 1).any():
        fail("query_ids", f"duplicate id {str(uniq[n > 1][0])!r}")


def _check_dtype(arr, dtype, name, fail):
    if arr.dtype != dtype:
        fail(name, f"expected dtype {np.dtype(dtype).name}, got {arr.dtype}")
