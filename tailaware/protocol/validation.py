"""Validation against known truth: every estimator at 10^8 (the paper's Table 1 study).

For each hardness regime (`simulate.REGIMES`), simulator family (`simulate.FAMILIES`) and sample
fraction, `draws` independent uniform samples of a 10^8 pool (see `simulate` for why independent
pools stand in for disjoint draws) are drawn; each estimator predicts mAP@k at N from the sample
alone, next to the baselines (evaluate-at-S, the power-law and log-uniform curve fits of
`baselines`) and two oracles that know the true hardness (expected-rank map and Poisson E[AP]:
the law's own error). Reported per estimator and fraction: bias and mean absolute error against
the realized truth, coverage of the 90% interval over the draws (the reported one, which adds the
tail model's threshold and prior sensitivity to the sampling interval, then the sampling
interval = nested bootstrap and its query and distractor parts; `intervals.intervals`) and its
median half-width, and per-positive calibration of the tail-priced positives (median estimated
/ true hardness, log-correlation, share priced 0). The nested bootstrap runs on the first draw
of each cell and its distractor spread serves the intervals of all the cell's draws (it
depends on the benchmark and S, not on the draw); this keeps the study to minutes.

Command: `python launch.py --config=configs/validate.py --workdir=DIR`. Writes
DIR/validation.json, DIR/validation.txt (the table) and DIR/validation_{errors,calibration}.png.
"""

import dataclasses
import functools
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging

from tailaware.core import law, metrics
from tailaware.core.results import Hardness
from tailaware.protocol import baselines, budget, intervals, nested, prediction, schema
from tailaware.protocol.settings import PredictSettings
from tailaware.sim import simulate
from tailaware.tail import estimators

BASELINES = ("evaluate-at-S", "power_law", "log_uniform")
ORACLES = ("oracle (expected rank)", "oracle (Poisson E[AP])")
# Interval rows of the table: the reported interval, then its sampling part and that part's parts.
COVERAGE_TAGS = ("ci90", "ci90_sampling", "ci90_query", "ci90_distractor")


@dataclasses.dataclass(frozen=True)
class ValidationSettings:
    """The validation study's grid.

    Attributes:
      estimators: the estimators to validate (() = every registered one); intervals are checked
        for the prediction settings' estimator.
      regimes: hardness regimes of `simulate.REGIMES`.
      families: distractor-law families of `simulate.FAMILIES`.
      num_queries: Q per benchmark.
      n_pool: N, the pool the truth is realized at.
      fractions: sample fractions S / N.
      draws: independent samples per fraction.
      query_replicates: the query bootstrap's B.
      nested_replicates: the nested bootstrap's B (once per cell).
    """

    estimators: tuple[str, ...] = ()
    regimes: tuple[str, ...] = ("paper",)
    families: tuple[str, ...] = ("kumaraswamy", "truncnorm")
    num_queries: int = 500
    n_pool: int = 100_000_000
    fractions: tuple[float, ...] = (0.0005, 0.01, 0.05)
    draws: int = 20
    query_replicates: int = 1000
    nested_replicates: int = 50

    def __post_init__(self):
        for name, known in (
            ("estimators", estimators.ESTIMATORS),
            ("regimes", simulate.REGIMES),
            ("families", simulate.FAMILIES),
        ):
            unknown = [v for v in getattr(self, name) if v not in known]
            if unknown:
                raise ValueError(f"{name} holds {unknown[0]!r}; expected some of {sorted(known)}")
        for name, low in (
            ("num_queries", 1),
            ("n_pool", 1),
            ("draws", 1),
            ("query_replicates", 2),
            ("nested_replicates", 0),
        ):
            if getattr(self, name) < low:
                raise ValueError(f"{name} must be >= {low}, got {getattr(self, name)}")
        if not self.fractions or not all(0.0 < f <= 1.0 for f in self.fractions):
            raise ValueError(f"fractions must be shares in (0, 1], got {self.fractions}")


@functools.partial(jax.jit, static_argnames="k")  # the E[AP] sum's length is static
def _poisson_aps(x, mask, n, k):
    return jax.vmap(lambda xi, mi: law.expected_ap_poisson(xi, mi, n, k))(x, mask)


def expected_aps(bench: simulate.Benchmark, k: int) -> np.ndarray:
    """Returns E[AP@k] [Q] under Poisson counts at the pool's size, from the true hardness."""
    x, mask = jnp.asarray(bench.x, jnp.float32), jnp.asarray(bench.mask)
    return np.asarray(_poisson_aps(x, mask, jnp.float32(bench.n_pool), k))


