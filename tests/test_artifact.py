"""The hardness artifact: round trip, prediction without scores, and every malformation named."""

import json
import re

import numpy as np
import pytest

from configs import default
from tailaware import artifact, estimators, metrics, predict, simulate


@pytest.fixture(scope="module")
def sample():
    bench = simulate.make_benchmark(40, 10**7, seed=0)
    return simulate.draw(bench, 0.01, 100, seed=1).scores


def test_round_trip_and_predict(tmp_path, sample):
    h = estimators.count(sample)
    h = h._replace(info={"u": np.linspace(0.1, 0.2, 40), "converged": np.ones(40, bool)})
    art = artifact.from_hardness(h, sample, "count", {"model": "dinov3-l", "source": "yfcc"})
    path = tmp_path / "h.npz"
    artifact.save(path, art)
    back = artifact.load(path)
    np.testing.assert_array_equal(back.x, h.x)
    np.testing.assert_array_equal(back.mask, h.mask)
    assert back.estimator == "count" and back.n_sample == sample.n_sample
    assert back.metadata == {"model": "dinov3-l", "source": "yfcc"}
    np.testing.assert_array_equal(back.fit["u"], h.info["u"])
    got = artifact.predict(back, [1e6, 1e8], 100)
    want = predict.per_query_ap(h, 1e8, 100, sample.fixed_counts, sample)
    np.testing.assert_allclose(got["per_query_ap"][1], want, atol=1e-6)
    assert got["map"][0] >= got["map"][1]
    # At N = S the artifact (with the sample's counts) gives the sample's realized mAP.
    at_s = artifact.predict(back, sample.n_sample, 100)["map"][0]
    counts = np.where(sample.mask, sample.pos_counts + sample.fixed_counts, -1)
    assert at_s == pytest.approx(
        float(metrics.ap_at_k_from_counts(counts, sample.mask, 100).mean()), abs=2e-6
    )


def test_posterior_atoms_round_trip(tmp_path, sample):
    cfg = default.get_config()
    cfg.evt.top_m = 100
    h = estimators.get("evt_averaged")(sample, cfg)
    assert h.atoms is not None and h.atoms.shape[:2] == h.x.shape
    path = tmp_path / "h.npz"
    artifact.save(path, artifact.from_hardness(h, sample, "evt_averaged"))
    back = artifact.load(path)
    np.testing.assert_array_equal(back.atoms, h.atoms)
    np.testing.assert_array_equal(back.weights, h.weights)
    got = artifact.predict(back, 1e8, 100)["per_query_ap"][0]
    want = predict.per_query_ap(h, 1e8, 100, sample.fixed_counts, sample)
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
    plug = predict.per_query_ap(
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
