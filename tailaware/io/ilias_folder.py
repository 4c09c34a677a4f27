"""An ILIAS-format feature folder: queries, positives, distractor shards and the ground truth.

Folder layout (the official ILIAS code's; docs/outputs.md): `features_{image,text}_queries.hdf5`,
`features_positives.hdf5`, `features_distractors_{idx:05d}.hdf5` with `features` [n, d] and
`index` [n]. Plain numpy shards work too: `NAME.npy` ([n, d]) next to `NAME.ids.txt` (one id
per line) for any of these names. Ground truth: a query's positives are the positives whose id
has the same instance prefix `id.split("/")[0]`; the other instances' positives are always in
the database and counted as non-relevant.

The official report's inputs (`tailaware.protocol.ilias_report`): `positive_ids.txt`, CSV
`id,scale,clutter` (`read_positive_info`, found by `find_positive_info`), and a taxonomy JSON
(`read_taxonomy`); ILIAS's own (`ILIAS_TAXONOMY`, MIT, from the ILIAS repository's
`misc/taxonomy.json`, licence beside it) is the default for ILIAS's instances
(`report_taxonomy`).

Every reader checks what it reads and names the file, the field and what was expected.

Shapes: Q queries, T positives in the database, P positive slots per query (padded), D dims.
"""

import dataclasses
import glob
import hashlib
import json
import math
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
    found: dict[int, str] = {}
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
        x = _finite(path, x, "field 'features'")
        features.check_normalised(path, x)  # each block as it is read: no pass of its own
        return x

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


def slot_positive_ids(slots, positive_ids) -> np.ndarray:
    """Returns [Q, P] str: the id of the positive in each of `ground_truth`'s slots, "" at
    padding."""
    ids = np.asarray(list(map(str, positive_ids)) + [""])
    return ids[np.where(slots >= 0, slots, len(ids) - 1)]


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


# ---------------------------------------------------------------------------------------------
# The official report's inputs: scale and clutter per positive, the instances' taxonomy.

POSITIVE_INFO = "positive_ids.txt"
ILIAS_TAXONOMY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ilias_taxonomy.json")


def find_positive_info(folder: str) -> str | None:
    """Returns the path of `positive_ids.txt` in `folder`, else in `folder/image_ids/` (where the
    ILIAS download keeps it), or None."""
    for path in (
        os.path.join(folder, POSITIVE_INFO),
        os.path.join(folder, "image_ids", POSITIVE_INFO),
    ):
        if os.path.isfile(path):
            return path
    return None


def read_positive_info(path: str | os.PathLike) -> dict[str, tuple[float, int]]:
    """Reads ILIAS's `positive_ids.txt`: id -> (scale, clutter).

    The file is CSV `id,scale,clutter` (the official one has no header; a first line whose first
    field is `id` is skipped), scale a finite float >= 0, clutter an integer >= 0. A file of ids
    alone (one field per line) is accepted and gives {} (no scale or clutter groups).

    Raises:
      MissingInput: no such file.
      InputError: naming the file, the line and the field (a field count other than the first
        line's, a scale or clutter that is not a number >= 0, an empty or repeated id).
    """
    path = errors.require_file(path, "positive_ids.txt, CSV id,scale,clutter")
    try:
        with open(path, encoding="utf-8") as f:
            lines = [(n, line.strip()) for n, line in enumerate(f, start=1) if line.strip()]
    except (OSError, UnicodeDecodeError) as e:
        raise errors.InputError(f"{path}: unreadable ({e}); expected CSV id,scale,clutter") from e
    if lines and lines[0][1].split(",")[0].strip() == "id":
        lines = lines[1:]
    if not lines:
        raise errors.InputError(f"{path}: no ids; expected CSV id,scale,clutter")
    width = len(lines[0][1].split(","))
    if width not in (1, 3):
        raise errors.InputError(
            f"{path}: line {lines[0][0]}: {width} fields; expected id,scale,clutter or an id"
        )
    info: dict[str, tuple[float, int]] = {}
    first: dict[str, int] = {}
    for n, line in lines:
        fields = [v.strip() for v in line.split(",")]
        where = f"{path}: line {n}"
        if len(fields) != width:
            raise errors.InputError(
                f"{where}: {len(fields)} fields; expected {width} as on line {lines[0][0]}"
            )
        pid = fields[0]
        if not pid:
            raise errors.field_error(where, "id", "empty; expected an id")
        if pid in first:
            raise errors.field_error(where, "id", f"{pid!r} repeats line {first[pid]}")
        first[pid] = n
        if width == 3:
            info[pid] = (_scale(where, fields[1]), _clutter(where, fields[2]))
    return info


def _scale(where: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value >= 0):
        raise errors.field_error(where, "scale", f"expected a finite number >= 0, got {text!r}")
    return value


def _clutter(where: str, text: str) -> int:
    try:
        value = int(text)  # as the official code reads it: "3.0" is not a clutter
    except ValueError:
        value = -1
    if value < 0:
        raise errors.field_error(where, "clutter", f"expected an integer >= 0, got {text!r}")
    return value


def read_taxonomy(path: str | os.PathLike) -> dict[str, tuple[str, str]]:
    """Reads a taxonomy JSON: instance -> (category, label), in file order.

    The file maps category -> subcategory -> sub-subcategory -> [instance names] (ILIAS's
    `misc/taxonomy.json`). An instance's label is "category-subcategory" and its category is
    `label.split("-")[0]`, as the official report builds them (so a category name holding "-"
    is cut at it, as there).

    Raises:
      MissingInput: no such file.
      InputError: naming the file and the field (the dotted path of keys) that is not of that
        shape, or an instance listed twice.
    """
    path = errors.require_file(path, "a taxonomy JSON (category -> subcategory -> ... -> names)")
    try:
        with open(path, encoding="utf-8") as f:
            tree = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise errors.InputError(f"{path}: not a JSON file ({e})") from e
    out: dict[str, tuple[str, str]] = {}
    where: dict[str, str] = {}
    for c, subs in _children(path, "", tree, "category -> subcategory -> ..."):
        for sc, subsubs in _children(path, c, subs, "subcategory -> sub-subcategory -> ..."):
            for ssc, names in _children(path, f"{c}.{sc}", subsubs, "sub-subcategory -> [...]"):
                field = f"{c}.{sc}.{ssc}"
                if not isinstance(names, list) or not all(isinstance(n, str) and n for n in names):
                    raise errors.field_error(path, field, "expected a list of instance names")
                label = f"{c}-{sc}"
                for name in names:
                    if name in out:
                        raise errors.field_error(
                            path, field, f"instance {name!r} is also under {where[name]}"
                        )
                    out[name], where[name] = (label.split("-")[0], label), field
    if not out:
        raise errors.InputError(f"{path}: no instances; expected category -> ... -> [names]")
    return out


def _children(path: str, field: str, node, expected: str):
    if not isinstance(node, dict):
        raise errors.field_error(path, field or "(top level)", f"expected an object: {expected}")
    return node.items()


def report_taxonomy(instances, path: str = "") -> dict[str, tuple[str, str]] | None:
    """Returns the taxonomy of `path`, or without one ILIAS's (`ILIAS_TAXONOMY`) when every
    instance of `instances` is in it, else None (the report then skips categories)."""
    if path:
        return read_taxonomy(path)
    taxonomy = read_taxonomy(ILIAS_TAXONOMY)
    return taxonomy if set(map(str, instances)) <= set(taxonomy) else None
