"""Choose the interval's model factors on a validation run: coverage and width for each pair.

The reported 90% interval is the sampling interval widened by the tail model's error, a normal
term of sd hypot(threshold_sd x threshold deviation, prior_sd x prior deviation) added in
quadrature on each side (`tailaware.protocol.intervals`). Every draw of a validation run
(`validation.json`, e.g. the dev split's) records the sampling interval, both deviations, the
prediction and the truth, so the interval any pair of factors would have reported is recomputed
here without rerunning anything. Prints, per pair of a grid, the worst cell's coverage, the mean
coverage and the median half-width over every draw, and picks the narrowest pair whose worst
cell holds the truth in at least `--target` of its draws.

  python benchmarks/interval_factors.py DIR/validation.json [more.json ...] --target 0.85
"""

import argparse
import json
import statistics

import numpy as np

Z90 = statistics.NormalDist().inv_cdf(0.95)


def draws_of(paths):
    """Yields (cell, point, sampling (lo, hi), threshold deviation, prior deviation, truth)."""
    for path in paths:
        with open(path) as fh:
            res = json.load(fh)
        est = res["estimator"]
        for cell, fractions in res["raw"].items():
            for f, draws in fractions.items():
                for d in draws:
                    unc = d["interval"]
                    yield (
                        f"{cell} f={f}",
                        d["predictions"][est],
                        unc["ci90_sampling"],
                        unc["threshold_deviation"],
                        unc["prior_deviation"],
                        d["truth"],
                    )


def reported(point, sampling, dev, dev_prior, thr, prior):
    """Returns the reported 90% interval for factors (thr, prior), cut to [0, 1]."""
    sd = np.hypot(thr * dev, prior * dev_prior)
    lo = point - np.hypot(point - sampling[0], Z90 * sd)
    hi = point + np.hypot(sampling[1] - point, Z90 * sd)
    return max(lo, 0.0), min(hi, 1.0)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="+")
    p.add_argument("--target", type=float, default=0.85)
    args = p.parse_args()
    draws = list(draws_of(args.runs))
    cells = sorted({d[0] for d in draws})
    print(f"{len(draws)} draws in {len(cells)} cells")
    print(f"{'threshold_sd':>12} {'prior_sd':>8} {'worst cell':>10} {'mean':>6} {'half-width':>10}")
    best = None
    for thr in np.arange(0.0, 4.01, 0.5):
        for prior in np.arange(0.0, 3.01, 0.5):
            cover = {c: [] for c in cells}
            widths = []
            for cell, point, sampling, dev, dev_prior, truth in draws:
                lo, hi = reported(point, sampling, dev, dev_prior, thr, prior)
                cover[cell].append(lo <= truth <= hi)
                widths.append((hi - lo) / 2)
            worst = min(np.mean(v) for v in cover.values())
            mean = float(np.mean([x for v in cover.values() for x in v]))
            width = float(np.median(widths))
            print(f"{thr:>12.1f} {prior:>8.1f} {worst:>10.2f} {mean:>6.2f} {width:>10.4f}")
            if worst >= args.target and (best is None or width < best[2]):
                best = (thr, prior, width, worst, mean)
    if best is None:
        print(f"no pair reaches {args.target:.0%} in every cell")
    else:
        print(
            f"narrowest pair with every cell >= {args.target:.0%}: threshold_sd {best[0]:.1f}, "
            f"prior_sd {best[1]:.1f} (median half-width {best[2]:.4f}, worst cell {best[3]:.2f}, "
            f"mean {best[4]:.2f})"
        )


if __name__ == "__main__":
    main()
