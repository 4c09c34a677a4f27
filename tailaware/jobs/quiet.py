"""The third-party log lines a job hides at default verbosity: messages about the machine that
say nothing about the job and that a user cannot act on.

JAX probes for a TPU on its first use and, where there is none, logs that it could not load
libtpu; matplotlib logs that it builds its font cache on its first use in a fresh environment.
`launch.py` hides them unless `--verbose`; every other message of those loggers still shows
(e.g. JAX's warning that a GPU or TPU is present but its jaxlib is not installed).
"""

import logging
import re

# {logger: the messages of it that are hidden}, matched against the formatted message.
NOISE = {
    "jax._src.xla_bridge": re.compile(r"^Unable to initialize backend 'tpu'"),
    "matplotlib.font_manager": re.compile(r"building the font cache|generated new fontManager"),
}


class _Hide(logging.Filter):
    """Drops the records whose message matches `pattern`."""

    def __init__(self, pattern: re.Pattern):
        super().__init__()
        self.pattern = pattern

    def filter(self, record: logging.LogRecord) -> bool:
        return not self.pattern.search(record.getMessage())


def hide_noise() -> None:
    """Hides the messages of `NOISE` from here on (once, however often it is called)."""
    for name, pattern in NOISE.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, _Hide) for f in logger.filters):
            logger.addFilter(_Hide(pattern))
