"""prediction.json and comparison.json: the typed results written as JSON, in one place.

`prediction_json` is the public layout of prediction.json (docs/outputs.md lists its fields):
every metric under `metrics`, and mAP@k's entry repeated at the top (`map`, `per_query_ap`,
`ci90`, `uncertainty`, `curve`, ...), the layout files had before there were several.
`prediction_from_json` reads back what a comparison needs, from files of either age.
`format_table` and `format_comparison` are the plain-text tables the predict and compare jobs
print.
"""

import statistics
from typing import Any

import numpy as np

from tailaware.core import metrics as core_metrics
from tailaware.core.results import (
    MAP,
    Bounds,
    Budget,
    Comparison,
    Curve,
    Diagnostics,
    Drift,
    Interval,
    MetricPrediction,
    Paired,
    Prediction,
    Report,
)
from tailaware.io.errors import InputError, field_error
from tailaware.protocol import ilias_report, intervals, reference


def _pair(bounds) -> list[float]:
    return [float(bounds[0]), float(bounds[1])]


def interval_json(interval: Interval) -> dict:
    """Returns prediction.json's `uncertainty`: the interval and every part it is built from."""
    out = {"ci_method": interval.method, "sd_query": interval.sd_query}
    if interval.sd_combined is not None:
        out["sd_combined"] = interval.sd_combined
    if interval.sd_distractor is not None:
        out["sd_distractor"] = interval.sd_distractor
    out["threshold_deviation"] = interval.threshold_deviation
    out["prior_deviation"] = interval.prior_deviation
    out["prior_spread"] = interval.prior_spread
    out["sd_model"] = interval.sd_model
    out["sd_realized"] = interval.sd_realized
    out["sd_subsample"] = interval.sd_subsample
    if interval.distractor_replicates is not None:
        out["distractor_replicates"] = [float(v) for v in interval.distractor_replicates]
    for tag, b in (("ci90", interval.ci90), ("ci95", interval.ci95)):
        out[f"{tag}_query"] = _pair(b.query)
        if b.distractor is not None:
            out[f"{tag}_distractor"] = _pair(b.distractor)
        out[f"{tag}_sampling"] = _pair(b.sampling)
        out[tag] = _pair(b.reported)
        if b.queries is not None:
            out[f"{tag}_queries"] = _pair(b.queries)
    listed = lambda a: None if a is None else [float(v) for v in a]
    out["threshold_maps"] = listed(interval.threshold_maps)
    out["prior_maps"] = listed(interval.prior_maps)
    return out


def _headline_json(interval: Interval) -> dict:
    """Returns the intervals a prediction and each metric show at their top: `ci90` / `ci95` for
    these queries, `ci90_queries` / `ci95_queries` over queries like these."""
    out = {}
    for tag, b in (("ci90", interval.ci90), ("ci95", interval.ci95)):
        out[tag] = _pair(b.reported)
        if b.queries is not None:
            out[f"{tag}_queries"] = _pair(b.queries)
    return out


def _curve_json(curve: Curve, key: str = "map") -> dict:
    out = {
        "n": [float(v) for v in curve.n],
        key: [float(v) for v in curve.values],
        "ci90": [_pair(b) for b in curve.ci90],
    }
    if curve.ci90_queries is not None:
        out["ci90_queries"] = [_pair(b) for b in curve.ci90_queries]
    if curve.sd_distractor is not None:
        out["sd_distractor"] = [float(v) for v in curve.sd_distractor]
    if curve.sd_subsample is not None:
        out["sd_subsample"] = [float(v) for v in curve.sd_subsample]
    return out


def _budget_json(b: Budget) -> dict:
    if not b.checked:
        return {
            "converged": b.converged,
            "checked": False,
            "message": b.message,
            "reason": b.reason,
        }
    return {
        "sizes": list(b.sizes),
        "predictions": list(b.predictions),
        "last_change": b.last_change,
        "noise": b.noise,
        "converged": b.converged,
        "needed_sample": b.needed_sample,
        "message": b.message,
    }


