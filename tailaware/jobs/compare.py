"""The compare job: two systems' predictions on the same queries, A - B at N with its interval.

`python launch.py --config=configs/compare.py --config.a=A/prediction.json
--config.b=B/prediction.json --workdir=DIR` writes DIR/comparison.json (the paired comparison,
`tailaware.protocol.comparison`) and its figure DIR/comparison.png, and prints the table. Either may
instead be a hardness artifact (`A/hardness.npz`, which the predict job writes beside its
prediction): it is predicted at `--config.n_target` and `--config.k` first, with the same interval
terms, so two systems can be compared at any N without their scores.
"""

import json
import os

from absl import logging

from tailaware.core.results import Prediction
from tailaware.io import artifact, atomic
from tailaware.io.errors import InputError
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


def run(config, workdir: str) -> None:
    """Reads `config.a` and `config.b` and writes `workdir/comparison.json`."""
    config_lib.check_compare(config)
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
    a, b = os.path.abspath(config.a), os.path.abspath(config.b)
    path = os.path.join(workdir, "comparison.json")
    atomic.write_json(path, schema.comparison_json(out, a, b))
    print(schema.format_comparison(out, a, b))
    curves = (preds[0].curve, preds[1].curve)
    plots.comparison(os.path.join(workdir, "comparison.png"), out, curves)
    logging.info("wrote %s and comparison.png", path)
