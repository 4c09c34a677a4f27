"""The hardness artifact: round trip, prediction without scores, and every malformation named."""

import dataclasses
import json
import re

import numpy as np
import pytest

from tailaware.configs import compare as compare_config
from tailaware.configs import default
from tailaware.core import evaluate, metrics
from tailaware.core.results import TailFit
from tailaware.io import artifact
from tailaware.jobs import compare as compare_job
from tailaware.jobs import predict as predict_job
from tailaware.protocol import comparison, from_artifact, prediction, report, schema
from tailaware.protocol.settings import IntervalSettings, PredictSettings, ProtocolSettings
from tailaware.sim import simulate
from tailaware.tail import estimators
from tailaware.tail.settings import TailSettings


def _at(art, sizes, k):
    """Returns (per-query AP [G, Q], mAP [G], intervals [G]) from the artifact at `sizes`."""
    aps, bands = from_artifact.at_sizes(art, sizes, PredictSettings(k=k))
    return aps, aps.mean(axis=1), bands


@pytest.fixture(scope="module")
def sample():
    bench = simulate.make_benchmark(40, 10**7, seed=0)
    return simulate.draw(bench, 0.01, 100, seed=1).scores


def test_round_trip_and_predict(tmp_path, sample):
    h = estimators.count(sample)
    fit = TailFit(*(np.linspace(0.1, 0.2, 40) for _ in TailFit._fields[:13]))
    h = h._replace(fit=fit._replace(converged=np.ones(40, bool)))
    art = artifact.from_hardness(h, sample, "count", {"model": "dinov3-l", "source": "yfcc"})
    path = tmp_path / "h.npz"
    artifact.save(path, art)
    back = artifact.load(path)
    np.testing.assert_array_equal(back.x, h.x)
    np.testing.assert_array_equal(back.mask, h.mask)
    assert back.estimator == "count" and back.n_sample == sample.n_sample
    assert back.metadata == {"model": "dinov3-l", "source": "yfcc"}
    for name, value in h.fit.items():
        np.testing.assert_array_equal(getattr(back.fit, name), value)
    assert back.fit.prior_mean is None
    aps, maps, _ = _at(back, [1e6, 1e8], 100)
    want = evaluate.per_query_ap(h, 1e8, 100, sample.fixed_counts, sample)
    np.testing.assert_allclose(aps[1], want, atol=1e-6)
    assert maps[0] >= maps[1]
    # At N = S the artifact (with the sample's counts) gives the sample's realized mAP.
    at_s = _at(back, sample.n_sample, 100)[1][0]
    counts = np.where(sample.mask, sample.pos_counts + sample.fixed_counts, -1)
    assert at_s == pytest.approx(
        float(metrics.ap_at_k_from_counts(counts, sample.mask, 100).mean()), abs=2e-6
    )


def test_a_partial_tail_fit_is_named(tmp_path, sample):
    h = estimators.get("evt")(sample, TailSettings(top_m=100))
    path = tmp_path / "h.npz"
    artifact.save(path, artifact.from_hardness(h, sample, "evt"))
    fields = dict(np.load(path))
    del fields["fit_xi"]
    np.savez(path, **fields)
    with pytest.raises(ValueError, match="fit_xi.*missing"):
        artifact.load(path)
    fields["fit_xi"], fields["fit_shape"] = h.fit.xi, h.fit.xi
    np.savez(path, **fields)
    with pytest.raises(ValueError, match="fit_shape.*not a tail-fit field"):
        artifact.load(path)


