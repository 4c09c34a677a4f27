"""Paired comparison: sign, probability and resolution against cases with a known answer."""

import dataclasses
import json

import ml_collections
import numpy as np
import PIL.Image
import pytest
from scipy import stats

from tailaware.configs import compare as compare_config
from tailaware.core import metrics
from tailaware.core.results import Interval, MetricPrediction
from tailaware.io import scores as scores_lib
from tailaware.jobs import compare as compare_job
from tailaware.protocol import comparison as compare
from tailaware.protocol import prediction, schema
from tailaware.protocol.settings import IntervalSettings, PredictSettings, ProtocolSettings
from tailaware.sim import simulate


def test_sign_and_probability():
    rng = np.random.default_rng(0)
    base = rng.beta(0.6, 0.9, 600)  # shared query difficulty dominates the variance
    a = np.clip(base + 0.02 + 0.01 * rng.standard_normal(600), 0, 1)
    out = compare.paired(a, base, sd_distractor_a=0.004, sd_distractor_b=0.003)
    assert out["difference"] > 0 and out["p_a_beats_b"] > 0.99 and out["resolved"]
    assert out["ci90_queries"][0] > 0
    rev = compare.paired(base, a, sd_distractor_a=0.003, sd_distractor_b=0.004)
    assert rev["difference"] == pytest.approx(-out["difference"])
    assert rev["p_a_beats_b"] < 0.01
    # Pairing cancels the shared query difficulty: the interval over queries like these is a
    # small fraction of what two independent query sets would allow.
    unpaired = 1.645 * np.sqrt((a.var() + base.var()) / 600)
    lo, hi = out["ci90_queries"]
    assert (hi - lo) / 2 < unpaired / 3


def test_these_queries_interval_is_the_distractor_and_model_terms():
    """For these queries the difference is uncertain only through the two distractor samples
    and the model term: a normal interval of their quadrature sum (written out here), which the
    interval over queries like these contains."""
    rng = np.random.default_rng(3)
    base = rng.beta(0.6, 0.9, 400)
    a = np.clip(base + 0.01 + 0.02 * rng.standard_normal(400), 0, 1)
    factors = IntervalSettings(threshold_sd=1.0, prior_sd=0.5)
    out = compare.paired(
        a,
        base,
        sd_distractor_a=0.004,
        sd_distractor_b=0.003,
        deviation=0.002,
        prior_deviation=0.004,
        settings=factors,
    )
    sd = np.sqrt(0.004**2 + 0.003**2 + 0.002**2 + (0.5 * 0.004) ** 2)
    d = float(np.mean(a - base))
    assert out["sd"] == pytest.approx(sd)
    assert out["ci90"] == pytest.approx((d - 1.6448536 * sd, d + 1.6448536 * sd))
    assert out["ci95"] == pytest.approx((d - 1.959964 * sd, d + 1.959964 * sd))
    assert out["p_a_beats_b"] == pytest.approx(stats.norm.cdf(d / sd))
    for tag in ("ci90", "ci95"):
        lo, hi = out[tag]
        qlo, qhi = out[f"{tag}_queries"]
        assert qlo < lo and hi < qhi
    assert out["sd_queries"] > out["sd"]


def test_no_difference_is_not_resolved_and_margin_scales():
    rng = np.random.default_rng(1)
    hits = []
    for t in range(100):
        base = rng.beta(0.6, 0.9, 300)
        a = base + 0.02 * rng.standard_normal(300)
        b = base + 0.02 * rng.standard_normal(300)
        lo, hi = compare.paired(a, b, num_replicates=400, seed=t)["ci90_queries"]
        hits.append(lo > 0 or hi < 0)
    assert np.mean(hits) < 0.2  # a 90% interval excludes 0 about 10% of the time
    a, b = base + 0.01, base
    plain = compare.paired(a, b, sd_distractor_a=0.002)
    noisy = compare.paired(a, b, sd_distractor_a=0.01, sd_distractor_b=0.01)
    assert noisy["resolvable_margin"] > plain["resolvable_margin"]
    assert plain["resolved"] and not noisy["resolved"]
    with pytest.raises(ValueError, match="same queries"):
        compare.paired(a, b[:-1])


def _pred(m, **maps) -> MetricPrediction:
    interval = Interval("query", 0.0, None, None, 0.0, 0.0, 0.0, None, None, **maps)
    return MetricPrediction.of(metrics.METRICS["map"], 1, m, np.zeros(1), interval)


