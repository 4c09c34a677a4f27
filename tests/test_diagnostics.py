"""The summary's notes on the input: a target below the sample, counts reconciled on reading, tail
fits that did not converge."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tailaware.core import law
from tailaware.core.results import Hardness
from tailaware.io import artifact
from tailaware.io import scores as scores_lib
from tailaware.protocol import diagnostics, from_artifact, prediction, schema
from tailaware.protocol.settings import PredictSettings, ProtocolSettings
from tailaware.sim import simulate
from tailaware.tail import estimators, gpd
from tailaware.tail.settings import TailSettings
from tests.test_scores import float32_tie_fields

K, S = 10, 400
TINY = ProtocolSettings(query_replicates=50, nested_replicates=0, curve_points=3, budget_levels=1)
SETTINGS = PredictSettings(estimator="count", k=K, protocol=TINY)


def sample(seed=0, q=6, m=30, p=4):
    rng = np.random.default_rng(seed)
    tail = -np.sort(-rng.uniform(0.2, 0.6, (q, m)), axis=1)
    pos = rng.uniform(0.3, 0.9, (q, p))
    counts = (tail[:, None, :] > pos[:, :, None]).sum(axis=2)
    counts = np.where(pos < tail[:, -1:], counts + rng.integers(0, 40, (q, p)), counts)
    return scores_lib.make_scores(tail, pos, counts, S)


def test_a_target_below_the_sample_is_a_sub_gallery_prediction():
    sc = sample()
    n = S // 4
    below = prediction.predict(sc, SETTINGS, n)
    assert below.diagnostics.summary[0].startswith(f"SUB-GALLERY: N = {n:,} < S = {S:,}")
    # Independent reference: below S the count estimator's prediction is E[AP@k] under
    # K_j ~ Poisson(N c_j / S), the exact Poisson sum (not the conditioned law, not the table).
    x = jnp.asarray(np.where(sc.mask, sc.pos_counts, 0) / S, jnp.float32)
    aps = jax.vmap(lambda xi, mi: law.expected_ap_poisson(xi, mi, float(n), K))(x, sc.mask)
    np.testing.assert_allclose(below.map, float(aps.mean()), atol=2e-5)
    for at_or_above in (S, 10 * S):
        p = prediction.predict(sc, SETTINGS, at_or_above)
        assert not any("SUB-GALLERY" in line for line in p.diagnostics.summary)
    # From the hardness artifact alike.
    art = artifact.from_hardness(estimators.count(sc), sc, "count")
    p = from_artifact.predict(art, SETTINGS, n)
    assert any(line.startswith("SUB-GALLERY") for line in p.diagnostics.summary)
    assert p.diagnostics.summary[-1].startswith(f"mAP@{K} at N = {n:,}")


def test_reconciled_counts_are_reported(tmp_path):
    fields, _ = float32_tie_fields()
    np.savez(tmp_path / "ties.npz", **fields)
    sc = scores_lib.load_scores(tmp_path / "ties.npz")
    p = prediction.predict(sc, SETTINGS, 10 * int(sc.n_sample))
    assert p.diagnostics.summary[0].startswith("RECONCILED: 1 positive's count exceeded")
    assert diagnostics.reconciled(0) == () and "2 positives' counts" in diagnostics.reconciled(2)[0]
    clean = prediction.predict(sample(), SETTINGS, 10 * S)
    assert not any("RECONCILED" in line for line in clean.diagnostics.summary)


def test_tail_counts_is_the_truncated_poisson_predictive():
    """`tail_counts` against a Monte Carlo of its own model (atoms drawn by weight, K ~ Poisson(S
    x), kept when K < c), and the warning's two guards."""
    rng = np.random.default_rng(3)
    q, p, a, s, c = 40, 3, 6, 10_000, 5
    atoms = np.exp(rng.uniform(np.log(1e-6), np.log(2e-3), (q, p, a)))
    weights = rng.dirichlet(np.ones(a), q)
    priced = rng.uniform(size=(q, p)) < 0.8
    h = Hardness(atoms @ np.ones(a) / a, np.ones((q, p), bool), priced, None, atoms, weights)
    counts = rng.integers(0, c, (q, p))
    observed, expected, sd = diagnostics.tail_counts(h, counts, s, c)
    assert observed == counts[priced].sum()
    draws = 20_000
    means, variances = [], []
    for i, j in zip(*np.nonzero(priced), strict=True):
        pick = rng.choice(a, draws, p=weights[i])
        k = rng.poisson(s * atoms[i, j, pick])
        k = k[k < c]
        means.append(k.mean())
        variances.append(k.var())
    np.testing.assert_allclose(expected, np.sum(means), rtol=0.01)
    np.testing.assert_allclose(sd, np.sqrt(np.sum(variances)), rtol=0.03)
    # Warns only when off by more than the ratio and by more than the noise.
    assert diagnostics.tail_counts_warning(111.0, 1087.0, 30.0).startswith("TAIL VS COUNTS")
    assert "heavier" in diagnostics.tail_counts_warning(111.0, 1087.0, 30.0)
    assert "lighter" in diagnostics.tail_counts_warning(300.0, 150.0, 10.0)
    assert diagnostics.tail_counts_warning(1806.0, 1568.7, 34.9) == ""  # dev's largest ratio
    assert diagnostics.tail_counts_warning(20.0, 10.0, 5.0) == ""  # twice, within 3 sd


