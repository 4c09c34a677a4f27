"""Test-wide settings: strict numerics, warnings as errors, two CPU devices for sharding code."""

import os

# Must be set before jax initialises its backends.
os.environ.setdefault("XLA_FLAGS", "")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# The suite is mostly XLA compiling small programs once: the tests check what a program
# computes, not how fast its machine code runs, so XLA's backend optimizations are off here and
# in every job or kernel a test starts (`JAX_DISABLE_MOST_OPTIMIZATIONS=0 make test` turns them
# on; the golden test always runs its jobs with them, as users do). Timed by
# benchmarks/suite_speed.py (figures in benchmarks/README.md).
os.environ.setdefault("JAX_DISABLE_MOST_OPTIMIZATIONS", "1")

import jax  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_num_cpu_devices", 2)
jax.config.update("jax_numpy_dtype_promotion", "strict")
jax.config.update("jax_numpy_rank_promotion", "raise")


def pytest_configure(config):
    # Warnings are errors; known third-party ones are filtered here or per test module with
    # `pytestmark = pytest.mark.filterwarnings(...)`.
    config.addinivalue_line("filterwarnings", "error")
    config.addinivalue_line("filterwarnings", "ignore::DeprecationWarning:tensorflow_datasets.*")
    config.addinivalue_line("filterwarnings", "ignore::DeprecationWarning:google.protobuf.*")


@pytest.fixture
def x64():
    """Runs a test with float64 enabled (for tolerances tighter than float32 allows)."""
    with jax.enable_x64(True):
        yield


def pytest_collection_modifyitems(items):
    # The modules that hold a slow test run first, each in its usual order. `make test` hands
    # whole modules to its two workers in this order (pytest-xdist, `--dist loadfile
    # --no-loadscope-reorder`): the short modules then fill in at the end, where a long one
    # started last would keep one worker busy while the other waits.
    slow = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow)
