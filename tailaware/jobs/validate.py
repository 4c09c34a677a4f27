"""The validate job: every estimator against known truth at 10^8 (the paper's Table 1 study).

For each hardness regime (`simulate.REGIMES`), simulator family (`simulate.FAMILIES`) and sample
fraction, `draws` independent uniform samples of a 10^8 pool (see `simulate` for why independent
pools stand in for disjoint draws) are drawn; each estimator predicts mAP@k at N from the sample
alone, next to the baselines (evaluate-at-S, the power-law and log-uniform curve fits of
`curvefit`) and two oracles that know the true hardness (expected-rank map and Poisson E[AP]:
the law's own error). Reported per estimator and fraction: bias and mean absolute error against
the realized truth, coverage of the 90% interval over the draws (the reported one, which adds the
tail model's threshold and prior sensitivity to the sampling interval, then the sampling
interval = nested bootstrap and its query and distractor parts; `bootstrap.intervals`) and its
median half-width, and per-positive calibration of the tail-priced positives (median estimated
/ true hardness, log-correlation, share priced 0). The nested bootstrap runs on the first draw
of each cell and its distractor spread serves the intervals of all the cell's draws (it
depends on the benchmark and S, not on the draw); this keeps the study to minutes.

Command: `python launch.py --config=configs/validate.py --workdir=DIR`. Writes
DIR/validation.json, DIR/validation.txt (the table) and DIR/validation_{errors,calibration}.png.
"""

import functools
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging

from tailaware.core import law
from tailaware.io import atomic
from tailaware.protocol import augment as protocol
from tailaware.protocol import bootstrap, budget, curvefit
from tailaware.sim import simulate
from tailaware.tail import estimators

BASELINES = ("evaluate-at-S", "power_law", "log_uniform")
ORACLES = ("oracle (expected rank)", "oracle (Poisson E[AP])")
# Interval rows of the table: the reported interval, then its sampling part and that part's parts.
COVERAGE_TAGS = ("ci90", "ci90_sampling", "ci90_query", "ci90_distractor")


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


def calibration(hardness: estimators.Hardness, x_true: np.ndarray) -> dict:
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


def one_draw(bench, fraction, seed, config, names, nested=None) -> dict:
    """Returns every prediction, the truth, the interval and calibration for one draw.

    `nested`: the distractor replicates of a nested bootstrap to reuse (from another draw of
    the same cell: its spread is a property of the benchmark and S, not of the draw); when None
    it is run on this draw and returned under "nested".
    """
    v = config.validate
    k, n = int(config.k), bench.n_pool
    d = simulate.draw(bench, fraction, int(config.evt.top_m), seed)
    scores = d.scores
    out = {"truth": simulate.true_map(d.truth_counts, k), "n_sample": scores.n_sample}
    preds, calib = {}, {}
    for name in names:
        if name == config.estimator:  # with its threshold reruns, for the interval
            h = point = protocol.estimate(scores, config)
        else:
            h = estimators.get(name)(scores, config)
        aps, priors = protocol.prior_maps(h, [n], k, scores.fixed_counts, scores)  # [1, Q]
        preds[name] = float(aps.mean())
        if h.tail_priced.any():
            calib[name] = calibration(h, bench.x)
        if name == config.estimator:
            point_aps, point_priors = aps, priors
    preds["evaluate-at-S"] = curvefit.at_sample_map(scores, k)
    subs = budget.nested_subsamples(scores, 3, seed)
    preds.update({m: float(v_) for m, v_ in curvefit.extrapolate(subs, k, n).items()})

    if nested is None:
        nested = bootstrap.nested_bootstrap(
            scores, config.estimator, config, [float(n)], int(v.nested_replicates), seed
        )
        out["nested"] = nested
    maps = protocol.threshold_maps(scores, config, [float(n)], point)
    opts = {"query_replicates": int(v.query_replicates), "seed": seed}
    out["interval"] = protocol.size_intervals(point_aps, opts, maps, nested, None, point_priors)[0]
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


