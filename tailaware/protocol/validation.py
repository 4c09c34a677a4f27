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
import json
import time
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging

from tailaware.core import law, metrics
from tailaware.core.results import Hardness
from tailaware.io.scores import load_scores
from tailaware.protocol import (
    baselines,
    budget,
    diagnostics,
    intervals,
    nested,
    prediction,
    schema,
)
from tailaware.protocol.settings import PredictSettings
from tailaware.sim import simulate
from tailaware.tail import estimators

BASELINES = ("evaluate-at-S", "power_law", "log_uniform")
ORACLES = ("oracle (expected rank)", "oracle (Poisson E[AP])")
# The law fed each draw's realized fractions K / N of its own full gallery: exact by
# construction (the estimand is the realized mAP@k of the fixed gallery the sample came from).
REALIZED = "oracle (realized K / N)"
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
      split: "" (the grid of `regimes` x `families` x `fractions` at `n_pool`), or a frozen
        split of `SPLITS` ("dev", "test"), whose benchmarks replace the grid.
      manifest: with a split, the real-text benchmarks' manifest (`benchmarks/text_galleries.py`);
        "" leaves them out.
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
    split: str = ""
    manifest: str = ""

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
        if self.split and self.split not in SPLITS:
            raise ValueError(f"split must be '' or one of {sorted(SPLITS)}, got {self.split!r}")


class Split(NamedTuple):
    """A frozen set of benchmarks to validate on: every choice is made on "dev", "test" is
    reported as it falls (it holds tail families, gallery sizes, fractions and real-text
    benchmarks that dev does not).

    Attributes:
      simulated: (regime, family) pairs of `simulate.REGIMES` / `simulate.FAMILIES`.
      sizes: gallery sizes N of the simulated pools.
      text: names of real-text benchmarks (`benchmarks/text_galleries.py`'s manifest).
      fractions: sample fractions S / N.
    """

    simulated: tuple[tuple[str, str], ...]
    sizes: tuple[int, ...]
    text: tuple[str, ...]
    fractions: tuple[float, ...]


# Each split's real-text benchmarks are `<split>-<name>` in the manifest: the half ones and the
# large ones (issue #32: the same instances among every other usable summary, a shared pool).
_TEXT_BENCHMARKS = tuple(
    f"{e}-{k}{pool}"
    for pool in ("", "-large")
    for e in ("minilm", "lsa")
    for k in ("names", "keywords")
)

SPLITS = {
    "dev": Split(
        simulated=(("paper", "kumaraswamy"), ("paper", "normal")),
        sizes=(100_000_000,),
        text=tuple(f"dev-{name}" for name in _TEXT_BENCHMARKS),
        fractions=(0.01, 0.05),
    ),
    "test": Split(
        simulated=tuple(("paper", f) for f in ("truncnorm", "gpd", "beta", "mixture")),
        sizes=(200_000, 10_000_000, 1_000_000_000),
        text=tuple(f"test-{name}" for name in _TEXT_BENCHMARKS),
        fractions=(0.0005, 0.01, 0.05, 0.2),
    ),
}


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


def realized_map(truth_counts, fixed, n: int, k: int) -> float:
    """Returns the law's mAP@k fed the realized fractions K / N of a gallery (`law.map_at_k`):
    the gallery's exact mAP@k (the expected-rank map is exact at realized counts)."""
    mask = truth_counts >= 0
    x = np.where(mask, truth_counts, 0) / float(n)
    fx = np.where(mask, fixed, 0).astype(np.float64)
    with jax.enable_x64(True):  # ranks up to 1e9 + k: float32 would round them
        value = law.map_at_k(jnp.asarray(x), jnp.asarray(mask), float(n), float(k), fx)[0]
    return float(value)


