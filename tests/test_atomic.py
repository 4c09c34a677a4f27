"""Atomic writes: complete or absent, with the permissions of a plain write."""

import importlib
import importlib.metadata
import json
import os
import stat

import numpy as np
import pytest

from tailaware.io import atomic


def test_results_are_complete_or_absent_and_readable_like_plain_files(tmp_path):
    plain = tmp_path / "plain.json"
    plain.write_text("{}")
    path = tmp_path / "sub" / "result.json"
    atomic.write_json(path, {"map": np.float32(0.5), "aps": np.arange(3)})
    # Every JSON output records the version that wrote it; a cache compared whole opts out.
    written = {"tailaware_version": importlib.metadata.version("tailaware"), "map": 0.5}
    assert json.loads(path.read_text()) == {**written, "aps": [0, 1, 2]}
    atomic.write_json(tmp_path / "cache.json", {"n": 1}, stamp=False)
    assert json.loads((tmp_path / "cache.json").read_text()) == {"n": 1}
    mode = lambda p: stat.S_IMODE(os.stat(p).st_mode)
    assert mode(path) == mode(plain)  # not mkstemp's 0600
    atomic.write_npz(tmp_path / "a.npz", x=np.ones(2))
    assert mode(tmp_path / "a.npz") == mode(plain)

    # A failing writer leaves the previous file and no temporary behind.
    with pytest.raises(TypeError, match="not JSON serialisable"):
        atomic.write_json(path, {"bad": object()})
    assert json.loads(path.read_text())["map"] == 0.5
    assert sorted(os.listdir(path.parent)) == ["result.json"]


def test_the_file_and_then_its_folder_are_on_disk_before_the_write_returns(tmp_path, monkeypatch):
    synced = []  # (what was flushed, the final file's state at that moment)
    path = tmp_path / "out" / "result.json"
    real = os.fsync

    def fsync(fd):
        st = os.fstat(fd)
        synced.append((st.st_ino, stat.S_ISDIR(st.st_mode), st.st_size, path.exists()))
        return real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    atomic.write_json(path, {"map": 0.5})
    (file_ino, file_is_dir, size, renamed), (dir_ino, dir_is_dir, _, renamed_then) = synced
    # The data first, complete, before the rename; then the folder holding the new name.
    assert file_ino == os.stat(path).st_ino and not file_is_dir and size == path.stat().st_size
    assert not renamed and renamed_then
    assert dir_ino == os.stat(path.parent).st_ino and dir_is_dir
    synced.clear()
    with pytest.raises(TypeError):
        atomic.write_json(path, {"bad": object()})
    assert synced == []  # a failed write flushes nothing and leaves the old file


def test_umask_is_read_when_writing_and_never_set_where_it_can_be_read(tmp_path, monkeypatch):
    set_umask = os.umask
    calls = []
    monkeypatch.setattr(os, "umask", lambda mask: calls.append(mask) or set_umask(mask))
    importlib.reload(atomic)
    assert calls == []  # importing leaves the umask alone
    mode = lambda p: stat.S_IMODE(os.stat(p).st_mode)
    before = set_umask(0o027)
    try:
        atomic.write_json(tmp_path / "a.json", {})
        linux = os.path.exists(atomic._STATUS)
        monkeypatch.setattr(atomic, "_STATUS", str(tmp_path / "no-status"))  # not Linux
        atomic.write_npz(tmp_path / "b.npz", x=np.ones(2))
        after = set_umask(before)
    finally:
        set_umask(before)
    assert mode(tmp_path / "a.json") == mode(tmp_path / "b.npz") == 0o666 & ~0o027 == 0o640
    assert after == 0o027  # the fallback put the umask back
    assert calls == ([] if linux else [0o022, 0o027]) + [0o022, 0o027]  # set and reset
