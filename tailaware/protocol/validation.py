"""Validation against known truth: every estimator at 10^8 (the paper's Table 1 study).

For each hardness regime (`simulate.REGIMES`), simulator family (`simulate.FAMILIES`) and sample
fraction, `draws` independent uniform samples of a 10^8 pool (see `simulate` for why independent
pools stand in for disjoint draws) are drawn; each estimator predicts mAP@k at N from the sample
alone, next to the baselines (evaluate-at-S, the power-law and log-uniform curve fits of
`baselines`) and two oracles that know the true hardness (expected-rank map and Poisson E[AP]:
the law's own error). Reported per estimator and fraction: bias and mean absolute error against
the realized truth, coverage of the 90% intervals over the draws (the reported one for these
queries: the distractor part with the tail model's threshold and prior sensitivity; the one over
queries like these, which adds the query bootstrap; then the sampling interval = nested
bootstrap and its query and distractor parts; `intervals.intervals`) and the reported one's
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
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging

from tailaware.core import evaluate, law, metrics
from tailaware.core.results import Hardness, Interval
from tailaware.io.scores import load_scores
from tailaware.protocol import (
    baselines,
    budget,
    diagnostics,
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
COVERAGE_TAGS = ("ci90", "ci90_queries", "ci90_sampling", "ci90_query", "ci90_distractor")


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
      metrics: metrics besides mAP@k (`core.metrics.METRICS`) whose prediction by the configured
        estimator is checked against their realized truth too.
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
    metrics: tuple[str, ...] = ("recall", "ndcg")

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
        for name in self.metrics:
            metrics.get(name)
        if self.split and self.split not in SPLITS:
            raise ValueError(f"split must be '' or one of {sorted(SPLITS)}, got {self.split!r}")


class Split(NamedTuple):
    """A frozen set of benchmarks to validate on: every choice is made on "dev", "test" is
    reported as it falls (it holds tail families, gallery sizes, fractions and real-text
    benchmarks that dev does not).

    Attributes:
      simulated: (regime, family) pairs of `simulate.REGIMES` / `simulate.FAMILIES`.
      sizes: gallery sizes N of the simulated pools.
      fractions: sample fractions S / N.
    """

    simulated: tuple[tuple[str, str], ...]
    sizes: tuple[int, ...]
    fractions: tuple[float, ...]


SPLITS = {
    "dev": Split(
        simulated=(("paper", "kumaraswamy"), ("paper", "normal")),
        sizes=(100_000_000,),
        fractions=(0.01, 0.05),
    ),
    "test": Split(
        simulated=tuple(("paper", f) for f in ("truncnorm", "gpd", "beta", "mixture")),
        sizes=(200_000, 10_000_000, 1_000_000_000),
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


class TailCounts(NamedTuple):
    """The tail against the tail-priced positives' own counts (`diagnostics.tail_counts`)."""

    observed: float
    expected: float
    sd: float
    warned: bool


class Draw(NamedTuple):
    """One sample's validation record.

    Attributes:
      truth: the realized mAP@k of the full gallery.
      n_sample: S.
      estimates: estimator name -> predicted mAP@k.
      baselines: `BASELINES` and `REALIZED` -> mAP@k (NaN where a curve fit was impossible).
      interval: the configured estimator's interval at N.
      tail_counts: its tail against the positives' counts.
      calibration: estimator name -> `calibration` of its tail-priced positives.
      metrics: label (e.g. "recall@100") -> (the configured estimator's prediction, the realized
        truth) of the validation's other metrics.
    """

    truth: float
    n_sample: int
    estimates: dict
    baselines: dict
    interval: Interval
    tail_counts: TailCounts
    calibration: dict
    metrics: Mapping[str, tuple[float, float]] = MappingProxyType({})

    def predictions(self) -> dict:
        """Returns every row's prediction: the estimators', then the baselines'."""
        return {**self.estimates, **self.baselines}

    def to_json(self) -> dict:
        return {
            "truth": self.truth,
            "n_sample": self.n_sample,
            "interval": schema.interval_json(self.interval),
            "tail_counts": self.tail_counts._asdict(),
            "predictions": self.predictions(),
            "calibration": self.calibration,
            "metrics": {label: list(pair) for label, pair in self.metrics.items()},
        }

    @classmethod
    def from_json(cls, d: dict, names) -> "Draw":
        preds = d["predictions"]
        return cls(
            truth=d["truth"],
            n_sample=d["n_sample"],
            estimates={n: preds[n] for n in names},
            baselines={n: v for n, v in preds.items() if n not in names},
            interval=schema.interval_from_json(d["interval"]),
            tail_counts=TailCounts(**d["tail_counts"]),
            calibration=d["calibration"],
            metrics={label: tuple(pair) for label, pair in d.get("metrics", {}).items()},
        )


