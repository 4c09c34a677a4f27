"""The distractor bootstrap's sd against the spread of predictions over independent samples.

One uniform sample serves every query of a benchmark: a distractor drawn in (or left out) moves
every query it is near, so the sampling errors of a query set's queries are correlated, and the
error of their mean falls slower than 1 / sqrt(queries). The nested bootstrap draws one Poisson
weight per distractor, shared by every query that stores it (`nested.shared_items`, from the
file's `tail_ids`); without ids it draws one per stored score. On the real-text benchmarks of
`benchmarks/text_galleries.py` (run with `--draws=10` for ten independent id-hash samples per
fraction) each query set is predicted from each draw as a user would (`interval_coverage.one`)
twice: with the ids (shared weights) and without (`tail_ids=None`). The truth of the sampling
noise is the spread of the predictions over the draws (the gallery and its truth are fixed).
Printed per benchmark, fraction and set: the draws' mean error (the bias no sampling term can
carry), the sd of the predictions over draws, the median bootstrap sd both ways with its ratio
to that sd, and the MAE, the coverage of `ci90` (these queries) and its median half-width over
the MAE. Every prediction is one JSON line of `--out` (a rerun skips those done).

  python benchmarks/sampling_spread.py --cache=/work/cache/text --split=dev \
      --out=workdir/sampling_spread_dev.jsonl
"""

import argparse
import dataclasses
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import interval_coverage as coverage  # noqa: E402


def _parse():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    coverage.add_arguments(p)
    p.add_argument("--apart", type=int, default=1, help="also predict without ids (0: skip)")
    p.set_defaults(sets=0, draws=10, nested=30, out="workdir/sampling_spread.jsonl")
    return p.parse_args()


def summarize(records: list[dict]) -> list[str]:
    """Returns the table: one row per benchmark, fraction and set of three draws or more, then
    the pooled figures over those rows' records."""
    groups: dict[tuple, list[dict]] = {}
    for r in records:
        groups.setdefault((r["benchmark"], r["fraction"], r["set"]), []).append(r)
    head = f"{'benchmark':<22}{'frac':>6}{'set':>9}{'draws':>6}{'bias':>9}{'sd draws':>10}"
    head += f"{'shared':>9}{'ratio':>7}{'apart':>9}{'ratio':>7}{'MAE':>8}{'ci90':>6}{'hw/MAE':>8}"
    lines = [head]
    groups = {key: rs for key, rs in groups.items() if len(rs) >= 3}
    for (bench, frac, name), rs in sorted(groups.items()):
        maps = np.array([r["map"] for r in rs])
        spread = maps.std(ddof=1)
        shared = float(np.median([r["sd_shared"] for r in rs]))
        apart = float(np.median([r["sd_apart"] or np.nan for r in rs]))
        bias = maps.mean() - rs[0]["truth"]
        mae, cover, half = ci90_figures(rs)
        lines.append(
            f"{bench:<22}{frac:>6}{name:>9}{len(rs):>6}{bias:>+9.4f}{spread:>10.4f}"
            f"{shared:>9.4f}{shared / spread:>7.2f}{apart:>9.4f}{apart / spread:>7.2f}"
            f"{mae:>8.4f}{cover:>6.2f}{half / mae:>8.2f}"
        )
    return lines + pooled([r for rs in groups.values() for r in rs])


def pooled(records: list[dict]) -> list[str]:
    """Returns issue #41's figures over every prediction of each fraction and of all: the
    coverage of `ci90` and its median half-width over the MAE (both over the same records), and
    the share of predictions whose `ci90_queries` contains their `ci90`."""
    lines = [f"{'pooled':<22}{'frac':>6}{'n':>6}{'MAE':>8}{'ci90':>6}{'hw/MAE':>8}{'Q>=90':>7}"]
    fracs = sorted({r["fraction"] for r in records})
    for frac in fracs + ["all"]:
        rs = [r for r in records if frac in ("all", r["fraction"])]
        mae, cover, half = ci90_figures(rs)
        wide = np.mean([coverage.contains(r["ci90_queries"], r["ci90"]) for r in rs])
        lines.append(
            f"{'':<22}{frac:>6}{len(rs):>6}{mae:>8.4f}{cover:>6.2f}{half / mae:>8.2f}{wide:>7.2f}"
        )
    return lines


def ci90_figures(rs: list[dict]) -> tuple[float, float, float]:
    """Returns the records' MAE, the coverage of `ci90` and its median half-width."""
    mae = float(np.mean([abs(r["map"] - r["truth"]) for r in rs]))
    cover = float(np.mean([r["ci90"][0] <= r["truth"] <= r["ci90"][1] for r in rs]))
    half = float(np.median([(r["ci90"][1] - r["ci90"][0]) / 2 for r in rs]))
    return mae, cover, half


def main():
    args = _parse()

    def both(scores, truth_counts, n_full, settings):
        rec = coverage.one(scores, truth_counts, n_full, settings)
        apart = None
        if args.apart:
            alone = dataclasses.replace(scores, tail_ids=None)
            apart = coverage.one(alone, truth_counts, n_full, settings)
        rec.update(
            sd_shared=rec["sd_distractor"],
            sd_apart=None if apart is None else apart["sd_distractor"],
        )
        return rec

    print("\n".join(summarize(list(coverage.run(args, both).values()))))


if __name__ == "__main__":
    main()