def paired(a, b, field="threshold_maps"):
    """The pairing of two predictions' mAP@k (`comparison.paired_deviation`)."""
    return compare.paired_deviation(a, b, field)


def test_paired_deviation_of_the_difference():
    def pred(m, half, double):
        return _pred(m, threshold_maps=(half, double))

    # Both estimates move alike with the threshold: the difference does not move.
    assert paired(pred(0.5, 0.52, 0.47), pred(0.4, 0.42, 0.37)) == (pytest.approx(0.0, abs=1e-12))
    # Opposite moves add up: (0.02 - (-0.01)) at half, (-0.03 - 0.01) at double.
    got = paired(pred(0.5, 0.52, 0.47), pred(0.4, 0.39, 0.41))
    assert got == pytest.approx(0.04)
    # Without reruns (an estimator without a tail model, or an older file): no term.
    no_interval = MetricPrediction.of(metrics.METRICS["map"], 1, 0.5, np.zeros(1))
    assert paired(no_interval, pred(0.4, 0.39, 0.41)) == 0.0
    assert paired(pred(0.5, 0.5, 0.5), _pred(0.4)) == 0
    # The prior reruns pair the same way.
    priors = lambda m, flat, steep: _pred(m, prior_maps=(flat, steep))
    got = paired(priors(0.5, 0.53, 0.46), priors(0.4, 0.42, 0.37), "prior_maps")
    assert got == pytest.approx(0.01)
    assert paired(priors(0.5, 0.53, 0.46), pred(0.4, 0.4, 0.4)) == 0.0


def test_prior_term_of_the_difference():
    # Both systems' query-by-query prior terms in quadrature (their errors independent).
    a = _pred(0.5, prior_maps=(0.53, 0.46), prior_spread=0.003)
    b = _pred(0.4, prior_maps=(0.42, 0.37), prior_spread=0.004)
    assert compare.prior_term(a, b) == pytest.approx(0.005)
    # Files written before the spread: the paired move under the other priors, as before.
    old_a, old_b = _pred(0.5, prior_maps=(0.53, 0.46)), _pred(0.4, prior_maps=(0.42, 0.37))
    assert compare.prior_term(old_a, old_b) == pytest.approx(paired(old_a, old_b, "prior_maps"))


def test_paired_adds_the_threshold_term_in_quadrature():
    rng = np.random.default_rng(4)
    base = rng.beta(0.6, 0.9, 600)
    a = np.clip(base + 0.02 + 0.01 * rng.standard_normal(600), 0, 1)
    factors = IntervalSettings(threshold_sd=1.0)  # the default leaves the threshold term out
    plain = compare.paired(a, base, num_replicates=4000, sd_distractor_a=0.002, settings=factors)
    wide = compare.paired(
        a, base, num_replicates=4000, sd_distractor_a=0.002, deviation=0.01, settings=factors
    )
    assert wide["sd"] == pytest.approx(np.hypot(plain["sd"], factors.threshold_sd * 0.01))
    assert wide["sd_queries"] == pytest.approx(np.hypot(plain["sd_queries"], 0.01), rel=1e-6)
    assert wide["difference"] == plain["difference"]
    assert wide["p_a_beats_b"] < plain["p_a_beats_b"]
    assert wide["resolvable_margin"] > 2 * plain["resolvable_margin"]


def test_paired_adds_the_shared_prior_move_in_quadrature():
    # The difference's move under the other priors (both systems re-weighted alike) scaled by
    # shared_sd joins the threshold and query-by-query prior terms in quadrature.
    rng = np.random.default_rng(6)
    base = rng.beta(0.6, 0.9, 600)
    a = np.clip(base + 0.02 + 0.01 * rng.standard_normal(600), 0, 1)
    factors = IntervalSettings(threshold_sd=1.0, prior_sd=1.5, shared_sd=0.5)
    terms = dict(deviation=0.01, prior_deviation=0.004, settings=factors)
    plain = compare.paired(a, base, num_replicates=2000, **terms)
    wide = compare.paired(a, base, num_replicates=2000, shared_deviation=0.03, **terms)
    assert plain["sd"] == pytest.approx(np.hypot(0.01, 1.5 * 0.004))
    assert wide["sd"] == pytest.approx(np.sqrt(0.01**2 + (1.5 * 0.004) ** 2 + (0.5 * 0.03) ** 2))