def one_draw(
    scores,
    truth_counts,
    n,
    x_true,
    *,
    seed: int,
    settings: PredictSettings,
    v,
    names,
    reps=None,
) -> tuple[Draw, nested.Nested]:
    """Returns the validation record of one sample and the nested-bootstrap replicates its
    interval used.

    Args:
      scores: the sample (`SampledScores`).
      truth_counts: [Q, P] distractors of the full gallery above each positive (-1 at padding).
      n: N, the full gallery's size.
      x_true: [Q, P] true hardness for the calibration rows (population hardness of a simulated
        pool, or the realized K / N of a real gallery).
      seed: seed of the resamplings.
      settings, v: the prediction and validation settings; names: the estimators, the
        configured one (`settings.estimator`) among them.
      reps: the replicates of a nested bootstrap to reuse (from another draw of the same cell:
        its spread is a property of the benchmark and S, not of the draw); run here when None.
    """
    k = settings.k
    metric_list = (metrics.METRICS["map"], *(metrics.get(name) for name in v.metrics))
    if reps is None:
        reps, _ = nested.nested_bootstrap(
            scores,
            settings.estimator,
            settings.tail,
            k,
            [float(n)],
            v.nested_replicates,
            seed=seed,
            metric_list=metric_list,
            num_atoms=prediction.NESTED_ATOMS,
        )
    # The prediction's pass and interval (with the reruns), as `prediction.predict` makes them.
    point = prediction.estimate(scores, settings)
    at_n = prediction.at_target(scores, settings, point, n, metric_list=metric_list, reps=reps)
    ap, *others = at_n.values()
    estimates, calib = _estimates(scores, settings, n, x_true, names=names, point=(point, ap.value))
    draw = Draw(
        truth=metrics.map_from_counts(truth_counts, k, scores.fixed_counts),
        n_sample=scores.n_sample,
        estimates=estimates,
        baselines=_draw_baselines(scores, truth_counts, n, k, seed),
        interval=prediction.predicted_interval(ap),
        tail_counts=_tail_counts(scores, settings, point),
        calibration=calib,
        metrics=_metric_pairs(scores, truth_counts, k, others),
    )
    return draw, reps


def _estimates(
    scores, settings: PredictSettings, n, x_true, *, names, point: tuple[Hardness, float]
) -> tuple[dict[str, float], dict[str, dict]]:
    """Returns (estimator name -> predicted mAP@k at `n`, name -> the calibration of its
    tail-priced positives against `x_true`, for those that price some by a tail). `point`: the
    configured estimator's estimate and prediction (`one_draw`); the others are run here."""
    estimates, calib = {}, {}
    for name in names:
        if name == settings.estimator:
            h, estimates[name] = point
        else:
            h = estimators.get(name)(scores, settings.tail)
            estimates[name] = float(
                evaluate.per_query_ap(h, n, settings.k, scores.fixed_counts, scores).mean()
            )
        if h.tail_priced.any():
            calib[name] = calibration(h, x_true)
    return estimates, calib


