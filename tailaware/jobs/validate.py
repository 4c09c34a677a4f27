"""The validate job: every estimator against known truth at 10^8 (`protocol.validation`).

`python launch.py --config=configs/validate.py --workdir=DIR` writes DIR/validation.json,
DIR/validation.txt (the table) and DIR/validation_{errors,calibration}.png.
"""

import os

from tailaware.io import atomic
from tailaware.jobs import config as config_lib
from tailaware.protocol import plots, validation


def run(config, workdir: str) -> None:
    """Runs the validation study of `config.validate` and writes its table, JSON and plots."""
    settings = config_lib.predict_settings(config)
    v = config_lib.block(validation.ValidationSettings, config.validate, "validate")
    if v.split:
        results = validation.split_study(settings, v, v.split, v.manifest, int(config.seed))
    else:
        results = validation.study(settings, v, int(config.seed))
    table = validation.format_table(results, settings.estimator)
    print(table)
    print(f"validate: {results['seconds']:.0f} s")
    os.makedirs(workdir, exist_ok=True)
    with atomic.atomic_path(os.path.join(workdir, "validation.txt")) as tmp, open(tmp, "w") as fh:
        fh.write(table + "\n")
    atomic.write_json(os.path.join(workdir, "validation.json"), results)
    plots.validation(workdir, results, settings.estimator)
