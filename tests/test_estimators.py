"""The estimator registry: every registered estimator carries every term of the interval, and a
new estimator or tail model is one registration."""

import jax.numpy as jnp
import numpy as np
import pytest

from tailaware.core import evaluate
from tailaware.protocol import prediction
from tailaware.protocol.settings import PredictSettings, ProtocolSettings
from tailaware.sim import simulate
from tailaware.tail import estimators, evt, models, plug_in
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
    has_prior = tail is not None and tail.prior_weights is not None
    assert (interval.prior_maps is not None) == has_prior


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


def _exponential_fit(c, settings, default, *, factor, width):
    """A toy tail model's fit: an exponential tail (xi = 0) of the mean excess as its scale."""
    del settings, factor, width
    n = jnp.maximum(jnp.sum(default.mask, axis=1), 1).astype(c.tail.dtype)
    sigma = jnp.sum(default.y, axis=1) / n
    xi = jnp.zeros_like(sigma)
    log_x = evt.plug_in_log_x(evt.nan_padded(c), default.u, default.mask, c.s, xi, sigma)
    ones = jnp.ones((c.tail.shape[0], 1), c.tail.dtype)
    return models.TailAtoms(log_x[..., None], ones, converged=jnp.ones_like(sigma, bool))


def _exponential_reference(sample, top_m):
    """The toy model's hardness in numpy, from the eq. B.1 recipe: the threshold u at the
    (k + 1)-th largest of m kept scores, k = round(0.05 m), x = (k / S) exp(-(s - u) / mean
    excess) for a positive that fewer than 5 sampled distractors beat, at or above u; K / S
    otherwise."""
    x = np.where(sample.mask, sample.pos_counts / sample.n_sample, 0.0)
    for q in range(sample.num_queries):
        tail = sample.tail_scores[q, :top_m].astype(np.float64)
        tail = tail[np.isfinite(tail)]
        k = int(np.floor(0.05 * tail.size + 0.5))
        u, sigma = tail[k], np.mean(tail[:k] - tail[k])
        s = sample.pos_scores[q].astype(np.float64)
        priced = sample.mask[q] & (sample.pos_counts[q] < 5) & (s >= u)
        x[q] = np.where(priced, k / sample.n_sample * np.exp(-(s - u) / sigma), x[q])
    return x


def test_a_new_tail_model_is_one_file_and_one_registration(sample, monkeypatch):
    monkeypatch.setattr(estimators, "ESTIMATORS", dict(estimators.ESTIMATORS))
    toy = models.TailModel("exponential_tail", _exponential_fit, plug_in.price)
    estimators.register(estimators.tail_aware(toy))  # the registration line
    assert estimators.tail_model("exponential_tail") is toy
    h = estimators.get("exponential_tail")(sample, TailSettings(top_m=200))
    assert h.fit is not None and h.atoms is None and h.tail_priced.any()
    np.testing.assert_allclose(h.x, _exponential_reference(sample, 200), rtol=2e-4, atol=1e-12)
    settings = PredictSettings(
        estimator="exponential_tail", k=100, tail=TailSettings(top_m=200), protocol=FAST
    )
    p = prediction.predict(sample, settings, N)
    assert 0.0 < p.map < 1.0
    # Every term of the interval but the prior's: the threshold reruns (`evt.threshold_reruns`,
    # the toy's `fit` at each threshold) and the nested bootstrap of its traced definition.
    assert p.interval.threshold_maps is not None and p.interval.prior_maps is None
    assert p.interval.method == "nested" and p.interval.sd_distractor > 0