def _drift_json(d: Drift) -> dict:
    if not d.checked:
        return {"checked": False, "reason": d.reason}
    return {
        "block_map": list(d.block_map),
        "chi2": d.chi2,
        "dof": d.dof,
        "p_value": d.p_value,
        "flag": d.flag,
        "max_deviation": d.max_deviation,
        "checked": True,
    }


def _diagnostics_json(d: Diagnostics) -> dict:
    out: dict[str, Any] = {"summary": list(d.summary)}
    if d.budget is not None:
        out["budget"] = _budget_json(d.budget)
    if d.drift is not None:
        out["drift"] = _drift_json(d.drift)
    if d.share_tail_priced is not None:
        out["share_tail_priced"] = d.share_tail_priced
    if d.share_threshold_raised is not None:
        out["share_threshold_raised"] = d.share_threshold_raised
    if d.tail_counts is not None:
        observed, expected, sd = d.tail_counts
        out["tail_counts"] = {"observed": observed, "expected": expected, "sd": sd}
    if d.fits_not_converged is not None:
        out["fits_not_converged"] = d.fits_not_converged
    return out


def _metric_json(m: MetricPrediction) -> dict:
    """Returns one entry of prediction.json's `metrics`."""
    out: dict[str, Any] = {
        "metric": m.metric,
        "cutoff": m.cutoff,
        "value": float(m.value),
        "per_query": [float(v) for v in m.per_query],
    }
    if m.interval is not None:
        out.update(_headline_json(m.interval))
        out["uncertainty"] = interval_json(m.interval)
    if m.curve is not None:
        out["curve"] = _curve_json(m.curve, "values")
    return out


def prediction_json(p: Prediction, correction=None) -> dict:
    """Returns the prediction.json object of a `Prediction` (JSON types only); with
    `correction`, a (`reference.Correction`, `reference.Inputs`) pair, its `reference` block.

    mAP@k's entry of `metrics` is repeated at the top level (`map`, `per_query_ap`, `ci90`, ...,
    `uncertainty`, `curve`), as files written before there were several metrics hold it."""
    ap = p.ap
    out = {
        "map": float(ap.value),
        "estimator": p.estimator,
        "n_target": int(p.n_target),
        "n_sample": int(p.n_sample),
        "k": int(p.k),
        "num_queries": int(len(ap.per_query)),
        "per_query_ap": [float(a) for a in ap.per_query],
        "baselines": {name: _number(v) for name, v in p.baselines.items()},
    }
    if p.share_tail_priced is not None:
        out["share_tail_priced"] = float(p.share_tail_priced)
    if p.query_ids is not None:
        out["query_ids"] = [str(q) for q in p.query_ids]
    if ap.interval is not None:
        out.update(_headline_json(ap.interval))
        out["uncertainty"] = interval_json(ap.interval)
    if ap.curve is not None:
        out["curve"] = _curve_json(ap.curve)
    out["metrics"] = {label: _metric_json(m) for label, m in p.metrics.items()}
    if p.diagnostics is not None:
        out["diagnostics"] = _diagnostics_json(p.diagnostics)
    if p.artifact is not None:
        out["artifact"] = {"path": p.artifact[0], "metadata": p.artifact[1]}
    if p.queries is not None:
        out["queries"] = p.queries
    if p.report is not None:
        out["report"] = report_json(p.report)
    if correction is not None:
        out["reference"] = reference_json(*correction)
    return out


def reference_json(c: reference.Correction, inputs: reference.Inputs) -> dict:
    """Returns prediction.json's `reference` block: the reference's files and, per metric, the
    corrected value with its interval, lambda and the uncorrected value."""
    metrics_out = {
        label: {
            "value": m.value,
            "ci90": _pair(m.ci90),
            "lambda": m.lam,
            "uncorrected": m.uncorrected,
            "difference": m.difference,
            "bias": m.bias,
            "sd": m.sd,
            "sd_uncorrected": m.sd_uncorrected,
            "sd_difference": m.sd_difference,
            "per_query": [float(v) for v in m.per_query],
            "exact": m.exact,
            "exact_per_query": [float(v) for v in m.exact_per_query],
            "reference_error": None if np.isnan(m.reference_error) else m.reference_error,
        }
        for label, m in c.metrics.items()
    }
    first = next(iter(c.metrics.values()))
    return {
        "counts": inputs.counts_path,
        "scores": inputs.scores_path,
        "n_distractors": c.n_distractors,
        "n_sample": c.n_sample,
        "replicates": c.replicates,
        "share_paired": c.share_paired,
        "map": first.value,
        "lambda": first.lam,
        "uncorrected": first.uncorrected,
        "metrics": metrics_out,
    }


