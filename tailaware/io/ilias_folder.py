"""An ILIAS-format feature folder: queries, positives, distractor shards and the ground truth.

Folder layout (the official ILIAS code's; docs/outputs.md): `features_{image,text}_queries.hdf5`,
`features_positives.hdf5`, `features_distractors_{idx:05d}.hdf5` with `features` [n, d] and
`index` [n]. Plain numpy shards work too: `NAME.npy` ([n, d]) next to `NAME.ids.txt` (one id
per line) for any of these names. Ground truth: a query's positives are the positives whose id
has the same instance prefix `id.split("/")[0]`; the other instances' positives are always in
the database and counted as non-relevant.

Every reader checks what it reads and names the file, the field and what was expected.

Shapes: Q queries, T positives in the database, P positive slots per query (padded), D dims.
"""

import dataclasses
import glob
import hashlib
import os
import re
from collections.abc import Callable

import h5py
import numpy as np

from tailaware.io import atomic, errors, features


@dataclasses.dataclass(frozen=True)
class Shard:
    """One distractor file: `read_ids()` -> [n] ids, `read_rows(rows)` -> [len(rows), D]."""

    number: int
    name: str
    num_rows: int
    read_ids: Callable[[], np.ndarray]
    read_rows: Callable[[np.ndarray], np.ndarray]


QUERY_FILES = {"image": features.IMAGE_QUERIES, "text": features.TEXT_QUERIES}
_SHARD_RE = re.compile(r"features_distractors_(\d{5})\.(hdf5|npy)$")


@dataclasses.dataclass(frozen=True)
class Split:
    """A fully read split (queries or positives): float16 descriptors and ids."""

    features: np.ndarray
    ids: np.ndarray


def read_split(folder: str, name: str, dim: int | None = None) -> Split:
    """Reads `name` (an ILIAS file name) from `folder`, as HDF5 or as `.npy` + `.ids.txt`.

    Raises:
      MissingInput: neither file is there.
      InputError: naming the file and the field (descriptors not [n, d] finite floats of `dim`
        columns, ids not one per row, empty or repeated).
    """
    if not os.path.isdir(folder):
        raise errors.MissingInput(f"{folder}: no such folder; expected an ILIAS-format folder")
    path = os.path.join(folder, name)
    if os.path.exists(path):
        feats, ids = features.read_features(path, dim=dim)
        return Split(feats, np.asarray(ids))
    npy = _npy_path(path)
    if os.path.exists(npy):
        feats = np.asarray(_load_npy(npy, dim))
        return Split(_finite(npy, feats, "descriptors"), _read_txt_ids(npy, feats.shape[0]))
    raise errors.MissingInput(
        f"{path}: missing (nor {os.path.basename(npy)} with its id list); expected an "
        "ILIAS-format feature file"
    )


def distractor_shards(folder: str, dim: int, expected: int = 0) -> list[Shard]:
    """Returns the distractor shards of `folder`, numbered 0..n-1 with no gaps.

    Args:
      folder: the feature folder.
      dim: the descriptor dimension every shard must have.
      expected: the number of shards there must be (0: whatever is there).

    Raises:
      MissingInput: no shard, a gap in the numbering (naming the missing shard), or fewer than
        `expected`.
      InputError: naming an unreadable or mismatched file, more shards than `expected`, or one
        number given as both `.hdf5` and `.npy`.
    """
    if not os.path.isdir(folder):
        raise errors.MissingInput(f"{folder}: no such folder; expected an ILIAS-format folder")
    found = {}
    for path in sorted(glob.glob(os.path.join(folder, "features_distractors_*"))):
        match = _SHARD_RE.search(os.path.basename(path))
        if match:
            number = int(match.group(1))
            if number in found:
                raise errors.InputError(
                    f"{path}: shard {number} is also {os.path.basename(found[number])}; keep one"
                )
            found[number] = path
    if not found:
        raise errors.MissingInput(
            f"{folder}: no distractor shards features_distractors_{{00000..}}.hdf5 (or .npy)"
        )
    n = max(max(found) + 1, expected)
    missing = [i for i in range(n) if i not in found]
    if missing:
        name = features.distractor_name(missing[0])
        raise errors.MissingInput(
            f"{os.path.join(folder, name)}: missing distractor shard; shards are numbered "
            f"0..{n - 1} without gaps"
        )
    if expected and n > expected:
        raise errors.InputError(
            f"{found[n - 1]}: {n} distractor shards; expected {expected} (--config.expected_shards)"
        )
    return [_open_shard(i, found[i], dim) for i in range(n)]


def memory_shard(number: int, x: np.ndarray, ids=None, name: str = "") -> Shard:
    """Returns a `Shard` over an in-memory [n, D] array, read as a file's rows are (`take_rows`).

    `ids`: [n] ids (default "number/row"); `name` defaults to "memory<number>".
    """
    n = x.shape[0]
    ids = np.asarray([f"{number}/{j}" for j in range(n)] if ids is None else ids)
    return Shard(number, name or f"memory{number}", n, lambda: ids, lambda rows: take_rows(x, rows))


