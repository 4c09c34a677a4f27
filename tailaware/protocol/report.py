"""Writing a prediction: prediction.json, its curve and the hardness artifact, atomically.

`report` predicts from a sampled-scores file and writes the three files a predict or ILIAS job
leaves in its workdir, logging each stage as it starts, every few seconds while it runs and when
it ends (`tailaware.io.progress`; the nested bootstrap alone can take tens of seconds);
`write_prediction` writes one `Prediction` (from the scores, an artifact or an exact evaluation)
and prints its table.
"""

import dataclasses
import os

from absl import logging

from tailaware.core.results import Prediction
from tailaware.io import artifact, atomic
from tailaware.io.progress import Progress
from tailaware.io.scores import SampledScores
from tailaware.protocol import census, ilias_report, plots, prediction, reference, schema
from tailaware.protocol.settings import PredictSettings


def write_prediction(
    p: Prediction,
    workdir: str,
    curve: bool = True,
    correction: tuple[reference.Correction, reference.Inputs] | None = None,
) -> str:
    """Writes `workdir/prediction.json` (and with `curve`, when the prediction has one, its plot
    `prediction_curve.png`; with an ILIAS report, its figure `ilias_report.png`), prints the
    table; returns the JSON's path. `correction`: a (`reference.Correction`,
    `reference.Inputs`) pair, written and printed with it."""
    os.makedirs(workdir, exist_ok=True)
    path = os.path.join(workdir, "prediction.json")
    atomic.write_json(path, schema.prediction_json(p, correction))
    print(schema.format_table(p))
    if correction is not None:
        print(reference.summary(*correction))
    if curve and p.curve is not None:
        plots.prediction_curve(os.path.join(workdir, "prediction_curve.png"), p)
    if p.report is not None:
        plots.report_values(os.path.join(workdir, "ilias_report.png"), p.report, p.k)
    logging.info("wrote %s", path)
    return path


def report(
    scores: SampledScores,
    settings: PredictSettings,
    n_target: int,
    workdir: str,
    *,
    metadata: dict[str, object] | None = None,
    queries: str | None = None,
    spec: ilias_report.ReportSpec | None = None,
    ref: reference.Inputs | None = None,
) -> Prediction:
    """Predicts at `n_target` and writes prediction.json, its curve plot and the hardness
    artifact `hardness.npz` (with the reruns and the distractor sds; `metadata` joins the tail
    settings in its provenance); returns the prediction.

    `queries` names the query set of an ILIAS job ("image" or "text"), kept in the output;
    `spec`, its official report's groups, adds the predicted report; `ref`, a reference model's
    exact run and sampled scores (`reference.load_inputs`), the corrected prediction
    (`reference.correct`, prediction.json's `reference`). A census design's file (`n_census`
    > 0) is predicted pooled (`census.predict`, with the uniform-only value beside it).
    """
    q, m = scores.tail_scores.shape
    what = f"of {q:,} queries by {settings.estimator} ({m:,} stored scores each)"
    opts = settings.protocol
    stages = (
        f"hardness {what}, then mAP@{settings.k} at N = {n_target:,} and {opts.curve_points} "
        f"curve sizes: every metric, nested bootstrap of {opts.nested_replicates} replicates, "
        f"query bootstrap of {opts.query_replicates}, budget check on {opts.budget_levels} "
        "sub-samples"
    )
    with Progress("estimating and predicting", stages):
        if scores.n_census:
            if ref is not None:
                raise ValueError("a reference correction of a census design is not supported")
            hardness, p = census.predict(scores, settings, n_target, report=spec)
            # The artifact holds the sample as the estimator read it (`census.fold`).
            scores = census.fold(scores, n_target)
        else:
            hardness, p = prediction.estimate_and_predict(scores, settings, n_target, report=spec)
    p = p._replace(queries=queries)
    provenance = {"evt": dataclasses.asdict(settings.tail), **(metadata or {})}
    stored = prediction.distractor_sd(p)
    art = artifact.from_hardness(
        hardness,
        scores,
        settings.estimator,
        provenance,
        stored,
        subsample_sd=None if stored is None else stored[4],
    )
    os.makedirs(workdir, exist_ok=True)
    artifact.save(os.path.join(workdir, "hardness.npz"), art)
    correction = None
    if ref is not None:
        with Progress("correcting with the reference", ref.counts_path):
            correction = (
                reference.correct(scores, ref.scores, ref.counts, settings, ref.settings),
                ref,
            )
    write_prediction(p, workdir, correction=correction)
    return p
