"""The ILIAS job end to end on a generated ILIAS-format folder, against the official recipe."""

import json
import os
import pickle
import socket
import subprocess
import sys

import numpy as np
import pytest

from tailaware.configs import ilias as ilias_config
from tailaware.core import sampling
from tailaware.io import artifact, features, ilias_folder
from tailaware.io import scores as scores_lib
from tailaware.io.errors import InputError
from tailaware.jobs import ilias
from tailaware.protocol import budget, from_artifact
from tailaware.protocol.settings import PredictSettings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
N_INSTANCES, QUERIES_PER, POSITIVES_PER, SHARDS, ROWS, DIM = 6, 2, 3, 3, 200, 16


def make_folder(path, seed=0):
    """Writes a small ILIAS-format folder; entries in {-1/4, 1/4} (DIM = 16) make every row a
    unit vector, as ILIAS's are, and every score exact."""
    rng = np.random.default_rng(seed)
    tern = lambda *shape: rng.choice(np.float32([-0.25, 0.25]), size=shape)
    base = tern(N_INSTANCES, DIM)

    def near(v, n, flips):
        out = np.repeat(v[None], n, axis=0)
        for row in out:
            row[rng.choice(DIM, flips, replace=False)] = tern(flips)
        return out

    queries = np.concatenate([near(b, QUERIES_PER, 5) for b in base])
    positives = np.concatenate([near(b, POSITIVES_PER, 7) for b in base])
    qids = [
        f"i{i:03d}/query/Q{i:03d}_{j:02d}.jpg"
        for i in range(N_INSTANCES)
        for j in range(QUERIES_PER)
    ]
    pids = [
        f"i{i:03d}/pos/P{i:03d}_{j:02d}.jpg"
        for i in range(N_INSTANCES)
        for j in range(POSITIVES_PER)
    ]
    features.write_features(os.path.join(path, features.IMAGE_QUERIES), queries, qids)
    tids = [f"i{i:03d}/text" for i in range(N_INSTANCES)]
    features.write_features(os.path.join(path, features.TEXT_QUERIES), near_all(base, rng), tids)
    features.write_features(os.path.join(path, features.POSITIVES), positives, pids)
    for s in range(SHARDS):
        ids = [f"tar{s:03d}/{j:06d}" for j in range(ROWS)]
        features.write_features(
            os.path.join(path, features.distractor_name(s)), tern(ROWS, DIM), ids
        )
    return path


def near_all(base, rng):
    out = base.copy()
    out[:, :4] = rng.choice(np.float32([-0.25, 0.25]), size=(base.shape[0], 4))
    return out


def official_map(folder, queries="image", k=1000):
    """A literal transcription of the official ILIAS mAP@k: rank the whole database.

    Database = positives + every distractor, ordered by descending score; among equal scores the
    query's own positives first (our stated tie rule; the official unstable sort is arbitrary).
    AP = 1 / min(k, |gt|) * sum over positives at rank i <= k of (positives up to i) / i.
    """
    q, qids = features.read_features(os.path.join(folder, ilias_folder.QUERY_FILES[queries]))
    p, pids = features.read_features(os.path.join(folder, features.POSITIVES))
    xs, dids = [p], list(pids)
    for s in range(SHARDS):
        x, ids = features.read_features(os.path.join(folder, features.distractor_name(s)))
        xs.append(x)
        dids += ids
    db = np.concatenate(xs).astype(np.float32)
    sims = q.astype(np.float32) @ db.T
    aps, top_ids = [], []
    for i, qid in enumerate(qids):
        rel = np.asarray(
            [j < len(pids) and d.split("/")[0] == qid.split("/")[0] for j, d in enumerate(dids)]
        )
        group = np.where(rel, 0, np.where(np.arange(len(dids)) < len(pids), 1, 2))
        order = np.lexsort((np.arange(len(dids)), group, -sims[i]))
        ap, hits = 0.0, 0
        for rank, j in enumerate(order[:k], start=1):
            if rel[j]:
                hits += 1
                ap += hits / rank
        aps.append(ap / min(k, rel.sum()))
        top_ids.append([dids[j] for j in order[:k]])
    return np.asarray(aps), top_ids


def config(folder, top_m=60, **overrides):
    c = ilias_config.get_config()
    c.features = str(folder)
    c.evt.top_m = top_m
    c.block_size = 64
    c.checkpoint_every_s = 0.0
    c.protocol.nested_replicates = 0  # the protocol has its own tests; keep these quick
    c.min_sample = 0  # a folder of 600 distractors: no sample reaches the floor
    for key, value in overrides.items():
        setattr(c, key, value)
    return c


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_folder(str(tmp_path_factory.mktemp("ilias")))


