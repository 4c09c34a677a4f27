"""The compare job: two systems' predictions on the same queries, A - B at N with its interval.

`python launch.py --config=configs/compare.py --config.a=A/prediction.json
--config.b=B/prediction.json --workdir=DIR` writes DIR/comparison.json (the paired comparison,
`tailaware.protocol.comparison`) and its figure DIR/comparison.png, and prints the table. Either may
instead be a hardness artifact (`A/hardness.npz`, which the predict job writes beside its
prediction): it is predicted at `--config.n_target` and `--config.k` first, with the same interval
terms, so two systems can be compared at any N without their scores.

Either may also be a reference model's exact run (`A/reference_counts.npz`) when the other is a
prediction corrected by it (the predict job with `--config.reference`): the difference is then
the corrected estimate minus the reference's exact value, its interval from the correction alone
(`comparison.against_reference`; comparison.json's `reference`).
"""

import json
import os

import numpy as np
from absl import logging

from tailaware.core.results import Comparison, Prediction
from tailaware.io import artifact, atomic, reference_counts
from tailaware.io.errors import InputError, field_error
from tailaware.jobs import config as config_lib
from tailaware.protocol import comparison, from_artifact, plots, schema


def _read(path: str, config) -> Prediction:
    """Returns the prediction in `path`: a prediction.json, or a hardness artifact's prediction
    at `config.n_target` and `config.k` (a `.npz` path)."""
    if str(path).endswith(".npz"):
        settings = config_lib.predict_settings(config)
        art = artifact.load(path)
        return from_artifact.predict(art, settings, int(config.n_target), str(path))
    try:
        with open(path, encoding="utf-8") as f:
            return schema.prediction_from_json(json.load(f), str(path))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise InputError(f"{path}: not a readable prediction.json ({e})") from e


def _read_json(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise InputError(f"{path}: not a readable prediction.json ({e})") from e


def _against_reference(config, reference_first: bool) -> tuple[Comparison, dict]:
    """Returns the comparison of the prediction corrected by a reference with that reference's
    exact run (`reference_first`: `config.a` is the run), and comparison.json's `reference`."""
    run_path, pred_path = (config.a, config.b) if reference_first else (config.b, config.a)
    if reference_counts.looks_like(pred_path):
        raise InputError(
            f"{pred_path}: two reference-counts files; compare one with a prediction corrected "
            "by it (the predict job's prediction.json with --config.reference)"
        )
    d = _read_json(pred_path)
    if not isinstance(d, dict) or "reference" not in d:
        raise field_error(
            pred_path,
            "reference",
            f"missing: comparing with the exact run {run_path} needs a prediction corrected by "
            "it (the predict job with --config.reference and --config.reference_scores)",
        )
    correction = schema.correction_from_json(d["reference"], pred_path)
    run = reference_counts.load(run_path)
    k = int(d["k"])
    mismatch = None
    if run.n_distractors != correction.n_distractors or run.k != k:
        mismatch = (
            "n_distractors",
            f"N = {run.n_distractors}, k = {run.k}; the correction's N = "
            f"{correction.n_distractors}, k = {k}",
        )
    elif "query_ids" in d and list(run.query_ids) != [str(q) for q in d["query_ids"]]:
        mismatch = ("query_ids", f"not the queries of {pred_path} in their order")
    else:
        for name, value in zip(run.metric_names, run.metric_values, strict=True):
            m = correction.metrics.get(name)
            if m is not None and not np.isclose(value, m.exact, rtol=0.0, atol=1e-6):
                mismatch = (
                    "metric_values",
                    f"{name} = {value:.6f}, the reference {pred_path} was corrected with has "
                    f"{m.exact:.6f}: not the same run",
                )
                break
    if mismatch is not None:
        raise field_error(run_path, *mismatch)
    out = comparison.against_reference(
        correction,
        k=k,
        num_replicates=int(config.replicates),
        seed=int(config.seed),
        reference_first=reference_first,
    )
    first = next(iter(correction.metrics.values()))
    block = d["reference"]
    info = {
        "side": "a" if reference_first else "b",
        "counts": block.get("counts"),
        "scores": block.get("scores"),
        "lambda": first.lam,
        "uncorrected": first.uncorrected,
    }
    return out, info


def run(config, workdir: str) -> None:
    """Reads `config.a` and `config.b` and writes `workdir/comparison.json`."""
    config_lib.check_compare(config)
    a, b = os.path.abspath(config.a), os.path.abspath(config.b)
    exact = [reference_counts.looks_like(config[name]) for name in ("a", "b")]
    if any(exact):
        out, info = _against_reference(config, reference_first=exact[0])
        os.makedirs(workdir, exist_ok=True)
        path = os.path.join(workdir, "comparison.json")
        atomic.write_json(path, {**schema.comparison_json(out, a, b), "reference": info})
        side = "A" if exact[0] else "B"
        print(schema.format_comparison(out, a, b))
        print(
            f"  {side} is the exact run the other was corrected with (lambda "
            f"{info['lambda']:.2f}): the interval is the corrected estimate's alone"
        )
        plots.comparison(os.path.join(workdir, "comparison.png"), out, None)
        logging.info("wrote %s and comparison.png", path)
        return
    preds = [_read(config[name], config) for name in ("a", "b")]
    settings = config_lib.predict_settings(config)
    try:
        out = comparison.compare(
            *preds,
            num_replicates=int(config.replicates),
            seed=int(config.seed),
            settings=settings.intervals,
        )
    except ValueError as e:
        raise ValueError(f"{config.a} vs {config.b}: {e}") from e
    os.makedirs(workdir, exist_ok=True)
    path = os.path.join(workdir, "comparison.json")
    atomic.write_json(path, schema.comparison_json(out, a, b))
    print(schema.format_comparison(out, a, b))
    curves = (preds[0].curve, preds[1].curve)
    plots.comparison(os.path.join(workdir, "comparison.png"), out, curves)
    logging.info("wrote %s and comparison.png", path)
