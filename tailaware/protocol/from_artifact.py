"""Predictions from a hardness artifact alone: mAP@k at any N and k, without the scores.

A predict job writes the hardness artifact (`tailaware.io.artifact`) beside its prediction; it
holds each positive's hardness posterior, the threshold reruns, the prior re-weightings and the
distractor-sample sd the job measured. `predict` turns it into a `Prediction` at any gallery
size, with the same interval terms as a prediction from the scores (a term whose fields the
artifact lacks is left out, and the summary says so); no baselines, budget or drift checks
(they need the scores).

Shapes: Q queries, G gallery sizes.
"""

from collections.abc import Sequence

import numpy as np
from numpy.typing import ArrayLike

from tailaware.core import evaluate
from tailaware.core.results import Diagnostics, Interval, Prediction
from tailaware.io.artifact import HardnessArtifact
from tailaware.protocol import diagnostics, prediction
from tailaware.protocol.settings import CURVE_RANGE, PredictSettings
from tailaware.tail import estimators


def distractor_sd_at(
    art: HardnessArtifact,
    sizes: ArrayLike,
    k: int,
    names: Sequence[str] = ("map",),
    *,
    subsample: bool = False,
) -> np.ndarray:
    """Returns the stored distractor-sample sd [M, G] (the sub-samples' with `subsample`) of each
    metric `names` [M] at `sizes` [G] (interpolated in log N, constant beyond the stored range);
    NaN where the artifact has none for that metric at this k."""
    log_n = np.log(np.asarray(sizes, np.float64))
    out = np.full((len(names), log_n.size), np.nan)
    stored = art.subsample_sd if subsample else art.distractor_sd
    if art.distractor_n is None or stored is None or art.distractor_k != int(k):
        return out
    for m, name in enumerate(names):
        if name in art.distractor_metrics:
            row = stored[art.distractor_metrics.index(name)]
            out[m] = np.interp(log_n, np.log(art.distractor_n), row)
    return out


def _subsample_at(
    art: HardnessArtifact, sizes: ArrayLike, k: int, names: Sequence[str] = ("map",)
) -> np.ndarray | None:
    """Returns the stored sub-samples' sd [M, G] (0 for a metric it lacks), or None without."""
    if art.subsample_sd is None:
        return None
    got = distractor_sd_at(art, sizes, k, names, subsample=True)
    return np.where(np.isnan(got), 0.0, got)


def at_sizes(
    art: HardnessArtifact, sizes: ArrayLike, settings: PredictSettings
) -> tuple[np.ndarray, list[Interval]]:
    """Returns (per-query AP@k [G, Q], the reported `Interval` at each size) at `sizes` [G].

    The interval is the query bootstrap widened by the stored distractor sd, the reruns'
    threshold and prior terms and the sub-samples' term, where the artifact has them.
    """
    sizes = np.atleast_1d(np.asarray(sizes, np.float64))
    k = settings.k
    sample = None if art.pos_counts is None else evaluate.Counts(art.pos_counts, art.n_sample)
    every, rows = prediction.variants(art.hardness)
    values, _ = evaluate.predicted_values(every, art.mask, sizes, k, art.fixed_counts, sample)
    means = values[:, :, 0].mean(axis=-1)  # [W, G]
    bands = prediction.combined_intervals(
        values[0, :, 0],
        settings,
        rows.terms(
            means,
            _realized_each(art, sizes, settings),
            _first(_subsample_at(art, sizes, k)),
            per_query=values[:, :, 0],
        ),
        sd_distractor=distractor_sd_at(art, sizes, k)[0],
    )
    return values[0, :, 0], bands


def _first(sd: np.ndarray | None) -> np.ndarray | None:
    """Returns the first metric's row [G] of `sd` [M, G], or None."""
    return None if sd is None else sd[0]


def _realized_each(
    art: HardnessArtifact, sizes: np.ndarray, settings: PredictSettings
) -> np.ndarray | None:
    """Returns [G] mAP@k's realized-value sd at each of `sizes`, each drawn as a target is
    (`prediction.realized_sd`), or None when off."""
    metric = (settings.metric_list()[0],)
    got = [
        prediction.realized_sd(
            art.hardness, art, [n], k=settings.k, metric_list=metric, opts=settings.protocol
        )
        for n in sizes
    ]
    # realized_sd is None for every size or for none (`opts.realized_draws`).
    return None if got[0] is None else np.asarray([g[0, 0] for g in got if g is not None])


def _missing_terms(art: HardnessArtifact, sd: np.ndarray) -> list[str]:
    """Returns the interval terms a tail-aware artifact lacks the fields for (`sd` [M, G]: the
    stored distractor sds at the prediction's sizes)."""
    if estimators.tail_model(art.estimator) is None:
        return []
    missing = []
    if np.isnan(sd).any():
        measured = art.distractor_k
        missing.append("distractor-sample" + (f" (measured at k = {measured})" if measured else ""))
    if art.rerun_atoms is None:
        missing.append("threshold")
    if art.weights is not None and art.prior_weights is None:
        missing.append("prior")
    if art.distractor_sd is not None and art.subsample_sd is None:
        missing.append("sub-sample")
    return missing


def predict(
    art: HardnessArtifact, settings: PredictSettings, n_target: int, source: str = ""
) -> Prediction:
    """Returns the `Prediction` from the artifact at `n_target` (the predict job with
    `--config.artifact`): every metric of `settings.metrics` with its interval and curve, in
    one pass (`evaluate.predicted_values`)."""
    k = settings.k
    metric_list = settings.metric_list()
    grid = np.geomspace(*CURVE_RANGE, int(settings.protocol.curve_points))
    sizes = np.concatenate([[float(n_target)], grid])
    sample = None if art.pos_counts is None else evaluate.Counts(art.pos_counts, art.n_sample)
    every, rows = prediction.variants(art.hardness)
    values, _ = evaluate.predicted_values(
        every, art.mask, sizes, k, art.fixed_counts, sample, metric_list=metric_list
    )
    sd = distractor_sd_at(art, sizes, k, tuple(m.name for m in metric_list))
    realized = prediction.realized_sd(
        art.hardness, art, sizes, k=k, metric_list=metric_list, opts=settings.protocol
    )
    names = tuple(m.name for m in metric_list)
    out = prediction.metric_predictions(
        values,
        rows,
        metric_list,
        settings,
        grid,
        sd=sd,
        realized=realized,
        subsample=_subsample_at(art, sizes, k, names),
    )
    missing = _missing_terms(art, sd)
    lacks = ", ".join(missing[:-1]) + (" and " if len(missing) > 1 else "") + "".join(missing[-1:])
    ap, *others = out.values()
    summary = (
        f"FROM THE HARDNESS ARTIFACT {source or '(in memory)'} ({art.estimator}, S = "
        f"{art.n_sample:,}): no baselines, budget or drift checks (they need the scores)"
        + (f"; the interval lacks the {lacks} term{'s' * (len(missing) > 1)}" if missing else ""),
        *diagnostics.sub_gallery(art.n_sample, n_target),
        *(diagnostics.metric_line(m.label, m.value, m.interval, n_target) for m in others),
        diagnostics.metric_line(f"mAP@{k}", ap.value, ap.interval, n_target),
    )
    return Prediction(
        estimator=art.estimator,
        n_target=int(n_target),
        n_sample=int(art.n_sample),
        k=k,
        query_ids=art.query_ids,
        metrics=out,
        diagnostics=Diagnostics(summary, share_tail_priced=float(art.tail_priced[art.mask].mean())),
        artifact=(source, art.metadata),
    )
