"""Tests for tailaware.core.evaluate: the E[AP] pass on pruned atoms equals it on all of them."""

import numpy as np
import pytest

from tailaware.core import evaluate
from tailaware.protocol import prediction
from tailaware.protocol.settings import PredictSettings
from tailaware.sim import simulate

K = 1000
SIZES = np.array([1e4, 1e6, 1e8])
# float32 rounding of the pass, which sums other atoms once some are dropped: 4 ulps of an AP
# near 1 (2 measured).
F32 = 2.4e-7


@pytest.fixture(scope="module")
def estimated():
    """100 simulated queries as the protocol benchmark draws them: the default averaged estimate
    with its reruns and prior terms."""
    sc = simulate.draw(simulate.make_benchmark(100, seed=0), 0.05, 4000, seed=1).scores
    return sc, prediction.estimate(sc, PredictSettings())


def test_pruning_keeps_each_query_heaviest_atoms_under_any_weighting():
    a = 30
    w = np.full((2, 1, a), 1e-12)
    w[0, 0, :4], w[1, 0, -4:] = 0.25, 0.25  # the prediction's atoms, and another prior's
    w /= w.sum(axis=-1, keepdims=True)
    atoms = np.broadcast_to(np.arange(a, dtype=np.float64), (1, 3, a))
    got, weights, dropped = evaluate.prune_atoms(atoms, w, 1e-9)
    want = [0, 1, 2, 3, 26, 27, 28, 29]
    np.testing.assert_array_equal(got, np.broadcast_to(want, (1, 3, 8)))
    np.testing.assert_allclose(weights.sum(axis=-1), 1.0, rtol=1e-15)
    np.testing.assert_allclose(dropped, 22e-12, rtol=1e-6)
    # A tolerance below what the 8 leave: the next count of `ATOM_COUNTS` that meets it, or all.
    assert evaluate.prune_atoms(atoms, w, 20e-12)[0].shape[-1] == 12
    assert evaluate.prune_atoms(atoms, w, 1e-12)[0].shape[-1] == a


def test_pruned_atoms_move_each_query_ap_by_at_most_the_dropped_mass(estimated):
    sc, h = estimated
    tol = evaluate.ATOM_TOLERANCE

    def ap(est, t, priors=False):
        return evaluate.per_query_aps(
            est, SIZES, K, sc.fixed_counts, sc, priors=priors, atom_tolerance=t
        )

    weightings = np.stack([h.weights, *h.prior_weights])
    full = ap(h, 0.0, priors=True)
    kept = evaluate.prune_atoms(h.atoms, weightings)[0].shape[-1]
    assert kept < h.atoms.shape[-1]
    np.testing.assert_allclose(ap(h, tol, priors=True), full, rtol=0, atol=tol + F32)
    for r in h.reruns:
        assert evaluate.prune_atoms(r.atoms, r.weights)[0].shape[-1] < r.atoms.shape[-1]
        np.testing.assert_allclose(ap(r, tol), ap(r, 0.0), rtol=0, atol=tol + F32)
    # Coarser, so that the bound rather than rounding is what is tested.
    atoms, _, dropped = evaluate.prune_atoms(h.atoms, weightings, 1e-2)
    assert atoms.shape[-1] < kept and F32 < dropped <= 1e-2
    np.testing.assert_allclose(ap(h, 1e-2, priors=True), full, rtol=0, atol=dropped + F32)


def test_flat_weights_keep_every_atom(estimated):
    sc, h = estimated
    flat = h._replace(weights=np.full_like(h.weights, 1.0 / h.weights.shape[1]))
    atoms, weights, dropped = evaluate.prune_atoms(flat.atoms, flat.weights)
    assert atoms is flat.atoms and weights is flat.weights and dropped == 0.0
    got = evaluate.per_query_aps(flat, SIZES, K, sc.fixed_counts, sc)
    want = evaluate.per_query_aps(flat, SIZES, K, sc.fixed_counts, sc, atom_tolerance=0.0)
    np.testing.assert_array_equal(got, want)
