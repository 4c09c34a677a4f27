"""The interval's model term rescored on interval_coverage's records (issue #41).

The interval for these queries is the sampling interval widened by the tail model's error, a
normal term of sd `intervals.sd_model`: `IntervalSettings.threshold_sd` x how far the prediction
moves when the tail threshold keeps half or twice the excesses, `prior_sd` x the prior's term
query by query, and `shared_sd` x the aggregate move under the same priors (the part the queries
share). Records of `benchmarks/interval_coverage.py` or `benchmarks/sampling_spread.py` (from
the commit that added `threshold_deviation` to them) hold every term, so the interval any
factors would have reported is rebuilt here with the library's own functions, without rerunning
anything; at the records' own factors (`--recorded`) it must reproduce their `ci90` (checked).
Printed per split (`--cells`: per benchmark) and set size (whole sets, the small sets), per
fraction and pooled: coverage of `ci90` against the realized truth and its median half-width
over the MAE, for each threshold factor (shared part off) and each shared factor (threshold part
off). ~2 s.

  python benchmarks/model_term.py --records=workdir/old.jsonl,workdir/new.jsonl \
      --thresholds=0,0.5,1 --shared=0,0.1,0.2,0.3 --recorded="0,0;0,0.2"
"""

import argparse
import collections
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from prior_spread import these  # noqa: E402  (the interval for these queries from a record)
from sampling_spread import ci90_figures  # noqa: E402

from tailaware.protocol import intervals  # noqa: E402
from tailaware.protocol.settings import IntervalSettings  # noqa: E402


def _parse():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--records", required=True, help="comma-separated JSON-lines files")
    p.add_argument("--thresholds", default="0,0.5,1", help="threshold_sd values (shared_sd 0)")
    p.add_argument("--shared", default="0,0.1,0.2,0.3", help="shared_sd values (threshold_sd 0)")
    p.add_argument("--cells", action="store_true", help="one row per benchmark, not per split")
    p.add_argument(
        "--recorded", default="0,0.2", help="the records' threshold_sd,shared_sd: one pair for "
        "every file, or one per file separated by ';'"
    )  # fmt: skip
    return p.parse_args()


def rebuilt(r: dict, settings: IntervalSettings) -> tuple[float, float]:
    """Returns the 90% interval for these queries that `settings` would have reported for
    record `r` (`prior_spread.these` with the model term of `settings`)."""
    sd_m = intervals.sd_model(
        r["threshold_deviation"], r["prior_spread"], settings, r["prior_deviation"]
    )
    return these(r, sd_m)


def figures(rs: list[dict], bounds: list[tuple[float, float]]) -> tuple[float, float, float]:
    """Returns the MAE, the coverage of `bounds` and their median half-width over the MAE."""
    mae, cover, half = ci90_figures([dict(r, ci90=b) for r, b in zip(rs, bounds, strict=True)])
    return mae, cover, half / mae


def main():
    args = _parse()
    paths = args.records.split(",")
    pairs = args.recorded.split(";")
    if len(pairs) not in (1, len(paths)):
        raise SystemExit(f"--recorded: {len(pairs)} pairs for {len(paths)} files")
    records, off = [], 0.0
    for path, pair in zip(paths, pairs * len(paths) if len(pairs) == 1 else pairs, strict=False):
        threshold, shared = (float(x) for x in pair.split(","))
        base = IntervalSettings(threshold_sd=threshold, shared_sd=shared)
        with open(path) as f:
            rs = [json.loads(line) for line in f if line.strip()]
        for r in rs:
            off = max(off, *(abs(a - b) for a, b in zip(rebuilt(r, base), r["ci90"], strict=True)))
        records += rs
    print(
        f"{len(records)} records; rebuilt at their factors ({args.recorded}): max |diff| {off:.1e}"
    )
    if off > 1e-9:
        raise SystemExit("the rebuilt intervals do not reproduce the records' ci90")
    candidates = [
        (f"thr {c}", IntervalSettings(threshold_sd=float(c), shared_sd=0.0))
        for c in filter(None, args.thresholds.split(","))
    ]
    candidates += [
        (f"shared {c}", IntervalSettings(threshold_sd=0.0, shared_sd=float(c)))
        for c in filter(None, args.shared.split(","))
    ]
    groups = collections.defaultdict(list)
    for r in records:
        split = r["benchmark"] if args.cells else r["benchmark"].split("-")[0]
        size = "whole" if r["set"].startswith("all") else r["set"].split("_")[0]
        for frac in (r["fraction"], "all"):
            groups[(split, size, frac)].append(r)
    print(f"{'records':<22}{'set':>7}{'frac':>6}{'n':>5}{'MAE':>8}  " + "  ".join(
        f"{name:>14}" for name, _ in candidates))  # fmt: skip
    for (split, size, frac), rs in sorted(groups.items()):
        cells = []
        for _, settings in candidates:
            mae, cover, ratio = figures(rs, [rebuilt(r, settings) for r in rs])
            cells.append(f"{cover:>6.2f}, {ratio:>5.2f}x")
        print(f"{split:<22}{size:>7}{frac:>6}{len(rs):>5}{mae:>8.4f}  " + "  ".join(cells))


if __name__ == "__main__":
    main()
