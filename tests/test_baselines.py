"""Baselines: evaluate-at-S against the official metric, the curve fits exact on their own
model curves and evaluated on nested sub-samples."""

import numpy as np
import pytest

from tailaware.core import metrics
from tailaware.protocol import baselines, budget
from tailaware.sim import simulate


@pytest.mark.parametrize("model", baselines.MODELS)
def test_fit_recovers_its_own_curve(model):
    sizes = np.array([1e4, 2e4, 4e4, 8e4])
    truth = (0.9, 0.05) if model == "power_law" else (1.2, 0.06)
    values = baselines.evaluate(truth, sizes, model)
    params = baselines.fit(sizes, values, model)
    np.testing.assert_allclose(params, truth, rtol=1e-9)
    want = 0.9 * 1e8**-0.05 if model == "power_law" else max(1.2 - 0.06 * np.log(1e8), 0.0)
    assert baselines.evaluate(params, 1e8, model) == pytest.approx(want)


def test_extrapolate_uses_exact_subsample_metrics():
    bench = simulate.make_benchmark(100, 10**7, seed=0)
    sc = simulate.draw(bench, 0.01, 200, seed=1).scores
    subs = budget.nested_subsamples(sc, 3, seed=2)
    m = sc.mask
    want = metrics.ap_at_k_from_counts(np.where(m, sc.pos_counts, -1), m, 100).mean()
    assert baselines.at_sample_map(sc, 100) == pytest.approx(want)
    out = baselines.extrapolate(subs, 100, [1e7, 1e8])
    assert set(out) == set(baselines.MODELS)
    for values in out.values():
        # mAP never grows with N, and extrapolation sits below the measured curve.
        assert values[1] <= values[0] <= baselines.at_sample_map(sc, 100) + 1e-12