@pytest.mark.parametrize("queries, k", [("image", 10), ("text", 1000)])
def test_exact_mode_matches_official_recipe(folder, tmp_path, queries, k):
    result = ilias.run(config(folder, sample_fraction=1.0, k=k, queries=queries), str(tmp_path))
    aps, top_ids = official_map(folder, queries, k)
    saved = json.loads((tmp_path / "prediction.json").read_text())
    assert saved["estimator"] == "exact" and saved["n_target"] == SHARDS * ROWS
    np.testing.assert_allclose(saved["per_query_ap"], aps, rtol=1e-12)
    assert saved["map"] == pytest.approx(aps.mean(), rel=1e-12) == result.map
    assert 0.05 < saved["map"] < 0.95  # a non-trivial benchmark
    with open(tmp_path / f"ranked_top{k}.pkl", "rb") as f:
        lists = pickle.load(f)
    assert set(lists) == {"query_ids", "db_ids", "sims", "ranks"}
    got = [[lists["db_ids"][r] for r in row if r >= 0] for row in lists["ranks"]]
    assert got == [ids[: len(row)] for row, ids in zip(got, top_ids, strict=True)]
    assert min(map(len, got)) >= min(k, 60)  # all positives above the M-th kept distractor


@pytest.mark.slow
def test_sampled_mode_through_launch(folder, tmp_path):
    out = subprocess.run(
        [
            sys.executable,
            "launch.py",
            "--config=configs/ilias.py",
            f"--config.features={folder}",
            "--config.sample_fraction=0.5",
            "--config.min_sample=0",
            "--config.evt.top_m=40",
            "--config.block_size=50",
            "--config.protocol.nested_replicates=0",
            f"--workdir={tmp_path}",
        ],
        cwd=ROOT,
        env=dict(os.environ, JAX_PLATFORMS="cpu"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    scores = scores_lib.load_scores(tmp_path / "sampled_scores.npz")
    ids = [f"tar{s:03d}/{j:06d}" for s in range(SHARDS) for j in range(ROWS)]
    assert scores.n_sample == sampling.in_sample(ids, 0.5, 0).sum()
    assert scores.tail_scores.shape == (N_INSTANCES * QUERIES_PER, 40)
    assert (scores.fixed_counts[scores.mask] >= 0).all() and scores.fixed_counts.sum() > 0
    result = json.loads((tmp_path / "prediction.json").read_text())
    assert result["n_target"] == SHARDS * ROWS and result["n_sample"] == scores.n_sample
    assert result["estimator"] == ilias_config.get_config().estimator
    assert 0.0 <= result["map"] <= 1.0
    # The hardness artifact beside it predicts the same mAP without the scores.
    art = artifact.load(tmp_path / "hardness.npz")
    assert art.metadata["features"] == str(folder) and art.n_sample == scores.n_sample
    aps, _ = from_artifact.at_sizes(art, result["n_target"], PredictSettings())
    assert aps[0].mean() == pytest.approx(result["map"], abs=1e-7)


def test_interrupted_run_resumes_to_identical_output(folder, tmp_path, monkeypatch):
    reference = tmp_path / "reference"
    ilias.run(config(folder, sample_fraction=1.0, k=20), str(reference))
    calls = {"n": 0}
    original = ilias.scoring.HostBackend.add

    def flaky(self, x, ids):
        calls["n"] += 1
        if calls["n"] == 6:  # inside the third shard
            raise KeyboardInterrupt
        return original(self, x, ids)

    monkeypatch.setattr(ilias.scoring.HostBackend, "add", flaky)
    work = tmp_path / "resumed"
    with pytest.raises(KeyboardInterrupt):
        ilias.run(config(folder, sample_fraction=1.0, k=20), str(work))
    # Interrupted: the checkpoint stays for the resume; finished: it is removed.
    assert os.listdir(work / "partials") == ["process_000_of_001.npz"]
    assert not (reference / "partials").exists()
    monkeypatch.setattr(ilias.scoring.HostBackend, "add", original)
    ilias.run(config(folder, sample_fraction=1.0, k=20), str(work))
    assert not (work / "partials").exists()
    for name in ("sampled_scores.npz", "prediction.json", "ranked_top20.pkl"):
        assert (work / name).read_bytes() == (reference / name).read_bytes(), name


def _free_port():
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


WORKER = """
import sys
import jax
jax.config.update("jax_platforms", "cpu")
jax.distributed.initialize(coordinator_address="localhost:{port}", num_processes=2,
                           process_id=int(sys.argv[1]))
from tailaware.configs import ilias as c
from tailaware.jobs import ilias
cfg = c.get_config()
cfg.features, cfg.sample_fraction, cfg.evt.top_m, cfg.block_size = {folder!r}, 0.6, 50, 64
cfg.protocol.nested_replicates, cfg.min_sample = 0, 0
ilias.run(cfg, {work!r})
"""


@pytest.mark.slow
def test_two_processes_merge_to_the_single_process_result(folder, tmp_path):
    single = tmp_path / "single"
    ilias.run(config(folder, top_m=50, sample_fraction=0.6), str(single))
    script = WORKER.format(port=_free_port(), folder=str(folder), work=str(tmp_path / "multi"))
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script, str(i)],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err[-3000:]
    assert not (tmp_path / "multi" / "partials").exists()  # merged, then removed
    with np.load(tmp_path / "multi" / "sampled_scores.npz") as a:
        with np.load(single / "sampled_scores.npz") as b:
            for key in b.files:
                np.testing.assert_array_equal(a[key], b[key])
    assert (tmp_path / "multi" / "prediction.json").read_text() == (
        single / "prediction.json"
    ).read_text()


def _copy(folder, dst):
    import shutil

    shutil.copytree(folder, dst)
    return str(dst)


def test_missing_corrupt_mismatched_and_duplicate_inputs_name_the_file(folder, tmp_path):
    missing = _copy(folder, tmp_path / "missing")
    os.remove(os.path.join(missing, features.distractor_name(1)))
    with pytest.raises(FileNotFoundError, match=r"features_distractors_00001\.hdf5: missing"):
        ilias.run(config(missing), str(tmp_path / "w1"))
    with pytest.raises(FileNotFoundError, match=r"features_distractors_00003\.hdf5: missing"):
        ilias.run(config(folder, expected_shards=4), str(tmp_path / "w1b"))

    corrupt = _copy(folder, tmp_path / "corrupt")
    with open(os.path.join(corrupt, features.distractor_name(2)), "wb") as f:
        f.write(b"not an hdf5 file")
    with pytest.raises(ValueError, match=r"features_distractors_00002\.hdf5: not a readable"):
        ilias.run(config(corrupt), str(tmp_path / "w2"))

    mismatch = _copy(folder, tmp_path / "mismatch")
    features.write_features(
        os.path.join(mismatch, features.distractor_name(0)), np.zeros((3, DIM + 1)), ["a", "b", "c"]
    )
    with pytest.raises(
        ValueError, match=r"features_distractors_00000\.hdf5: field 'features': dimension 17"
    ):
        ilias.run(config(mismatch), str(tmp_path / "w3"))

    dup = _copy(folder, tmp_path / "dup")
    features.write_features(
        os.path.join(dup, features.distractor_name(0)), np.full((2, DIM), 0.25), ["x/1", "x/1"]
    )
    with pytest.raises(ValueError, match=r"features_distractors_00000\.hdf5: .*duplicate id 'x/1'"):
        ilias.run(config(dup, sample_fraction=1.0), str(tmp_path / "w4"))

    nan = _copy(folder, tmp_path / "nan")
    x, ids = features.read_features(os.path.join(nan, features.distractor_name(1)))
    x[-1, 0] = np.nan
    features.write_features(os.path.join(nan, features.distractor_name(1)), x, ids)
    with pytest.raises(
        ValueError, match=r"features_distractors_00001\.hdf5: field 'features'.*NaN"
    ):
        ilias.run(config(nan, sample_fraction=1.0), str(tmp_path / "w5"))


def test_a_sample_below_the_floor_is_refused_before_scoring(folder, tmp_path):
    # The default floor (the config's, which is the protocol's) against 300 of 600 distractors.
    assert ilias_config.get_config().min_sample == budget.MIN_SAMPLE
    c = config(folder, sample_fraction=0.5, min_sample=budget.MIN_SAMPLE)
    with pytest.raises(InputError, match=r"^--config\.sample_fraction=0\.5: samples ~300 of 600 "):
        ilias.run(c, str(tmp_path))
    assert not os.path.exists(tmp_path / "sampled_scores.npz")


def test_numpy_shards_give_the_same_result(folder, tmp_path):
    npy = tmp_path / "npy"
    os.makedirs(npy)
    for name in os.listdir(folder):
        x, ids = features.read_features(os.path.join(folder, name))
        stem = os.path.splitext(name)[0]
        np.save(npy / f"{stem}.npy", x)
        (npy / f"{stem}.ids.txt").write_text("".join(i + "\n" for i in ids))
    a = ilias.run(config(folder, sample_fraction=1.0, k=15), str(tmp_path / "h5"))
    b = ilias.run(config(str(npy), sample_fraction=1.0, k=15), str(tmp_path / "np"))
    np.testing.assert_array_equal(a.per_query_ap, b.per_query_ap)

    stem = os.path.splitext(features.distractor_name(1))[0]
    bad = np.load(npy / f"{stem}.npy")
    bad[0, -1] = np.inf
    np.save(npy / f"{stem}.npy", bad)
    with pytest.raises(ValueError, match=rf"{stem}\.npy: descriptors: NaN or infinite"):
        ilias.run(config(str(npy), sample_fraction=1.0, k=15), str(tmp_path / "np2"))
