"""Compare two systems' predictions on the same queries (paired bootstrap of A - B at N).

Command:
  python launch.py --config=configs/compare.py --config.a=A/prediction.json \
      --config.b=B/prediction.json --workdir=DIR
Writes DIR/comparison.json: the difference, its 90% / 95% intervals (query bootstrap plus both
systems' distractor-sample and threshold terms), P(A beats B) and the resolvable margin.
At any N from the predict jobs' hardness artifacts (seconds):
  python launch.py --config=configs/compare.py --config.a=A/hardness.npz \
      --config.b=B/hardness.npz --config.n_target=1000000000 --workdir=DIR
B predicted with A's exact run as its reference (predict's --config.reference), against that run:
  python launch.py --config=configs/compare.py --config.a=B/prediction.json \
      --config.b=A/reference_counts.npz --workdir=DIR
(B - A: B's corrected value minus A's exact one, the interval from the correction alone.)
"""

from tailaware.configs import default


def get_config(arg=None):
    c = default.get_config(arg)
    c.job = "tailaware.jobs.compare"
    c.a = ""  # prediction.json of system A (the predict job's)
    c.b = ""  # prediction.json of system B, same queries (or a's reference_counts.npz)
    # With hardness artifacts (hardness.npz) for a or b: predicted at n_target and k first.
    c.replicates = 1000  # paired bootstrap (seed: c.seed)
    return c