def _float_or_nan(v: float | None) -> float:
    return float("nan") if v is None else float(v)


def correction_from_json(block: dict, source: str = "prediction.json") -> reference.Correction:
    """Returns the `reference.Correction` of prediction.json's `reference` block, as far as a
    comparison with the reference needs it (per metric: the corrected value, its sd and
    per-query values, the reference's exact ones).

    Raises:
      InputError: naming `source` and the missing field (a file written before the block held
        the reference's exact values needs its prediction rerun).
    """
    out = {}
    try:
        for label, m in block["metrics"].items():
            for field in ("exact", "exact_per_query"):
                if field not in m:
                    raise field_error(
                        source, f"reference.metrics.{label}.{field}", "missing (rerun predict)"
                    )
            out[label] = reference.MetricCorrection(
                label=label,
                value=float(m["value"]),
                uncorrected=float(m["uncorrected"]),
                difference=float(m["difference"]),
                lam=float(m["lambda"]),
                sd=float(m["sd"]),
                ci90=(float(m["ci90"][0]), float(m["ci90"][1])),
                sd_uncorrected=float(m["sd_uncorrected"]),
                sd_difference=float(m["sd_difference"]),
                bias=float(m["bias"]),
                per_query=np.asarray(m["per_query"], np.float64),
                reference_error=_float_or_nan(m.get("reference_error")),
                exact=float(m["exact"]),
                exact_per_query=np.asarray(m["exact_per_query"], np.float64),
            )
        return reference.Correction(
            metrics=out,
            n_distractors=int(block["n_distractors"]),
            n_sample=int(block["n_sample"]),
            replicates=int(block["replicates"]),
            share_paired=float(block["share_paired"]),
        )
    except (KeyError, TypeError, ValueError, IndexError) as e:
        raise InputError(f"{source}: not a predict job's `reference` block ({e!r})") from e


def report_json(r: Report) -> dict:
    """Returns prediction.json's `report`: the official ILIAS report's keys and units (percent).

    `map`, `oracle` and, per group, `scale`, `clutter`, `categories`, `subcategories` (an
    empty object where `notes` says why it was skipped); `num_queries` and `num_instances` in the
    same layout (what each value averages); `ci90` (these queries) and `ci90_queries` (queries
    like these) likewise when the values have intervals;
    `queries` and `aps` (each query's AP@k) as the official report has them.
    """
    out = {"units": "percent", **_report_layout(r, lambda v: float(v.value))}
    out["num_queries"] = _report_layout(r, lambda v: int(v.num_queries))
    out["num_instances"] = _report_layout(r, lambda v: int(v.num_instances))
    if any(v.ci90 is not None for v in r.values):
        out["ci90"] = _report_layout(r, lambda v: None if v.ci90 is None else _pair(v.ci90))
    if any(v.ci90_queries is not None for v in r.values):
        out["ci90_queries"] = _report_layout(
            r, lambda v: None if v.ci90_queries is None else _pair(v.ci90_queries)
        )
    out["queries"] = [str(q) for q in r.query_ids]
    out["aps"] = [float(a) for a in r.aps]
    out["notes"] = list(r.notes)
    return out


def _number(v):
    return np.asarray(v, np.float64).tolist()


def prediction_from_json(d: dict, source: str = "prediction.json") -> Prediction:
    """Returns the `Prediction` of a prediction.json object, as far as a comparison needs it:
    the point, per-query AP, query ids, the interval's distractor sd and model reruns, and the
    same for every metric under `metrics`.

    Raises:
      InputError: naming `source` and the missing or malformed field.
    """
    if not isinstance(d, dict):
        raise InputError(f"{source}: expected a JSON object (a predict job's prediction.json)")
    for field in ("map", "estimator", "n_target", "n_sample", "k", "per_query_ap"):
        if field not in d:
            raise field_error(source, field, "missing (required)")
    try:
        return _prediction_from_json(d)
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise InputError(f"{source}: not a predict job's prediction.json ({e!r})") from e


