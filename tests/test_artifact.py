"""The hardness artifact: round trip, prediction without scores, and every malformation named."""

import json

import numpy as np
import pytest

from tailaware import artifact, estimators, law, predict, simulate


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
    want = predict.per_query_ap(h, 1e8, 100, sample.fixed_counts)
    np.testing.assert_allclose(got["per_query_ap"][1], want, atol=1e-6)
    assert got["map"][0] >= got["map"][1]
    assert got["map"][1] == pytest.approx(
        float(law.map_at_k(h.x.astype(np.float32), h.mask, 1e8, 100.0)[0]), abs=1e-6
    )


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
