"""Predict mAP@k at gallery size N from a sampled-scores file.

Command:
  python launch.py --config=configs/predict.py --config.scores=FILE.npz \
      --config.n_target=100000000 --config.k=1000 --workdir=DIR
Writes DIR/prediction.json; seconds on 2 CPU cores for ~1,200 queries.
"""

from configs import default


def get_config(arg=None):
    c = default.get_config(arg)
    c.job = "tailaware.predict"
    c.scores = ""  # path to the sampled-scores .npz
    return c
