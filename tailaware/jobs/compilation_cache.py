"""JAX's persistent compilation cache for tailaware jobs: compile once per machine, not per run.

The estimators' GPD fitters and the law's expectations take seconds to compile on CPU and a
fraction of that to run, so a fresh process spends most of a prediction compiling. JAX can keep
compiled programs on disk (keyed by the program, the JAX version and the device), so the next
process loads them instead. `launch.py` turns it on for every job.

The directory: `TAILAWARE_JAX_CACHE` if set ("off" disables the cache), else
`$XDG_CACHE_HOME/tailaware/jax` (default `~/.cache/tailaware/jax`).
"""

import os

ENV = "TAILAWARE_JAX_CACHE"
# Programs that compile faster than this are not worth a disk round trip.
MIN_COMPILE_SECONDS = 0.2


def default_dir() -> str:
    """Returns the cache directory used when `TAILAWARE_JAX_CACHE` is not set."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "tailaware", "jax")


def enable(path: str | None = None) -> str | None:
    """Turns the persistent cache on; returns its directory, or None when disabled ("off")."""
    path = path if path is not None else os.environ.get(ENV, default_dir())
    if path in ("", "off"):
        return None
    import jax  # here, not above: the launcher logs its first line before JAX's import

    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", MIN_COMPILE_SECONDS)
    return path
