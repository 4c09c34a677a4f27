"""The demo: a synthetic ILIAS-like benchmark, a 5% sample, every estimator against the truth.

Command: `python launch.py` (or `make demo`), about 1-2 minutes on 2 CPU cores.
Writes `results.json` and `map_vs_gallery.png` to the workdir and prints the table.
Expected result: truth 0.3283; evt_averaged +0.007, evt +0.03, count +0.07 (docs/validation.md).

Every other config starts from this one and overrides what differs. The `evt`, `protocol` and
`intervals` blocks are the library's settings objects with their defaults (each field is
documented there: `tailaware.TailSettings`, `ProtocolSettings`, `IntervalSettings`); override a
field with e.g. `--config.evt.top_m=2000`.
"""

import dataclasses

from ml_collections import config_dict

from tailaware.protocol.settings import IntervalSettings, ProtocolSettings
from tailaware.tail.settings import TailSettings


def settings_block(settings) -> config_dict.ConfigDict:
    """Returns a config block holding a settings object's fields and defaults."""
    return config_dict.ConfigDict(dataclasses.asdict(settings))


def get_config(arg=None):
    del arg
    c = config_dict.ConfigDict()
    c.job = "tailaware.jobs.demo"  # the module whose run(config, workdir) does the work
    c.seed = 0  # the job's random seed (the demo's benchmark and sample, the bootstraps)
    c.k = 1000  # mAP@k
    c.estimator = "evt_averaged"  # count, homogeneous, evt or evt_averaged (tail.estimators)
    # Predicted with their intervals and curves (tailaware.core.metrics.METRICS: map, recall,
    # precision, ndcg, hit, mrr at k; map_at_r, r_precision, top1); mAP@k always. On the command
    # line a tuple or names with commas: --config.metrics=map,recall,map_at_r,r_precision.
    c.metrics = ("map", "recall")
    c.n_target = 0  # target gallery size N; 0 = the job's natural target

    c.evt = settings_block(TailSettings())  # the tail-aware estimators (paper, Appendix B)
    c.protocol = settings_block(ProtocolSettings())  # intervals, curve, budget and drift checks
    c.intervals = settings_block(IntervalSettings())  # the interval's tail-model terms

    # The synthetic benchmark of the demo.
    c.demo = config_dict.ConfigDict()
    c.demo.n_instances = 120  # objects, each with its queries and positives
    c.demo.queries_per_instance = 1  # query images per object
    c.demo.positives_per_instance = 5  # positives per object
    c.demo.n_distractors = 2_000_000  # the full gallery's N
    c.demo.dim = 64  # descriptor dimension
    c.demo.sample_fraction = 0.05  # S / N, the uniform distractor sample
    # Gallery sizes (nested sub-galleries) where the truth is counted and the table compares.
    c.demo.sizes = (10_000, 50_000, 200_000, 500_000, 1_000_000, 2_000_000)
    return c
