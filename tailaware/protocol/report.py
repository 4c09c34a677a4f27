"""Writing a prediction: prediction.json, its curve and the hardness artifact, atomically.

`report` predicts from a sampled-scores file and writes the three files a predict or ILIAS job
leaves in its workdir; `write_prediction` writes one `Prediction` (from the scores, an artifact
or an exact evaluation) and prints its table.
"""

import dataclasses
import os

from absl import logging

from tailaware.core.results import Prediction
from tailaware.io import artifact, atomic
from tailaware.io.scores import SampledScores
from tailaware.protocol import plots, prediction, schema
from tailaware.protocol.settings import PredictSettings


def write_prediction(p: Prediction, workdir: str, curve: bool = True) -> str:
    """Writes `workdir/prediction.json` (and with `curve`, when the prediction has one, its plot
    `prediction_curve.png`), prints the table; returns the JSON's path."""
    os.makedirs(workdir, exist_ok=True)
    path = os.path.join(workdir, "prediction.json")
    atomic.write_json(path, schema.prediction_json(p))
    print(schema.format_table(p))
    if curve and p.curve is not None:
        plots.prediction_curve(os.path.join(workdir, "prediction_curve.png"), p)
    logging.info("wrote %s", path)
    return path


def report(
    scores: SampledScores,
    settings: PredictSettings,
    n_target: int,
    workdir: str,
    metadata: dict | None = None,
    queries: str | None = None,
) -> Prediction:
    """Predicts at `n_target` and writes prediction.json, its curve plot and the hardness
    artifact `hardness.npz` (with the reruns and the distractor sds; `metadata` joins the tail
    settings in its provenance); returns the prediction.

    `queries` names the query set of an ILIAS job ("image" or "text"), kept in the output.
    """
    hardness = prediction.estimate(scores, settings)
    p = prediction.predict(scores, settings, n_target, hardness)._replace(queries=queries)
    provenance = {"evt": dataclasses.asdict(settings.tail), **(metadata or {})}
    art = artifact.from_hardness(
        hardness, scores, settings.estimator, provenance, prediction.distractor_sd(p)
    )
    os.makedirs(workdir, exist_ok=True)
    artifact.save(os.path.join(workdir, "hardness.npz"), art)
    write_prediction(p, workdir)
    return p