def oracles(bench: simulate.Benchmark, k: int) -> dict:
    """Returns the law's predictions from the true hardness: expected-rank map and E[AP]."""
    x = jnp.asarray(bench.x, jnp.float32)
    mask = jnp.asarray(bench.mask)
    n = jnp.float32(bench.n_pool)
    return {
        ORACLES[0]: float(law.map_at_k(x, mask, n, jnp.float32(k))[0]),
        ORACLES[1]: float(expected_aps(bench, k).mean()),
    }


def calibration(hardness: Hardness, x_true: np.ndarray) -> dict:
    """Returns per-positive calibration of the tail-priced positives with true x > 0."""
    sel = hardness.tail_priced & (x_true > 0)
    if not sel.any():
        return {"n": 0}
    est, true = hardness.x[sel], x_true[sel]
    pos = est > 0
    corr = (
        float(np.corrcoef(np.log(est[pos]), np.log(true[pos]))[0, 1]) if pos.sum() > 2 else np.nan
    )
    immune = hardness.tail_priced & hardness.mask & (x_true == 0)
    return {
        "n": int(sel.sum()),
        "median_ratio": float(np.median(est / true)),
        "log_corr": corr,
        "share_zero": float(np.mean(~pos)),
        "immune_priced_nonzero": float(np.mean(hardness.x[immune] > 0)) if immune.any() else 0.0,
    }


def one_draw(
    bench, fraction, seed, settings: PredictSettings, v: ValidationSettings, names, reps=None
) -> dict:
    """Returns every prediction, the truth, the interval and calibration for one draw.

    `reps`: the replicates of a nested bootstrap to reuse (from another draw of the same cell:
    its spread is a property of the benchmark and S, not of the draw); when None it is run on
    this draw and returned under "nested".
    """
    k, n = settings.k, bench.n_pool
    d = simulate.draw(bench, fraction, int(settings.tail.top_m), seed)
    scores = d.scores
    out = {"truth": metrics.map_from_counts(d.truth_counts, k), "n_sample": scores.n_sample}
    preds, calib = {}, {}
    for name in names:
        if name == settings.estimator:  # with its threshold reruns, for the interval
            h = point = prediction.estimate(scores, settings)
        else:
            h = estimators.get(name)(scores, settings.tail)
        aps, priors = prediction.prior_maps(h, [n], k, scores.fixed_counts, scores)  # [1, Q]
        preds[name] = float(aps.mean())
        if h.tail_priced.any():
            calib[name] = calibration(h, bench.x)
        if name == settings.estimator:
            point_aps, point_priors = aps, priors
    preds["evaluate-at-S"] = baselines.at_sample_map(scores, k)
    subs = budget.nested_subsamples(scores, 3, seed)
    preds.update({m: float(v_) for m, v_ in baselines.extrapolate(subs, k, n).items()})

    if reps is None:
        reps = nested.nested_bootstrap(
            scores, settings.estimator, settings.tail, k, [float(n)], v.nested_replicates, seed
        )
        out["nested"] = reps
    maps = prediction.threshold_maps(scores, settings, [float(n)], point)
    unc = intervals.size_intervals(
        point_aps, settings.intervals, v.query_replicates, seed, maps, reps, priors=point_priors
    )[0]
    out["interval"] = schema.interval_json(unc)
    out["predictions"] = preds
    out["calibration"] = calib
    return out


def summarize(draws: list[dict], names: list[str], oracle: dict) -> dict:
    """Returns bias, MAE, coverage and calibration per row over the draws of one cell."""
    truth = np.array([d["truth"] for d in draws])
    rows = {}
    for name in [*names, *BASELINES]:
        err = np.array([d["predictions"][name] for d in draws]) - truth
        rows[name] = {"bias": float(err.mean()), "mae": float(np.abs(err).mean())}
        cal = [d["calibration"][name] for d in draws if d["calibration"].get(name, {}).get("n")]
        if cal:
            for key in ("median_ratio", "log_corr", "share_zero"):
                rows[name][key] = float(np.nanmedian([c[key] for c in cal]))
    for name, value in oracle.items():
        err = value - truth
        rows[name] = {"bias": float(err.mean()), "mae": float(np.abs(err).mean())}
    est = draws[0]["interval"]
    for tag in COVERAGE_TAGS:
        if tag in est:
            cover = [d["interval"][tag][0] <= d["truth"] <= d["interval"][tag][1] for d in draws]
            rows.setdefault("_coverage", {})[tag] = float(np.mean(cover))
    half = [(d["interval"]["ci90"][1] - d["interval"]["ci90"][0]) / 2.0 for d in draws]
    rows["_width"] = {"ci90": float(np.median(half))}
    rows["_truth"] = {"mean": float(truth.mean()), "sd": float(truth.std())}
    return rows


