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
- `fit_<name>` float or bool [Q], optional: the tail fits' per-query diagnostics, one field of
  `TailFit` each (`Hardness.fit`: threshold, xi, sigma, endpoint, ...); its fit fields come
  together.
- `query_ids` str [Q], optional.
- `pos_counts` int64 [Q, P], optional: the sample's own counts above each positive, so that
  predictions at N >= S condition on them as `predict` does from the scores (-1 at padding).
- `atoms` float64 [Q, P, A] and `weights` float64 [Q, A], optional together: the estimator's
  posterior over each positive's hardness (`Hardness.atoms`), which predictions
  average over; `x` is its mean.
- `rerun_atoms` float64 [F, Q, P, A'] and `rerun_weights` float64 [F, Q, A'], optional together:
  the estimate rerun with half and twice the excesses over its tail threshold
  (`Hardness.reruns`; A' = 1 for a plug-in tail): the interval's threshold term.
- `prior_weights` float64 [T, Q, A], optional (with `atoms`): the weights of `atoms` under a
  flatter and a steeper prior on the tail shape (`Hardness.prior_weights`): the
  interval's prior term.
- `distractor_n` float64 [G], `distractor_sd` float64 [M, G] (or [G]: mAP@k alone) and
  `distractor_k` int64 [], optional together, with `distractor_metrics` str [M] (absent: mAP):
  the nested bootstrap's distractor-sample sd of each metric@k (at k = `distractor_k`) at the
  gallery sizes `distractor_n` (ascending), as the predict job measured it: the interval's
  distractor term at that k, interpolated in log N (held constant beyond the ends).
- `subsample_sd` float64, optional (with the distractor fields, of `distractor_sd`'s shape):
  the sd the budget check's nested sub-samples imply for each metric at each of those sizes
  (`tailaware.protocol.budget.subsample_sd`): the interval's sub-samples' term.

Predictions from an artifact (`tailaware.protocol.from_artifact`; the predict job with
`--config.artifact`) carry the reported interval of a prediction from the scores: the query
bootstrap, widened by the stored distractor sd, the reruns' threshold term, the prior term and
the sub-samples' term;
a term whose fields are absent is left out (and said so).

Loading validates every field like the sampled-scores reader and names the file, the field and
the problem.
"""

import dataclasses
import json
import os
from typing import NoReturn

import numpy as np

from tailaware.core import metrics
from tailaware.core.results import Hardness, TailFit
from tailaware.io import atomic, errors
from tailaware.io.scores import SampledScores, check_ids

REQUIRED = ("x", "mask", "tail_priced", "fixed_counts", "n_sample", "estimator", "metadata")
_SD_FIELDS = ("distractor_n", "distractor_sd", "distractor_k")
_SD_METRICS = "distractor_metrics"
_SUB_SD = "subsample_sd"
OPTIONAL: tuple[str, ...] = (
    "query_ids",
    "pos_counts",
    "atoms",
    "weights",
    "rerun_atoms",
    "rerun_weights",
)
OPTIONAL += ("prior_weights", *_SD_FIELDS, _SD_METRICS, _SUB_SD)
# The fit fields of `TailFit` (the rest are optional): `fit_<name>` comes all or none.
_FIT_REQUIRED = tuple(f for f in TailFit._fields if f not in TailFit._field_defaults)


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
    fit: TailFit | None
    query_ids: np.ndarray | None = None
    pos_counts: np.ndarray | None = None
    atoms: np.ndarray | None = None
    weights: np.ndarray | None = None
    rerun_atoms: np.ndarray | None = None
    rerun_weights: np.ndarray | None = None
    prior_weights: np.ndarray | None = None
    distractor_n: np.ndarray | None = None
    distractor_sd: np.ndarray | None = None
    distractor_k: int | None = None
    distractor_metrics: tuple[str, ...] = ("map",)
    subsample_sd: np.ndarray | None = None

    @property
    def hardness(self) -> Hardness:
        """The artifact as a `Hardness`, with its reruns (their `tail_priced` is
        the estimate's: which positives a rerun's tail priced is not stored)."""
        reruns: tuple[Hardness, ...] = ()
        if self.rerun_atoms is not None and self.rerun_weights is not None:
            reruns = tuple(
                Hardness(
                    x=np.einsum("qpa,qa->qp", a, w),
                    mask=self.mask,
                    tail_priced=self.tail_priced,
                    atoms=a,
                    weights=w,
                )
                for a, w in zip(self.rerun_atoms, self.rerun_weights, strict=True)
            )
        return Hardness(
            x=self.x,
            mask=self.mask,
            tail_priced=self.tail_priced,
            fit=self.fit,
            atoms=self.atoms,
            weights=self.weights,
            reruns=reruns,
            prior_weights=self.prior_weights,
        )


def _rerun_fields(reruns) -> dict:
    """Returns the `rerun_atoms` / `rerun_weights` fields of `Hardness.reruns` (none if empty)."""
    if not reruns:
        return {}
    atoms = [h.x[:, :, None] if h.atoms is None else h.atoms for h in reruns]
    weights = [np.ones((h.x.shape[0], 1)) if h.atoms is None else h.weights for h in reruns]
    if len({a.shape for a in atoms}) != 1:
        raise ValueError(f"reruns with different atom shapes: {[a.shape for a in atoms]}")
    return {
        "rerun_atoms": np.stack(atoms).astype(np.float64),
        "rerun_weights": np.stack(weights).astype(np.float64),
    }


def from_hardness(
    hardness: Hardness,
    scores: SampledScores,
    estimator: str,
    metadata: dict | None = None,
    distractor_sd: tuple | None = None,
    subsample_sd: np.ndarray | None = None,
) -> HardnessArtifact:
    """Returns the artifact of an estimate on `scores`, with its tail fits' diagnostics.

    Its reruns (`hardness.reruns`) are kept; `distractor_sd` is (sizes [G], sds [M, G], k,
    metric names [M]) (or (sizes, sds [G], k): mAP@k), the nested bootstrap's distractor-sample
    sds of each metric@k at those gallery sizes
    (`tailaware.protocol.prediction.distractor_sd`), or None; `subsample_sd` the sub-samples'
    sds at the same sizes, of the same shape, or None.
    """
    fit = {} if hardness.fit is None else dict(hardness.fit.items())
    sd_names = () if distractor_sd is None else (*distractor_sd[3:], ("map",))[0]
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
            **_rerun_fields(hardness.reruns),
            **(
                {}
                if hardness.prior_weights is None
                else {"prior_weights": np.asarray(hardness.prior_weights, np.float64)}
            ),
            **(
                {}
                if distractor_sd is None
                else {
                    "distractor_n": np.asarray(distractor_sd[0], np.float64),
                    "distractor_sd": np.asarray(distractor_sd[1], np.float64).reshape(
                        len(sd_names), -1
                    ),
                    "distractor_k": np.asarray(distractor_sd[2], np.int64),
                    _SD_METRICS: np.asarray(sd_names),
                }
            ),
            **(
                {}
                if subsample_sd is None or distractor_sd is None
                else {_SUB_SD: np.asarray(subsample_sd, np.float64).reshape(len(sd_names), -1)}
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
        **({} if art.fit is None else {f"fit_{k}": np.asarray(v) for k, v in art.fit.items()}),
    }
    if art.query_ids is not None:
        arrays["query_ids"] = np.asarray(art.query_ids, dtype=str)
    if art.pos_counts is not None:
        arrays["pos_counts"] = art.pos_counts
    groups = (("atoms", "weights"), ("rerun_atoms", "rerun_weights"), ("prior_weights",))
    for group in (*groups, _SD_FIELDS):
        if getattr(art, group[0]) is not None:
            arrays.update({name: np.asarray(getattr(art, name)) for name in group})
    if art.distractor_n is not None:
        arrays[_SD_METRICS] = np.asarray(art.distractor_metrics)
    if art.subsample_sd is not None:
        arrays[_SUB_SD] = np.asarray(art.subsample_sd)
    atomic.write_npz(path, **arrays)


def load(path: str | os.PathLike) -> HardnessArtifact:
    """Reads and validates a hardness artifact.

    Raises:
      MissingInput: no such file.
      InputError: naming the file, the field and what was expected.
    """
    fields = atomic.read_npz(path, "a hardness artifact .npz (a predict job's hardness.npz)")
    return _validate(fields, os.fspath(path))


def _validate(fields: dict, src: str) -> HardnessArtifact:
    def fail(field: str, msg: str) -> NoReturn:
        raise errors.field_error(src, field, msg)

    for name in REQUIRED:
        if name not in fields:
            fail(name, "missing (required)")
    extra = [f for f in fields if f not in REQUIRED + OPTIONAL and not f.startswith("fit_")]
    if extra:
        fail(sorted(extra)[0], "unknown field; expected those of docs/outputs.md")

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
    if 0 in x.shape:
        fail("x", f"expected [Q, P] with Q, P >= 1, got shape {x.shape}")
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
        if name[4:] not in TailFit._fields:
            fail(name, f"not a tail-fit field; expected fit_ plus one of {list(TailFit._fields)}")
        if arr.shape != (q,) or arr.dtype.kind not in "biuf":
            fail(name, f"expected a numeric [Q] = [{q}] array, got {arr.dtype} {arr.shape}")
        fit[name[4:]] = arr
    missing = [f"fit_{f}" for f in _FIT_REQUIRED if f not in fit]
    if fit and missing:
        fail(missing[0], "missing: a tail fit's fields come together (`TailFit`)")
    query_ids = fields.get("query_ids")
    if query_ids is not None:
        check_ids(query_ids, q, fail)
    atoms, weights = _validate_atoms(fields, ("atoms", "weights"), x.shape, fail)
    rerun_atoms, rerun_weights = _validate_atoms(
        fields, ("rerun_atoms", "rerun_weights"), x.shape, fail, reruns=True
    )
    prior_weights = _validate_prior(fields.get("prior_weights"), weights, fail)
    distractor_n, distractor_sd, distractor_k, sd_metrics = _validate_sd(fields, fail)
    subsample_sd = _validate_subsample(fields.get(_SUB_SD), distractor_sd, fail)
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
        fit=TailFit(**fit) if fit else None,
        query_ids=query_ids,
        pos_counts=pos_counts,
        atoms=atoms,
        weights=weights,
        rerun_atoms=rerun_atoms,
        rerun_weights=rerun_weights,
        prior_weights=prior_weights,
        distractor_n=distractor_n,
        distractor_sd=distractor_sd,
        distractor_metrics=sd_metrics,
        distractor_k=distractor_k,
        subsample_sd=subsample_sd,
    )


def _validate_atoms(fields, names, shape, fail, reruns=False):
    """Returns the atoms and weights named `names` ([Q, P, A] and [Q, A]; with `reruns` one more
    leading axis [F]), or (None, None); both or neither must be present."""
    (a_name, w_name), (atoms, weights) = names, (fields.get(n) for n in names)
    if atoms is None and weights is None:
        return None, None
    if atoms is None or weights is None:
        fail(a_name if atoms is None else w_name, f"{a_name} and {w_name} come together")
    lead = "[F, " if reruns else "["
    q_p = tuple(atoms.shape[reruns : reruns + 2])
    if atoms.dtype.kind != "f" or atoms.ndim != 3 + reruns or q_p != shape:
        want = f"float {lead}Q, P, A] with [Q, P] = {list(shape)}"
        fail(a_name, f"expected {want}, got {atoms.shape}")
    if not np.isfinite(atoms).all() or (atoms < 0).any() or (atoms > 1).any():
        fail(a_name, "hardness atoms must be finite and in [0, 1]")
    want = atoms.shape[:reruns] + (shape[0], atoms.shape[-1])
    if weights.dtype.kind != "f" or weights.shape != want:
        fail(w_name, f"expected float {lead}Q, A] = {list(want)}, got {weights.shape}")
    if not np.isfinite(weights).all() or (weights < 0).any():
        fail(w_name, "weights must be finite and >= 0")
    if not np.allclose(weights.sum(axis=-1), 1.0, atol=1e-6):
        fail(w_name, "each query's weights must sum to 1")
    return atoms.astype(np.float64), weights.astype(np.float64)


def _validate_prior(prior, weights, fail):
    """Returns the validated `prior_weights` [T, Q, A] (A and Q of `weights`), or None."""
    if prior is None:
        return None
    if weights is None:
        fail("prior_weights", "needs atoms and weights (it re-weights them)")
    if prior.dtype.kind != "f" or prior.ndim != 3 or prior.shape[1:] != weights.shape:
        want = f"float [T, Q, A] with [Q, A] = {list(weights.shape)}"
        fail("prior_weights", f"expected {want}, got {prior.dtype} {prior.shape}")
    if not np.isfinite(prior).all() or (prior < 0).any():
        fail("prior_weights", "weights must be finite and >= 0")
    if not np.allclose(prior.sum(axis=-1), 1.0, atol=1e-6):
        fail("prior_weights", "each query's weights must sum to 1")
    return prior.astype(np.float64)


def _validate_subsample(sub, distractor_sd, fail):
    """Returns `subsample_sd` [M, G] (the shape of the validated `distractor_sd`) or None."""
    if sub is None:
        return None
    if distractor_sd is None:
        fail(_SUB_SD, f"without {', '.join(_SD_FIELDS)}")
    if sub.dtype.kind != "f" or sub.size != distractor_sd.size:
        want = list(distractor_sd.shape)
        fail(
            _SUB_SD, f"expected float of distractor_sd's shape {want}, got {sub.dtype} {sub.shape}"
        )
    if not np.isfinite(sub).all() or (sub < 0).any():
        fail(_SUB_SD, "sds must be finite and >= 0")
    return sub.astype(np.float64).reshape(distractor_sd.shape)


def _validate_sd(fields, fail):
    """Returns (distractor_n, distractor_sd [M, G], distractor_k, metric names) or Nones and
    ("map",); the first three come together."""
    n, sd, k = (fields.get(name) for name in _SD_FIELDS)
    names = fields.get(_SD_METRICS)
    if n is None and sd is None and k is None:
        if names is not None:
            fail(_SD_METRICS, f"without {', '.join(_SD_FIELDS)}")
        return None, None, None, ("map",)
    for name, value in zip(_SD_FIELDS, (n, sd, k), strict=True):
        if value is None:
            fail(name, f"{', '.join(_SD_FIELDS)} come together")
    if k.shape != () or k.dtype.kind not in "iu" or int(k) < 1:
        fail("distractor_k", f"expected an integer scalar >= 1, got {k!r}")
    if n.dtype.kind not in "iuf" or n.ndim != 1 or n.size == 0:
        fail("distractor_n", f"expected a numeric [G] array, got {n.dtype} {n.shape}")
    if not np.isfinite(n).all() or (n < 1).any() or (np.diff(n) <= 0).any():
        fail("distractor_n", "gallery sizes must be finite, >= 1 and strictly ascending")
    if names is None:
        names, want, shape = ("map",), (n.size,), "[G]"
    else:
        if names.ndim != 1 or names.dtype.kind != "U" or names.size == 0:
            fail(_SD_METRICS, f"expected a str [M] array of metric names, got {names.dtype}")
        unknown = [str(v) for v in names if str(v) not in metrics.METRICS]
        if unknown:
            fail(_SD_METRICS, f"unknown metric {unknown[0]!r}; expected {sorted(metrics.METRICS)}")
        names, want, shape = tuple(str(v) for v in names), (names.size, n.size), "[M, G]"
    if sd.dtype.kind != "f" or sd.shape != want:
        fail("distractor_sd", f"expected float {shape} = {list(want)}, got {sd.dtype} {sd.shape}")
    if not np.isfinite(sd).all() or (sd < 0).any():
        fail("distractor_sd", "sds must be finite and >= 0")
    return n.astype(np.float64), sd.astype(np.float64).reshape(len(names), -1), int(k), names
