"""Validate every estimator against known truth at 10^8 (the paper's Table-1 style study).

Command:
  python launch.py --config=configs/validate.py --workdir=workdir/validate
Writes validation.txt (the table), validation.json and two PNGs; about 2.5 minutes on 2 CPU
cores. Add the stress regime (half of all positives priced by the tail alone, about twice the
time) with --config.validate.regimes="('paper','stress')"; other distractor-law families (e.g.
"('normal','gpd')") with --config.validate.families (benchmarks/tail_families.py sweeps them
all more cheaply).
Expected result: the tables in docs/validation.md. After each cell the results so far go to
validation.partial.json; the same command, run again after an interruption, resumes there.

The frozen dev / test protocol (tailaware.protocol.validation.SPLITS: every choice is made on
dev, test is reported as it falls); the real-text benchmarks come from the manifest that
benchmarks/text_galleries.py writes (about 30 minutes to build once):
  python launch.py --config=configs/validate.py --workdir=workdir/dev \
      --config.validate.split=dev --config.validate.manifest=CACHE/manifest.json --config.k=100
"""

from tailaware.configs import default
from tailaware.protocol.validation import ValidationSettings


def get_config(arg=None):
    c = default.get_config(arg)
    c.job = "tailaware.jobs.validate"
    # The grid (tailaware.protocol.validation.ValidationSettings documents each field): regimes
    # of tailaware.sim.simulate.REGIMES, families of .FAMILIES, Q, N, fractions, draws per
    # fraction, the bootstraps' replicates. Intervals are checked for c.estimator.
    c.validate = default.settings_block(ValidationSettings())
    return c
