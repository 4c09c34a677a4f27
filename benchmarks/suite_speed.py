"""Wall time of compile-bound tests with XLA's backend optimizations on and off, in one run.

The suite compiles many small programs once each (tests/conftest.py turns XLA's backend
optimizations off with `JAX_DISABLE_MOST_OPTIMIZATIONS=1`). This script runs the same tests in
fresh pytest processes, one worker each, alternating the setting so that a machine's load
falls on both alike, and prints each run's wall time, the median per setting and their ratio
(off / on). By default the three slowest in-process tests of the suite; `--tests` names others
(pytest node ids, comma-separated).

Command (2 CPU cores, ~5 min with --repeats=2):
  python benchmarks/suite_speed.py --repeats=2
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTS = (
    "tests/test_functional.py::test_core_reads_only_the_real_scores_of_a_padded_file",
    "tests/test_diagnostics.py::test_fits_that_did_not_converge_are_counted",
    "tests/test_prediction.py::test_summary_warns_about_a_query_without_a_tail_fit",
)


def run(tests: list[str], disabled: bool) -> float:
    """Returns the wall seconds of one pytest process running `tests`, the setting given."""
    env = dict(os.environ, JAX_DISABLE_MOST_OPTIMIZATIONS="1" if disabled else "0")
    start = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    seconds = time.perf_counter() - start
    if out.returncode != 0:
        raise SystemExit(f"pytest failed (disabled={disabled}):\n{out.stdout[-3000:]}")
    return seconds


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tests", default=",".join(TESTS), help="pytest node ids, comma-separated")
    p.add_argument("--repeats", type=int, default=2, help="runs per setting")
    args = p.parse_args()
    tests = args.tests.split(",")
    times: dict[bool, list[float]] = {True: [], False: []}
    for _ in range(args.repeats):
        for disabled in (False, True):
            seconds = run(tests, disabled)
            times[disabled].append(seconds)
            print(json.dumps({"optimizations": "off" if disabled else "on", "seconds": seconds}))
    on, off = statistics.median(times[False]), statistics.median(times[True])
    print(f"median wall: optimizations on {on:.1f} s, off {off:.1f} s; off / on = {off / on:.2f}")


if __name__ == "__main__":
    main()
