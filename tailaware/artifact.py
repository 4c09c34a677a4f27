"""The hardness artifact: per-query, per-positive hardness that predicts mAP@k at any N.

Per-query hardness is specific to a model and a distractor source, and with the law it yields
that system's metric at any gallery size in closed form (paper Sec. 6). One `.npz` holds:

- `x` float64 [Q, P]: hardness in [0, 1], 0 at padding.
- `mask` bool [Q, P]: real positives.
- `tail_priced` bool [Q, P]: positives priced by the fitted tail rather than the count.
- `fixed_counts` int64 [Q, P]: always-indexed non-relevant items above each positive (-1 at
  padding).
- `n_sample` int64 []: S of the sample the hardness came from.
- `estimator` str []: the estimator's name.
- `metadata` str []: JSON object of free-form provenance (model, distractor source, config).
- `fit_<name>` float64 or bool [Q], optional: per-query fit parameters and diagnostics (the
  estimator's `Hardness.info`, e.g. threshold, xi, sigma, endpoint).
- `query_ids` str [Q], optional.
- `pos_counts` int64 [Q, P], optional: the sample's own counts above each positive, so that
  predictions at N >= S condition on them as `predict` does from the scores (-1 at padding).
- `atoms` float64 [Q, P, A] and `weights` float64 [Q, A], optional together: the estimator's
  posterior over each positive's hardness (`estimators.Hardness.atoms`), which predictions
  average over; `x` is its mean.

Loading validates every field like the sampled-scores reader and names the file, the field and
the problem.
"""

import dataclasses
import json
import os

import numpy as np

from tailaware import atomic, estimators
from tailaware import predict as predict_lib
from tailaware.scores import SampledScores

REQUIRED = ("x", "mask", "tail_priced", "fixed_counts", "n_sample", "estimator", "metadata")


@dataclasses.dataclass(frozen=True)
class HardnessArtifact:
    """Validated contents of a hardness artifact (see the module docstring for fields)."""

    x: np.ndarray
    mask: np.ndarray
    tail_priced: np.ndarray
    fixed_counts: np.ndarray
    n_sample: int
    estimator: str
    metadata: dict
    fit: dict
    query_ids: np.ndarray | None = None
    pos_counts: np.ndarray | None = None
    atoms: np.ndarray | None = None
    weights: np.ndarray | None = None

    @property
    def hardness(self) -> estimators.Hardness:
        """The artifact as the estimators' `Hardness`."""
        return estimators.Hardness(
            self.x, self.mask, self.tail_priced, dict(self.fit), self.atoms, self.weights
        )


def from_hardness(
    hardness: estimators.Hardness,
    scores: SampledScores,
    estimator: str,
    metadata: dict | None = None,
) -> HardnessArtifact:
    """Returns the artifact of an estimate on `scores` (fit info kept where it is [Q])."""
    q = hardness.x.shape[0]
    fit = {
        name: np.asarray(v)
        for name, v in hardness.info.items()
        if np.shape(v) == (q,) and np.asarray(v).dtype.kind in "biuf"
    }
    return _validate(
        {
            "x": np.asarray(hardness.x, np.float64),
            "mask": np.asarray(hardness.mask, bool),
            "tail_priced": np.asarray(hardness.tail_priced, bool),
            "fixed_counts": np.asarray(scores.fixed_counts, np.int64),
            "pos_counts": np.asarray(scores.pos_counts, np.int64),
            "n_sample": np.asarray(scores.n_sample, np.int64),
            "estimator": np.asarray(estimator),
            "metadata": np.asarray(json.dumps(metadata or {}, sort_keys=True, default=str)),
            **{f"fit_{k}": v for k, v in fit.items()},
            **({} if scores.query_ids is None else {"query_ids": np.asarray(scores.query_ids)}),
            **(
                {}
                if hardness.atoms is None
                else {
                    "atoms": np.asarray(hardness.atoms, np.float64),
                    "weights": np.asarray(hardness.weights, np.float64),
                }
            ),
        },
        "<arrays>",
    )


def save(path: str | os.PathLike, art: HardnessArtifact) -> None:
    """Writes the artifact `.npz` atomically."""
    arrays = {
        "x": art.x,
        "mask": art.mask,
        "tail_priced": art.tail_priced,
        "fixed_counts": art.fixed_counts,
        "n_sample": np.asarray(art.n_sample, np.int64),
        "estimator": np.asarray(art.estimator),
        "metadata": np.asarray(json.dumps(art.metadata, sort_keys=True, default=str)),
        **{f"fit_{k}": np.asarray(v) for k, v in art.fit.items()},
    }
    if art.query_ids is not None:
        arrays["query_ids"] = np.asarray(art.query_ids, dtype=str)
    if art.pos_counts is not None:
        arrays["pos_counts"] = art.pos_counts
    if art.atoms is not None:
        arrays["atoms"], arrays["weights"] = art.atoms, art.weights
    atomic.write_npz(path, **arrays)


def load(path: str | os.PathLike) -> HardnessArtifact:
    """Reads and validates a hardness artifact.

    Raises:
      ValueError: naming the file, the field and what was expected.
    """
    fields = atomic.read_npz(path, "hardness artifact")
    return _validate(fields, os.fspath(path))


