"""The validate job end to end through launch.py, and the protocol fields of prediction.json."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from configs import default
from tailaware.io import scores
from tailaware.jobs import predict
from tailaware.protocol import augment as protocol
from tailaware.protocol import bootstrap
from tailaware.sim import simulate

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
def test_validate_job_tiny(tmp_path):
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    out = subprocess.run(
        [
            sys.executable,
            "launch.py",
            "--config=configs/validate.py",
            f"--workdir={tmp_path}",
            "--config.estimator=count",
            "--config.validate.estimators=('count','homogeneous')",
            "--config.evt.top_m=200",
            "--config.k=100",
            "--config.validate.families=('kumaraswamy',)",
            "--config.validate.num_queries=40",
            "--config.validate.n_pool=1000000",
            "--config.validate.fractions=(0.01,0.05)",
            "--config.validate.draws=3",
            "--config.validate.query_replicates=100",
            "--config.validate.nested_replicates=8",
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


def _sample(num_queries, n_pool, **protocol):
    """Returns (config at k = 100 with these protocol settings, benchmark, a 1% sample)."""
    cfg = default.get_config()
    cfg.k = 100
    cfg.protocol = protocol
    bench = simulate.make_benchmark(num_queries, n_pool, seed=0)
    return cfg, bench, simulate.draw(bench, 0.01, 200, seed=1).scores


@pytest.mark.slow
def test_protocol_augment_fields():
    cfg, _, sc = _sample(60, 10**7, query_replicates=200, nested_replicates=10, curve_points=7)
    result = predict.predict(sc, cfg, 10**7)
    extra = protocol.augment(result, sc, cfg, 10**7)
    lo, hi = extra["ci90"]
    lo95, hi95 = extra["ci95"]
    assert lo95 <= lo < result["map"] < hi <= hi95
    curve = extra["curve"]
    assert len(curve["n"]) == 7 and curve["n"][0] == 1e3 and curve["n"][-1] == pytest.approx(1e9)
    assert (np.diff(curve["map"]) <= 1e-9).all()  # never increases with N
    assert all(a <= m <= b for (a, b), m in zip(curve["ci90"], curve["map"], strict=True))
    diag = extra["diagnostics"]
    assert {"budget", "drift", "share_tail_priced", "share_threshold_raised", "summary"} <= set(
        diag
    )
    assert diag["drift"]["checked"] is False and len(diag["budget"]["sizes"]) == 4
    assert {"at_sample", "count", "homogeneous", "power_law", "log_uniform"} <= set(
        extra["baselines"]
    )
    half, double = extra["uncertainty"]["threshold_maps"]  # the reruns behind the interval
    dev = max(abs(half - result["map"]), abs(double - result["map"]))
    assert extra["uncertainty"]["threshold_deviation"] == pytest.approx(dev, abs=1e-6)
    assert 0.0 <= extra["other_metrics"]["top1"] <= 1.0
    assert 0.0 <= extra["other_metrics"]["recall@100"] <= 1.0
    json.dumps(extra)  # prediction.json must serialise


def test_protocol_notes_raised_thresholds():
    from tailaware.tail import estimators

    mask = np.ones((3, 2), bool)
    info = {"n_exceed": np.array([200, 200, 200]), "n_exceed_selected": np.array([200, 100, 50])}
    h = estimators.Hardness(np.full((3, 2), 1e-6), mask, mask, info)
    share, note = protocol._raised_thresholds(h)
    assert share == pytest.approx(2 / 3) and note.startswith("THRESHOLD RAISED for 2 of 3 queries")
    assert protocol._raised_thresholds(h._replace(info={"n_exceed": info["n_exceed"]})) == (0.0, "")
    same = {**info, "n_exceed_selected": info["n_exceed"]}
    assert protocol._raised_thresholds(h._replace(info=same)) == (0.0, "")


def test_protocol_warns_about_a_query_without_a_tail_fit():
    # One query whose stored scores are all equal (no excess over its threshold) and a sample
    # of one query (no query noise): the protocol must say so, not crash or stay silent.
    cfg, bench, sc = _sample(4, 10**6, query_replicates=50, nested_replicates=0, curve_points=3)
    tail, counts = sc.tail_scores.copy(), sc.pos_counts.copy()
    tail[1] = tail[1, -1]
    above = sc.pos_scores[1] > tail[1, 0]
    real = ~np.isnan(sc.pos_scores[1])
    counts[1] = np.where(real, np.where(above, 0, np.maximum(counts[1], tail.shape[1])), -1)
    tied = scores.make_scores(tail, sc.pos_scores, counts, sc.n_sample, source="tied")
    summary = predict.predict(tied, cfg, 10**6)["diagnostics"]["summary"]
    assert any(line.startswith("TAIL NOT FITTED for 1 of 4 queries") for line in summary)
    one = scores.make_scores(
        sc.tail_scores[:1], sc.pos_scores[:1], sc.pos_counts[:1], sc.n_sample, source="one"
    )
    result = predict.predict(one, cfg, 10**6)
    assert np.isfinite(result["map"]) and result["diagnostics"]["budget"]["noise"] == 0.0
    # The tails of a 1% sample are fitted to its top 10 of 200 kept scores of S = 10,000 (rate
    # 1e-3, at the limit) but of a 0.2% sample to the top 10 of 2,000 (5e-3): only it warns.
    shallow = lambda r: any(line.startswith("SHALLOW TAIL") for line in r["diagnostics"]["summary"])
    assert not shallow(result)
    small = simulate.draw(bench, 0.002, 200, seed=2).scores
    assert shallow(predict.predict(small, cfg, 10**6))


def test_protocol_warns_when_the_prediction_moves_with_the_threshold_or_the_prior():
    rng = np.random.default_rng(3)
    reps = 0.5 + 0.01 * rng.standard_normal(1000)
    calm = bootstrap.intervals(0.5, reps, None, deviation=0.005, prior_deviation=0.005)
    assert protocol._model_sensitive(calm, 1000) == []
    moved = bootstrap.intervals(0.5, reps, None, deviation=0.03)
    (note,) = protocol._model_sensitive(moved, 1000)
    assert note.startswith("THRESHOLD SENSITIVE: mAP@1000 moves by 0.0300")
    assert "sd 0.0" in note
    both = bootstrap.intervals(0.5, reps, None, deviation=0.03, prior_deviation=0.02)
    _, note = protocol._model_sensitive(both, 1000)
    assert note.startswith("PRIOR SENSITIVE: mAP@1000 moves by 0.0200")