@pytest.mark.slow
def test_compare_job_reads_two_predictions_and_adds_every_term(tmp_path, capsys):
    bench_a = simulate.make_benchmark(150, n_pool=10**7, seed=0)
    bench_b = simulate.second_system(bench_a, seed=1)
    settings = PredictSettings(protocol=ProtocolSettings(nested_replicates=20))
    preds = []
    for i, bench in enumerate((bench_a, bench_b)):
        scores = simulate.draw(bench, 0.01, 4000, seed=10 + i).scores
        ids = np.asarray([f"q{j}" for j in range(scores.num_queries)])
        scores = dataclasses.replace(scores, query_ids=ids)
        preds.append(schema.prediction_json(prediction.predict(scores, settings, bench.n_pool)))
        with open(tmp_path / f"{'ab'[i]}.json", "w") as f:
            json.dump(preds[-1], f)
    cfg = compare_config.get_config()
    cfg.a, cfg.b = str(tmp_path / "a.json"), str(tmp_path / "b.json")
    compare_job.run(cfg, str(tmp_path / "w"))
    with open(tmp_path / "w" / "comparison.json") as f:
        out = json.load(f)
    a, b = preds
    # The table on stdout: a row per metric with A, B, A - B and its interval from the JSON.
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"A - B at N = {bench_a.n_pool:,}, k = 1000"
    for label, m in out["metrics"].items():
        lo, hi = m["ci90"]
        row = next(
            line.split() for line in lines if line.split()[:1] == [label.replace("map@", "mAP@")]
        )
        want = [f"{m['value_a']:.4f}", f"{m['value_b']:.4f}", f"{m['difference']:+.4f}"]
        assert row[1:4] == want and row[4:6] == [f"[{lo:+.4f},", f"{hi:+.4f}]"], row
    # Its figure: a PNG of both panels (the metrics' differences, A - B over N).
    with PIL.Image.open(tmp_path / "w" / "comparison.png") as png:
        assert png.format == "PNG" and png.size[0] > 500 and png.size[1] > 500
    assert out["difference"] == pytest.approx(a["map"] - b["map"], abs=1e-9)
    assert a["uncertainty"]["sd_distractor"] > 0 and out["threshold_deviation"] > 0
    # Every term in quadrature: the paired query sd, both sampling sds (each the larger of its
    # nested and sub-samples' reads), the threshold term, both systems' query-by-query prior
    # terms, the paired prior move (the part the queries share), both realized-value sds.
    diff = np.asarray(a["per_query_ap"]) - np.asarray(b["per_query_ap"])
    sd_pairs = diff.std(ddof=1) / np.sqrt(diff.size)
    sd_d = [p["uncertainty"]["sd_distractor"] for p in preds]
    sd_r = [p["uncertainty"]["sd_realized"] for p in preds]
    sd_s = [p["uncertainty"]["sd_subsample"] for p in preds]
    assert min(sd_r) > 0 and min(sd_s) > 0
    factors = IntervalSettings()
    these = np.sqrt(
        max(sd_d[0], sd_s[0]) ** 2
        + max(sd_d[1], sd_s[1]) ** 2
        + (factors.threshold_sd * out["threshold_deviation"]) ** 2
        + (factors.prior_sd * a["uncertainty"]["prior_spread"]) ** 2
        + (factors.prior_sd * b["uncertainty"]["prior_spread"]) ** 2
        + (factors.shared_sd * out["prior_deviation"]) ** 2
        + sd_r[0] ** 2
        + sd_r[1] ** 2
    )
    assert out["sd"] == pytest.approx(these, rel=1e-9)  # for these queries: no query term
    assert out["sd_queries"] == pytest.approx(np.hypot(these, sd_pairs), rel=0.1)
    assert out["ci90_queries"][0] < out["ci90"][0] < out["ci90"][1] < out["ci90_queries"][1]

    # A prediction.json written before there were two intervals (its `ci90` the interval over
    # queries like these) still reads: that interval, and the one for these queries rebuilt.
    old = json.loads(json.dumps(a))
    for d in (old, *old["metrics"].values()):
        for tag in ("ci90", "ci95"):
            d[tag] = d.pop(f"{tag}_queries")
            del d["uncertainty"][f"{tag}_queries"]
    typed_old = schema.prediction_from_json(old)
    assert typed_old.interval.ci90.queries == pytest.approx(a["ci90_queries"])
    assert typed_old.interval.ci90.reported == pytest.approx(a["ci90"], abs=1e-12)

    # Predictions of other queries, or at another N, are refused by name.
    typed_a, typed_b = (schema.prediction_from_json(p) for p in preds)
    b_other = typed_b._replace(query_ids=typed_b.query_ids[::-1])
    with pytest.raises(ValueError, match="'query_ids': query 0"):
        compare.compare(typed_a, b_other)
    with pytest.raises(ValueError, match="'n_target'"):
        compare.compare(typed_a, typed_b._replace(n_target=10**9))
    bad = ml_collections.ConfigDict(dict(cfg, b=str(tmp_path / "missing.json")))
    with pytest.raises(FileNotFoundError, match="--config.b=.*missing.json: no such file"):
        compare_job.run(bad, str(tmp_path / "w2"))
    (tmp_path / "broken.json").write_text('{"map": 0.5')
    bad = ml_collections.ConfigDict(dict(cfg, b=str(tmp_path / "broken.json")))
    with pytest.raises(ValueError, match="broken.json: not a readable prediction.json"):
        compare_job.run(bad, str(tmp_path / "w2"))