def _prediction_from_json(d: dict) -> Prediction:
    k = int(d["k"])
    ids = d.get("query_ids")
    unc, curve = d.get("uncertainty"), d.get("curve")
    ap = MetricPrediction.of(
        core_metrics.get(MAP),
        k,
        d["map"],
        np.asarray(d["per_query_ap"], np.float64),
        None if unc is None else interval_from_json(unc, d),
        None if curve is None else _curve_from_json(curve),
    )
    metrics = {ap.label: ap}
    for label, m in d.get("metrics", {}).items():
        if label != ap.label:
            metrics[label] = _metric_from_json(label, m, k)
    return Prediction(
        estimator=str(d["estimator"]),
        n_target=int(d["n_target"]),
        n_sample=int(d["n_sample"]),
        k=k,
        query_ids=None if ids is None else np.asarray(ids),
        metrics=metrics,
        baselines=dict(d.get("baselines", {})),
    )


def _metric_from_json(label: str, m: dict, k: int) -> MetricPrediction:
    """The `MetricPrediction` of a `_metric_json` entry; a file written before entries named
    their metric and cut-off has them from the registry (the metric reported as `label`)."""
    if "metric" in m:
        name, cutoff = str(m["metric"]), m["cutoff"]
    else:
        metric = core_metrics.labelled(label, k)
        name, cutoff = metric.name, metric.cutoff_value(k)
    return MetricPrediction(
        label,
        name,
        cutoff,
        float(m["value"]),
        np.asarray(m["per_query"], np.float64),
        None if "uncertainty" not in m else interval_from_json(m["uncertainty"], m),
        None if "curve" not in m else _curve_from_json(m["curve"], "values"),
    )


def _curve_from_json(d: dict, key: str = "map") -> Curve:
    """The `Curve` of a `_curve_json` object."""
    sd, sub = d.get("sd_distractor"), d.get("sd_subsample")
    queries = d.get("ci90_queries")
    return Curve(
        tuple(float(v) for v in d["n"]),
        tuple(float(v) for v in d[key]),
        tuple((float(lo), float(hi)) for lo, hi in d["ci90"]),
        None if sd is None else tuple(float(v) for v in sd),
        None if queries is None else tuple((float(lo), float(hi)) for lo, hi in queries),
        None if sub is None else tuple(float(v) for v in sub),
    )


def interval_from_json(unc: dict, reported: dict | None = None) -> Interval:
    """Returns the `Interval` of an `interval_json` object; the reported bounds come from
    `reported` (prediction.json keeps them at its top level) or from `unc` itself."""
    maps = lambda name: None if unc.get(name) is None else tuple(unc[name])
    top = unc if reported is None else reported
    return Interval(
        method=unc.get("ci_method", "query"),
        sd_query=float(unc.get("sd_query", 0.0)),
        sd_distractor=unc.get("sd_distractor"),
        sd_combined=unc.get("sd_combined"),
        threshold_deviation=float(unc.get("threshold_deviation", 0.0)),
        prior_deviation=float(unc.get("prior_deviation", 0.0)),
        sd_model=float(unc.get("sd_model", 0.0)),
        ci90=_bounds(unc, top, "ci90"),
        ci95=_bounds(unc, top, "ci95"),
        threshold_maps=maps("threshold_maps"),
        prior_maps=maps("prior_maps"),
        sd_realized=float(unc.get("sd_realized", 0.0)),
        sd_subsample=float(unc.get("sd_subsample", 0.0)),
        prior_spread=float(unc.get("prior_spread", 0.0)),
        distractor_replicates=_replicates(unc),
    )


def _replicates(unc: dict) -> tuple[float, ...] | None:
    """The interval's `distractor_replicates`, or None; a ValueError naming the field unless a
    list of finite numbers."""
    if unc.get("distractor_replicates") is None:
        return None
    a = np.asarray(unc["distractor_replicates"], np.float64)
    if a.ndim != 1 or not np.isfinite(a).all():
        raise ValueError("field 'distractor_replicates': expected a list of finite numbers")
    return tuple(a.tolist())


