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

Loading validates every field like the sampled-scores reader and names the file, the field and
the problem.
"""

import dataclasses
import json
import os

import jax.numpy as jnp
import numpy as np

from tailaware import atomic, estimators, law
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

    @property
    def hardness(self) -> estimators.Hardness:
        """The artifact as the estimators' `Hardness`."""
        return estimators.Hardness(self.x, self.mask, self.tail_priced, dict(self.fit))


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
            "n_sample": np.asarray(scores.n_sample, np.int64),
            "estimator": np.asarray(estimator),
            "metadata": np.asarray(json.dumps(metadata or {}, sort_keys=True, default=str)),
            **{f"fit_{k}": v for k, v in fit.items()},
            **({} if scores.query_ids is None else {"query_ids": np.asarray(scores.query_ids)}),
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
    extra = [
        f for f in fields if f not in REQUIRED and f != "query_ids" and not f.startswith("fit_")
    ]
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
    )


def predict(art: HardnessArtifact, n, k: int) -> dict:
    """Returns mAP@k and per-query AP@k at gallery size(s) n from the artifact alone."""
    sizes = np.atleast_1d(np.asarray(n, np.float64))
    x = jnp.asarray(art.x, jnp.float32)
    fixed = jnp.asarray(np.where(art.mask, art.fixed_counts, 0), jnp.float32)
    mask = jnp.asarray(art.mask)
    maps, aps = [], []
    for size in sizes:
        m, a = law.map_at_k(x, mask, jnp.float32(size), jnp.float32(k), fixed)
        maps.append(float(m))
        aps.append(np.asarray(a, np.float64))
    return {"n": sizes.tolist(), "map": maps, "per_query_ap": np.stack(aps)}
