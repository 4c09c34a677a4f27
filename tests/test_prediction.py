"""A prediction from a sampled-scores file: its fields, and the summary's warnings."""

import dataclasses
import json
from types import SimpleNamespace

import numpy as np
import pytest

from tailaware.core import metrics, realization
from tailaware.core.results import Hardness, TailFit
from tailaware.io import scores
from tailaware.jobs import config as config_lib
from tailaware.protocol import comparison, diagnostics, intervals, prediction, schema
from tailaware.protocol.settings import IntervalSettings, PredictSettings, ProtocolSettings
from tailaware.sim import simulate


def _sample(num_queries, n_pool, **protocol):
    """Returns (settings at k = 100 with these protocol settings, benchmark, a 1% sample)."""
    cfg = PredictSettings(k=100, protocol=ProtocolSettings(**protocol))
    bench = simulate.make_benchmark(num_queries, n_pool, seed=0)
    return cfg, bench, simulate.draw(bench, 0.01, 200, seed=1).scores


@pytest.mark.slow
def test_prediction_fields():
    cfg, _, sc = _sample(60, 10**7, query_replicates=200, nested_replicates=10, curve_points=7)
    result = schema.prediction_json(prediction.predict(sc, cfg, 10**7))
    extra = result
    lo, hi = extra["ci90"]
    lo95, hi95 = extra["ci95"]
    assert lo95 <= lo < result["map"] < hi <= hi95
    curve = extra["curve"]
    assert len(curve["n"]) == 7 and curve["n"][0] == 1e3 and curve["n"][-1] == pytest.approx(1e9)
    assert (np.diff(curve["map"]) <= 1e-9).all()  # never increases with N
    assert all(a <= m <= b for (a, b), m in zip(curve["ci90"], curve["map"], strict=True))
    diag = extra["diagnostics"]
    assert {"budget", "drift", "share_tail_priced", "share_threshold_raised", "summary"} <= set(
        diag
    )
    assert diag["drift"]["checked"] is False and len(diag["budget"]["sizes"]) == 4
    assert {"at_sample", "count", "homogeneous", "power_law", "log_uniform"} <= set(
        extra["baselines"]
    )
    half, double = extra["uncertainty"]["threshold_maps"]  # the reruns behind the interval
    dev = max(abs(half - result["map"]), abs(double - result["map"]))
    assert extra["uncertainty"]["threshold_deviation"] == pytest.approx(dev, abs=1e-6)
    # One recall@k, the registry's with its interval and curve (no second law beside it).
    assert "other_metrics" not in extra and 0.0 <= extra["metrics"]["recall@100"]["value"] <= 1.0
    assert {"ci90", "uncertainty", "curve"} <= set(extra["metrics"]["recall@100"])
    json.dumps(extra)  # prediction.json must serialise


def test_summary_notes_raised_thresholds():
    mask = np.ones((3, 2), bool)
    fit = TailFit(*(np.array([200, 200, 200]) for _ in TailFit._fields[:13]))
    fit = fit._replace(n_exceed_selected=np.array([200, 100, 50]))
    h = Hardness(np.full((3, 2), 1e-6), mask, mask, fit)
    share, note = diagnostics.raised_thresholds(h)
    assert share == pytest.approx(2 / 3) and note.startswith("THRESHOLD RAISED for 2 of 3 queries")
    only = h._replace(fit=fit._replace(n_exceed_selected=None))
    assert diagnostics.raised_thresholds(only) == (0.0, "")
    same = fit._replace(n_exceed_selected=fit.n_exceed)
    assert diagnostics.raised_thresholds(h._replace(fit=same)) == (0.0, "")