def one_draw(
    scores, truth_counts, n, x_true, seed, settings: PredictSettings, v, names, reps=None
) -> dict:
    """Returns every prediction, the truth, the interval and calibration for one sample.

    Args:
      scores: the sample (`SampledScores`).
      truth_counts: [Q, P] distractors of the full gallery above each positive (-1 at padding).
      n: N, the full gallery's size.
      x_true: [Q, P] true hardness for the calibration rows (population hardness of a simulated
        pool, or the realized K / N of a real gallery).
      seed: seed of the resamplings.
      settings, v: the prediction and validation settings; names: the estimators.
      reps: the replicates of a nested bootstrap to reuse (from another draw of the same cell:
        its spread is a property of the benchmark and S, not of the draw); when None it is run
        on this draw and returned under "nested".
    """
    k = settings.k
    truth = metrics.map_from_counts(truth_counts, k, scores.fixed_counts)
    out = {"truth": truth, "n_sample": scores.n_sample}
    preds, calib = {}, {}
    for name in names:
        if name == settings.estimator:  # with its threshold reruns, for the interval
            h = point = prediction.estimate(scores, settings)
        else:
            h = estimators.get(name)(scores, settings.tail)
        aps, priors = prediction.prior_maps(h, [n], k, scores.fixed_counts, scores)  # [1, Q]
        preds[name] = float(aps.mean())
        if h.tail_priced.any():
            calib[name] = calibration(h, x_true)
        if name == settings.estimator:
            point_aps, point_priors = aps, priors
    preds["evaluate-at-S"] = baselines.at_sample_map(scores, k)
    try:
        subs = budget.nested_subsamples(scores, 3, seed)
        preds.update({m: float(v_) for m, v_ in baselines.extrapolate(subs, k, n).items()})
    except ValueError:  # too small to halve 3 times (some query keeps no stored score)
        preds.update({m: float("nan") for m in baselines.MODELS})
    preds[REALIZED] = realized_map(truth_counts, scores.fixed_counts, n, k)

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
    counts = np.where(scores.mask, scores.pos_counts, 0)
    seen, expected, sd = diagnostics.tail_counts(
        point, counts, scores.n_sample, settings.tail.min_count
    )
    warned = bool(diagnostics.tail_counts_warning(seen, expected, sd))
    out["tail_counts"] = {"observed": seen, "expected": expected, "sd": sd, "warned": warned}
    out["predictions"] = preds
    out["calibration"] = calib
    return out


def summarize(draws: list[dict], names: list[str], oracle: dict) -> dict:
    """Returns bias, MAE, coverage and calibration per row over the draws of one cell."""
    truth = np.array([d["truth"] for d in draws])
    rows = {}
    for name in [*names, *BASELINES, REALIZED]:
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
    checked = [d["tail_counts"]["warned"] for d in draws if "tail_counts" in d]
    if checked:  # (results written before the check lack it)
        rows["_warned"] = {"tail_counts": float(np.mean(checked))}
    half = [(d["interval"]["ci90"][1] - d["interval"]["ci90"][0]) / 2.0 for d in draws]
    rows["_width"] = {"ci90": float(np.median(half))}
    rows["_truth"] = {"mean": float(truth.mean()), "sd": float(truth.std())}
    return rows


