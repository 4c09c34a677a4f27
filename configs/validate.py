"""Validate every estimator against known truth at 10^8 (the paper's Table-1 style study).

Command:
  python launch.py --config=configs/validate.py --workdir=workdir/validate
Writes validation.txt (the table), validation.json and two PNGs; about 2.5 minutes on 2 CPU
cores. Add the stress regime (half of all positives priced by the tail alone, about twice the
time) with --config.validate.regimes="('paper','stress')"; other distractor-law families (e.g.
"('normal','gpd')") with --config.validate.families (benchmarks/tail_families.py sweeps them
all more cheaply).
Expected result: the tables in README.md ("Validation against known truth").
"""

from configs import default


def get_config(arg=None):
    c = default.get_config(arg)
    c.job = "tailaware.jobs.validate"
    # Intervals (the coverage rows) are checked for c.estimator, the default's unless overridden.
    c.validate = dict(
        estimators=(),  # () = every registered estimator that imports
        regimes=("paper",),  # see tailaware.sim.simulate.REGIMES
        families=("kumaraswamy", "truncnorm"),  # see tailaware.sim.simulate.FAMILIES
        num_queries=500,
        n_pool=100_000_000,
        fractions=(0.0005, 0.01, 0.05),  # S = 50k, 1M, 5M
        draws=20,  # per fraction: independent samples (stand-ins for disjoint draws)
        query_replicates=1000,
        nested_replicates=50,  # once per cell (see tailaware.jobs.validate)
    )
    return c