def _draw_baselines(scores, truth_counts, n, k: int, seed: int) -> dict[str, float]:
    """Returns a draw's baselines' mAP@k at `n`: evaluate-at-S, the curve fits to nested
    sub-samples (NaN for a sample too small to halve 3 times) and the realized truth."""
    base = {"evaluate-at-S": baselines.at_sample_map(scores, k)}
    try:
        subs = budget.nested_subsamples(scores, 3, seed)
        base.update({m: float(v_) for m, v_ in baselines.extrapolate(subs, k, n).items()})
    except ValueError:  # too small to halve 3 times (some query keeps no stored score)
        base.update({m: float("nan") for m in baselines.MODELS})
    base[REALIZED] = realized_map(truth_counts, scores.fixed_counts, n, k)
    return base


def _tail_counts(scores, settings: PredictSettings, point: Hardness) -> TailCounts:
    """Returns the estimate's tail against its tail-priced positives' counts, and whether the
    summary would warn (`diagnostics.tail_counts_warning`)."""
    counts = np.where(scores.mask, scores.pos_counts, 0)
    seen, expected, sd = diagnostics.tail_counts(
        point, counts, scores.n_sample, settings.tail.min_count
    )
    warned = bool(diagnostics.tail_counts_warning(seen, expected, sd))
    return TailCounts(seen, expected, sd, warned)


def _metric_pairs(scores, truth_counts, k: int, others) -> dict[str, tuple[float, float]]:
    """Returns label -> (predicted, realized on the full gallery) of the metrics besides mAP@k
    (`others`, `MetricPrediction`s)."""
    full = np.where(scores.mask, truth_counts + scores.fixed_counts, -1)
    return {
        m.label: (
            m.value,
            float(metrics.value_from_counts(metrics.get(m.metric), full, scores.mask, k).mean()),
        )
        for m in others
    }


class Row(NamedTuple):
    """One row of a cell's table: the error of a prediction over the draws, and for tail
    estimators the median calibration of their tail-priced positives (None otherwise)."""

    bias: float
    mae: float
    median_ratio: float | None = None
    log_corr: float | None = None
    share_zero: float | None = None


class CellSummary(NamedTuple):
    """A (cell, fraction)'s summary over its draws.

    Attributes:
      rows: row name (estimators, `BASELINES`, `REALIZED`, oracles) -> `Row`.
      coverage: `COVERAGE_TAGS` -> the share of draws whose interval held the truth.
      width: the median half-width of the reported 90% interval.
      warned: the share of draws that warned TAIL VS COUNTS.
      truth_mean, truth_sd: the realized truth over the draws.
    """

    rows: dict
    coverage: dict
    width: float
    warned: float
    truth_mean: float
    truth_sd: float

    def to_json(self) -> dict:
        """Returns the JSON rows: one per row name, then the "_"-prefixed summaries."""
        rows = {
            name: {k: v for k, v in r._asdict().items() if v is not None}
            for name, r in self.rows.items()
        }
        return {
            **rows,
            "_coverage": self.coverage,
            "_warned": {"tail_counts": self.warned},
            "_width": {"ci90": self.width},
            "_truth": {"mean": self.truth_mean, "sd": self.truth_sd},
        }

    @classmethod
    def from_json(cls, d: dict) -> "CellSummary":
        return cls(
            rows={n: Row(**r) for n, r in d.items() if not n.startswith("_")},
            coverage=d["_coverage"],
            width=d["_width"]["ci90"],
            warned=d["_warned"]["tail_counts"],
            truth_mean=d["_truth"]["mean"],
            truth_sd=d["_truth"]["sd"],
        )


