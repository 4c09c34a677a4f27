"""Predict mAP@k at gallery size N from a sampled-scores file.

Command:
  python launch.py --config=configs/predict.py --config.scores=FILE.npz \
      --config.n_target=100000000 --config.k=1000 --workdir=DIR
Writes DIR/prediction.json, DIR/prediction_curve.png and the hardness artifact DIR/hardness.npz;
about 20-30 s and 1.1 GB on 2 CPU cores for 1,200 queries (benchmarks/README.md,
"predict_speed.py").

From the artifact, at any N and k, without the scores (seconds):
  python launch.py --config=configs/predict.py --config.artifact=DIR/hardness.npz \
      --config.n_target=1000000000 --workdir=DIR2
"""

from tailaware.configs import default


def get_config(arg=None):
    c = default.get_config(arg)
    c.job = "tailaware.jobs.predict"
    c.scores = ""  # path to the sampled-scores .npz
    c.artifact = ""  # or: a hardness artifact .npz (a predict job's hardness.npz)
    c.metadata = ""  # JSON object kept in the artifact, e.g. '{"model": "dinov2_b14"}'
    # A related model's exact run (an exact ILIAS run's reference_counts.npz) and its sampled
    # scores of the same sample correct the prediction (docs/estimators.md); both or neither.
    c.reference = ""
    c.reference_scores = ""
    c.reference_replicates = 50  # joint bootstrap replicates, each reruns the estimator once
    return c