def test_posterior_atoms_round_trip(tmp_path, sample):
    h = estimators.get("evt_averaged")(sample, TailSettings(top_m=100))
    assert h.atoms is not None and h.atoms.shape[:2] == h.x.shape
    path = tmp_path / "h.npz"
    artifact.save(path, artifact.from_hardness(h, sample, "evt_averaged"))
    back = artifact.load(path)
    np.testing.assert_array_equal(back.atoms, h.atoms)
    np.testing.assert_array_equal(back.weights, h.weights)
    got = _at(back, 1e8, 100)[0][0]
    want = evaluate.per_query_ap(h, 1e8, 100, sample.fixed_counts, sample)
    np.testing.assert_allclose(got, want, atol=1e-6)
    # Malformed atoms are named like every other field.
    with np.load(path) as z:
        arrays = {name: z[name] for name in z.files}
    for field, value, message in (
        ("weights", arrays["weights"] * 2.0, "sum to 1"),
        ("weights", arrays["weights"][:, :-1], "expected float [Q, A]"),
        ("atoms", -arrays["atoms"], "in [0, 1]"),
    ):
        np.savez(tmp_path / "bad.npz", **{**arrays, field: value})
        with pytest.raises(ValueError, match=f"bad.npz: field '{field}': .*{re.escape(message)}"):
            artifact.load(tmp_path / "bad.npz")
    # The mixture is not the plug-in of its mean: E[AP] is far from linear in x.
    plug = evaluate.per_query_ap(
        h._replace(atoms=None, weights=None), 1e8, 100, sample.fixed_counts, sample
    )
    assert np.abs(plug - want).max() > 1e-3


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("x", lambda a: a["x"] * 0 + 2.0, "outside"),
        ("x", lambda a: a["x"].astype(np.float32).astype(np.int64), "dtype kind"),
        ("mask", lambda a: a["mask"][:, :-1], "shape"),
        ("tail_priced", lambda a: ~a["mask"], "padding"),
        ("metadata", lambda a: np.asarray("[1, 2]"), "JSON object"),
        ("n_sample", lambda a: np.asarray(0), "integer scalar"),
        ("fit_xi", lambda a: np.zeros(3), "numeric"),
        ("bogus", lambda a: np.zeros(1), "unknown field"),
    ],
)
def test_malformed_files_are_named(tmp_path, sample, field, value, message):
    art = artifact.from_hardness(estimators.count(sample), sample, "count")
    path = tmp_path / "ok.npz"
    artifact.save(path, art)
    with np.load(path) as z:
        arrays = {k: z[k] for k in z.files}
    arrays[field] = value(arrays)
    bad = tmp_path / "bad.npz"
    np.savez(bad, **arrays)
    with pytest.raises(ValueError, match=f"bad.npz: field '{field}'.*{message}"):
        artifact.load(bad)
    arrays.pop(field)
    if field in artifact.REQUIRED:
        np.savez(bad, **arrays)
        with pytest.raises(ValueError, match="missing"):
            artifact.load(bad)
    assert json.loads(json.dumps(art.metadata)) == {}


