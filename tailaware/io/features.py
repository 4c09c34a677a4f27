"""ILIAS-format descriptor files: HDF5 with `features` [n, d] and `index` [n] id strings.

The official ILIAS evaluation writes one file per split (`features_image_queries.hdf5`,
`features_text_queries.hdf5`, `features_positives.hdf5`) and one per 1M distractors
(`features_distractors_{idx:05d}.hdf5`); features are float16 and L2-normalised.
"""

import os

import h5py
import numpy as np

from tailaware.io import atomic

IMAGE_QUERIES = "features_image_queries.hdf5"
TEXT_QUERIES = "features_text_queries.hdf5"
POSITIVES = "features_positives.hdf5"
DISTRACTOR_PATTERN = "features_distractors_{idx:05d}.hdf5"


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
    """Reads only the `index` dataset of an ILIAS-format file."""
    with _open(path) as f:
        return _ids(f, path)


def read_features(
    path: str | os.PathLike, rows: np.ndarray | None = None, dim: int | None = None
) -> tuple[np.ndarray, list[str]]:
    """Reads `features` (as stored, usually float16) and ids, optionally only `rows` (sorted).

    Raises:
      ValueError: naming the file and field when a dataset is missing or malformed, or when
        `dim` is given and the feature dimension differs.
    """
    with _open(path) as f:
        ids = _ids(f, path)
        if "features" not in f:
            raise ValueError(f"{path}: missing dataset 'features' (expected [n, d] float16)")
        ds = f["features"]
        if ds.ndim != 2 or ds.shape[0] != len(ids):
            raise ValueError(
                f"{path}: field 'features' has shape {ds.shape}; expected [n, d] with "
                f"n = {len(ids)} rows as in 'index'"
            )
        if dim is not None and ds.shape[1] != dim:
            raise ValueError(
                f"{path}: field 'features' has dimension {ds.shape[1]}; expected {dim} "
                "(the dimension of the other files)"
            )
        if rows is None:
            feats = ds[...]
        else:
            rows = np.asarray(rows, dtype=np.int64)
            feats = ds[rows] if rows.size else np.zeros((0, ds.shape[1]), ds.dtype)
            ids = [ids[r] for r in rows]
    if not np.all(np.isfinite(feats)):
        raise ValueError(f"{path}: field 'features' holds NaN or infinite values")
    return feats, ids


def _open(path: str | os.PathLike) -> h5py.File:
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: no such feature file")
    try:
        return h5py.File(path, "r")
    except OSError as e:
        raise ValueError(f"{path}: not a readable HDF5 file ({e})") from e


def _ids(f: h5py.File, path: str | os.PathLike) -> list[str]:
    if "index" not in f:
        raise ValueError(f"{path}: missing dataset 'index' (expected [n] id strings)")
    raw = f["index"][...]
    if raw.ndim != 1:
        raise ValueError(f"{path}: field 'index' has shape {raw.shape}; expected [n]")
    return [r.decode("ascii") if isinstance(r, bytes) else str(r) for r in raw]
