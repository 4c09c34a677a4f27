"""The one entry point: `python launch.py --config=configs/<job>.py --workdir=DIR`.

Every config names the module that runs it (`config.job`); that module's `run(config, workdir)`
does the work, so notebooks and tests call the same code without flags.
"""

import importlib

from absl import app, flags, logging
from ml_collections import config_flags

from tailaware.jobs import compilation_cache

_CONFIG = config_flags.DEFINE_config_file(
    "config",
    "configs/default.py",
    "Job configuration (an ml_collections config file).",
    lock_config=True,
)
_WORKDIR = flags.DEFINE_string("workdir", "workdir/default", "Where results are written.")


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    config = _CONFIG.value
    cache = compilation_cache.enable()
    logging.info("job %s, workdir %s, compilation cache %s", config.job, _WORKDIR.value, cache)
    importlib.import_module(config.job).run(config, _WORKDIR.value)


if __name__ == "__main__":
    app.run(main)
