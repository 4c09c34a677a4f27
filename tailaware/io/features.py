"""ILIAS-format descriptor files: HDF5 with `features` [n, d] and `index` [n] id strings.

The official ILIAS evaluation writes one file per split (`features_image_queries.hdf5`,
`features_text_queries.hdf5`, `features_positives.hdf5`) and one per 1M distractors
(`features_distractors_{idx:05d}.hdf5`); features are float16 and L2-normalised, which every
read checks (`check_normalised`).
"""

import contextlib
import os

import h5py
import numpy as np

from tailaware.io import atomic, errors

IMAGE_QUERIES = "features_image_queries.hdf5"
TEXT_QUERIES = "features_text_queries.hdf5"
POSITIVES = "features_positives.hdf5"
DISTRACTOR_PATTERN = "features_distractors_{idx:05d}.hdf5"
# ILIAS descriptors are unit vectors stored as float16, whose rounding moves a row's norm by
# about 1e-3 at most; a norm further from 1 than this is a descriptor never normalised.
NORM_TOLERANCE = 1e-2


def distractor_name(idx: int) -> str:
    """Returns the file name of distractor shard `idx`."""
    return DISTRACTOR_PATTERN.format(idx=idx)


def write_features(path: str | os.PathLike, features: np.ndarray, ids: list[str]) -> None:
    """Writes an ILIAS-format HDF5 file atomically (float16 features, ASCII ids)."""
    features = np.asarray(features)
    if features.ndim != 2 or features.shape[0] != len(ids):
        raise ValueError(
            f"{path}: features must be [n, d] with n = len(ids) = {len(ids)}, got {features.shape}"
        )
    with atomic.atomic_path(path) as tmp, h5py.File(tmp, "w") as f:
        f.create_dataset("features", data=features.astype(np.float16))
        f.create_dataset("index", data=np.asarray([i.encode("ascii") for i in ids], dtype="S"))


def read_ids(path: str | os.PathLike) -> list[str]:
    """Reads only the `index` dataset of an ILIAS-format file (checked: [n] ASCII strings).

    Raises:
      MissingInput: no such file.
      InputError: naming the file and the field.
    """
    with _open(path) as f, _reading(path):
        return _ids(f, path)


def read_features(
    path: str | os.PathLike, rows: np.ndarray | None = None, dim: int | None = None
) -> tuple[np.ndarray, list[str]]:
    """Reads `features` (as stored, usually float16) and ids, optionally only `rows` (sorted).

    Raises:
      MissingInput: no such file.
      InputError: naming the file and field when a dataset is missing or malformed (not
        [n, d] floats with n = len(index), NaN or infinite values, rows not L2-normalised
        (`check_normalised`), `dim` given and the feature dimension differs).
    """
    with _open(path) as f, _reading(path):
        ids = _ids(f, path)
        ds = _features(f, path, len(ids), dim)
        if rows is None:
            feats = ds[...]
        else:
            rows = np.asarray(rows, dtype=np.int64)
            feats = ds[rows] if rows.size else np.zeros((0, ds.shape[1]), ds.dtype)
            ids = [ids[r] for r in rows]
    if not np.all(np.isfinite(feats)):
        raise errors.field_error(path, "features", "holds NaN or infinite values")
    check_normalised(path, feats)
    return feats, ids


def check_normalised(path: str | os.PathLike, x: np.ndarray) -> None:
    """Raises an `InputError` naming `path` and the field `features` when a row's L2 norm is
    further than `NORM_TOLERANCE` from 1 (scores are cosines only between unit vectors)."""
    if x.size == 0:
        return
    norms = np.linalg.norm(np.asarray(x, np.float32), axis=1)
    off = np.flatnonzero(np.abs(norms - 1.0) > NORM_TOLERANCE)
    if off.size:
        raise errors.field_error(
            path,
            "features",
            f"row {off[0]} has L2 norm {norms[off[0]]:.4g} ({off.size} of {len(norms)} rows off 1 "
            f"by more than {NORM_TOLERANCE:g}): not L2-normalised: ILIAS descriptors are unit "
            "vectors; normalise them before writing",
        )


def shape(path: str | os.PathLike) -> tuple[int, int]:
    """Returns (n, d) of an ILIAS-format file, checking both datasets' shapes and dtypes only
    (the ids and descriptors are not read)."""
    with _open(path) as f, _reading(path):
        index = _dataset(f, path, "index", "[n] id strings")
        if index.ndim != 1:
            raise errors.field_error(path, "index", f"expected [n] id strings, got {index.shape}")
        return _features(f, path, index.shape[0]).shape


def _open(path: str | os.PathLike) -> h5py.File:
    path = errors.require_file(path, "an ILIAS-format HDF5 feature file")
    try:
        return h5py.File(path, "r")
    except (OSError, ValueError) as e:
        raise errors.InputError(
            f"{path}: not a readable HDF5 file ({e}); expected an ILIAS-format feature file"
        ) from e


@contextlib.contextmanager
def _reading(path):
    """Turns what h5py raises on a damaged file into an `InputError` naming it."""
    try:
        yield
    except errors.InputError:
        raise
    except (OSError, KeyError, ValueError, TypeError, RuntimeError) as e:
        raise errors.InputError(f"{path}: unreadable, truncated or corrupt HDF5 ({e})") from e


def _dataset(f: h5py.File, path, name: str, expected: str):
    if name not in f or not isinstance(f[name], h5py.Dataset):
        raise errors.field_error(path, name, f"missing dataset (expected {expected})")
    return f[name]


def _features(f: h5py.File, path, n: int, dim: int | None = None):
    """Returns the `features` dataset, checked: [n, d] floats (d = `dim` when given)."""
    ds = _dataset(f, path, "features", "[n, d] float16")
    if ds.dtype.kind != "f":
        raise errors.field_error(
            path,
            "features",
            f"expected floats (ILIAS descriptors are float16 unit vectors), got {ds.dtype}",
        )
    if ds.ndim != 2 or ds.shape[0] != n:
        raise errors.field_error(
            path, "features", f"has shape {ds.shape}; expected [n, d] with n = {n} rows as 'index'"
        )
    if dim is not None and ds.shape[1] != dim:
        raise errors.field_error(
            path,
            "features",
            f"has dimension {ds.shape[1]}; expected {dim} (the dimension of the other files)",
        )
    return ds


def _ids(f: h5py.File, path: str | os.PathLike) -> list[str]:
    raw = _dataset(f, path, "index", "[n] id strings")[...]
    if raw.ndim != 1 or raw.dtype.kind not in "SOU":
        raise errors.field_error(
            path, "index", f"expected [n] id strings, got {raw.dtype} {raw.shape}"
        )
    try:
        ids = [r.decode("ascii") if isinstance(r, bytes) else str(r) for r in raw]
    except UnicodeDecodeError as e:
        raise errors.field_error(path, "index", f"not ASCII ({e})") from e
    check_ids(ids, path, "index")
    return ids


def check_ids(ids, source, field: str) -> None:
    """Raises an `InputError` naming `source` and `field` when an id is empty or repeated."""
    empty = [i for i, v in enumerate(ids) if not str(v).strip()]
    if empty:
        raise errors.field_error(source, field, f"row {empty[0]} has an empty id")
    if len(set(ids)) != len(ids):  # a set is faster than np.unique on strings
        uniq, counts = np.unique(np.asarray(ids), return_counts=True)
        raise errors.field_error(source, field, f"duplicate id {str(uniq[counts > 1][0])!r}")
