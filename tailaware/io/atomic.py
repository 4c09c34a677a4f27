"""Atomic file writes: a result file is either absent or complete, never half-written."""

import contextlib
import json
import os
import tempfile
from collections.abc import Iterator
from typing import Any

import numpy as np

# The process's file-creation mask, read once at import (os.umask can only be read by setting
# it): a finished file gets the permissions a plain open() would give it, not mkstemp's 0600.
_UMASK = os.umask(0o022)
os.umask(_UMASK)


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[str]:
    """Yields a temporary path beside `path`; renames it onto `path` when the block succeeds.

    The file gets the permissions of a plain `open(path, "w")` (0666 less the umask).
    """
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    suffix = os.path.splitext(path)[1]
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=suffix, dir=directory)
    os.close(fd)
    try:
        yield tmp
        os.chmod(tmp, 0o666 & ~_UMASK)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def write_json(path: str | os.PathLike, obj: Any) -> None:
    """Writes `obj` as indented JSON, atomically."""
    with atomic_path(path) as tmp, open(tmp, "w") as f:
        json.dump(obj, f, indent=2, sort_keys=False, default=_json_default)
        f.write("\n")


def write_npz(path: str | os.PathLike, **arrays: np.ndarray) -> None:
    """Writes an uncompressed `.npz`, atomically (the name keeps its `.npz` suffix)."""
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        np.savez(f, **arrays)


def save_figure(fig, path: str | os.PathLike, dpi: int = 110) -> None:
    """Saves a matplotlib figure as PNG, atomically."""
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=dpi, format="png")


def read_npz(path: str | os.PathLike, what: str) -> dict:
    """Returns every array of an `.npz` file; errors name the file and say what it should be."""
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: no such {what}")
    try:
        with np.load(path, allow_pickle=False) as z:
            return {name: z[name] for name in z.files}
    except (OSError, ValueError) as e:
        raise ValueError(f"{path}: not a readable .npz file ({e})") from e


def _json_default(obj: Any) -> Any:
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")