def _bounds(unc: dict, top: dict, tag: str) -> Bounds:
    """The interval at `tag`: the reported ones from `top`, their parts from `unc` (NaN where a
    prediction.json lacks them).

    A file written before there were two intervals holds at `tag` the interval over queries like
    these; its interval for these queries is rebuilt from its parts (the sampling interval
    widened by the model and realized-value terms), as `intervals.intervals` builds it."""
    pair = lambda key: tuple(unc[key]) if key in unc else (np.nan, np.nan)
    distractor = tuple(unc[f"{tag}_distractor"]) if f"{tag}_distractor" in unc else None
    reported = tuple(top.get(tag, (np.nan, np.nan)))
    key = f"{tag}_queries"
    if key in unc or key in top:
        return Bounds(
            reported,
            pair(f"{tag}_sampling"),
            pair(f"{tag}_query"),
            distractor,
            tuple(top[key] if key in top else unc[key]),
        )
    point = float(top.get("map", top.get("value", np.nan)))
    z = statistics.NormalDist().inv_cdf(0.5 + int(tag[2:]) / 200.0)
    sd_m = float(np.hypot(float(unc.get("sd_model", 0.0)), float(unc.get("sd_realized", 0.0))))
    if unc.get("sd_distractor") is not None:
        s = intervals.sampling_sd(unc["sd_distractor"], float(unc.get("sd_subsample", 0.0)))
        these = intervals.for_these_queries(point, z, s, sd_m)
    else:
        these = intervals.widened(point, distractor or (point, point), z * sd_m)
    return Bounds(these, pair(f"{tag}_sampling"), pair(f"{tag}_query"), distractor, reported)


def comparison_json(c: Comparison, a: str = "", b: str = "") -> dict:
    """Returns the comparison.json object of a `Comparison` of prediction files `a` and `b`:
    mAP@k's fields at the top (`map_a`, `map_b`, `difference`, ...), every metric's under
    `metrics`."""
    ap = c.ap
    out = {
        "n_target": int(c.n_target),
        "k": int(c.k),
        "map_a": float(ap.value_a),
        "map_b": float(ap.value_b),
        **_paired_json(ap),
        "metrics": {
            label: {"value_a": float(m.value_a), "value_b": float(m.value_b), **_paired_json(m)}
            for label, m in c.metrics.items()
        },
    }
    if a or b:
        out["a"], out["b"] = a, b
    return out


def format_comparison(c: Comparison, a: str = "", b: str = "") -> str:
    """Returns the plain-text table of a comparison: per metric A, B, A - B with its 90% interval
    for these queries, P(A > B), whether that interval excludes 0, and the interval over queries
    like these."""
    rows = c.metrics
    names = {label: label.replace("map@", "mAP@", 1) for label in rows}
    w = max(14, *(len(n) + 2 for n in names.values()))
    lines = [f"A - B at N = {c.n_target:,}, k = {c.k}"]
    lines += [f"  {side}: {path}" for side, path in (("A", a), ("B", b)) if path]
    head = f"  {'metric':<{w}}{'A':>8}{'B':>9}{'A - B':>10}   {'90% CI':<20}{'P(A > B)':>9}"
    lines.append(head + f"  resolved   {'90% CI, queries like these'}")
    for label, m in rows.items():
        lo, hi = m.ci90
        like = "" if m.ci90_queries is None else "[{:+.4f}, {:+.4f}]".format(*m.ci90_queries)
        lines.append(
            f"  {names[label]:<{w}}{m.value_a:>8.4f}{m.value_b:>9.4f}{m.difference:>+10.4f}   "
            f"{f'[{lo:+.4f}, {hi:+.4f}]':<20}{m.p_a_beats_b:>9.3f}  "
            f"{'yes' if m.resolved else 'no':<8}   {like}"
        )
    lines.append("  90% CI: the difference the full evaluations would print on these queries")
    if c.ap.sampling_correlation:
        lines.append(
            f"  mAP@{c.k}: both scored one sample; their sampling errors taken as correlated "
            f"{c.ap.sampling_correlation:+.2f} (their nested replicates, paired by item)"
        )
    lines.append(
        f"  mAP@{c.k}: a difference of {c.ap.resolvable_margin:.4f} is the least its 90% interval "
        "would separate from 0"
    )
    return "\n".join(lines)