@pytest.mark.slow
def test_summary_warns_about_a_query_without_a_tail_fit():
    # One query whose stored scores are all equal (no excess over its threshold) and a sample
    # of one query (no query noise): the protocol must say so, not crash or stay silent.
    cfg, bench, sc = _sample(4, 10**6, query_replicates=50, nested_replicates=0, curve_points=3)
    tail, counts = sc.tail_scores.copy(), sc.pos_counts.copy()
    tail[1] = tail[1, -1]
    above = sc.pos_scores[1] > tail[1, 0]
    real = ~np.isnan(sc.pos_scores[1])
    counts[1] = np.where(real, np.where(above, 0, np.maximum(counts[1], tail.shape[1])), -1)
    tied = scores.make_scores(tail, sc.pos_scores, counts, sc.n_sample, source="tied")
    summary = prediction.predict(tied, cfg, 10**6).diagnostics.summary
    assert any(line.startswith("TAIL NOT FITTED for 1 of 4 queries") for line in summary)
    one = scores.make_scores(
        sc.tail_scores[:1], sc.pos_scores[:1], sc.pos_counts[:1], sc.n_sample, source="one"
    )
    result = prediction.predict(one, cfg, 10**6)
    assert np.isfinite(result.map) and result.diagnostics.budget.noise == 0.0
    # The tails of a 1% sample are fitted to its top 10 of 200 kept scores of S = 10,000 (rate
    # 1e-3, at the limit) but of a 0.2% sample to the top 10 of 2,000 (5e-3): only it warns.
    shallow = lambda r: any(line.startswith("SHALLOW TAIL") for line in r.diagnostics.summary)
    assert not shallow(result)
    small = simulate.draw(bench, 0.002, 200, seed=2).scores
    assert shallow(prediction.predict(small, cfg, 10**6))


def test_summary_warns_when_the_prediction_moves_with_the_threshold_or_the_prior():
    rng = np.random.default_rng(3)
    reps = 0.5 + 0.01 * rng.standard_normal(1000)
    s = IntervalSettings()
    calm = intervals.intervals(0.5, reps, s, deviation=0.005, prior_deviation=0.005)
    assert diagnostics.model_sensitive(calm, 1000) == []
    moved = intervals.intervals(0.5, reps, s, deviation=0.03)
    (note,) = diagnostics.model_sensitive(moved, 1000)
    assert note.startswith("THRESHOLD SENSITIVE: mAP@1000 moves by 0.0300")
    assert "sd 0.0" in note
    both = intervals.intervals(0.5, reps, s, deviation=0.03, prior_deviation=0.02)
    _, note = diagnostics.model_sensitive(both, 1000)
    assert note.startswith("PRIOR SENSITIVE: mAP@1000 moves by 0.0200")