@pytest.mark.slow
def test_the_predict_job_writes_an_artifact_that_predicts_with_the_same_interval(tmp_path):
    bench = simulate.make_benchmark(120, 10**7, seed=3)
    scores = simulate.draw(bench, 0.01, 1000, seed=4).scores
    ids = np.asarray([f"q{j}" for j in range(scores.num_queries)])
    scores = dataclasses.replace(scores, query_ids=ids)
    settings = PredictSettings(
        tail=TailSettings(top_m=1000), protocol=ProtocolSettings(nested_replicates=8)
    )
    n = 10**7
    provenance = {"scores": "sim", "model": "vit_b16", "pool": "simulated"}
    want = schema.prediction_json(
        report.report(scores, settings, n, str(tmp_path), metadata=provenance)
    )
    art = artifact.load(tmp_path / "hardness.npz")
    assert art.metadata["model"] == "vit_b16" and art.metadata["scores"] == "sim"
    # The distractor sds of the target and the 25-point curve (N = 1e7 is one of its points), of
    # each metric.
    assert art.rerun_atoms.shape[:3] == (2, *art.x.shape) and art.distractor_sd.shape == (2, 25)
    assert art.subsample_sd.shape == (2, 25) and (art.subsample_sd > 0).all()
    assert art.distractor_metrics == ("map", "recall")
    assert art.prior_weights.shape == (2, *art.weights.shape)

    # At the target N the artifact reproduces the prediction and every part of its interval:
    # the same per-query AP, the reruns' mAP, the distractor sd it stored.
    got = schema.prediction_json(from_artifact.predict(art, settings, n, "hardness.npz"))
    np.testing.assert_allclose(got["per_query_ap"], want["per_query_ap"], atol=1e-7)
    fields = (
        "sd_query",
        "sd_distractor",
        "threshold_deviation",
        "prior_deviation",
        "prior_spread",
        "sd_realized",
        "sd_subsample",
    )
    for field in fields:
        assert got["uncertainty"][field] == pytest.approx(want["uncertainty"][field], abs=1e-7)
    np.testing.assert_allclose(got["ci90"], want["ci90"], atol=1e-6)
    np.testing.assert_allclose(got["ci95"], want["ci95"], atol=1e-6)
    np.testing.assert_allclose(got["curve"]["ci90"], want["curve"]["ci90"], atol=1e-6)
    for label, entry in want["metrics"].items():  # every metric's interval likewise
        mine = got["metrics"][label]
        np.testing.assert_allclose(mine["per_query"], entry["per_query"], atol=1e-7)
        np.testing.assert_allclose(mine["ci90"], entry["ci90"], atol=1e-6)
        np.testing.assert_allclose(mine["curve"]["ci90"], entry["curve"]["ci90"], atol=1e-6)

    # Elsewhere: the sd between two stored sizes is between theirs; the interval for these
    # queries is normal with the larger of it and the sub-samples' sd, the model and
    # realized-value terms in quadrature, and
    # the one over queries like these widens that by the query interval in quadrature
    # (`intervals`).
    _, maps, (typed,) = _at(art, [3e8], 1000)
    unc = schema.interval_json(typed)
    i = np.searchsorted(art.distractor_n, 3e8)
    lo_sd, hi_sd = sorted(art.distractor_sd[0, i - 1 : i + 1])
    assert lo_sd <= unc["sd_distractor"] <= hi_sd
    point = maps[0]
    q_lo, q_hi = unc["ci90_query"]
    z = 1.6448536269514722
    assert unc["sd_realized"] > 0
    lo_sub, hi_sub = sorted(art.subsample_sd[0, i - 1 : i + 1])
    assert lo_sub <= unc["sd_subsample"] <= hi_sub
    sampling = max(unc["sd_distractor"], unc["sd_subsample"])
    sd = np.sqrt(sampling**2 + unc["sd_model"] ** 2 + unc["sd_realized"] ** 2)
    these_hi = min(point + z * sd, 1.0)
    assert unc["ci90"][1] == pytest.approx(these_hi, abs=1e-9)
    expect_hi = point + np.hypot(these_hi - point, q_hi - point)
    assert unc["ci90_queries"][1] == pytest.approx(min(expect_hi, 1.0), abs=1e-9)
    factors = IntervalSettings()
    model = np.sqrt(
        (factors.threshold_sd * unc["threshold_deviation"]) ** 2
        + (factors.prior_sd * unc["prior_spread"]) ** 2
        + (factors.shared_sd * unc["prior_deviation"]) ** 2
    )
    assert 0 < unc["prior_spread"] < unc["prior_deviation"]
    assert unc["sd_model"] == pytest.approx(model)
    assert unc["ci90"][0] < point < unc["ci90"][1]

    # The job from the artifact, and a comparison of the two predictions (the same system).
    cfg = default.get_config()
    cfg.protocol.query_replicates = 1000
    cfg.artifact, cfg.scores, cfg.n_target = str(tmp_path / "hardness.npz"), "", n
    predict_job.run(cfg, str(tmp_path / "from_artifact"))
    saved = json.loads((tmp_path / "from_artifact" / "prediction.json").read_text())
    assert saved["map"] == pytest.approx(want["map"], abs=1e-7)
    assert saved["diagnostics"]["summary"][0].startswith("FROM THE HARDNESS ARTIFACT")
    same = comparison.compare(*(schema.prediction_from_json(p) for p in (want, saved))).ap
    assert same.difference == pytest.approx(0.0, abs=1e-7)
    assert same.threshold_deviation == pytest.approx(0.0, abs=1e-7)
    assert same.prior_deviation == pytest.approx(0.0, abs=1e-7)
    assert not same.resolved
    # The compare job reads artifacts too, predicting them at its N (or refusing without one).
    with open(tmp_path / "prediction.json") as f:
        assert json.load(f)["map"] == pytest.approx(want["map"], abs=1e-12)
    job = compare_config.get_config()
    job.a, job.b = str(tmp_path / "hardness.npz"), str(tmp_path / "prediction.json")
    with pytest.raises(ValueError, match="--config.n_target: expected N >= 1, the N to compare"):
        compare_job.run(job, str(tmp_path / "cmp"))
    job.n_target = n
    compare_job.run(job, str(tmp_path / "cmp"))
    out = json.loads((tmp_path / "cmp" / "comparison.json").read_text())
    assert out["difference"] == pytest.approx(0.0, abs=1e-7) and out["n_target"] == n
    job.b, job.n_target = job.a, 10**9
    compare_job.run(job, str(tmp_path / "cmp"))
    out = json.loads((tmp_path / "cmp" / "comparison.json").read_text())
    assert out["n_target"] == 10**9 and out["map_a"] < want["map"]
    # Without the optional terms the interval says what it lacks and is the query interval.
    bare = dataclasses.replace(
        art,
        rerun_atoms=None,
        rerun_weights=None,
        prior_weights=None,
        distractor_n=None,
        distractor_sd=None,
        distractor_k=None,
    )
    plain = schema.prediction_json(from_artifact.predict(bare, settings, n))
    lacks = "lacks the distractor-sample, threshold and prior terms"
    assert lacks in plain["diagnostics"]["summary"][0]
    # For these queries only the realized counts' own noise is left (drawn from the hardness and
    # counts the artifact always holds); over queries like these, the query interval with it.
    point, z = plain["map"], 1.6448536269514722
    sd_r = plain["uncertainty"]["sd_realized"]
    assert sd_r > 0
    np.testing.assert_allclose(plain["ci90"], [point - z * sd_r, point + z * sd_r], atol=1e-12)
    q_lo, q_hi = plain["uncertainty"]["ci90_query"]
    queries = [point - np.hypot(point - q_lo, z * sd_r), point + np.hypot(q_hi - point, z * sd_r)]
    np.testing.assert_allclose(plain["ci90_queries"], queries, atol=1e-12)
    assert plain["uncertainty"]["ci_method"] == "query"
    # The distractor sds were measured for mAP@1000: at another k the term is left out, and said.
    at_100 = schema.prediction_json(
        from_artifact.predict(art, dataclasses.replace(settings, k=100), n)
    )
    assert "distractor-sample (measured at k = 1000) term" in at_100["diagnostics"]["summary"][0]
    assert "sd_distractor" not in at_100["uncertainty"]


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("rerun_atoms", lambda a: a["rerun_atoms"][:1, :, :-1], "expected float [F, Q, P, A]"),
        ("rerun_weights", lambda a: a["rerun_weights"] * 3.0, "sum to 1"),
        ("prior_weights", lambda a: a["prior_weights"][:, :, :-1], "expected float [T, Q, A]"),
        ("prior_weights", lambda a: a["prior_weights"] * 3.0, "sum to 1"),
        ("distractor_n", lambda a: a["distractor_n"][::-1], "ascending"),
        ("distractor_sd", lambda a: a["distractor_sd"] * np.nan, "finite"),
        ("distractor_sd", lambda a: a["distractor_sd"][:, :-1], "expected float [M, G]"),
        ("distractor_k", lambda a: np.asarray(0), "integer scalar >= 1"),
    ],
)
def test_malformed_interval_fields_are_named(tmp_path, sample, field, value, message):
    h = prediction.estimate(sample, PredictSettings(tail=TailSettings(top_m=100)))
    sizes = np.geomspace(1e3, 1e9, 5)
    art = artifact.from_hardness(h, sample, "evt_averaged", None, (sizes, sizes * 0 + 0.01, 100))
    path = tmp_path / "ok.npz"
    artifact.save(path, art)
    assert artifact.load(path).rerun_atoms.shape[0] == 2
    with np.load(path) as z:
        arrays = {k: z[k] for k in z.files}
    arrays[field] = value(arrays)
    np.savez(tmp_path / "bad.npz", **arrays)
    with pytest.raises(ValueError, match=f"bad.npz: field '{field}': .*{re.escape(message)}"):
        artifact.load(tmp_path / "bad.npz")
    # Without the fields it comes with: (the fields removed, the field the error names).
    partners = {
        "rerun_atoms": (("rerun_weights",), "rerun_weights"),
        "rerun_weights": (("rerun_atoms",), "rerun_atoms"),
        "prior_weights": (("atoms", "weights"), "prior_weights"),  # it re-weights them
        "distractor_n": (("distractor_sd",), "distractor_sd"),
    }
    removed, named = partners.get(field, (("distractor_n",), "distractor_n"))
    for name in removed:
        arrays.pop(name)
    np.savez(tmp_path / "bad.npz", **arrays)
    with pytest.raises(ValueError, match=f"field '{named}'"):
        artifact.load(tmp_path / "bad.npz")