def plot(workdir: str, results: dict, estimator: str) -> None:
    """Writes the error box plots and the per-positive calibration scatter."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = list(results["cells"])
    fig, axes = plt.subplots(1, len(cells), figsize=(6 * len(cells), 4.5), squeeze=False)
    for ax, cell in zip(axes[0], cells, strict=True):
        raw = results["raw"][cell]
        names = [n for n in raw[next(iter(raw))][0]["predictions"]]
        pos = 0
        for f, draws in raw.items():
            truth = np.array([d["truth"] for d in draws])
            errs = [np.array([d["predictions"][n] for d in draws]) - truth for n in names]
            ax.boxplot(errs, positions=pos + np.arange(len(names)), widths=0.6)
            ax.text(pos + len(names) / 2, ax.get_ylim()[1], f"f={f}", ha="center", va="bottom")
            pos += len(names) + 1
        ax.axhline(0, color="k", lw=0.8)
        ax.set_xticks(np.arange(pos))
        ax.set_xticklabels([*(names + [""]) * len(raw)][:pos], rotation=90, fontsize=7)
        ax.set_ylabel(f"predicted - true mAP@{results['k']}")
        ax.set_title(cell)
    fig.tight_layout()
    atomic.save_figure(fig, os.path.join(workdir, "validation_errors.png"), dpi=100)
    plt.close(fig)

    fig, axes = plt.subplots(1, len(cells), figsize=(5 * len(cells), 4.5), squeeze=False)
    for ax, cell in zip(axes[0], cells, strict=True):
        pts = results["scatter"].get(cell)
        if pts:
            ax.loglog(pts["true"], np.maximum(pts["est"], 1e-14), ".", ms=2, alpha=0.4)
            lim = [1e-14, 1e-1]
            ax.plot(lim, lim, "k-", lw=0.8)
        ax.set_xlabel("true hardness x")
        ax.set_ylabel(f"estimated x ({estimator}; 0 drawn at 1e-14)")
        ax.set_title(f"{cell}, f={results['fractions'][-1]}")
    fig.tight_layout()
    atomic.save_figure(fig, os.path.join(workdir, "validation_calibration.png"), dpi=100)
    plt.close(fig)


def run(config, workdir: str) -> None:
    """The validate job (configs/validate.py)."""
    t0 = time.time()
    v = config.validate
    k = int(config.k)
    names = list(v.estimators) or estimators.available()
    if config.estimator not in names:
        names.append(config.estimator)
    results = {
        "k": k,
        "n_pool": int(v.n_pool),
        "num_queries": int(v.num_queries),
        "draws": int(v.draws),
        "fractions": [float(f) for f in v.fractions],
        "estimator": config.estimator,
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
            seed=int(config.seed) + 1000 * i,
            **simulate.REGIMES[regime],
        )
        oracle = oracles(bench, k)
        cell = f"{regime}/{family}"
        results["cells"][cell], results["raw"][cell] = {}, {}
        for j, f in enumerate(v.fractions):
            seeds = [int(config.seed) + 10_000 * (j + 1) + r for r in range(int(v.draws))]
            first = one_draw(bench, float(f), seeds[0], config, names)
            nested = first.pop("nested")
            draws = [first] + [
                one_draw(bench, float(f), s, config, names, nested) for s in seeds[1:]
            ]
            results["raw"][cell][str(f)] = draws
            results["cells"][cell][str(f)] = summarize(draws, names, oracle)
            logging.info("%s f=%s done at %.0f s", cell, f, time.time() - t0)
        # One calibration scatter per benchmark, at the largest fraction.
        d = simulate.draw(bench, float(v.fractions[-1]), int(config.evt.top_m), int(config.seed))
        h = estimators.get(config.estimator)(d.scores, config)
        sel = h.tail_priced & (bench.x > 0)
        results["scatter"][cell] = {"true": bench.x[sel].tolist(), "est": h.x[sel].tolist()}

    table = format_table(results, config.estimator)
    results["seconds"] = time.time() - t0
    print(table)
    print(f"validate: {results['seconds']:.0f} s")
    os.makedirs(workdir, exist_ok=True)
    with atomic.atomic_path(os.path.join(workdir, "validation.txt")) as tmp, open(tmp, "w") as fh:
        fh.write(table + "\n")
    atomic.write_json(os.path.join(workdir, "validation.json"), results)
    plot(workdir, results, config.estimator)