def format_table(results: dict, estimator: str) -> str:
    """Returns the validation table (one block per family) as text."""
    lines = []
    for cell, cells in results["cells"].items():
        fr = list(cells)
        lines.append(
            f"{cell}: {results['num_queries']} queries, N = {results['n_pool']:,}, "
            f"{results['draws']} draws per fraction; truth mAP@{results['k']} "
            + ", ".join(f"{cells[f]['_truth']['mean']:.4f}" for f in fr)
        )
        head = f"  {'estimator':<26}" + "".join(f"{'f=' + f:>24}" for f in fr)
        lines += [head, f"  {'':<26}" + "".join(f"{'bias    MAE   med  corr':>24}" for _ in fr)]
        names = [n for n in cells[fr[0]] if not n.startswith("_")]
        for name in names:
            row = f"  {name + (' *' if name == estimator else ''):<26}"
            for f in fr:
                c = cells[f][name]
                cal = (
                    f"{c['median_ratio']:5.2f} {c['log_corr']:5.2f}"
                    if "median_ratio" in c
                    else f"{'-':>5} {'-':>5}"
                )
                row += f"  {c['bias']:+.4f} {c['mae']:.4f} {cal}"
            lines.append(row)
        for tag in COVERAGE_TAGS:
            if tag in cells[fr[0]].get("_coverage", {}):
                cov = "".join(f"{cells[f]['_coverage'][tag]:>24.2f}" for f in fr)
                lines.append(f"  {'coverage ' + tag + ' (*)':<26}{cov}")
        if "_width" in cells[fr[0]]:
            half = "".join(f"{cells[f]['_width']['ci90']:>24.4f}" for f in fr)
            lines.append(f"  {'half-width ci90 (*)':<26}{half}")
        lines.append("")
    lines.append(
        "bias / MAE: prediction minus realized truth; med / corr: median estimated-over-true "
        "hardness and log-correlation of tail-priced positives; * = config.estimator (intervals)."
    )
    return "\n".join(lines)


def study(settings: PredictSettings, v: ValidationSettings, seed: int = 0) -> dict:
    """Returns the validation's results: per cell (regime/family) and fraction the `summarize`
    rows, the raw draws and a calibration scatter; the table is `format_table(results)`. Every
    benchmark and draw is a function of `seed`."""
    t0 = time.time()
    k = settings.k
    names = list(v.estimators) or list(estimators.ESTIMATORS)
    if settings.estimator not in names:
        names.append(settings.estimator)
    results = {
        "k": k,
        "n_pool": int(v.n_pool),
        "num_queries": int(v.num_queries),
        "draws": int(v.draws),
        "fractions": [float(f) for f in v.fractions],
        "estimator": settings.estimator,
        "cells": {},
        "raw": {},
        "scatter": {},
    }
    benches = [(r, f) for r in v.regimes for f in v.families]
    for i, (regime, family) in enumerate(benches):
        if regime not in simulate.REGIMES:
            raise ValueError(f"unknown regime {regime!r}; choose from {list(simulate.REGIMES)}")
        bench = simulate.make_benchmark(
            int(v.num_queries),
            int(v.n_pool),
            family,
            seed=int(seed) + 1000 * i,
            **simulate.REGIMES[regime],
        )
        oracle = oracles(bench, k)
        cell = f"{regime}/{family}"
        results["cells"][cell], results["raw"][cell] = {}, {}
        for j, f in enumerate(v.fractions):
            seeds = [int(seed) + 10_000 * (j + 1) + r for r in range(int(v.draws))]
            first = one_draw(bench, float(f), seeds[0], settings, v, names)
            reps = first.pop("nested")
            draws = [first] + [
                one_draw(bench, float(f), s, settings, v, names, reps) for s in seeds[1:]
            ]
            results["raw"][cell][str(f)] = draws
            results["cells"][cell][str(f)] = summarize(draws, names, oracle)
            logging.info("%s f=%s done at %.0f s", cell, f, time.time() - t0)
        # One calibration scatter per benchmark, at the largest fraction.
        d = simulate.draw(bench, float(v.fractions[-1]), int(settings.tail.top_m), int(seed))
        h = estimators.get(settings.estimator)(d.scores, settings.tail)
        sel = h.tail_priced & (bench.x > 0)
        results["scatter"][cell] = {"true": bench.x[sel].tolist(), "est": h.x[sel].tolist()}

    results["seconds"] = time.time() - t0
    return results
