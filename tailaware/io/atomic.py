"""Atomic file writes (a result file is either absent or complete, never half-written) and the
checked `.npz` read every reader uses (`read_npz`)."""

import contextlib
import json
import math
import os
import struct
import tempfile
import tokenize
import zipfile
import zlib
from collections.abc import Iterator
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from tailaware.io import errors, version

# Where Linux (4.7+) shows the process's file-creation mask, which os.umask can only read by
# setting it: a moment in which another thread's new file gets the wrong permissions.
_STATUS = "/proc/self/status"


def _umask() -> int:
    """Returns the process's umask: read from `_STATUS`, else set and put back at once."""
    try:
        with open(_STATUS) as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[str]:
    """Yields a temporary path beside `path`; renames it onto `path` when the block succeeds.

    The file gets the permissions of a plain `open(path, "w")` (0666 less the umask), not
    mkstemp's 0600. Before the block returns, the file's data is on disk (fsync) and so is its
    name (fsync of the folder after the rename): a crash or power cut afterwards cannot leave
    an empty or missing file where a run reported one written.
    """
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    suffix = os.path.splitext(path)[1]
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=suffix, dir=directory)
    os.close(fd)
    try:
        yield tmp
        os.chmod(tmp, 0o666 & ~_umask())
        _fsync(tmp)
        os.replace(tmp, path)
        _fsync(directory)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def _fsync(path: str) -> None:
    """Flushes a file's data, or a folder's entries, to disk (the writer has closed the file)."""
    flags = os.O_RDONLY
    if os.path.isdir(path):
        flags |= getattr(os, "O_DIRECTORY", 0)
    fd = os.open(path, flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_json(path: str | os.PathLike, obj: Any, *, stamp: bool = True) -> None:
    """Writes `obj` as indented JSON, atomically.

    With `stamp`, a dict gets `"tailaware_version"` first (`version.KEY`): every JSON output
    says which tailaware wrote it. A cache compared whole on reading passes `stamp=False`.
    """
    if stamp and isinstance(obj, dict):
        obj = {version.KEY: version.version(), **obj}
    with atomic_path(path) as tmp, open(tmp, "w") as f:
        json.dump(obj, f, indent=2, sort_keys=False, default=_json_default)
        f.write("\n")


def write_npz(path: str | os.PathLike, **arrays: ArrayLike) -> None:
    """Writes an uncompressed `.npz`, atomically (the name keeps its `.npz` suffix)."""
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        # numpy's stub lets `**arrays` reach savez's `allow_pickle: bool` (numpy >= 2.1); no
        # array is named so, and numpy 1.26 has no such parameter to pass explicitly.
        np.savez(f, **arrays)  # type: ignore[arg-type]


def save_figure(fig, path: str | os.PathLike, dpi: int = 110) -> None:
    """Saves a matplotlib figure as PNG, atomically."""
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=dpi, format="png")


def read_npz(path: str | os.PathLike, what: str, schema: dict | None = None) -> dict:
    """Returns every array of an `.npz` file, each checked against its archive entry first.

    A truncated or bit-flipped archive, a text or `.npy` file, a member that is not a plain
    array (pickled objects) or whose header promises more data than it holds is an
    `InputError` naming the file (and the field); nothing is allocated from a header's word.

    Args:
      path: the file.
      what: what it should be, for the messages (e.g. "a sampled-scores .npz file").
      schema: optional {field: (dtype kinds, ndim)} of required fields, e.g. {"ids": ("i", 2)}
        (kinds as `np.dtype.kind`: "f" float, "iu" integer, "U" string, "b" bool).

    Raises:
      MissingInput: no such file.
      InputError: naming the file, the field where there is one, and what was expected.
    """
    path = errors.require_file(path, what)
    with open(path, "rb") as f:
        head = f.read(4)
    if head not in _ZIP_MAGIC:
        found = {b"": "an empty file", b"\x93NUM": "a single .npy array"}.get(head)
        raise errors.InputError(
            f"{path}: not an .npz archive ({found or f'starts with {head!r}'}); expected {what}"
        )
    try:
        with zipfile.ZipFile(path) as z:
            fields = {}
            for info in z.infolist():
                if not info.filename.endswith(".npy"):
                    raise errors.InputError(
                        f"{path}: member {info.filename!r} is not an .npy array; expected {what}"
                    )
                with z.open(info) as member:
                    name = info.filename[: -len(".npy")]
                    fields[name] = _read_member(member, info.file_size, path, name)
    except errors.InputError:
        raise
    except READ_ERRORS as e:
        raise errors.InputError(
            f"{path}: not a readable .npz archive, truncated or corrupt ({type(e).__name__}: "
            f"{e}); expected {what}"
        ) from e
    for name, (kinds, ndim) in (schema or {}).items():
        if name not in fields:
            raise errors.field_error(path, name, f"missing (required); expected {what}")
        arr = fields[name]
        if arr.dtype.kind not in kinds or arr.ndim != ndim:
            raise errors.field_error(
                path,
                name,
                f"expected a {ndim}-d array of kind {kinds!r}, got {arr.dtype} {arr.shape}",
            )
    return fields


# "PK\x03\x04" opens a zip archive's first entry; "PK\x05\x06" an empty archive.
_ZIP_MAGIC = (b"PK\x03\x04", b"PK\x05\x06")
# What the zip and .npy layers raise on a damaged file (numpy parses an .npy header with
# `tokenize` and `ast`: a flipped bit there is a TokenError or a SyntaxError).
READ_ERRORS = (
    tokenize.TokenError,
    SyntaxError,
    zipfile.BadZipFile,
    zlib.error,
    EOFError,
    OSError,
    ValueError,
    KeyError,
    struct.error,
    NotImplementedError,
    RuntimeError,
    OverflowError,
    TypeError,
)


def _read_member(member, size: int, path: str, name: str) -> np.ndarray:
    """Returns one `.npy` member of an archive: its header checked against its size, then read
    to its end (which checks the archive's CRC)."""
    version = np.lib.format.read_magic(member)
    if version == (1, 0):
        shape, fortran, dtype = np.lib.format.read_array_header_1_0(member)
    elif version == (2, 0):
        shape, fortran, dtype = np.lib.format.read_array_header_2_0(member)
    else:
        raise errors.field_error(path, name, f"unsupported .npy format version {version}")
    if dtype.hasobject:
        raise errors.field_error(path, name, "holds pickled Python objects; expected a plain array")
    expected = math.prod(shape) * dtype.itemsize
    held = size - member.tell()
    if held != expected:
        raise errors.field_error(
            path,
            name,
            f"{held} bytes of data for shape {shape} {dtype} ({expected} bytes): truncated or "
            "corrupt",
        )
    data = bytearray(member.read())  # writable, like np.load's arrays
    if len(data) != expected:
        raise errors.field_error(path, name, f"{len(data)} of {expected} bytes: truncated")
    arr = np.frombuffer(data, dtype) if expected else np.zeros(0, dtype)
    return arr.reshape(shape, order="F" if fortran else "C")


def _json_default(obj: Any) -> Any:
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")
