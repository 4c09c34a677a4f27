"""The reference-counts file: a related model's exact run, to correct a new model's estimate.

A reference model A scored exactly over the whole gallery knows, for every query and positive,
the exact count K_A of distractors strictly above the positive (our tie rule). A new model B
scored on a uniform sample of the same gallery corrects its estimate with it
(`tailaware.protocol.reference`). One `.npz` holds, with Q queries and P positive slots:

- `counts` int64 [Q, P]: distractors strictly above each positive under A, -1 at padding.
- `query_ids` str [Q]: the queries, in the order of the sampled-scores files it pairs with.
- `positive_ids` str [Q, P]: each slot's positive id ("" at padding).
- `n_distractors` int64 []: N, the distractors A was run over.
- `k` int64 []: the cut-off of the run's metric values.
- `metric_names` str [M], `metric_values` float64 [M]: the run's exact metrics@k (mAP@k first).

`check` pairs it with a target's sampled scores: the same query ids in the same order, the same
positive slots, the same N and k, else an `InputError` naming the file and the field.
"""

import os
import zipfile
from typing import NamedTuple, NoReturn

import numpy as np

from tailaware.io import atomic, errors
from tailaware.io.scores import SampledScores, check_ids

FIELDS: tuple[str, ...] = ("counts", "query_ids", "positive_ids", "n_distractors", "k")
FIELDS += ("metric_names", "metric_values")
WHAT = "a reference-counts .npz file (docs/outputs.md)"


class ReferenceCounts(NamedTuple):
    """A reference model's exact run (the module docstring lists the fields)."""

    counts: np.ndarray
    query_ids: np.ndarray
    positive_ids: np.ndarray
    n_distractors: int
    k: int
    metric_names: tuple[str, ...]
    metric_values: np.ndarray

    @property
    def mask(self) -> np.ndarray:
        """[Q, P] bool: the real positive slots."""
        return self.counts >= 0


def make(
    counts,
    query_ids,
    positive_ids,
    *,
    n_distractors: int,
    k: int,
    metric_names,
    metric_values,
    source: str = "<arrays>",
) -> ReferenceCounts:
    """Returns a validated `ReferenceCounts` from arrays, cast to the file's dtypes.

    Raises:
      InputError: naming `source`, the field and the problem.
    """
    fields = dict(
        counts=np.asarray(counts, np.int64),
        query_ids=np.asarray(query_ids, str),
        positive_ids=np.asarray(positive_ids, str),
        n_distractors=np.asarray(n_distractors, np.int64),
        k=np.asarray(k, np.int64),
        metric_names=np.asarray(metric_names, str).reshape(-1),
        metric_values=np.asarray(metric_values, np.float64).reshape(-1),
    )
    return _validate(fields, source)


def save(path: str | os.PathLike, ref: ReferenceCounts) -> None:
    """Writes a reference-counts `.npz` atomically."""
    atomic.write_npz(
        path,
        counts=ref.counts,
        query_ids=ref.query_ids,
        positive_ids=ref.positive_ids,
        n_distractors=np.int64(ref.n_distractors),
        k=np.int64(ref.k),
        metric_names=np.asarray(ref.metric_names, str),
        metric_values=ref.metric_values,
    )


def load(path: str | os.PathLike) -> ReferenceCounts:
    """Reads and validates a reference-counts `.npz`.

    Raises:
      MissingInput: no such file.
      InputError: naming the file, the field and what was expected.
    """
    return _validate(atomic.read_npz(path, WHAT), os.fspath(path))


def looks_like(path: str | os.PathLike) -> bool:
    """Returns whether `path` is an `.npz` archive with a reference-counts file's own fields (to
    tell it from other `.npz` inputs; `load` validates it)."""
    try:
        with zipfile.ZipFile(path) as z:
            names = {n.removesuffix(".npy") for n in z.namelist()}
    except (OSError, zipfile.BadZipFile):
        return False
    return {"counts", "metric_names", "metric_values"} <= names


def check(ref: ReferenceCounts, scores: SampledScores, *, k: int, source: str) -> None:
    """Checks that `ref` (read from `source`) is the exact run of `scores`' queries and positives
    at cut-off `k`; `scores` must be a sample of `ref.n_distractors` (S <= N).

    Raises:
      InputError: naming `source` and the first field that does not match.
    """

    def fail(field: str, msg: str) -> NoReturn:
        raise errors.field_error(source, field, msg)

    if scores.query_ids is None:
        fail("query_ids", "the sampled scores have no query ids to pair with")
    if ref.query_ids.shape != scores.query_ids.shape or (ref.query_ids != scores.query_ids).any():
        fail("query_ids", "not the sampled scores' queries in their order")
    if ref.counts.shape[1] < scores.mask.shape[1]:
        fail("positive_ids", f"{ref.counts.shape[1]} slots, the sampled scores have more")
    width = scores.mask.shape[1]
    if ref.mask[:, width:].any() or (ref.mask[:, :width] != scores.mask).any():
        fail("positive_ids", "not the sampled scores' positive slots")
    if int(ref.k) != int(k):
        fail("k", f"the run's metrics are at k = {ref.k}, the prediction's at k = {k}")
    if int(scores.n_sample) > ref.n_distractors:
        fail("n_distractors", f"N = {ref.n_distractors} is below the sample's S")


def _validate(fields: dict, src: str) -> ReferenceCounts:
    def fail(field: str, msg: str) -> NoReturn:
        raise errors.field_error(src, field, msg)

    for name in FIELDS:
        if name not in fields:
            fail(name, "missing (required)")
    unknown = set(fields) - set(FIELDS)
    if unknown:
        fail(sorted(unknown)[0], f"unknown field; expected only {', '.join(FIELDS)}")
    counts, ids, pos_ids = fields["counts"], fields["query_ids"], fields["positive_ids"]
    if counts.dtype != np.int64 or counts.ndim != 2 or 0 in counts.shape:
        fail("counts", f"expected int64 [Q, P], got {counts.dtype} {counts.shape}")
    q = counts.shape[0]
    check_ids(ids, q, fail)
    if pos_ids.dtype.kind != "U" or pos_ids.shape != counts.shape:
        fail("positive_ids", f"expected strings of shape {counts.shape}, got {pos_ids.shape}")
    if (counts < -1).any():
        fail("counts", "negative counts (only -1 is allowed, as padding)")
    if ((pos_ids == "") != (counts < 0)).any():
        fail("positive_ids", "empty ids must be exactly at the padding (-1 counts)")
    if not (counts >= 0).any(axis=1).all():
        fail("counts", "a query has no positives")
    n, k = fields["n_distractors"], fields["k"]
    for name, value in (("n_distractors", n), ("k", k)):
        if value.shape != () or value.dtype.kind not in "iu" or int(value) < 1:
            fail(name, f"expected an integer >= 1, got {value}")
    if (counts > int(n)).any():
        fail("counts", f"a count exceeds n_distractors = {int(n)}")
    names, values = fields["metric_names"], fields["metric_values"]
    if names.dtype.kind != "U" or names.ndim != 1 or values.shape != names.shape:
        fail("metric_values", "expected one float per metric name")
    if not np.isfinite(values).all() or (values < 0).any() or (values > 1).any():
        fail("metric_values", "expected values in [0, 1]")
    return ReferenceCounts(
        counts=counts,
        query_ids=ids,
        positive_ids=pos_ids,
        n_distractors=int(n),
        k=int(k),
        metric_names=tuple(str(x) for x in names),
        metric_values=values.astype(np.float64),
    )
