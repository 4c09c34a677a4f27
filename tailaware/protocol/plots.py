"""The figures the jobs write: a prediction's curve, the ILIAS report, a comparison, the demo's
mAP-versus-N, the validation's.

Each builds a `matplotlib.figure.Figure` (no pyplot, so a notebook's backend is left alone) and
writes it atomically as PNG.
"""

import os

import numpy as np
from matplotlib.figure import Figure

from tailaware.core.results import Comparison, Curve, Prediction, Report
from tailaware.io import atomic
from tailaware.protocol import ilias_report


def _spans(mid, lo, hi) -> np.ndarray:
    """Returns [2, n] error-bar lengths below and above `mid`; 0 where an interval is only its
    point (float rounding would make it a hair negative, which matplotlib refuses)."""
    mid, lo, hi = (np.asarray(v, np.float64) for v in (mid, lo, hi))
    return np.maximum(np.stack([mid - lo, hi - mid]), 0.0)


def prediction_curve(path: str | os.PathLike, p: Prediction) -> None:
    """Writes a PNG of the predicted mAP@k curve with its 90% band and the target point.

    Raises:
      ValueError: `p` has no curve or no interval (an exact evaluation).
    """
    curve, interval = p.curve, p.interval
    if curve is None or interval is None:
        raise ValueError("a prediction without a curve and an interval has no curve to plot")
    band = np.asarray(curve.ci90)
    fig = Figure(figsize=(7, 4.5))
    ax = fig.subplots()
    ax.fill_between(curve.n, band[:, 0], band[:, 1], alpha=0.25, label="90% band")
    ax.plot(curve.n, curve.values, "-", label=f"{p.estimator} (predicted)")
    lo, hi = interval.ci90.reported
    err = _spans([p.map], [lo], [hi])
    ax.errorbar([p.n_target], [p.map], err, fmt="ko", capsize=3, label="target N")
    ax.axvline(p.n_sample, color="grey", ls=":", label="sample size S")
    ax.set_xscale("log")
    ax.set_xlabel("gallery size N (distractors)")
    ax.set_ylabel(f"mAP@{p.k}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    atomic.save_figure(fig, path)


def report_values(path: str | os.PathLike, r: Report, k: int) -> None:
    """Writes a PNG of the ILIAS report: one bar per value in percent, in the report's order
    (map, oracle, then each section's groups, one colour per section), with its 90% interval
    where it has one (a prediction; an exact report has none)."""
    values = r.values
    y = np.arange(len(values))[::-1]
    fig = Figure(figsize=(7, 1.2 + 0.25 * len(values)))
    ax = fig.subplots()
    colours = [f"C{ilias_report.SECTIONS.index(v.section)}" for v in values]
    ax.barh(y, [v.value for v in values], color=colours, alpha=0.8)
    with_ci = [(i, v) for i, v in enumerate(values) if v.ci90 is not None]
    if with_ci:
        at = np.asarray([y[i] for i, _ in with_ci])
        mid = np.asarray([v.value for _, v in with_ci])
        lo, hi = np.asarray([v.ci90 for _, v in with_ci]).T
        ax.errorbar(mid, at, xerr=_spans(mid, lo, hi), fmt="none", ecolor="k", capsize=2)
        ax.plot([], [], "k-", label="90% interval")
        ax.legend(fontsize=8, loc="lower right")
    ax.set_yticks(y, [ilias_report.label(v) for v in values], fontsize=8)
    ax.set_xlim(0, 100)
    ax.set_xlabel(f"percent at k = {k} (oracle: recall@{k}; the rest mAP@{k})")
    ax.set_title(f"ILIAS report, {len(r.query_ids)} queries", fontsize=10)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    atomic.save_figure(fig, path)


def comparison(
    path: str | os.PathLike, c: Comparison, curves: tuple[Curve | None, Curve | None] | None
) -> None:
    """Writes a PNG of a comparison: each metric's A - B with its 90% interval and, given both
    predictions' mAP@k curves on the same sizes, A - B over N (the curves' difference; its
    interval is the paired one, at N only)."""
    rows, ap = c.metrics, c.ap
    a, b = (None, None) if curves is None else curves
    pair = (a, b) if a is not None and b is not None and np.allclose(a.n, b.n) else None
    same = pair is not None
    fig = Figure(figsize=(7, 2.0 + 0.4 * len(rows) + (3.2 if same else 0.0)))
    axes = fig.subplots(2 if same else 1, 1, squeeze=False)[:, 0]
    ax = axes[0]
    y = np.arange(len(rows))[::-1]
    diff = np.asarray([m.difference for m in rows.values()])
    lo, hi = np.asarray([m.ci90 for m in rows.values()]).T
    ax.errorbar(diff, y, xerr=_spans(diff, lo, hi), fmt="ko", capsize=3, label="90% interval")
    ax.axvline(0.0, color="grey", ls=":")
    ax.set_yticks(y, [label.replace("map@", "mAP@", 1) for label in rows])
    ax.set_ylim(-0.7, len(rows) - 0.3)
    ax.set_xlabel(f"A - B at N = {c.n_target:,}")
    ax.grid(axis="x", alpha=0.3)
    ax.legend(fontsize=8)
    if pair is not None:
        ax = axes[1]
        n = np.asarray(pair[0].n)
        ax.plot(n, np.subtract(pair[0].values, pair[1].values), "-", label="A - B (curves)")
        ax.errorbar(
            [c.n_target],
            [ap.difference],
            _spans([ap.difference], [ap.ci90[0]], [ap.ci90[1]]),
            fmt="ko",
            capsize=3,
            label="target N, paired 90% interval",
        )
        ax.axhline(0.0, color="grey", ls=":")
        ax.set_xscale("log")
        ax.set_xlabel("gallery size N (distractors)")
        ax.set_ylabel(f"mAP@{c.k}: A - B")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    atomic.save_figure(fig, path)


def map_vs_gallery(path, truth, predicted, at_sample, k) -> None:
    """Writes `gallery_figure(truth, predicted, at_sample, k)` as a PNG at `path`."""
    atomic.save_figure(gallery_figure(truth, predicted, at_sample, k), path)


def gallery_figure(truth, predicted, at_sample, k) -> Figure:
    """Returns the figure of mAP@k versus gallery size: the truth, predictions, evaluate-at-S.

    A prediction is two laws that meet at the sample size S: at N >= S the gallery contains the
    sample and the law conditions on its counts; below S it predicts a random sub-gallery of the
    sampled pool (`core.law.expected_map`). The two need not agree at S (the `homogeneous`
    estimator's conditioned branch starts at the sample's own mAP, its sub-gallery branch well
    below), so each curve is drawn solid at N >= S and dotted below, never joined across S: a
    line joining them would draw a spike that no gallery has.

    Args:
      truth: (sizes, mAP@k) measured on the full galleries.
      predicted: (grid, {estimator: mAP@k on the grid}) from the sample alone.
      at_sample: (S, mAP@k measured on the sample).
      k: the cut-off, for the label.
    """
    fig = Figure(figsize=(7, 4.5))
    ax = fig.subplots()
    ax.plot(*truth, "ko", label="truth (full gallery)", zorder=5)
    grid, curves = predicted
    grid = np.asarray(grid, np.float64)
    inside = grid >= at_sample[0]
    for name, values in curves.items():
        values = np.asarray(values, np.float64)
        (line,) = ax.plot(grid[inside], values[inside], "-", label=f"{name} (from sample)")
        if (~inside).any():
            ax.plot(grid[~inside], values[~inside], ":", color=line.get_color())
    if (~inside).any():
        ax.plot([], [], "k:", label="N < S: a sub-gallery of the sample")
    ax.plot([at_sample[0]], [at_sample[1]], "r^", label="evaluate-at-S")
    ax.set_xscale("log")
    ax.set_xlabel("gallery size N (distractors)")
    ax.set_ylabel(f"mAP@{k}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def validation(workdir: str, results: dict, estimator: str) -> None:
    """Writes the validation's error box plots and per-positive calibration scatter
    (`validation_errors.png`, `validation_calibration.png`) from its results."""
    cells = list(results["cells"])
    fig = Figure(figsize=(6 * len(cells), 4.5))
    axes = fig.subplots(1, len(cells), squeeze=False)
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

    fig = Figure(figsize=(5 * len(cells), 4.5))
    axes = fig.subplots(1, len(cells), squeeze=False)
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
