"""Atomic writes: complete or absent, with the permissions of a plain write."""

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
    assert json.loads(path.read_text()) == {"map": 0.5, "aps": [0, 1, 2]}
    mode = lambda p: stat.S_IMODE(os.stat(p).st_mode)
    assert mode(path) == mode(plain)  # not mkstemp's 0600
    atomic.write_npz(tmp_path / "a.npz", x=np.ones(2))
    assert mode(tmp_path / "a.npz") == mode(plain)

    # A failing writer leaves the previous file and no temporary behind.
    with pytest.raises(TypeError, match="not JSON serialisable"):
        atomic.write_json(path, {"bad": object()})
    assert json.loads(path.read_text())["map"] == 0.5
    assert sorted(os.listdir(path.parent)) == ["result.json"]
