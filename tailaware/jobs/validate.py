"""The validate job: every estimator against known truth (`protocol.validation`).

`python launch.py --config=configs/validate.py --workdir=DIR` writes DIR/validation.json,
DIR/validation.txt (the table) and DIR/validation_{errors,calibration}.png. After each cell it
writes the results so far to DIR/validation.partial.json (atomically); a run interrupted and
started again with the same settings resumes from there, and ends with the same results.
"""

import json
import os

from absl import logging

from tailaware.io import atomic
from tailaware.jobs import config as config_lib
from tailaware.protocol import plots, validation

PARTIAL = "validation.partial.json"


def _resumable(path: str, key: str) -> dict | None:
    """Returns the results of an interrupted run with settings `key` at `path`, or None."""
    if not os.path.exists(path):
        return None
    try:
        with open(path) as fh:
            partial = json.load(fh)
    except (OSError, ValueError) as err:
        logging.warning("%s: unreadable (%s); starting over", path, err)
        return None
    if not isinstance(partial, dict) or partial.get("key") != key:
        logging.warning("%s: from other settings; starting over", path)
        return None
    done = partial["results"]
    cells = sum(len(by_fraction) for by_fraction in done.get("cells", {}).values())
    logging.info("%s: resuming, %d (cell, fraction)s already done", path, cells)
    return done


def run(config, workdir: str) -> None:
    """Runs the validation study of `config.validate` and writes its table, JSON and plots."""
    settings = config_lib.predict_settings(config)
    v = config_lib.block(validation.ValidationSettings, config.validate, "validate")
    seed = int(config.seed)
    os.makedirs(workdir, exist_ok=True)
    partial_path = os.path.join(workdir, PARTIAL)
    key = repr((settings, v, seed))  # frozen dataclasses: every setting, in order
    done = _resumable(partial_path, key)

    def on_cell(results):
        atomic.write_json(partial_path, {"key": key, "results": results})

    results = validation.study(settings, v, seed, done, on_cell)
    table = validation.format_table(results, settings.estimator)
    print(table)
    print(f"validate: {results['seconds']:.0f} s")
    with atomic.atomic_path(os.path.join(workdir, "validation.txt")) as tmp, open(tmp, "w") as fh:
        fh.write(table + "\n")
    atomic.write_json(os.path.join(workdir, "validation.json"), results)
    plots.validation(workdir, results, settings.estimator)
    os.remove(partial_path)
