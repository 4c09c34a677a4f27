"""The summary's notes on the input: a target below the sample, counts reconciled on reading."""

import jax
import jax.numpy as jnp
import numpy as np

from tailaware.core import law
from tailaware.io import artifact
from tailaware.io import scores as scores_lib
from tailaware.protocol import diagnostics, from_artifact, prediction
from tailaware.protocol.settings import PredictSettings, ProtocolSettings
from tailaware.tail import estimators
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