def _validate(fields: dict, src: str) -> HardnessArtifact:
    def fail(field, msg):
        raise ValueError(f"{src}: field '{field}': {msg}")

    for name in REQUIRED:
        if name not in fields:
            fail(name, "missing (required)")
    optional = ("query_ids", "pos_counts", "atoms", "weights")
    extra = [f for f in fields if f not in REQUIRED + optional and not f.startswith("fit_")]
    if extra:
        fail(sorted(extra)[0], "unknown field")

    x, mask, priced, fixed = (fields[n] for n in ("x", "mask", "tail_priced", "fixed_counts"))
    for name, arr, kind in (
        ("x", x, "f"),
        ("mask", mask, "b"),
        ("tail_priced", priced, "b"),
        ("fixed_counts", fixed, "i"),
    ):
        if arr.dtype.kind != kind:
            fail(name, f"expected dtype kind '{kind}', got {arr.dtype}")
        if arr.ndim != 2:
            fail(name, f"expected [Q, P], got shape {arr.shape}")
        if arr.shape != x.shape:
            fail(name, f"expected the shape of x {x.shape}, got {arr.shape}")
    q = x.shape[0]
    if not np.isfinite(x).all():
        fail("x", "holds NaN or infinite values")
    if (x < 0).any() or (x > 1).any():
        fail("x", "hardness outside [0, 1]")
    if (x[~mask] != 0).any():
        fail("x", "padding (mask False) must hold 0")
    if (priced & ~mask).any():
        fail("tail_priced", "set at padding")
    if (fixed[mask] < 0).any():
        fail("fixed_counts", "negative at a real positive")
    if not mask.any(axis=1).all():
        fail("mask", f"query {int(np.flatnonzero(~mask.any(axis=1))[0])} has no positives")

    n_sample = fields["n_sample"]
    if n_sample.shape != () or n_sample.dtype.kind not in "iu" or int(n_sample) < 1:
        fail("n_sample", f"expected an integer scalar >= 1, got {n_sample!r}")
    estimator = fields["estimator"]
    if estimator.shape != () or estimator.dtype.kind != "U":
        fail("estimator", f"expected a string scalar, got {estimator.dtype} {estimator.shape}")
    try:
        metadata = json.loads(str(fields["metadata"]))
    except json.JSONDecodeError as e:
        fail("metadata", f"not JSON ({e})")
    if not isinstance(metadata, dict):
        fail("metadata", "expected a JSON object")

    fit = {}
    for name in (f for f in fields if f.startswith("fit_")):
        arr = fields[name]
        if arr.shape != (q,) or arr.dtype.kind not in "biuf":
            fail(name, f"expected a numeric [Q] = [{q}] array, got {arr.dtype} {arr.shape}")
        fit[name[4:]] = arr
    query_ids = fields.get("query_ids")
    if query_ids is not None and query_ids.shape != (q,):
        fail("query_ids", f"expected [Q] = [{q}], got shape {query_ids.shape}")
    atoms, weights = _validate_atoms(fields, x.shape, fail)
    pos_counts = fields.get("pos_counts")
    if pos_counts is not None:
        if pos_counts.dtype.kind != "i" or pos_counts.shape != x.shape:
            fail("pos_counts", f"expected int [Q, P] = {list(x.shape)}, got {pos_counts.shape}")
        if (pos_counts[mask] < 0).any():
            fail("pos_counts", "negative at a real positive")
        pos_counts = np.where(mask, pos_counts, -1).astype(np.int64)
    return HardnessArtifact(
        x=x.astype(np.float64),
        mask=mask,
        tail_priced=priced,
        fixed_counts=np.where(mask, fixed, -1).astype(np.int64),
        n_sample=int(n_sample),
        estimator=str(estimator),
        metadata=metadata,
        fit=fit,
        query_ids=query_ids,
        pos_counts=pos_counts,
        atoms=atoms,
        weights=weights,
    )


def _validate_atoms(fields, shape, fail):
    """Returns (atoms, weights) or (None, None); both or neither must be present."""
    atoms, weights = fields.get("atoms"), fields.get("weights")
    if atoms is None and weights is None:
        return None, None
    if atoms is None or weights is None:
        fail("atoms" if atoms is None else "weights", "atoms and weights come together")
    if atoms.dtype.kind != "f" or atoms.ndim != 3 or atoms.shape[:2] != shape:
        fail("atoms", f"expected float [Q, P, A] with [Q, P] = {list(shape)}, got {atoms.shape}")
    if not np.isfinite(atoms).all() or (atoms < 0).any() or (atoms > 1).any():
        fail("atoms", "hardness atoms must be finite and in [0, 1]")
    if weights.dtype.kind != "f" or weights.shape != (shape[0], atoms.shape[2]):
        fail(
            "weights",
            f"expected float [Q, A] = [{shape[0]}, {atoms.shape[2]}], got {weights.shape}",
        )
    if not np.isfinite(weights).all() or (weights < 0).any():
        fail("weights", "weights must be finite and >= 0")
    if not np.allclose(weights.sum(axis=1), 1.0, atol=1e-6):
        fail("weights", "each query's weights must sum to 1")
    return atoms.astype(np.float64), weights.astype(np.float64)


def predict(art: HardnessArtifact, n, k: int) -> dict:
    """Returns mAP@k and per-query AP@k at gallery size(s) n from the artifact alone."""
    sizes = np.atleast_1d(np.asarray(n, np.float64))
    sample = None if art.pos_counts is None else art  # it has pos_counts and n_sample
    aps = predict_lib.per_query_ap(art.hardness, sizes, k, art.fixed_counts, sample)
    return {"n": sizes.tolist(), "map": aps.mean(axis=1).tolist(), "per_query_ap": aps}
