"""Every reader against damaged files: its result or one `InputError` line, nothing else.

Property-based (hypothesis): small valid files of each kind are damaged the ways files get
damaged (truncated, bits flipped, fields dropped, dtypes and ranks changed, rows shuffled, bad
values written, shards missing, id lists edited), and every outcome must be either what the
reader returns for a valid file or an `InputError` whose message is one line naming the file.
500 cases per reader (derandomized, so the suite is repeatable); a share of the sampled-scores
files that survive go on through a whole prediction with tiny settings.
"""

import functools
import io
import json
import os
import re
import shutil
import struct
import sys
import tempfile

import h5py
import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from tailaware import models
from tailaware.core.results import Hardness, TailFit
from tailaware.data import files
from tailaware.io import artifact, atomic, features, ilias_folder
from tailaware.io import scores as scores_lib
from tailaware.io.errors import InputError
from tailaware.models import state_dict
from tailaware.protocol import prediction
from tailaware.protocol.settings import PredictSettings, ProtocolSettings
from tailaware.search import scoring, topk
from tailaware.tail import estimators
from tailaware.tail.settings import TailSettings

CASES = settings(
    max_examples=500,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
Q, M, P, S = 3, 20, 3, 200


@pytest.fixture(scope="module")
def folder():
    with tempfile.TemporaryDirectory() as d:
        yield d


def outcome(read, *args, source):
    """Returns `read(*args)`, or None when it raised a one-line `InputError` naming `source`
    (--hypothesis-show-statistics counts each)."""
    try:
        got = read(*args)
    except InputError as e:
        msg = str(e)
        assert "\n" not in msg and str(source) in msg, msg
        event("InputError")
        return None
    event("read")
    return got


# Damage -----------------------------------------------------------------------------------

DTYPES = (np.float64, np.float32, np.float16, np.int64, np.int32, np.uint8, np.bool_, "U4")
VALUES = (np.nan, np.inf, -np.inf, -1, 0, 1.5, -2.0, 1e9)


def damage_fields(data, fields: dict, kinds=None) -> dict:
    """Returns `fields` (name -> array) damaged one way drawn from `kinds`."""
    fields = {k: np.array(v, copy=True) for k, v in fields.items()}
    kinds = kinds or ("none", "drop", "dtype", "rank", "rows", "shuffle", "value", "extra")
    kind = data.draw(st.sampled_from(kinds), label="field damage")
    name = data.draw(st.sampled_from(sorted(fields)), label="field")
    a = fields[name]
    with np.errstate(all="ignore"):
        if kind == "drop":
            del fields[name]
        elif kind == "dtype":
            try:
                fields[name] = a.astype(data.draw(st.sampled_from(DTYPES)))
            except (ValueError, TypeError):  # e.g. strings to numbers: leave it
                pass
        elif kind == "rank":
            fields[name] = data.draw(st.sampled_from([a[None], a.reshape(-1), a[..., None]]))
        elif kind == "rows" and a.ndim:  # this field's rows alone
            fields[name] = a[
                np.random.default_rng(data.draw(st.integers(0, 99))).permutation(len(a))
            ]
        elif kind == "shuffle":  # every [Q, ...] field's rows alike: still valid
            perm = np.random.default_rng(data.draw(st.integers(0, 99))).permutation(Q)
            fields = {k: v[perm] if v.ndim and len(v) == Q else v for k, v in fields.items()}
        elif kind == "value" and a.size and a.dtype.kind in "fiub":
            flat = a.reshape(-1).copy()
            value = data.draw(st.sampled_from(VALUES))
            i = data.draw(st.integers(0, a.size - 1))
            try:  # an integer field gets a large negative number for a non-finite value
                flat[i] = value if a.dtype.kind == "f" or np.isfinite(value) else -(2**31)
            except OverflowError:  # beyond the dtype (uint8, bool): leave it
                pass
            fields[name] = flat.reshape(a.shape)
        elif kind == "extra":
            fields["bogus"] = np.zeros(2)
    return fields


def damage_bytes(data, blob: bytes) -> bytes:
    """Returns `blob` truncated, with bits flipped, or whole."""
    kind = data.draw(st.sampled_from(("none", "none", "truncate", "flip")), label="byte damage")
    if kind == "truncate":
        return blob[: data.draw(st.integers(0, len(blob) - 1))]
    if kind == "flip":
        b = bytearray(blob)
        for _ in range(data.draw(st.integers(1, 4))):
            b[data.draw(st.integers(0, len(b) - 1))] ^= 1 << data.draw(st.integers(0, 7))
        return bytes(b)
    return blob


def write_npz(data, path, fields, kinds=None, bytes_too=True) -> None:
    """Writes `fields` damaged (fields, then with `bytes_too` bytes) as an `.npz` at `path`."""
    buffer = io.BytesIO()
    np.savez(buffer, **damage_fields(data, fields, kinds))
    blob = buffer.getvalue()
    with open(path, "wb") as f:
        f.write(damage_bytes(data, blob) if bytes_too else blob)


# Valid files ------------------------------------------------------------------------------


def scores_fields(seed=0) -> dict:
    rng = np.random.default_rng(seed)
    tail = -np.sort(-rng.uniform(0.2, 0.6, (Q, M)), axis=1).astype(np.float32)
    pos = rng.uniform(0.3, 0.9, (Q, P)).astype(np.float32)
    pos[0, -1] = np.nan
    counts = (tail[:, None, :] > pos[:, :, None]).sum(axis=2)
    counts = np.where(pos < tail[:, -1:], counts + rng.integers(0, 50, (Q, P)), counts)
    counts = np.where(np.isnan(pos), -1, counts).astype(np.int64)
    return dict(
        tail_scores=tail,
        pos_scores=pos,
        pos_counts=counts,
        n_sample=np.int64(S),
        fixed_counts=np.where(counts >= 0, 1, -1).astype(np.int64),
        query_ids=np.array([f"i{q}/query/Q{q}" for q in range(Q)]),
    )


@functools.cache
def artifact_fields(path) -> dict:
    sc = scores_lib.make_scores(**scores_fields())
    h = estimators.count(sc)
    atoms = np.stack([h.x, h.x * 0.5], axis=-1)
    fit = TailFit(*(np.ones(Q) for _ in TailFit._fields[:13]))
    h = Hardness(h.x * 0.75, h.mask, h.tail_priced, fit, atoms, np.full((Q, 2), 0.5))
    sd = (np.array([1e3, 1e6]), np.array([0.01, 0.02]), 10)
    artifact.save(path, artifact.from_hardness(h, sc, "count", {"model": "m"}, sd))
    return atomic.read_npz(path, "an artifact")


# The readers ------------------------------------------------------------------------------


@CASES
@given(st.data())
def test_sampled_scores_reader(folder, data):
    path = os.path.join(folder, "scores.npz")
    write_npz(data, path, scores_fields())
    sc = outcome(scores_lib.load_scores, path, source=path)
    if sc is not None:
        assert sc.mask.any(axis=1).all() and np.isfinite(sc.pos_scores[sc.mask]).all()


@CASES
@given(st.data())
def test_hardness_artifact_reader(folder, data):
    path = os.path.join(folder, "hardness.npz")
    fields = artifact_fields(path)
    write_npz(data, path, fields)
    art = outcome(artifact.load, path, source=path)
    if art is not None:
        assert ((art.x >= 0) & (art.x <= 1)).all() and art.mask.any(axis=1).all()


def write_h5(data, path, feats, ids) -> None:
    """An ILIAS feature file (`features`, `index`) damaged as fields, then as bytes."""
    fields = damage_fields(data, {"features": feats, "index": ids})
    with h5py.File(path, "w") as f:
        for name, value in fields.items():
            if value.dtype.kind == "U":
                value = value.astype("S")
            f.create_dataset(name, data=value)
    with open(path, "rb") as f:
        blob = f.read()
    with open(path, "wb") as f:
        f.write(damage_bytes(data, blob))


def unit(x):
    """Rows scaled to norm 1, as ILIAS descriptors are (the readers check it)."""
    return x / np.linalg.norm(x, axis=1, keepdims=True)


@pytest.fixture(scope="module")
def shards(folder):
    """A folder of three distractor shards; the test rewrites shard 1 and restores the rest."""
    root = os.path.join(folder, "ilias")
    os.makedirs(root)
    rng = np.random.default_rng(0)
    for k in range(3):
        ids = [f"tar{k}/{i}" for i in range(5)]
        features.write_features(
            os.path.join(root, features.distractor_name(k)), unit(rng.normal(size=(5, 4))), ids
        )
    return root


@CASES
@given(st.data())
def test_ilias_folder_readers(shards, data):
    root, valid = shards, sorted(os.listdir(shards))
    damaged = os.path.join(root, features.distractor_name(1))
    ids = np.array([f"tar1/{i}" for i in range(5)])
    write_h5(data, damaged, np.ones((5, 4), np.float16), ids)
    layout = data.draw(st.sampled_from(("as is", "gap", "too many", "npy twin")), label="layout")
    first = os.path.join(root, features.distractor_name(0))
    if layout == "gap":
        os.rename(first, first + ".away")
    elif layout == "too many":
        shutil.copy(first, os.path.join(root, features.distractor_name(4)))
    elif layout == "npy twin":
        np.save(os.path.join(root, "features_distractors_00002.npy"), np.zeros((5, 4)))

    def read_all():
        found = ilias_folder.distractor_shards(root, 4, expected=3)
        for shard in found:
            assert len(shard.read_ids()) == shard.num_rows
            assert shard.read_rows(np.arange(shard.num_rows)).shape == (shard.num_rows, 4)
        return found

    try:
        if layout == "as is":  # the file alone, then the folder
            outcome(features.read_features, damaged, None, 4, source=damaged)
        found = outcome(read_all, source=root)
        if found is not None:
            assert layout == "as is" and [s.number for s in found] == [0, 1, 2]
    finally:
        if layout == "gap":
            os.rename(first + ".away", first)
        for name in set(os.listdir(root)) - set(valid):
            os.remove(os.path.join(root, name))


@CASES
@given(st.data())
def test_npy_split_and_id_lists(folder, data):
    root = os.path.join(folder, "npy")
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(root)
    stem = os.path.join(root, "features_positives")
    np.save(stem + ".npy", np.random.default_rng(0).normal(size=(4, 3)).astype(np.float16))
    with open(stem + ".npy", "rb") as f:
        blob = f.read()
    if data.draw(st.booleans(), label="damage the .npy"):
        with open(stem + ".npy", "wb") as f:
            f.write(damage_bytes(data, blob))
    lines = [f"i{k}/pos/P{k}.jpg" for k in range(4)]
    edit = data.draw(st.sampled_from(("none", "repeat", "drop", "blank", "bytes")), label="ids")
    i = data.draw(st.integers(0, 3))
    if edit == "repeat":
        lines[i] = lines[(i + 1) % 4]
    elif edit == "drop":
        del lines[i]
    elif edit == "blank":
        lines[i] = " "
    text = "".join(line + "\n" for line in lines).encode()
    if edit == "bytes":
        text = damage_bytes(data, text)
    with open(stem + ".ids.txt", "wb") as f:
        f.write(text)
    split = outcome(ilias_folder.read_split, root, features.POSITIVES, 3, source=root)
    if split is not None:
        assert split.features.shape == (4, 3) and len(set(split.ids)) == 4
    ids = outcome(files.read_id_list, stem + ".ids.txt", source=stem + ".ids.txt")
    if ids is not None:
        assert len(set(ids)) == len(ids) > 0


SPEC = scoring.SearchSpec(0.5, 0, M, "fingerprint")


@functools.cache
def checkpoint_fields(path) -> dict:
    scoring.save_checkpoint(path, topk.empty_state(Q, M, P), [0, 1], 123, SPEC)
    return atomic.read_npz(path, "a partial")


@CASES
@given(st.data())
def test_search_checkpoint_reader(folder, data):
    path = os.path.join(folder, "process_000_of_001.npz")
    write_npz(data, path, checkpoint_fields(path))
    other = data.draw(st.sampled_from((SPEC, scoring.SearchSpec(0.25, 0, M, "fingerprint"))))
    got = outcome(scoring.load_checkpoint, path, other, source=path)
    if got is not None:
        assert other == SPEC and got[0].vals.shape[1] == M


def safetensors_blob(header: dict, data: bytes) -> bytes:
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + data


@CASES
@given(st.data())
def test_safetensors_reader(folder, data):
    tensors = {
        "a": np.arange(12, dtype=np.float32).reshape(3, 4),
        "b": np.arange(5).astype(ml_dtypes.bfloat16),
        "c": np.arange(6, dtype=np.int64).reshape(2, 3),
    }
    header, blob, names = {"__metadata__": {"format": "pt"}}, b"", {"a": "F32", "b": "BF16"}
    for name, arr in tensors.items():
        raw = arr.tobytes()
        header[name] = {
            "dtype": names.get(name, "I64"),
            "shape": list(arr.shape),
            "data_offsets": [len(blob), len(blob) + len(raw)],
        }
        blob += raw
    name = data.draw(st.sampled_from(["a", "b", "c"]))
    key = data.draw(st.sampled_from(("none", "dtype", "shape", "data_offsets", "drop")))
    if key == "drop":
        del header[name]["shape"]
    elif key != "none":
        header[name][key] = data.draw(
            st.sampled_from(["F64", "X9", [3, 5], [-1, 4], [0, 10**6], [4, 2], "oops", None])
        )
    path = os.path.join(folder, "w.safetensors")
    with open(path, "wb") as f:
        f.write(damage_bytes(data, safetensors_blob(header, blob)))
    got = outcome(state_dict.load_state_dict, path, source=path)
    if got is not None:
        assert set(got) == set(tensors)
        for k, arr in got.items():
            assert arr.shape == tensors[k].shape


# A whole prediction from what survives ----------------------------------------------------


TINY = ProtocolSettings(query_replicates=50, nested_replicates=0, curve_points=3, budget_levels=1)


@pytest.mark.slow
@settings(max_examples=40, deadline=None, derandomize=True)
@given(st.data(), st.sampled_from(("count", "evt")))
def test_surviving_scores_files_predict(folder, data, estimator):
    # Damage that keeps the shapes (one compile per estimator): a valid prediction or one line.
    path = os.path.join(folder, "predict.npz")
    fields = scores_fields(data.draw(st.integers(0, 3)))
    write_npz(data, path, fields, kinds=("none", "rows", "shuffle", "value"), bytes_too=False)
    sc = outcome(scores_lib.load_scores, path, source=path)
    if sc is None:
        return
    tail = TailSettings(top_m=M, min_count=2)
    settings_ = PredictSettings(estimator=estimator, k=10, tail=tail, protocol=TINY)
    n_target = data.draw(st.sampled_from((S // 2, S, 10**6)))
    p = prediction.predict(sc, settings_, n_target)
    assert 0.0 <= p.map <= 1.0 and np.isfinite(p.per_query_ap).all()
    lo, hi = p.interval.ci90.reported
    assert 0.0 <= lo <= hi <= 1.0
    assert any(line.startswith("SUB-GALLERY") for line in p.diagnostics.summary) == (n_target < S)


# Named cases ------------------------------------------------------------------------------


def test_ilias_folder_problems_name_the_file(tmp_path):
    rng = np.random.default_rng(0)
    for k in range(2):
        ids = [f"tar{k}/{i}" for i in range(4)]
        path = tmp_path / features.distractor_name(k)
        features.write_features(path, unit(rng.normal(size=(4, 3))), ids)
    one = tmp_path / features.distractor_name(1)
    with h5py.File(one, "w") as f:  # 4 descriptors, 3 ids
        f.create_dataset("features", data=np.zeros((4, 3), np.float16))
        f.create_dataset("index", data=np.array([b"a", b"b", b"c"]))
    with pytest.raises(InputError, match=r"00001.hdf5: field 'features': has shape \(4, 3\)"):
        ilias_folder.distractor_shards(str(tmp_path), 3)
    features.write_features(one, np.zeros((3, 3)), ["a", "", "c"])
    with pytest.raises(InputError, match=r"00001.hdf5: field 'index': row 1 has an empty id"):
        features.read_ids(one)
    os.rename(tmp_path / features.distractor_name(0), tmp_path / features.distractor_name(2))
    with pytest.raises(FileNotFoundError, match=r"00000.hdf5: missing distractor shard"):
        ilias_folder.distractor_shards(str(tmp_path), 3)
    with pytest.raises(InputError, match=r"00002.hdf5: 3 distractor shards; expected 2"):
        shutil.copy(tmp_path / features.distractor_name(1), tmp_path / features.distractor_name(0))
        ilias_folder.distractor_shards(str(tmp_path), 3, expected=2)
    ids = tmp_path / "positive_ids.txt"
    ids.write_text("id,scale,clutter\na/pos/1.jpg,1,0\nb/pos/2.jpg,1,0\na/pos/1.jpg,2,1\n")
    with pytest.raises(InputError, match=r"positive_ids.txt: field 'ids': duplicate id 'a/pos/1"):
        files.read_id_list(ids)


def test_a_checkpoint_of_another_model_is_one_line_naming_the_file(tmp_path):
    path = tmp_path / "other.safetensors"
    arr = np.zeros((2, 2), np.float32)
    header = {"vision.other.weight": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}}
    path.write_bytes(safetensors_blob(header, arr.tobytes()))
    spec = models.spec_for("hf_dinov2", "dinov2", "mu/14", pos_grid=2)
    with pytest.raises(models.CheckpointError) as e:
        models.load(path, "hf_dinov2", spec)
    msg = str(e.value)
    assert msg.startswith(f"{path}: checkpoint does not match hf_dinov2") and "\n" not in msg
    assert re.search(r"missing \((\d+)\): (\S+, ){5}\S+ and \d+ more$", msg), msg


def test_faiss_missing_says_which_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "faiss", None)  # `import faiss` raises ImportError
    with pytest.raises(ImportError, match=r"backend faiss needs the `cpu` extra"):
        scoring.make_backend("faiss", np.zeros((2, 3), np.float32), 4, 8, "float32")


def test_a_damaged_pickled_checkpoint_is_one_line(tmp_path):
    torch = pytest.importorskip("torch")  # the `convert` extra
    path = tmp_path / "w.pth"
    torch.save({"state_dict": {"a": torch.ones(2, 3)}}, path)
    np.testing.assert_array_equal(state_dict.load_state_dict(path)["a"], np.ones((2, 3)))
    blob = path.read_bytes()
    for damaged in (blob[: len(blob) // 2], b"not a checkpoint"):
        path.write_bytes(damaged)
        with pytest.raises(InputError, match=r"w.pth: not a readable PyTorch checkpoint"):
            state_dict.load_state_dict(path)
    torch.save([torch.ones(2)], path)
    with pytest.raises(InputError, match=r"w.pth: expected a state dict, got list"):
        state_dict.load_state_dict(path)


def test_descriptors_not_l2_normalised_or_not_floats_are_named(tmp_path):
    rng = np.random.default_rng(0)
    good = unit(rng.normal(size=(4, 8)))
    path = tmp_path / features.distractor_name(0)
    features.write_features(path, good, [f"d/{i}" for i in range(4)])
    assert features.read_features(path)[0].shape == (4, 8)  # float16 rounding is within 1e-2
    features.write_features(
        path, good * np.asarray([[1.0], [1.0], [1.05], [1.0]]), ["a", "b", "c", "d"]
    )
    message = r"00000.hdf5: field 'features': row 2 has L2 norm 1.05.*not L2-normalised"
    with pytest.raises(InputError, match=message):
        features.read_features(path)
    (shard,) = ilias_folder.distractor_shards(str(tmp_path), 8)
    with pytest.raises(InputError, match=message):  # the scoring engine's block reads
        shard.read_rows(np.arange(4))
    with h5py.File(path, "w") as f:
        f.create_dataset("features", data=np.ones((4, 8), np.int8))
        f.create_dataset("index", data=np.array([b"a", b"b", b"c", b"d"]))
    with pytest.raises(InputError, match=r"00000.hdf5: field 'features': expected floats"):
        features.read_features(path)