@pytest.mark.slow
def test_compare_pairs_two_models_scored_on_one_sample():
    # Two models score the same sampled items (B's scores are A's with a little noise): each
    # prediction keeps its nested replicates, drawn by item id, and the comparison takes their
    # correlation for the two sampling errors (the formula written out here). Without ids the
    # replicates are not kept and the errors are taken as independent, as before.
    q, s, n = 40, 3000, 10**6
    rng = np.random.default_rng(5)
    latent = rng.standard_normal(s)[None, :] + 0.3 * rng.standard_normal((q, s))
    pos = np.tanh(0.2 * (2.6 + 0.4 * rng.standard_normal((q, 3))))
    settings = PredictSettings(protocol=ProtocolSettings(nested_replicates=30))
    preds = []
    for noise in (0.0, 0.1 * rng.standard_normal(s)[None, :]):
        sc = np.tanh(0.2 * (latent + noise))
        order = np.argsort(-sc, axis=1, kind="stable")
        tail = np.take_along_axis(sc, order, 1)[:, :1000]
        counts = (sc[:, None, :] > pos[:, :, None]).sum(axis=2)
        scores = scores_lib.make_scores(tail, pos, counts, s, tail_ids=order[:, :1000] + 10**10)
        preds.append(prediction.predict(scores, settings, n))
        assert preds[-1].interval.distractor_replicates is not None
        assert len(preds[-1].interval.distractor_replicates) == 30
    no_ids = prediction.predict(dataclasses.replace(scores, tail_ids=None), settings, n)
    assert no_ids.interval.distractor_replicates is None
    a, b = preds
    rho = np.corrcoef(a.interval.distractor_replicates, b.interval.distractor_replicates)[0, 1]
    assert rho > 0.5
    got = compare.compare(a, b).ap
    assert got.sampling_correlation == pytest.approx(rho)
    sd_a, sd_b = (max(p.interval.sd_distractor, p.interval.sd_subsample) for p in (a, b))
    factors = IntervalSettings()
    rest = (
        (factors.threshold_sd * got.threshold_deviation) ** 2
        + (factors.prior_sd * a.interval.prior_spread) ** 2
        + (factors.prior_sd * b.interval.prior_spread) ** 2
        + (factors.shared_sd * got.prior_deviation) ** 2
        + a.interval.sd_realized**2
        + b.interval.sd_realized**2
    )
    want = np.sqrt(sd_a**2 + sd_b**2 - 2 * rho * sd_a * sd_b + rest)
    assert got.sd == pytest.approx(want, rel=1e-9)
    apart = compare.compare(a, no_ids)
    assert apart.ap.sampling_correlation == 0.0
    assert f"taken as correlated {rho:+.2f}" in schema.format_comparison(compare.compare(a, b))
    assert "correlated" not in schema.format_comparison(apart)
    # prediction.json keeps the replicates; a malformed list is refused by its field.
    d = schema.prediction_json(a)
    back = schema.prediction_from_json(json.loads(json.dumps(d)))
    assert back.interval.distractor_replicates == pytest.approx(a.interval.distractor_replicates)
    d["uncertainty"]["distractor_replicates"][3] = None
    with pytest.raises(ValueError, match="a.json.*'distractor_replicates'"):
        schema.prediction_from_json(d, "a.json")
