"""A floor on the error any estimator must make on `truncnorm`: tails the sample cannot tell apart.

The validation's `truncnorm` benchmark cuts each query's Gaussian at e = mu + c sd, c in
[4.5, 7]. Cut the same Gaussian higher, at c' > c (at most at a score of 1, the cosine bound:
"uncut"), and call that law B. B conditioned on a score below e *is* the benchmark's law A, and
B puts mass p = P_B(score > e) above it, so a uniform sample of S scores has the same law under
A and B except on the event that B drew one of them above e: the total variation between the
two samples is exactly TV = 1 - (1 - p)^S (the positives, their scores and everything below e
are shared). Yet the truth differs: a positive between e and e' (the "immune" ones sit just
above e) has hardness 0 under A and up to p under B, and at N = 1e8 a hardness of 1e-8 is a
distractor above it.

Take any estimator whose prediction for query q depends only on q's sample and positives
(tailaware's tail fits and posteriors are per query; the empirical-Bayes shape prior, the
default since issue #21, pools its two hyperparameters over all queries, which the argument
does not cover) and whose AP lies in [0, 1]. Its
expected prediction moves by at most TV_q between A and B, while the truth moves by
gap_q = E[AP_A] - E[AP_B] >= 0, so bias_B - bias_A >= mean_q (gap_q - TV_q) and

    max(|bias_A|, |bias_B|) >= mean_q (gap_q - TV_q) / 2,

with c'_q chosen per query to make gap_q - TV_q largest (0 when no higher cut helps: c' = c).
That is a floor on the mean absolute error of mAP@k any estimator can promise on both. The
script prints it for the validation's two `truncnorm` benchmarks (same seeds) at its three
fractions, with the floor for the uncut Gaussian alone (a law as plausible as the cut one), and
`evt_averaged`'s mean error on A and on the uncut B over a few draws: where its two errors
straddle the floor by much more, the sample could have told the laws apart (TV near 1, e.g. c
near 4.5 at 5%) and the estimator did not.

Expected E[AP] from the true hardness (`validation.expected_aps`, the validation's Poisson oracle:
within 0.0002 of the realized truth's mean there).

Command (about two minutes on 2 cores):
  python benchmarks/identifiability.py [--queries 500] [--draws 2]
Prints the table, then one JSON line.
"""

import argparse
import json
import os
import sys

import numpy as np
from scipy import special

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from tailaware.core import evaluate, metrics  # noqa: E402
from tailaware.protocol import floors as floors_lib  # noqa: E402
from tailaware.protocol import prediction, validation  # noqa: E402
from tailaware.protocol.settings import PredictSettings  # noqa: E402
from tailaware.sim import simulate  # noqa: E402

FRACTIONS = (0.0005, 0.01, 0.05)
N_POOL = 100_000_000
SEED = 1000  # the validation's truncnorm benchmarks (configs/validate.py, seed 0, index 1)
RAISES = np.concatenate([np.linspace(0.0, 3.0, 61), [np.inf]])  # c' - c; inf: cut at score 1


def _parse():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--queries", type=int, default=500)
    p.add_argument("--draws", type=int, default=2)
    p.add_argument("--k", type=int, default=1000)
    return p.parse_args()


def raised(bench: simulate.Benchmark, raise_by: float) -> np.ndarray:
    """Returns c' [Q] = c + raise_by, at most the cosine bound: a score of 1 (inf: exactly)."""
    lw = bench.law
    return np.minimum(lw["c"] + raise_by, (1.0 - lw["mu"]) / lw["sd"])


def cut_at(bench: simulate.Benchmark, c_new: np.ndarray) -> simulate.Benchmark:
    """Returns the benchmark's positives against the same Gaussians cut at c_new [Q] >= c."""
    lw = bench.law
    return simulate.with_law(bench, dict(lw, c=c_new, e=lw["mu"] + c_new * lw["sd"]))


def mass_above(bench: simulate.Benchmark, c_new: np.ndarray) -> np.ndarray:
    """Returns p [Q]: the mass the law cut at c_new puts above the benchmark's cut."""
    c, c_lo = bench.law["c"], bench.law["c_lo"]
    return (special.ndtr(-c) - special.ndtr(-c_new)) / (special.ndtr(c_lo) - special.ndtr(-c_new))


def floors(bench: simulate.Benchmark, k: int, fractions=FRACTIONS) -> dict:
    """Returns, per sample fraction, the truths and the floors on max(|bias_A|, |bias_B|)."""
    ap_a = validation.expected_aps(bench, k)
    gaps, masses = [], []
    for raise_by in RAISES:
        c_new = raised(bench, raise_by)
        gaps.append(ap_a - validation.expected_aps(cut_at(bench, c_new), k))
        masses.append(mass_above(bench, c_new))
    gaps, masses = np.stack(gaps), np.stack(masses)  # [D, Q]
    out = {"map_cut": float(ap_a.mean()), "map_uncut": float(ap_a.mean() - gaps[-1].mean())}
    for f in fractions:
        tv = floors_lib.hit_probability(masses, round(f * bench.n_pool))  # [D, Q]
        out[str(f)] = {
            "tv_uncut": float(tv[-1].mean()),
            "floor_uncut": floors_lib.floor(gaps[-1:], tv[-1:]),
            "floor": floors_lib.floor(gaps, tv),
        }
    return out


def mean_error(bench: simulate.Benchmark, fraction: float, draws: int, settings) -> float:
    """Returns `evt_averaged`'s mean error of mAP@k against the realized truth over draws."""
    errors, k = [], settings.k
    for seed in range(draws):
        d = simulate.draw(bench, fraction, int(settings.tail.top_m), seed)
        h = prediction.estimate(d.scores, settings)  # as the validation estimates
        aps = evaluate.per_query_ap(h, bench.n_pool, k, d.scores.fixed_counts, d.scores)
        errors.append(float(aps.mean()) - metrics.map_from_counts(d.truth_counts, k))
    return float(np.mean(errors))


def main():
    args = _parse()
    config = PredictSettings(k=args.k)
    results = {}
    print(
        f"truncnorm (cut at c sd) against the same Gaussians cut higher: mAP@{args.k} at N = "
        f"{N_POOL:.0e}, {args.queries} queries; evt_averaged over {args.draws} draws"
    )
    print(
        f"{'regime':<8} {'fraction':>8} {'truth cut':>9} {'uncut':>7} {'TV uncut':>8} "
        f"{'floor uncut':>11} {'floor':>7} {'error cut':>10} {'uncut':>8}"
    )
    for regime in ("paper", "stress"):
        bench = simulate.make_benchmark(
            args.queries, N_POOL, "truncnorm", seed=SEED, **simulate.REGIMES[regime]
        )
        uncut = cut_at(bench, raised(bench, np.inf))
        res = floors(bench, args.k)
        for f in FRACTIONS:
            cell = res[str(f)]
            cell["error_cut"] = mean_error(bench, f, args.draws, config)
            cell["error_uncut"] = mean_error(uncut, f, args.draws, config)
            print(
                f"{regime:<8} {f:>8} {res['map_cut']:>9.4f} {res['map_uncut']:>7.4f} "
                f"{cell['tv_uncut']:>8.3f} {cell['floor_uncut']:>11.4f} {cell['floor']:>7.4f} "
                f"{cell['error_cut']:>+10.4f} {cell['error_uncut']:>+8.4f}",
                flush=True,
            )
        results[regime] = res
    print(json.dumps({"queries": args.queries, "draws": args.draws, "results": results}))


if __name__ == "__main__":
    main()