def format_table(results: dict, estimator: str) -> str:
    """Returns the validation table (one block per family) as text."""
    lines = []
    for cell, cells in results["cells"].items():
        fr = list(cells)
        meta = results.get("meta", {}).get(cell) or results
        lines.append(
            f"{cell}: {meta['num_queries']} queries, N = {meta['n_pool']:,}, "
            f"{meta['draws']} draws per fraction; truth mAP@{results['k']} "
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
        if all("_warned" in cells[f] for f in fr):
            warned = "".join(f"{cells[f]['_warned']['tail_counts']:>24.2f}" for f in fr)
            lines.append(f"  {'TAIL VS COUNTS warned (*)':<26}{warned}")
        lines.append("")
    lines.append(
        "bias / MAE: prediction minus realized truth; med / corr: median estimated-over-true "
        "hardness and log-correlation of tail-priced positives; * = config.estimator (intervals; "
        "the share of draws whose prediction warned TAIL VS COUNTS)."
    )
    return "\n".join(lines)


def evaluate_cell(samples, settings: PredictSettings, v, names, oracle=None) -> tuple:
    """Returns (`summarize`'s rows, the draws) of one cell: `samples` yields (scores, truth
    counts, N, true hardness, seed) per draw; the nested bootstrap runs on the first draw and
    serves every draw's interval (its spread depends on the benchmark and S, not the draw)."""
    draws, reps = [], None
    for scores, truth_counts, n, x_true, seed in samples:
        draws.append(one_draw(scores, truth_counts, n, x_true, seed, settings, v, names, reps))
        reps = draws[0].pop("nested", reps)
    return summarize(draws, names, oracle or {}), draws


def _simulated(bench, fraction: float, seed: int, settings: PredictSettings) -> tuple:
    """Returns (scores, truth counts, N, true hardness) of one sample of a simulated pool."""
    d = simulate.draw(bench, fraction, int(settings.tail.top_m), seed)
    return d.scores, d.truth_counts, bench.n_pool, bench.x


def _done(done: dict | None, cell: str, fraction) -> tuple | None:
    """Returns (rows, draws) of a (cell, fraction) that `done` (earlier results) holds, or None."""
    rows = ((done or {}).get("cells") or {}).get(cell, {}).get(str(fraction))
    return None if rows is None else (rows, done["raw"][cell][str(fraction)])


def _simulated_draws(bench, fraction: float, seeds, settings: PredictSettings):
    """Yields the samples of one simulated cell: (scores, truth counts, N, true hardness, seed)
    per seed, one at a time (`evaluate_cell` reads each once; a cell's draws need not all be in
    memory)."""
    return (_simulated(bench, float(fraction), s, settings) + (s,) for s in seeds)


def study(
    settings: PredictSettings,
    v: ValidationSettings,
    seed: int = 0,
    done: dict | None = None,
    on_cell: Callable[[dict], None] | None = None,
) -> dict:
    """Returns the validation's results: per cell (regime/family) and fraction the `summarize`
    rows, the raw draws and a calibration scatter; the table is `format_table(results)`. Every
    benchmark and draw is a function of `seed`, so a run resumed from `done` (the results of
    an interrupted run with the same settings, as `on_cell` received them) reuses its finished
    (cell, fraction)s and ends with the same results. `on_cell(results)` is called after each
    one (the validate job writes them, atomically, to resume from)."""
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
            finished = _done(done, cell, f)
            if finished is None:
                seeds = [int(seed) + 10_000 * (j + 1) + r for r in range(int(v.draws))]
                samples = _simulated_draws(bench, f, seeds, settings)
                finished = evaluate_cell(samples, settings, v, names, oracle)
                logging.info("%s f=%s done at %.0f s", cell, f, time.time() - t0)
            results["cells"][cell][str(f)], results["raw"][cell][str(f)] = finished
            if on_cell:
                on_cell(results)
        # One calibration scatter per benchmark, at the largest fraction.
        scatter = ((done or {}).get("scatter") or {}).get(cell)
        if scatter is None:
            top_m = int(settings.tail.top_m)
            d = simulate.draw(bench, float(v.fractions[-1]), top_m, int(seed))
            h = estimators.get(settings.estimator)(d.scores, settings.tail)
            sel = h.tail_priced & (bench.x > 0)
            scatter = {"true": bench.x[sel].tolist(), "est": h.x[sel].tolist()}
        results["scatter"][cell] = scatter
        if on_cell:
            on_cell(results)

    results["seconds"] = time.time() - t0
    return results


def _text_samples(entry: dict, fraction: float, draws: int) -> list:
    """Returns the samples (scores, truth counts, N, realized K / N, seed) of one real-text
    benchmark at `fraction` from its manifest entry (the exact run's counts are the truth)."""
    truth = load_scores(entry["truth"])
    n = int(truth.n_sample)
    x_true = np.where(truth.mask, truth.pos_counts, 0) / float(n)
    out = []
    for d in entry["sampled"][str(fraction)][:draws]:
        scores = load_scores(d["scores"])
        out.append((scores, truth.pos_counts, n, x_true, int(d["seed"])))
    return out


def split_study(
    settings: PredictSettings,
    v: ValidationSettings,
    split: str,
    manifest: str = "",
    seed: int = 0,
    done: dict | None = None,
    on_cell: Callable[[dict], None] | None = None,
) -> dict:
    """Returns the validation of one frozen split (`SPLITS`): its simulated families at each of
    its gallery sizes, and its real-text benchmarks when `manifest` (the JSON that
    `benchmarks/text_galleries.py` writes) names their folders, at every fraction of the split.

    Results as `study`'s, with each cell's own Q, N and draws in `results["meta"]`; `done` and
    `on_cell` resume an interrupted run as in `study`.
    """
    t0 = time.time()
    if split not in SPLITS:
        raise ValueError(f"--config.validate.split: {split!r}; expected one of {sorted(SPLITS)}")
    sp = SPLITS[split]
    names = list(v.estimators) or list(estimators.ESTIMATORS)
    if settings.estimator not in names:
        names.append(settings.estimator)
    results = {
        "k": settings.k,
        "split": split,
        "estimator": settings.estimator,
        "fractions": [float(f) for f in sp.fractions],
        "cells": {},
        "raw": {},
        "meta": {},
        "scatter": {},
    }

    def add(cell, fraction, samples, oracle=None, meta=None):
        """Evaluates one (cell, fraction) unless `done` holds it; `samples` makes its draws."""
        finished = _done(done, cell, fraction)
        if finished is None:
            finished = evaluate_cell(samples(), settings, v, names, oracle)
            logging.info("%s %s f=%s done at %.0f s", split, cell, fraction, time.time() - t0)
        results["cells"].setdefault(cell, {})[str(fraction)] = finished[0]
        results["raw"].setdefault(cell, {})[str(fraction)] = finished[1]
        results["meta"][cell] = meta
        if on_cell:
            on_cell(results)

    for i, ((regime, family), n_pool) in enumerate(
        (rf, n) for rf in sp.simulated for n in sp.sizes
    ):
        bench = simulate.make_benchmark(
            int(v.num_queries),
            int(n_pool),
            family,
            seed=int(seed) + 1000 * i,
            **simulate.REGIMES[regime],
        )
        cell = f"{regime}/{family} N={n_pool:.0e}"
        meta = {"num_queries": int(v.num_queries), "n_pool": int(n_pool), "draws": int(v.draws)}
        oracle = oracles(bench, settings.k)
        for j, f in enumerate(sp.fractions):
            seeds = [int(seed) + 10_000 * (j + 1) + r for r in range(int(v.draws))]
            samples = functools.partial(_simulated_draws, bench, f, seeds, settings)
            add(cell, f, samples, oracle, meta)
    if manifest:
        with open(manifest) as fh:
            entries = {e["name"]: e for e in json.load(fh)["benchmarks"]}
        for name in sp.text:
            if name not in entries:
                raise ValueError(f"{manifest}: no benchmark {name!r} (rebuild the text galleries)")
            entry = entries[name]
            for f in sp.fractions:
                samples = functools.partial(_text_samples, entry, f, int(v.draws))
                meta = {
                    "num_queries": int(entry["num_queries"]),
                    "n_pool": int(entry["num_distractors"]),
                    "draws": len(entry["sampled"][str(f)][: int(v.draws)]),
                }
                add(f"text/{name}", f, samples, None, meta)
    results["seconds"] = time.time() - t0
    return results
