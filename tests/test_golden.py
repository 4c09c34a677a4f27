"""Golden outputs: every job's files, as a user runs them, against the ones stored in golden/.

A regression pin for changes that must not move a number (a refactor, a faster kernel): the
demo, the predict job on a simulated sampled-scores file and on its hardness artifact, the
compare job and the validate job run through `launch.py` on tiny settings, and their outputs
must equal the stored ones to float rounding. A change that is meant to move a number
regenerates them, and says so in its commit:

    python tests/test_golden.py --write
"""

import json
import math
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GOLDEN = os.path.join(ROOT, "tests", "golden")
# Keys whose values depend on the run, not on the numbers (wall time, paths, provenance, the
# version that wrote the file).
VOLATILE = {"seconds", "path", "a", "b", "scores", "metadata", "tailaware_version"}
# Tolerances, per field, by the scale of its own rounding:
# - every float: float32 rounding carried into float64 outputs, relative to the field's scale.
#   The computation is reproducible across CPUs (numpy's CPU-specific float32 kernels are kept
#   out of the fits: `gpd._grid_constants`), so nothing needs more.
# - an interval's two bounds share one scale, the larger bound's magnitude: a bound is the point
#   plus or minus a width, each rounded at its own size, so a bound near 0 (an interval of a
#   difference) is not a 1e-5-relative quantity.
# - a comparison's `difference` has the scale of the two values it is the difference of.
# - the demo's plug-in `evt` (keys named `evt`): the demo scores descriptors with float32 matrix
#   products, whose rounding follows the BLAS kernel the CPU selects, and the plug-in MLE on a
#   flat likelihood profile amplifies a last-bit change in a score (`PLUG_IN_RTOL`).
RTOL, ATOL = 1e-5, 1e-6
PLUG_IN_RTOL, PLUG_IN_ATOL = 5e-3, 1e-5
PUNCT = "[](),;:"  # around a printed number

FAST_PROTOCOL = (
    "--config.protocol.query_replicates=200",
    "--config.protocol.nested_replicates=4",
    "--config.protocol.curve_points=5",
)


