"""The validate job end to end through launch.py, and the protocol fields of prediction.json."""

import json
import os
import subprocess
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# The validate job on tiny settings (each test adds its estimators and families).
TINY = [
    "--config=configs/validate.py",
    "--config.estimator=count",
    "--config.evt.top_m=200",
    "--config.k=100",
    "--config.validate.num_queries=40",
    "--config.validate.n_pool=1000000",
    "--config.validate.fractions=(0.01,0.05)",
    "--config.validate.draws=3",
    "--config.validate.query_replicates=100",
    "--config.validate.nested_replicates=8",
]


@pytest.mark.slow
def test_validate_job_tiny(tmp_path):
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    out = subprocess.run(
        [
            sys.executable,
            "launch.py",
            *TINY,
            f"--workdir={tmp_path}",
            "--config.validate.estimators=('count','homogeneous')",
            "--config.validate.families=('kumaraswamy',)",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    res = json.loads((tmp_path / "validation.json").read_text())
    cell = res["cells"]["paper/kumaraswamy"]["0.05"]
    for row in ("count", "homogeneous", "evaluate-at-S", "power_law", "log_uniform"):
        assert {"bias", "mae"} <= set(cell[row]) and cell[row]["mae"] >= abs(cell[row]["bias"])
    assert 0.0 <= cell["_coverage"]["ci90"] <= 1.0
    # Evaluate-at-S and count over-predict, as in the paper: the sample has not seen the tail.
    assert cell["evaluate-at-S"]["bias"] > cell["count"]["bias"] > 0
    assert "coverage ci90" in out.stdout and "evaluate-at-S" in out.stdout
    for png in ("validation_errors.png", "validation_calibration.png"):
        assert (tmp_path / png).read_bytes()[:4] == b"\x89PNG"


@pytest.mark.slow
def test_validate_job_resumes_after_kill(tmp_path):
    # Killed (SIGKILL) once its first cell is written, the job started again resumes from
    # validation.partial.json and ends with the results of an uninterrupted run.
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    args = [
        *TINY,
        "--config.validate.estimators=('count',)",
        "--config.validate.families=('kumaraswamy','truncnorm')",
    ]

    def command(workdir):
        return [sys.executable, "launch.py", *args, f"--workdir={workdir}"]

    def run(workdir):
        out = subprocess.run(
            command(workdir), cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
        )
        assert out.returncode == 0, out.stderr[-3000:]
        return out

    run(tmp_path / "ref")
    cut = tmp_path / "cut"
    partial = cut / "validation.partial.json"
    proc = subprocess.Popen(
        command(cut), cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    deadline = time.time() + 300
    while not partial.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    proc.kill()
    proc.wait()
    assert partial.exists() and not (cut / "validation.json").exists(), "not cut in time"
    done = json.loads(partial.read_text())["results"]["cells"]
    assert sum(len(c) for c in done.values()) < 4  # some work was left to do

    out = run(cut)
    assert "resuming" in out.stderr
    assert not partial.exists()
    ref = json.loads((tmp_path / "ref" / "validation.json").read_text())
    got = json.loads((cut / "validation.json").read_text())
    ref.pop("seconds"), got.pop("seconds")
    assert got == ref


def test_a_split_reads_its_text_benchmarks_from_the_manifest(tmp_path):
    from tailaware.protocol import validation

    path = tmp_path / "manifest.json"
    names = [("dev-a", "dev"), ("test-a", "test"), ("dev-b", "dev")]
    entries = [{"name": n, "split": s} for n, s in names]
    path.write_text(json.dumps({"benchmarks": entries}))
    got = validation._split_benchmarks(str(path), "dev")
    assert [e["name"] for e in got] == ["dev-a", "dev-b"]
    assert validation._split_benchmarks("", "dev") == ()
    path.write_text(json.dumps({"benchmarks": entries[1:2]}))
    with pytest.raises(ValueError, match="manifest.json: field 'benchmarks': no entry with split"):
        validation._split_benchmarks(str(path), "dev")