def _open_shard(number: int, path: str, dim: int) -> Shard:
    if path.endswith(".npy"):
        arr = _load_npy(path, dim)
        read = lambda rows: take_rows(np.load(path, mmap_mode="r"), rows)
        return Shard(
            number,
            path,
            arr.shape[0],
            lambda: _read_txt_ids(path, arr.shape[0]),
            lambda rows: _finite(path, read(rows), "descriptors"),
        )
    n, d = features.shape(path)
    if d != dim:
        raise errors.field_error(
            path, "features", f"dimension {d}; expected {dim} (as the queries)"
        )
    return Shard(number, path, n, lambda: np.asarray(features.read_ids(path)), _h5_rows(path))


def _h5_rows(path: str):
    def read(rows: np.ndarray) -> np.ndarray:
        rows = np.asarray(rows, np.int64)
        try:
            with h5py.File(path, "r") as f:
                ds = f["features"]
                x = take_rows(ds, rows) if rows.size else np.zeros((0, ds.shape[1]), ds.dtype)
        except (OSError, KeyError, ValueError, TypeError) as e:
            raise errors.InputError(f"{path}: field 'features': unreadable ({e})") from e
        return _finite(path, x, "field 'features'")

    return read


def take_rows(array, rows: np.ndarray) -> np.ndarray:
    """Returns `array[rows]` (a dataset, memory map or array); a contiguous range of rows is read
    as one slice (fastest; a view of an in-memory array)."""
    rows = np.asarray(rows, np.int64)
    if rows.size and rows[-1] - rows[0] + 1 == rows.size:
        return np.asarray(array[rows[0] : rows[-1] + 1])
    return np.asarray(array[rows])


def _finite(path: str, x: np.ndarray, what: str) -> np.ndarray:
    if not np.isfinite(x).all():
        raise errors.InputError(
            f"{path}: {what}: NaN or infinite values; expected finite descriptors"
        )
    return x


def _npy_path(path: str) -> str:
    return os.path.splitext(path)[0] + ".npy"


def _load_npy(path: str, dim: int | None) -> np.ndarray:
    """Returns the memory map of a `.npy` descriptor file, checked: [n, d] floats."""
    try:
        arr = np.load(path, mmap_mode="r", allow_pickle=False)
    except atomic.READ_ERRORS as e:
        raise errors.InputError(f"{path}: not a readable .npy file ({e})") from e
    if not isinstance(arr, np.ndarray) or arr.ndim != 2 or arr.dtype.kind != "f":
        got = f"{arr.dtype} {arr.shape}" if isinstance(arr, np.ndarray) else type(arr).__name__
        raise errors.InputError(f"{path}: descriptors: expected [n, d] floats, got {got}")
    if dim is not None and arr.shape[1] != dim:
        raise errors.InputError(
            f"{path}: descriptors: dimension {arr.shape[1]}; expected {dim} (as the queries)"
        )
    return arr


def _read_txt_ids(npy: str, n: int) -> np.ndarray:
    path = os.path.splitext(npy)[0] + ".ids.txt"
    if not os.path.exists(path):
        raise errors.MissingInput(f"{path}: missing id list for {npy}")
    try:
        with open(path, encoding="utf-8") as f:
            ids = [line.rstrip("\n") for line in f if line.strip()]
    except (OSError, UnicodeDecodeError) as e:
        raise errors.InputError(f"{path}: unreadable id list ({e})") from e
    if len(ids) != n:
        raise errors.InputError(f"{path}: {len(ids)} ids for {n} descriptors in {npy}")
    features.check_ids(ids, path, "ids")
    return np.asarray(ids)


def instance_of(ids) -> np.ndarray:
    """Returns each id's instance: the prefix before the first '/'."""
    return np.asarray([str(i).split("/")[0] for i in ids])


def ground_truth(query_ids, positive_ids) -> tuple[np.ndarray, np.ndarray]:
    """Returns (slots [Q, P] int64 indices into the positives, -1 padded; relevant [Q, T] bool).

    Raises:
      InputError: on duplicate ids or a query without positives (naming it).
    """
    for label, ids in (("query", query_ids), ("positive", positive_ids)):
        uniq, counts = np.unique(np.asarray(ids), return_counts=True)
        if (counts > 1).any():
            raise errors.InputError(f"duplicate {label} id {str(uniq[counts > 1][0])!r}")
    relevant = instance_of(query_ids)[:, None] == instance_of(positive_ids)[None, :]
    n_pos = relevant.sum(axis=1)
    if (n_pos == 0).any():
        raise errors.InputError(
            f"query {str(query_ids[int(np.argmin(n_pos))])!r} has no positives (no positive id "
            "shares its instance, the part before the first '/')"
        )
    order = np.argsort(~relevant, axis=1, kind="stable")[:, : n_pos.max()]
    slots = np.where(np.take_along_axis(relevant, order, axis=1), order, -1)
    return slots.astype(np.int64), relevant


def check_distinct(query_ids, positive_ids) -> None:
    """Raises an `InputError` naming an id that is both a query and a positive."""
    overlap = set(map(str, query_ids)) & set(map(str, positive_ids))
    if overlap:
        raise errors.InputError(f"id {sorted(overlap)[0]!r} is both a query and a positive")


def fingerprint(queries: Split, positives: Split) -> str:
    """Returns a digest of the queries' and positives' descriptors and ids (a search's identity:
    a checkpoint of another folder is not resumed)."""
    h = hashlib.blake2b(digest_size=16)
    for split in (queries, positives):
        h.update(np.ascontiguousarray(split.features).tobytes())
        h.update("\n".join(map(str, split.ids)).encode())
    return h.hexdigest()
