"""End to end through launch.py, as a user runs it: the help and version, the demo and the
predict command."""

import importlib.metadata
import json
import os
import re
import subprocess
import sys
import tomllib

import numpy as np
import pytest

from tailaware.configs import predict as predict_config
from tailaware.core import law, metrics
from tailaware.io import scores as scores_lib
from tailaware.io import version
from tests.test_scores import float32_tie_fields

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
with open(os.path.join(ROOT, "pyproject.toml"), "rb") as _f:
    PYPROJECT_VERSION = tomllib.load(_f)["project"]["version"]


def launch(*args):
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    out = subprocess.run(
        [sys.executable, "launch.py", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def _leaves(config, prefix=""):
    """(dotted name, value) of every field of a ConfigDict, read through its plain dict."""
    for key, value in config.items():
        if isinstance(value, dict):
            yield from _leaves(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


def test_help_lists_the_jobs_and_a_configs_fields_and_version_prints_it(tmp_path):
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    command = os.path.join(os.path.dirname(sys.executable), "tailaware")  # the installed one
    runs = {  # all at once: most of each run is starting Python
        "launch.py": ([sys.executable, "launch.py", "--help"], ROOT),
        "-m": ([sys.executable, "-m", "tailaware", "--help"], tmp_path),
        "tailaware": ([command, "--help"], tmp_path),
        "version": ([sys.executable, "launch.py", "--version"], ROOT),
        "predict": ([command, "--config=predict", "--help"], tmp_path),
        "missing": ([command, "--config=predictt", "--help"], tmp_path),
    }
    pipe = subprocess.PIPE
    procs = {
        name: subprocess.Popen(cmd, cwd=cwd, env=env, stdout=pipe, stderr=pipe, text=True)
        for name, (cmd, cwd) in runs.items()
    }
    out = {name: p.communicate(timeout=300) for name, p in procs.items()}
    code = {name: p.returncode for name, p in procs.items()}
    assert code == {**dict.fromkeys(runs, 0), "missing": 1}, out

    text = out["launch.py"][0]
    assert out["-m"][0] == text and out["tailaware"][0] == text
    assert text.startswith(f"tailaware {PYPROJECT_VERSION}: predict web-scale retrieval")
    configs = {"demo": "default", **{j: j for j in ("predict", "ilias", "compare", "validate")}}
    for job, name in {**configs, "embed": "embed"}.items():  # one line each, with its config
        assert re.search(rf"^  {job} +{name} +[A-Z]\w+", text, re.MULTILINE), (job, text)
    for flag in ("--config", "--workdir", "--verbose", "--version", "--help"):
        assert re.search(rf"^  {flag} +[A-Z]", text, re.MULTILINE), (flag, text)

    assert out["version"][0] == f"tailaware {PYPROJECT_VERSION}\n"
    assert importlib.metadata.version("tailaware") == PYPROJECT_VERSION

    # Every field of the predict config, at its default, and what it means where it is said.
    lines = out["predict"][0].splitlines()
    fields = dict(_leaves(predict_config.get_config().to_dict()))
    assert len(fields) > 30
    for name, default in fields.items():
        assert f"  {name} = {default!r}" in lines, name
    meaning = lambda name: lines[lines.index(f"  {name} = {fields[name]!r}") + 1]
    assert meaning("scores").strip() == "path to the sampled-scores .npz"  # the config's comment
    assert (
        meaning("evt.top_m").strip() == "M, the sampled scores kept per query (the paper's 4,000)."
    )
    assert "gallery sizes of the curve" in meaning("protocol.curve_points")  # the class's doc
    assert out["missing"][1].startswith("error: --config=predictt: no such file")


def test_version_falls_back_to_pyproject_outside_an_install(monkeypatch):
    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    assert version.version() == PYPROJECT_VERSION
    monkeypatch.setattr(importlib.metadata, "version", missing)
    assert version.version() == PYPROJECT_VERSION  # read from pyproject.toml
    monkeypatch.setattr(version, "_PYPROJECT", "/nonexistent/pyproject.toml")
    assert version.version() == "unknown"


@pytest.mark.slow
def test_demo_end_to_end(tmp_path):
    out = launch(
        "--config=configs/default.py",
        f"--workdir={tmp_path}",
        "--config.demo.n_distractors=60000",
        "--config.demo.n_instances=30",
        "--config.demo.sizes=(5000,20000,60000)",
        "--config.demo.sample_fraction=0.2",
        "--config.evt.top_m=500",
    )
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["sizes"] == [5000, 20000, 60000]
    assert "count" in results["predicted"] and "evaluate-at-S" in results["errors_at_full"]
    assert 0.0 < results["truth"][-1] <= results["truth"][0] <= 1.0
    assert (tmp_path / "map_vs_gallery.png").read_bytes()[:4] == b"\x89PNG"
    assert "True mAP@1000" in out


@pytest.mark.slow
def test_predict_command(tmp_path):
    # A gallery whose exact counts we know: predicting at N = S with the count estimator
    # must give back the sample's own exact mAP, and the at-sample baseline equals it.
    rng = np.random.default_rng(0)
    q, m, p, s = 20, 64, 5, 5000
    tail = -np.sort(-rng.uniform(0.3, 0.5, (q, m)), axis=1)
    pos = rng.uniform(0.35, 0.9, (q, p))
    pos[:, 3:] = np.where(rng.random((q, 2)) < 0.5, np.nan, pos[:, 3:])
    counts = (tail[:, None, :] > pos[:, :, None]).sum(axis=2)
    counts = np.where(pos < tail[:, -1:], counts + rng.integers(0, 300, (q, p)), counts)
    counts = np.where(np.isnan(pos), -1, counts)
    sc = scores_lib.make_scores(tail, pos, counts, s)
    path = tmp_path / "scores.npz"
    scores_lib.save_scores(path, sc)
    launch(
        "--config=configs/predict.py",
        f"--config.scores={path}",
        f"--config.n_target={s}",
        "--config.k=100",
        "--config.estimator=count",
        f"--workdir={tmp_path}",
        "--config.protocol.nested_replicates=0",
    )
    pred = json.loads((tmp_path / "prediction.json").read_text())
    assert pred["tailaware_version"] == PYPROJECT_VERSION
    want = metrics.ap_at_k_from_counts(counts, counts >= 0, 100)
    assert pred["estimator"] == "count" and pred["n_target"] == s and pred["k"] == 100
    np.testing.assert_allclose(pred["per_query_ap"], want, atol=1e-6)
    np.testing.assert_allclose(pred["map"], pred["baselines"]["at_sample"], atol=1e-6)
    # At a larger gallery the law predicts a lower value, as law.map_at_k does directly.
    launch(
        "--config=configs/predict.py",
        f"--config.scores={path}",
        "--config.n_target=1000000",
        "--config.k=100",
        "--config.estimator=count",
        f"--workdir={tmp_path}",
        "--config.protocol.nested_replicates=0",
    )
    big = json.loads((tmp_path / "prediction.json").read_text())
    direct = law.map_at_k(np.where(counts >= 0, counts, 0) / s, counts >= 0, 1e6, 100.0)[0]
    np.testing.assert_allclose(big["map"], float(direct), atol=1e-6)
    assert big["map"] < pred["map"]
    lo, hi = big["ci90"]
    # No distractor or model term here: the interval for these queries is the point (to rounding).
    assert lo - 1e-12 <= big["map"] <= hi + 1e-12 and big["ci95"][0] <= lo and hi <= big["ci95"][1]
    assert len(big["curve"]["n"]) == len(big["curve"]["map"]) > 2
    assert "budget" in big["diagnostics"]
    assert (tmp_path / "prediction_curve.png").exists()


@pytest.mark.slow
def test_default_verbosity_hides_the_libtpu_probe_and_font_cache(tmp_path):
    # A fresh machine as a new user has it: no JAX_PLATFORMS (JAX probes for a TPU) and no
    # matplotlib font cache. The same job with --verbose shows both, so the check can fail.
    rng = np.random.default_rng(1)
    tail = -np.sort(-rng.uniform(0.3, 0.5, (8, 32)), axis=1)
    pos = rng.uniform(0.35, 0.9, (8, 3))
    counts = (tail[:, None, :] > pos[:, :, None]).sum(axis=2)
    path = tmp_path / "scores.npz"
    scores_lib.save_scores(path, scores_lib.make_scores(tail, pos, counts, 1000))
    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
    pipe = subprocess.PIPE
    procs = {}
    for run in ("default", "verbose"):
        cmd = [
            sys.executable,
            "launch.py",
            "--config=configs/predict.py",
            f"--config.scores={path}",
            "--config.n_target=100000",
            "--config.k=10",
            "--config.protocol.nested_replicates=0",
            "--config.protocol.query_replicates=20",
            f"--workdir={tmp_path / run}",
            *(["--verbose"] if run == "verbose" else []),
        ]
        fresh = dict(env, MPLCONFIGDIR=str(tmp_path / f"mpl_{run}"))
        procs[run] = subprocess.Popen(cmd, cwd=ROOT, env=fresh, stdout=pipe, stderr=pipe, text=True)
    err = {run: p.communicate(timeout=300)[1] for run, p in procs.items()}
    assert all(p.returncode == 0 for p in procs.values()), err
    assert (tmp_path / "default" / "prediction_curve.png").exists()  # matplotlib drew
    noise = lambda line: "tpu" in line.lower() or "font" in line.lower()
    assert [line for line in err["default"].splitlines() if noise(line)] == []
    assert "Unable to initialize backend 'tpu'" in err["verbose"]
    assert "generated new fontManager" in err["verbose"]


def test_first_progress_line_comes_before_jax():
    """The launcher, its flags and the predict config load without JAX (the job's import brings
    it, after the first line), and the lazy public API still resolves every name."""
    code = (
        "import sys; from tailaware.jobs import launch; "
        "launch.flags.FLAGS(['x', '--config=configs/predict.py']); "
        "assert launch._CONFIG.value.job == 'tailaware.jobs.predict'; "
        "assert 'jax' not in sys.modules, 'jax imported'; "
        "import tailaware; [getattr(tailaware, n) for n in tailaware.__all__]; "
        "assert sorted(tailaware.__all__) == sorted(tailaware._EXPORTS)"
    )
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr[-3000:]


def test_predict_command_rejects_bad_file(tmp_path):
    np.savez(tmp_path / "bad.npz", tail_scores=np.zeros((2, 3), np.float64))
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    out = subprocess.run(
        [
            sys.executable,
            "launch.py",
            "--config=configs/predict.py",
            f"--config.scores={tmp_path / 'bad.npz'}",
            "--config.n_target=10",
            f"--workdir={tmp_path}",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode != 0
    assert "bad.npz" in out.stderr and "'pos_scores': missing" in out.stderr


@pytest.mark.slow
def test_broken_inputs_end_in_one_line(tmp_path):
    # The broken inputs, as a new user runs them: each ends in one line on stderr naming
    # the file or flag (exit status 1, no traceback), the traceback only with --verbose.
    good = tmp_path / "good.npz"
    fields, _ = float32_tie_fields()
    np.savez(good, **fields)  # counts in float64, scores stored in float32: one tie
    (tmp_path / "trunc.npz").write_bytes(good.read_bytes()[:1000])
    (tmp_path / "text.npz").write_text("query,positive,score\n")
    predict = ["--config=configs/predict.py", f"--workdir={tmp_path / 'w'}"]
    cases = {
        "trunc": (f"--config.scores={tmp_path / 'trunc.npz'}", "trunc.npz: not a readable .npz"),
        "text": (f"--config.scores={tmp_path / 'text.npz'}", "text.npz: not an .npz archive"),
        "k=0": ("--config.k=0", "--config.k: expected 1 <= k <= 10,000, got 0"),
        "kk": ("--config.kk=1", "--config.kk=1: no field 'kk' in configs/predict.py"),
        "flag": ("--nonexistent", "Unknown command line flag 'nonexistent'"),
    }
    base = [*predict, f"--config.scores={good}", "--config.n_target=1000000"]
    env = dict(os.environ, JAX_PLATFORMS="cpu")

    def run(*args):  # all at once: most of each run is starting Python and JAX
        cmd = [sys.executable, "launch.py", *base, *args]  # a later flag wins
        pipe = subprocess.PIPE
        return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=pipe, stderr=pipe, text=True)

    procs = {name: run(arg) for name, (arg, _) in cases.items()}
    procs["verbose"] = run(cases["trunc"][0], "--verbose")
    procs["ties"] = run("--config.n_target=1000", "--config.estimator=count")
    out = {name: p.communicate(timeout=300) for name, p in procs.items()}
    for name, (_, words) in cases.items():
        stderr = out[name][1]
        assert procs[name].returncode == 1 and "Traceback" not in stderr, stderr
        errors = [line for line in stderr.splitlines() if line.startswith("error: ")]
        assert len(errors) == 1 and words in errors[0], stderr
    assert procs["verbose"].returncode == 1 and "Traceback" in out["verbose"][1]
    assert "InputError: " in out["verbose"][1]
    # The float32-tie file predicts; at N < S the summary says it is a sub-gallery prediction.
    assert procs["ties"].returncode == 0, out["ties"][1][-3000:]
    summary = json.loads((tmp_path / "w" / "prediction.json").read_text())["diagnostics"]["summary"]
    assert summary[0].startswith("RECONCILED: 1 positive's count")
    assert summary[1].startswith("SUB-GALLERY: N = 1,000 < S = 3,000")
