"""The estimator registry: every registered estimator carries every term of the interval."""

import jax.numpy as jnp
import numpy as np
import pytest

from tailaware.core import evaluate
from tailaware.protocol import prediction
from tailaware.protocol.settings import PredictSettings, ProtocolSettings
from tailaware.sim import simulate
from tailaware.tail import estimators
from tailaware.tail.settings import TailSettings

N = 10**7
FAST = ProtocolSettings(query_replicates=50, nested_replicates=2, curve_points=2, budget_levels=1)


@pytest.fixture(scope="module")
def sample():
    bench = simulate.make_benchmark(24, N, seed=7)
    return simulate.draw(bench, 0.01, 200, seed=8).scores


def _predict(sample, name):
    settings = PredictSettings(estimator=name, k=100, tail=TailSettings(top_m=200), protocol=FAST)
    return prediction.predict(sample, settings, N).interval


def _half_count(c, settings):
    """A toy estimator registered through the public API: half the count."""
    del settings
    x = jnp.where(c.mask, 0.5 * c.counts / c.s, 0.0)
    return x[:, :, None], jnp.ones((x.shape[0], 1), x.dtype)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(estimators.ESTIMATORS))
def test_every_registered_estimator_has_every_interval_term(sample, name):
    interval = _predict(sample, name)
    # The distractor term: the nested bootstrap reruns the estimator's traced definition.
    assert interval.method == "nested" and interval.sd_distractor is not None
    tail = estimators.get(name).tail
    assert (interval.threshold_maps is not None) == (tail is not None)
    assert (interval.prior_maps is not None) == (tail == "mean")


def test_a_new_estimator_is_one_registration(sample, monkeypatch):
    toy = estimators.Estimator("half_count", _half_count)
    monkeypatch.setitem(estimators.ESTIMATORS, toy.name, toy)
    h = estimators.get("half_count")(sample)
    want = np.where(sample.mask, 0.5 * sample.pos_counts / sample.n_sample, 0.0)
    np.testing.assert_allclose(h.x, want, rtol=1e-6)
    np.testing.assert_allclose(
        evaluate.per_query_ap(h, N, 100, sample.fixed_counts, sample),
        evaluate.per_query_ap(h._replace(x=want), N, 100, sample.fixed_counts, sample),
        atol=1e-7,
    )
    interval = _predict(sample, "half_count")
    assert interval.method == "nested" and interval.sd_distractor > 0
