"""The demo: a synthetic ILIAS-like benchmark, a 5% sample, every estimator against the truth.

Command: `python launch.py` (or `make demo`), about 1-2 minutes on 2 CPU cores.
Writes `results.json` and `map_vs_gallery.png` to the workdir and prints the table.

Every other config starts from this one and overrides what differs.
"""

from ml_collections import config_dict


def get_config(arg=None):
    del arg
    c = config_dict.ConfigDict()
    c.job = "tailaware.jobs.demo"
    c.seed = 0
    c.k = 1000  # mAP@k
    c.estimator = "evt_averaged"  # see tailaware.tail.estimators.ESTIMATORS and the README
    c.n_target = 0  # target gallery size N; 0 = the job's natural target

    # The tail-aware estimator (paper, Appendix B).
    c.evt = config_dict.ConfigDict()
    c.evt.top_m = 4000  # sampled scores kept per query
    c.evt.threshold_quantile = 0.95  # threshold u at this quantile of the kept scores
    c.evt.min_count = 5  # fewer sampled distractors than this above a positive: use the tail

    # The protocol around a prediction (tailaware/protocol.py): intervals, curve, diagnostics.
    c.protocol = config_dict.ConfigDict()
    c.protocol.query_replicates = 1000  # query bootstrap
    c.protocol.nested_replicates = 50  # also resample the distractor sample and refit; 0 = off
    c.protocol.curve_points = 25  # the curve over N = 1e3 .. 1e9
    c.protocol.budget_levels = 3  # nested sub-samples S/8, S/4, S/2 for the budget verdict
    c.protocol.seed = 0
    c.protocol.blocks = ()  # sampled-scores files of disjoint id-hash blocks, for drift

    # The synthetic benchmark of the demo.
    c.demo = config_dict.ConfigDict()
    c.demo.n_instances = 120
    c.demo.queries_per_instance = 1
    c.demo.positives_per_instance = 5
    c.demo.n_distractors = 2_000_000
    c.demo.dim = 64
    c.demo.sample_fraction = 0.05
    c.demo.sizes = (10_000, 50_000, 200_000, 500_000, 1_000_000, 2_000_000)
    return c
