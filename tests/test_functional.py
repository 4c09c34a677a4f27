"""The estimators' traced definitions on fixed-shape inputs agree with the estimates on files,
padded or not."""

import jax
import numpy as np
import pytest

from tailaware.core import evaluate
from tailaware.io import scores
from tailaware.protocol import nested
from tailaware.sim import simulate
from tailaware.tail import estimators, functional
from tailaware.tail.settings import TailSettings

Q = 120


def _core_map(sc, name, settings):
    """mAP@100 at 1e7 of the estimator's traced definition on the file's fixed-shape inputs, as
    the budget check evaluates it (`nested.nested_bootstrap`'s `extra`, every atom kept)."""
    return nested.nested_bootstrap(sc, name, settings, 100, [1e7], 0, extra=(sc,))[1].values[
        0, 0, 0
    ]


def _core_aps(sc, name, settings):
    """Per-query AP@100 at 1e7 of the estimator's traced definition on the file's fixed-shape
    inputs (`functional.core`), through the prediction's pass; jitted, as every caller runs it
    (op by op, each of its hundreds of operations would compile on its own)."""
    traced = jax.jit(lambda c: estimators.get(name).traced(c, settings))
    atoms, w = traced(functional.core(sc, settings))
    variant = evaluate.Variant(np.asarray(atoms), np.asarray(w, np.float64)[None])
    values, _ = evaluate.predicted_values([variant], sc.mask, [1e7], 100, sc.fixed_counts, sc)
    return values[0, 0, 0]


@pytest.mark.parametrize(
    "name", ["count", "homogeneous", pytest.param("evt", marks=pytest.mark.slow)]
)
def test_core_agrees_with_the_estimator(name):
    settings = TailSettings(top_m=400)
    bench = simulate.make_benchmark(Q, 10**7, seed=4)
    sc = simulate.draw(bench, 0.01, 400, seed=5).scores
    fn = estimators.get(name)
    want = evaluate.per_query_ap(fn(sc, settings), 1e7, 100, sc.fixed_counts, sc)
    np.testing.assert_allclose(_core_aps(sc, name, settings), want, atol=2e-6)
    np.testing.assert_allclose(_core_map(sc, name, settings), want.mean(), atol=2e-6)


@pytest.mark.slow
def test_core_reads_only_the_real_scores_of_a_padded_file():
    # A file may store more columns than S (-inf padded): the nested bootstrap's core must put
    # the threshold where the estimator does, so both files predict the same.
    c = TailSettings()
    bench = simulate.make_benchmark(40, 10**7, seed=4)
    sc = simulate.draw(bench, 5e-5, 4000, seed=5).scores
    assert sc.n_sample < 4000 and sc.tail_scores.shape[1] == sc.n_sample
    tail = np.full((sc.num_queries, 4000), -np.inf, np.float32)
    tail[:, : sc.n_sample] = sc.tail_scores
    padded = scores.make_scores(
        tail,
        sc.pos_scores,
        sc.pos_counts,
        sc.n_sample,
        fixed_counts=sc.fixed_counts,
        source="padded",
    )
    want = _core_map(sc, "evt_averaged", c)
    got = _core_map(padded, "evt_averaged", c)
    np.testing.assert_allclose(got, want, atol=1e-6)
    got_q = _core_aps(padded, "evt_averaged", c)
    np.testing.assert_allclose(got_q, _core_aps(sc, "evt_averaged", c), atol=1e-6)
    h = estimators.get("evt_averaged")(padded, c)
    point = evaluate.per_query_ap(h, 1e7, 100, sc.fixed_counts, sc)
    np.testing.assert_allclose(got_q, point, atol=2e-5)
    np.testing.assert_allclose(got, point.mean(), atol=2e-5)