def summarize(draws: list[Draw], oracle: dict) -> CellSummary:
    """Returns bias, MAE, coverage and calibration per row over the draws of one cell."""
    truth = np.array([d.truth for d in draws])
    rows = {}
    for name in draws[0].predictions():
        err = np.array([d.predictions()[name] for d in draws]) - truth
        cal = [d.calibration[name] for d in draws if d.calibration.get(name, {}).get("n")]
        med = {}
        if cal:
            med = {k: float(np.nanmedian([c[k] for c in cal])) for k in Row._fields[2:]}
        rows[name] = Row(float(err.mean()), float(np.abs(err).mean()), **med)
    for name, value in oracle.items():
        err = value - truth
        rows[name] = Row(float(err.mean()), float(np.abs(err).mean()))
    for label in draws[0].metrics:
        err = np.array([d.metrics[label][0] - d.metrics[label][1] for d in draws])
        rows[label] = Row(float(err.mean()), float(np.abs(err).mean()))
    coverage = {}
    for tag in COVERAGE_TAGS:
        level, _, part = tag.partition("_")
        bounds = [getattr(getattr(d.interval, level), part or "reported") for d in draws]
        if all(b is not None for b in bounds):
            cover = [lo <= d.truth <= hi for (lo, hi), d in zip(bounds, draws, strict=True)]
            coverage[tag] = float(np.mean(cover))
    half = [(d.interval.ci90.reported[1] - d.interval.ci90.reported[0]) / 2.0 for d in draws]
    return CellSummary(
        rows=rows,
        coverage=coverage,
        width=float(np.median(half)),
        warned=float(np.mean([d.tail_counts.warned for d in draws])),
        truth_mean=float(truth.mean()),
        truth_sd=float(truth.std()),
    )


def format_table(results: dict, estimator: str) -> str:
    """Returns the validation table (one block per cell) of a study's JSON results as text."""
    lines = []
    for cell, cells in results["cells"].items():
        fr = list(cells)
        sums = {f: CellSummary.from_json(cells[f]) for f in fr}
        meta = results["meta"][cell]
        lines.append(
            f"{cell}: {meta['num_queries']} queries, N = {meta['n_pool']:,}, "
            f"{meta['draws']} draws per fraction; truth mAP@{results['k']} "
            + ", ".join(f"{sums[f].truth_mean:.4f}" for f in fr)
        )
        head = f"  {'estimator':<26}" + "".join(f"{'f=' + f:>24}" for f in fr)
        lines += [head, f"  {'':<26}" + "".join(f"{'bias    MAE   med  corr':>24}" for _ in fr)]
        for name in sums[fr[0]].rows:
            row = f"  {name + (' *' if name == estimator else ''):<26}"
            for f in fr:
                c = sums[f].rows[name]
                cal = (
                    f"{c.median_ratio:5.2f} {c.log_corr:5.2f}"
                    if c.median_ratio is not None
                    else f"{'-':>5} {'-':>5}"
                )
                row += f"  {c.bias:+.4f} {c.mae:.4f} {cal}"
            lines.append(row)
        for tag in COVERAGE_TAGS:
            if tag in sums[fr[0]].coverage:
                cov = "".join(f"{sums[f].coverage[tag]:>24.2f}" for f in fr)
                lines.append(f"  {'coverage ' + tag + ' (*)':<26}{cov}")
        half = "".join(f"{sums[f].width:>24.4f}" for f in fr)
        lines.append(f"  {'half-width ci90 (*)':<26}{half}")
        warned = "".join(f"{sums[f].warned:>24.2f}" for f in fr)
        lines.append(f"  {'TAIL VS COUNTS warned (*)':<26}{warned}")
        lines.append("")
    lines.append(
        "bias / MAE: prediction minus realized truth; med / corr: median estimated-over-true "
        "hardness and log-correlation of tail-priced positives; * = config.estimator (intervals; "
        "the share of draws whose prediction warned TAIL VS COUNTS); rows metric@k: "
        "config.estimator's prediction of that metric against its own realized truth."
    )
    return "\n".join(lines)