@pytest.mark.slow
def test_tail_vs_counts_warns_on_a_near_duplicate_bump_only():
    """Fed the true hardness the check holds; the default's tail over a Gaussian bulk with a
    near-duplicate cluster (`mixture`, N = 2e5, 5%: it predicts mAP ~0.2 where the gallery's is
    ~0.7) expects far more sampled outrankers than there are, and the prediction says so; a
    smooth bounded tail (`kumaraswamy`, the dev family) passes."""
    settings = PredictSettings(k=100, protocol=TINY)
    for family, n, warned in (("mixture", 200_000, True), ("kumaraswamy", 10**8, False)):
        bench = simulate.make_benchmark(150, n, family, seed=5)
        sc = simulate.draw(bench, 0.05, 4000, seed=6).scores
        counts = np.where(sc.mask, sc.pos_counts, 0)
        h = prediction.estimate(sc, settings)
        truth = h._replace(x=bench.x, atoms=None, weights=None)
        observed, expected, sd = diagnostics.tail_counts(truth, counts, sc.n_sample, 5)
        assert abs(observed - expected) <= 3.5 * sd, (family, observed, expected, sd)
        p = prediction.predict(sc, settings, n, hardness=h)
        got = any(line.startswith("TAIL VS COUNTS") for line in p.diagnostics.summary)
        assert got == warned, (family, p.diagnostics.summary)
        seen = p.diagnostics.tail_counts[0]
        assert seen == counts[h.tail_priced].sum()
        written = schema.prediction_json(p)["diagnostics"]["tail_counts"]
        keys = ("observed", "expected", "sd")
        assert written == dict(zip(keys, p.diagnostics.tail_counts, strict=True))


@pytest.fixture
def profile_steps(monkeypatch):
    """Sets the profile solves' Newton steps (`gpd.PROFILE_STEPS`) for one test; the compiled
    programs traced with them are dropped before and after."""

    def set_steps(steps):
        monkeypatch.setattr(gpd, "PROFILE_STEPS", steps)
        jax.clear_caches()

    yield set_steps
    monkeypatch.undo()
    jax.clear_caches()


@pytest.mark.slow
def test_fits_that_did_not_converge_are_counted(profile_steps):
    bench = simulate.make_benchmark(24, 10**7, seed=7)
    sc = simulate.draw(bench, 0.01, 200, seed=8).scores
    settings = PredictSettings(k=100, tail=TailSettings(top_m=200), protocol=TINY)
    p = prediction.predict(sc, settings, 10**7)
    assert p.diagnostics.fits_not_converged == 0
    assert schema.prediction_json(p)["diagnostics"]["fits_not_converged"] == 0
    assert not any("NOT CONVERGED" in line for line in p.diagnostics.summary)
    # One Newton step per profile solve: the solves started away from their roots stop short.
    profile_steps(1)
    h = estimators.get("evt_averaged")(sc, settings.tail)
    assert not h.fit.newton_converged.all()
    count = diagnostics.fits_not_converged(h)
    assert count == int((h.fit.fitted & ~h.fit.newton_converged).sum()) > 0
    p = prediction.predict(sc, settings, 10**7)
    assert p.diagnostics.fits_not_converged == count
    lines = p.diagnostics.summary
    assert any(line.startswith(f"FIT NOT CONVERGED for {count} of 24") for line in lines)
    # An estimator without a tail fit has nothing to count.
    assert diagnostics.fits_not_converged(estimators.count(sc)) is None