def _toy_by_hand(counts, mask):
    """The toy metric, literally: each query's ranked list from its counts (positive j, the j-th
    by count, at rank j + count), c = ceil(R / 2), positives in the top c over c."""
    out = []
    for row, m in zip(counts, mask, strict=True):
        ranks = [j + c for j, c in enumerate(sorted(row[m]), start=1)]
        cut = -(-len(ranks) // 2)
        out.append(sum(r <= cut for r in ranks) / cut)
    return np.asarray(out)


@pytest.mark.slow
def test_a_registered_metric_with_a_per_query_cutoff_is_predicted_and_compared(monkeypatch):
    # A toy metric, registered through the public API (not by editing the registry): precision
    # at a cut-off of half each query's positives, ceil(R / 2).
    monkeypatch.setattr(metrics, "METRICS", dict(metrics.METRICS))  # undone after the test
    half = metrics.Cutoff("R/2", lambda n_pos: n_pos - n_pos // 2)
    toy = metrics.register(
        metrics.Metric("toy", "one", lambda j: j * 0.0 + 1.0, lambda n, k: n - n // 2, "toy", half)
    )
    assert config_lib.metric_names("map,toy") == ("map", "toy")
    cfg, bench, sc = _sample(40, 10**6, query_replicates=200, nested_replicates=4, curve_points=5)
    cfg = dataclasses.replace(cfg, metrics=("map", "toy"))
    # At N = S the prediction conditions on the sample's own counts: it is the sample's exact
    # value, which the literal recipe gives.
    got = prediction.predict(sc, cfg, sc.n_sample).metrics["toy"]
    exact = _toy_by_hand(sc.pos_counts + sc.fixed_counts, sc.mask)
    assert (got.metric, got.cutoff, got.label) == ("toy", "R/2", toy.label(cfg.k))
    np.testing.assert_allclose(got.per_query, exact, atol=1e-6)
    # At N: the point with both intervals and the curve, as every metric has.
    a = prediction.predict(sc, cfg, 10**6)
    m = a.metrics["toy"]
    assert m.interval.ci90.queries[0] <= m.value <= m.interval.ci90.queries[1]
    assert m.interval.sd_distractor is not None and len(m.curve.n) == 5
    assert (np.diff(m.curve.values) <= 1e-7).all() and m.value <= float(exact.mean()) + 1e-6
    # prediction.json carries it under its name, with its metric and cut-off; read back, it is
    # compared like the others, paired on the same queries.
    saved = schema.prediction_json(a)
    assert saved["metrics"]["toy"]["metric"] == "toy" and saved["metrics"]["toy"]["cutoff"] == "R/2"
    other = simulate.draw(simulate.second_system(bench, seed=2), 0.01, 200, seed=3).scores
    b = prediction.predict(other, cfg, 10**6)
    c = comparison.compare(schema.prediction_from_json(json.loads(json.dumps(saved))), b)
    paired = c.metrics["toy"]
    assert paired.difference == pytest.approx(m.value - b.metrics["toy"].value, abs=1e-9)
    assert paired.ci90_queries[0] <= paired.difference <= paired.ci90_queries[1]
    assert set(schema.comparison_json(c)["metrics"]) == {"map@100", "toy"}


def test_realized_terms_of_metrics_and_report_items():
    """The realized counts' sd: 0 at N = S (nothing left to draw), a mean over queries' spread
    elsewhere; a report item's is its view's spread over its own query weights."""
    mask = np.array([[True, True, False], [True, True, True]])
    x = np.array([[0.001, 0.01, 0.0], [0.002, 0.003, 0.02]])
    sample = SimpleNamespace(
        fixed_counts=np.zeros((2, 3), np.int64),
        pos_counts=np.where(mask, [[0, 1, 0], [0, 0, 2]], -1),
        n_sample=100,
    )
    h = Hardness(x=x, mask=mask, tail_priced=mask)
    opts = ProtocolSettings(realized_draws=64)
    maps = (metrics.METRICS["map"],)
    at = dict(k=20, metric_list=maps)
    assert prediction.realized_sd(h, sample, [100.0], **at, opts=opts)[0, 0] == 0.0
    at_n = prediction.realized_sd(h, sample, [2000.0], **at, opts=opts)[0, 0]
    want = realization.spread(
        x,
        None,
        mask,
        2000.0,
        20,
        counts=np.where(mask, sample.pos_counts, 0),
        n_sample=100,
        draws=64,
    )
    assert at_n == pytest.approx(realization.mean_sd(want.counts[0])) and at_n > 0
    assert prediction.realized_sd(h, sample, [2000.0], **at, opts=ProtocolSettings()) is not None
    off = ProtocolSettings(realized_draws=0)
    assert prediction.realized_sd(h, sample, [2000.0], **at, opts=off) is None

    views = np.stack([mask, mask & np.array([False, True, True])])
    items = (SimpleNamespace(view=1, metric="map"), SimpleNamespace(view=0, metric="recall"))
    spec = SimpleNamespace(views=views, items=items, weights=np.array([[0.5, 0.5], [0.0, 1.0]]))
    both = (metrics.METRICS["map"], metrics.METRICS["recall"])
    got = prediction.realized_items(h, sample, spec, 2000.0, k=20, metric_list=both, opts=opts)
    counts = np.where(mask, sample.pos_counts, 0)
    kw = dict(counts=counts, n_sample=100, draws=64, views=views, metric_list=both)
    var = realization.spread(x, None, mask, 2000.0, 20, **kw).counts  # [V, M, Q]
    np.testing.assert_allclose(got[0], np.sqrt(0.25 * var[1, 0, 0] + 0.25 * var[1, 0, 1]))
    np.testing.assert_allclose(got[1], np.sqrt(var[0, 1, 1]))