def evaluate_cell(samples, settings: PredictSettings, v, names, oracle=None):
    """Returns (the `CellSummary`, the `Draw`s) of one cell: `samples` yields (scores, truth
    counts, N, true hardness, seed) per draw; the nested bootstrap runs on the first draw and
    serves every draw's interval (its spread depends on the benchmark and S, not the draw)."""
    draws, reps = [], None
    for scores, truth_counts, n, x_true, seed in samples:
        draw, reps = one_draw(
            scores,
            truth_counts,
            n,
            x_true,
            seed=seed,
            settings=settings,
            v=v,
            names=names,
            reps=reps,
        )
        draws.append(draw)
    return summarize(draws, oracle or {}), draws


def _simulated(bench, fraction: float, seed: int, settings: PredictSettings) -> tuple:
    """Returns (scores, truth counts, N, true hardness) of one sample of a simulated pool."""
    d = simulate.draw(bench, fraction, int(settings.tail.top_m), seed)
    return d.scores, d.truth_counts, bench.n_pool, bench.x


def _simulated_draws(bench, fraction: float, seeds, settings: PredictSettings):
    """Yields the samples of one simulated cell: (scores, truth counts, N, true hardness, seed)
    per seed, one at a time (`evaluate_cell` reads each once; a cell's draws need not all be in
    memory)."""
    return (_simulated(bench, float(fraction), s, settings) + (s,) for s in seeds)


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


class Cell(NamedTuple):
    """One benchmark of a study: its name, its (Q, N, draws) `meta`, the law's oracles from its
    true hardness ({} for a real gallery), and `samples(fraction)`, an iterable of its draws at
    a fraction (`evaluate_cell`)."""

    name: str
    meta: dict
    oracle: dict
    samples: Callable
    bench: simulate.Benchmark | None = None


def _simulated_cell(name, bench, v, settings, seed) -> Cell:
    def samples(j, f):
        seeds = [int(seed) + 10_000 * (j + 1) + r for r in range(int(v.draws))]
        return _simulated_draws(bench, f, seeds, settings)

    meta = {"num_queries": int(v.num_queries), "n_pool": int(bench.n_pool), "draws": int(v.draws)}
    return Cell(name, meta, oracles(bench, settings.k), samples, bench)


def _split_benchmarks(manifest: str, split: str) -> tuple[dict, ...]:
    """Returns the manifest's real-text benchmark entries of `split` (none without a manifest);
    a manifest that lists none for it is an error naming the file."""
    if not manifest:
        return ()
    with open(manifest) as fh:
        entries = tuple(e for e in json.load(fh)["benchmarks"] if e.get("split") == split)
    if not entries:
        raise ValueError(f"{manifest}: field 'benchmarks': no entry with split {split!r}")
    return entries


def _cells(settings: PredictSettings, v: ValidationSettings, seed: int) -> tuple:
    """Returns (the fractions, the `Cell`s) of the study `v` describes: the grid of its regimes
    and families at `n_pool`, or its frozen split (`SPLITS`) with the real-text benchmarks its
    manifest lists for that split (each entry's `split`, as `benchmarks/text_galleries.py`
    writes it). Benchmarks are built one at a time, as the study reaches them."""
    text: tuple[dict, ...]
    if not v.split:
        grid = [(r, f, int(v.n_pool)) for r in v.regimes for f in v.families]
        name = lambda r, f, n: f"{r}/{f}"
        fractions, text = v.fractions, ()
    else:
        sp = SPLITS[v.split]
        grid = [(r, f, n) for r, f in sp.simulated for n in sp.sizes]
        name = lambda r, f, n: f"{r}/{f} N={n:.0e}"
        fractions, text = sp.fractions, _split_benchmarks(v.manifest, v.split)

    def cells():
        for i, (regime, family, n_pool) in enumerate(grid):
            bench = simulate.make_benchmark(
                int(v.num_queries),
                n_pool,
                family,
                seed=int(seed) + 1000 * i,
                **simulate.REGIMES[regime],
            )
            yield _simulated_cell(name(regime, family, n_pool), bench, v, settings, seed)
        for entry in text:
            bench_name = entry["name"]
            meta = {
                "num_queries": int(entry["num_queries"]),
                "n_pool": int(entry["num_distractors"]),
                "draws": min(int(v.draws), *(len(entry["sampled"][str(f)]) for f in fractions)),
            }
            samples = lambda j, f, e=entry: _text_samples(e, f, int(v.draws))
            yield Cell(f"text/{bench_name}", meta, {}, samples)

    return fractions, cells()


