"""The predict job: a sampled-scores file (or a hardness artifact) in, mAP@k at N out.

`python launch.py --config=configs/predict.py --config.scores=FILE.npz --config.n_target=N
--config.k=K --workdir=DIR` writes `DIR/prediction.json` (docs/outputs.md lists its fields),
its curve `DIR/prediction_curve.png` and the hardness artifact `DIR/hardness.npz`, and prints a
table of the prediction next to the baselines. With `--config.artifact=DIR/hardness.npz`
instead of `--config.scores` it predicts from the artifact at any N and k, with the same
interval, without the scores. With `--config.reference=R.npz` (a related model's exact run,
`reference_counts.npz` of the ILIAS job's exact mode) and `--config.reference_scores=A.npz`
(that model's sampled scores of the same sample) the prediction is also corrected by it
(prediction.json's `reference`; docs/estimators.md).
"""

from tailaware.io import artifact
from tailaware.io.scores import load_scores
from tailaware.jobs import config as config_lib
from tailaware.protocol import from_artifact, report


def run(config, workdir: str) -> None:
    """Reads `config.scores` (or `config.artifact`) and predicts at `config.n_target`."""
    settings = config_lib.check_predict(config)
    n_target = int(config.n_target)
    if config.scores:
        metadata = {"scores": config.scores, **config_lib.metadata(config)}
        scores = load_scores(config.scores)
        ref = config_lib.reference_inputs(config, scores, settings, n_target)
        report.report(scores, settings, n_target, workdir, metadata=metadata, ref=ref)
        return
    art = artifact.load(config.artifact)
    p = from_artifact.predict(art, settings, n_target, str(config.artifact))
    report.write_prediction(p, workdir)
