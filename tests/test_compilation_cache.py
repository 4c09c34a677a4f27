"""The persistent compilation cache: a second process loads what the first compiled."""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

PROGRAM = """
import sys, time
from tailaware.jobs import compilation_cache
assert compilation_cache.enable(sys.argv[1]) == sys.argv[1]
import jax, jax.numpy as jnp
# Every program cached, however fast it compiles: on a loaded machine a small op may cross
# MIN_COMPILE_SECONDS in one run only, and the listing below must not depend on the load.
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
from tailaware.tail import gpd
y = jnp.linspace(0.01, 1.0, 64)[None, :].repeat(8, axis=0)
t0 = time.perf_counter()
jax.block_until_ready(jax.jit(jax.vmap(gpd.fit))(y, y > 0))
print(time.perf_counter() - t0)
"""


def test_second_process_reads_the_cache(tmp_path):
    cache = tmp_path / "jax"
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    run = lambda: subprocess.run(
        [sys.executable, "-c", PROGRAM, str(cache)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    cold = float(run().stdout.split()[-1])
    entries = os.listdir(cache)
    assert any(e.startswith("jit_fit-") for e in entries), "the fitter was not cached"
    warm = float(run().stdout.split()[-1])
    assert sorted(os.listdir(cache)) == sorted(entries)  # nothing new compiled
    assert warm < cold


def test_off_disables(monkeypatch):
    from tailaware.jobs import compilation_cache

    monkeypatch.setenv(compilation_cache.ENV, "off")
    assert compilation_cache.enable() is None