def _launch(workdir, *args):
    # Compiled as users run it (the suite turns XLA's optimizations off, tests/conftest.py):
    # the pinned numbers are the production program's.
    env = dict(os.environ, JAX_PLATFORMS="cpu", JAX_DISABLE_MOST_OPTIMIZATIONS="0")
    out = subprocess.run(
        [sys.executable, "launch.py", f"--workdir={workdir}", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def _simulated_scores(path):
    from tailaware.io import scores as scores_lib
    from tailaware.sim import simulate

    bench = simulate.make_benchmark(60, 10**7, "kumaraswamy", seed=3, **simulate.REGIMES["paper"])
    scores_lib.save_scores(path, simulate.draw(bench, 0.01, 1000, seed=4).scores)


def produce(workdir) -> dict:
    """Runs every job on tiny settings in `workdir`; returns {golden file name: its text}."""
    w = lambda name: os.path.join(workdir, name)
    _launch(
        w("demo"),
        "--config=configs/default.py",
        "--config.demo.n_distractors=100000",
        "--config.demo.n_instances=30",
        "--config.demo.sizes=(10000,100000)",
        "--config.evt.top_m=1000",
    )
    scores = w("scores.npz")
    _simulated_scores(scores)
    predict = ("--config=configs/predict.py", "--config.evt.top_m=1000", *FAST_PROTOCOL)
    _launch(w("a"), *predict, f"--config.scores={scores}", "--config.n_target=10000000")
    _launch(
        w("b"),
        *predict,
        f"--config.scores={scores}",
        "--config.n_target=10000000",
        "--config.estimator=evt",
    )
    _launch(
        w("art"),
        *predict,
        f"--config.artifact={w('a/hardness.npz')}",
        "--config.n_target=1000000000",
        "--config.k=100",
    )
    _launch(
        w("cmp"),
        "--config=configs/compare.py",
        f"--config.a={w('a/prediction.json')}",
        f"--config.b={w('b/prediction.json')}",
        "--config.replicates=200",
    )
    _launch(
        w("val"),
        "--config=configs/validate.py",
        "--config.evt.top_m=1000",
        "--config.validate.num_queries=60",
        "--config.validate.n_pool=10000000",
        "--config.validate.fractions=(0.01,)",
        "--config.validate.families=('kumaraswamy',)",
        "--config.validate.draws=2",
        "--config.validate.query_replicates=200",
        "--config.validate.nested_replicates=4",
    )
    files = {
        "demo.json": "demo/results.json",
        "prediction.json": "a/prediction.json",
        "prediction_evt.json": "b/prediction.json",
        "prediction_from_artifact.json": "art/prediction.json",
        "comparison.json": "cmp/comparison.json",
        "validation.txt": "val/validation.txt",
    }
    out = {}
    for name, rel in files.items():
        with open(w(rel)) as f:
            out[name] = f.read().replace(str(workdir), "<workdir>")
    return out


def _close(got, want, where="", plug_in=False, scale=0.0):
    """Returns the first place where two JSON values differ beyond their tolerance, or "".

    A float is held to `RTOL` of the larger of its own magnitude and `scale` (the field's scale,
    see the tolerances above); below a key named `evt`, to the plug-in tolerance."""
    if isinstance(want, dict):
        if not isinstance(got, dict) or set(got) != set(want):
            return f"{where}: keys {sorted(got) if isinstance(got, dict) else got!r} vs " + str(
                sorted(want)
            )
        for key in want:
            if key in VOLATILE:
                continue
            bad = _close(
                got[key], want[key], f"{where}.{key}", plug_in or key == "evt", _scale(want, key)
            )
            if bad:
                return bad
        return ""
    if isinstance(want, list):
        if not isinstance(got, list) or len(got) != len(want):
            return f"{where}: list of {len(want)} expected"
        if scale == "pair":  # an interval: both bounds at the larger one's scale
            scale = max((abs(v) for v in want if isinstance(v, float)), default=0.0)
        for i, (g, v) in enumerate(zip(got, want, strict=True)):
            bad = _close(g, v, f"{where}[{i}]", plug_in, "pair" if scale == "band" else scale)
            if bad:
                return bad
        return ""
    if isinstance(want, float) or isinstance(got, float):
        rtol, atol = (PLUG_IN_RTOL, PLUG_IN_ATOL) if plug_in else (RTOL, ATOL)
        if want is None or got is None:
            return f"{where}: {got!r} vs golden {want!r}"
        if abs(got - want) > max(atol, rtol * max(abs(want), float(scale))):
            return f"{where}: {got!r} vs golden {want!r}"
        return ""
    if isinstance(want, str) and isinstance(got, str):  # a summary line: numbers to their digits
        bad = _text_close(got, want)
        return f"{where}: {bad}" if bad else ""
    return "" if got == want else f"{where}: {got!r} vs golden {want!r}"


def _scale(parent: dict, key: str):
    """Returns the scale of `parent[key]`'s rounding beyond its own magnitude: "pair" for an
    interval (its two bounds), "band" for a curve's list of intervals, the compared values' for a
    difference, else 0."""
    if key.startswith("ci"):
        value = parent[key]
        if isinstance(value, list) and value and isinstance(value[0], list):
            return "band"  # a curve's band: each pair at its own scale
        return "pair"
    if key == "difference":
        return max(abs(parent.get("map_a", 0.0)), abs(parent.get("map_b", 0.0)))
    return 0.0


def _text_close(got: str, want: str) -> str:
    """Compares two tables word by word, numbers to float rounding of their printed digits."""
    g, w = got.split(), want.split()
    if len(g) != len(w):
        return f"{len(g)} words vs golden {len(w)}"
    for i, (a, b) in enumerate(zip(g, w, strict=True)):
        if a == b:
            continue
        try:
            if math.isclose(float(a.strip(PUNCT)), float(b.strip(PUNCT)), abs_tol=1.5e-4):
                continue
        except ValueError:
            pass
        return f"word {i}: {a!r} vs golden {b!r}"
    return ""


def compare(outputs: dict) -> list[str]:
    """Returns one line per golden file that the outputs do not match."""
    problems = []
    for name, text in outputs.items():
        with open(os.path.join(GOLDEN, name)) as f:
            want = f.read()
        if name.endswith(".json"):
            bad = _close(json.loads(text), json.loads(want))
        else:
            bad = _text_close(text, want)
        if bad:
            problems.append(f"{name}: {bad}")
    return problems


@pytest.mark.slow
def test_outputs_match_golden(tmp_path):
    assert compare(produce(str(tmp_path))) == []


if __name__ == "__main__":
    import tempfile

    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: python tests/test_golden.py --write")
    sys.path.insert(0, ROOT)
    with tempfile.TemporaryDirectory() as tmp:
        outputs = produce(tmp)
    os.makedirs(GOLDEN, exist_ok=True)
    for name, text in outputs.items():
        with open(os.path.join(GOLDEN, name), "w") as f:
            f.write(text)
    print(f"wrote {len(outputs)} golden files to {GOLDEN}")