def study(
    settings: PredictSettings,
    v: ValidationSettings,
    seed: int = 0,
    done: dict | None = None,
    on_cell: Callable[[dict], None] | None = None,
) -> dict:
    """Returns the validation's results (JSON): per cell and fraction the `CellSummary` rows,
    the raw draws, each cell's meta and, on the simulator grid, a calibration scatter; the
    table is `format_table(results)`.

    The cells are `v`'s grid of regimes and families at `n_pool`, or its frozen split
    (`v.split`, `SPLITS`): the split's simulated families at each of its gallery sizes and its
    real-text benchmarks when `v.manifest` (the JSON that `benchmarks/text_galleries.py`
    writes) names their folders. Every benchmark and draw is a function of `seed`, so a run
    resumed from `done` (the results of an interrupted run with the same settings, as `on_cell`
    received them) reuses its finished (cell, fraction)s and ends with the same results.
    `on_cell(results)` is called after each one (the validate job writes them, atomically, to
    resume from).
    """
    t0 = time.time()
    names = list(v.estimators) or list(estimators.ESTIMATORS)
    if settings.estimator not in names:
        names.append(settings.estimator)
    fractions, cells = _cells(settings, v, seed)
    previous = done or {}
    results: dict[str, Any] = {
        "k": settings.k,
        "split": v.split,
        "estimator": settings.estimator,
        "fractions": [float(f) for f in fractions],
        "cells": {},
        "raw": {},
        "meta": {},
        "scatter": {},
    }
    for cell in cells:
        results["meta"][cell.name] = cell.meta
        for j, f in enumerate(fractions):
            finished, raw = _cell_fraction(
                cell, j, f, settings, v, names=names, previous=previous, t0=t0
            )
            results["cells"].setdefault(cell.name, {})[str(f)] = finished
            results["raw"].setdefault(cell.name, {})[str(f)] = raw
            if on_cell:
                on_cell(results)
        if cell.bench is not None and not v.split:
            results["scatter"][cell.name] = _scatter(cell.bench, settings, v, seed, done, cell)
            if on_cell:
                on_cell(results)
    results["seconds"] = time.time() - t0
    return results


def _cell_fraction(
    cell: Cell,
    j: int,
    f: float,
    settings: PredictSettings,
    v,
    *,
    names,
    previous: dict,
    t0: float,
) -> tuple[dict, list]:
    """Returns (the `CellSummary` JSON, the raw draws' JSON) of `cell` at its `j`-th fraction
    `f`: those of the `previous` results of a resumed run where it has them, else run now (and
    logged with the seconds since the study's start `t0`)."""
    finished = (previous.get("cells") or {}).get(cell.name, {}).get(str(f))
    if finished is not None:
        return finished, previous["raw"][cell.name][str(f)]
    summary, draws = evaluate_cell(cell.samples(j, f), settings, v, names, cell.oracle)
    logging.info("%s f=%s done at %.0f s", cell.name, f, time.time() - t0)
    return summary.to_json(), [d.to_json() for d in draws]


def _scatter(bench, settings: PredictSettings, v, seed: int, done, cell: Cell) -> dict:
    """Returns the calibration scatter of a simulated benchmark at the largest fraction: true
    against estimated hardness of the tail-priced positives."""
    scatter = ((done or {}).get("scatter") or {}).get(cell.name)
    if scatter is None:
        d = simulate.draw(bench, float(v.fractions[-1]), int(settings.tail.top_m), int(seed))
        h = estimators.get(settings.estimator)(d.scores, settings.tail)
        sel = h.tail_priced & (bench.x > 0)
        scatter = {"true": bench.x[sel].tolist(), "est": h.x[sel].tolist()}
    return scatter