def _paired_json(c: Paired) -> dict:
    """Returns the paired difference's fields of one metric (`Paired`)."""
    return {
        "difference": c.difference,
        "sd": c.sd,
        "ci90": _pair(c.ci90),
        "ci95": _pair(c.ci95),
        "p_a_beats_b": c.p_a_beats_b,
        "resolvable_margin": c.resolvable_margin,
        "resolved": c.resolved,
        "threshold_deviation": c.threshold_deviation,
        "prior_deviation": c.prior_deviation,
        "sampling_correlation": c.sampling_correlation,
        **({} if c.sd_queries is None else {"sd_queries": c.sd_queries}),
        **{
            f"{tag}_queries": _pair(b)
            for tag, b in (("ci90", c.ci90_queries), ("ci95", c.ci95_queries))
            if b is not None
        },
    }


def _report_layout(r: Report, field) -> dict:
    """{"map": field(map value), "oracle": ..., "scale": {key: field(value)}, ...}."""
    out = {v.section: field(v) for v in r.values if v.section not in ilias_report.GROUPED}
    for section in ilias_report.GROUPED:
        out[section] = {v.key: field(v) for v in r.values if v.section == section}
    return out


def format_table(p: Prediction) -> str:
    """Returns a plain-text table of a prediction and its baselines (warnings first)."""
    k, n = p.k, p.n_target
    others = list(p.metrics.values())[1:]
    names = {"at_sample": "evaluate-at-S", "count": "count (K/S)"}
    first = p.estimator + " (prediction)"
    labels = [first, *(names.get(b, b) for b in p.baselines), *(m.label for m in others)]
    w = max(22, *(len(s) + 2 for s in labels))  # the label column
    lines = list(p.diagnostics.summary[: -1 - len(others)]) if p.diagnostics is not None else []
    lines += [
        f"mAP@{k} at N = {n:,} from S = {p.n_sample:,} sampled distractors "
        f"({len(p.per_query_ap)} queries)",
        f"  {'estimator':<{w}}{'mAP@' + str(k):>10}",
        f"  {first:<{w}}{p.map:>10.4f}",
    ]
    if p.interval is not None:
        lines[-1] += _ci_text(p.interval)
    for name, value in p.baselines.items():
        lines.append(f"  {names.get(name, name):<{w}}{float(value):>10.4f}")
    if others:
        lines.append(f"  other metrics ({p.estimator})")
    for m in others:
        ci = "" if m.interval is None else _ci_text(m.interval)
        lines.append(f"  {m.label:<{w}}{m.value:>10.4f}{ci}")
    if p.report is not None:
        lines += report_lines(p.report, k)
    return "\n".join(lines)


def _ci_text(interval: Interval) -> str:
    """Returns a table row's intervals: for these queries, then over queries like these."""
    text = "   90% CI [{:.4f}, {:.4f}] these queries".format(*interval.ci90.reported)
    if interval.ci90.queries is not None:
        text += ", [{:.4f}, {:.4f}] queries like these".format(*interval.ci90.queries)
    return text


def report_lines(r: Report, k: int) -> list[str]:
    """Returns the printed lines of the ILIAS report: one per value, then its notes."""
    label = ilias_report.label  # the groups' edges rounded; the JSON keeps the official keys
    width = max(22, *(len(label(v)) + 2 for v in r.values))
    lines = [f"ILIAS report at k = {k}, percent (and the number of queries averaged)"]
    for v in r.values:
        line = f"  {label(v):<{width}}{v.value:>8.2f}  ({v.num_queries})"
        if v.ci90 is not None:
            line += f"   90% CI [{v.ci90[0]:.2f}, {v.ci90[1]:.2f}]"
        if v.ci90_queries is not None:
            line += ", [{:.2f}, {:.2f}] queries like these".format(*v.ci90_queries)
        lines.append(line)
    return lines + [f"  note: {n}" for n in r.notes]
