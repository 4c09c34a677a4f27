"""Predictions from a hardness artifact alone: mAP@k at any N and k, without the scores.

A predict job writes the hardness artifact (`tailaware.io.artifact`) beside its prediction; it
holds each positive's hardness posterior, the threshold reruns, the prior re-weightings and the
distractor-sample sd the job measured. `predict` turns it into a `Prediction` at any gallery
size, with the same interval terms as a prediction from the scores (a term whose fields the
artifact lacks is left out, and the summary says so); no baselines, budget or drift checks
(they need the scores).

Shapes: Q queries, G gallery sizes.
"""

import numpy as np

from tailaware.core.results import Curve, Diagnostics, Interval, Prediction
from tailaware.io.artifact import HardnessArtifact
from tailaware.protocol import diagnostics, intervals, prediction
from tailaware.protocol.settings import CURVE_RANGE, PredictSettings
from tailaware.tail import estimators


def distractor_sd_at(art: HardnessArtifact, sizes, k: int) -> np.ndarray | None:
    """Returns the stored distractor-sample sd of mAP@k at `sizes` [G] (interpolated in log N,
    constant beyond the stored range), or None when the artifact has none at this k."""
    if art.distractor_n is None or art.distractor_k != int(k):
        return None
    log_n = np.log(np.asarray(sizes, np.float64))
    return np.interp(log_n, np.log(art.distractor_n), art.distractor_sd)


def at_sizes(
    art: HardnessArtifact, sizes, settings: PredictSettings
) -> tuple[np.ndarray, list[Interval]]:
    """Returns (per-query AP@k [G, Q], the reported `Interval` at each size) at `sizes` [G].

    The interval is the query bootstrap widened by the stored distractor sd and the reruns'
    threshold and prior terms, where the artifact has them.
    """
    sizes = np.atleast_1d(np.asarray(sizes, np.float64))
    k, opts = settings.k, settings.protocol
    sample = None if art.pos_counts is None else art  # it has pos_counts and n_sample
    h = art.hardness
    aps, priors = prediction.prior_maps(h, sizes, k, art.fixed_counts, sample)
    maps = prediction.rerun_maps(h.reruns, sizes, k, art.fixed_counts, sample)
    sd = distractor_sd_at(art, sizes, k)
    bands = intervals.size_intervals(
        aps,
        settings.intervals,
        opts.query_replicates,
        opts.seed,
        maps,
        sd_distractor=sd,
        priors=priors,
    )
    return aps, bands


def _missing_terms(art: HardnessArtifact, sizes, k: int) -> list[str]:
    """Returns the interval terms a tail-aware artifact lacks the fields for."""
    if estimators.tail_method(art.estimator) is None:
        return []
    missing = []
    if distractor_sd_at(art, sizes, k) is None:
        measured = art.distractor_k
        missing.append("distractor-sample" + (f" (measured at k = {measured})" if measured else ""))
    if art.rerun_atoms is None:
        missing.append("threshold")
    if art.weights is not None and art.prior_weights is None:
        missing.append("prior")
    return missing


def predict(
    art: HardnessArtifact, settings: PredictSettings, n_target: int, source: str = ""
) -> Prediction:
    """Returns the `Prediction` from the artifact at `n_target` (the predict job with
    `--config.artifact`): the prediction, its interval and the curve."""
    k = settings.k
    grid = np.geomspace(*CURVE_RANGE, int(settings.protocol.curve_points))
    sizes = np.concatenate([[float(n_target)], grid])
    aps, (unc, *bands) = at_sizes(art, sizes, settings)
    points = aps.mean(axis=1)
    missing = _missing_terms(art, sizes, k)
    lacks = ", ".join(missing[:-1]) + (" and " if len(missing) > 1 else "") + "".join(missing[-1:])
    lo, hi = unc.ci90.reported
    summary = (
        f"FROM THE HARDNESS ARTIFACT {source or '(in memory)'} ({art.estimator}, S = "
        f"{art.n_sample:,}): no baselines, budget or drift checks (they need the scores)"
        + (f"; the interval lacks the {lacks} term{'s' * (len(missing) > 1)}" if missing else ""),
        *diagnostics.sub_gallery(art.n_sample, n_target),
        f"mAP@{k} at N = {n_target:,}: {points[0]:.4f}, 90% CI [{lo:.4f}, {hi:.4f}]",
    )
    return Prediction(
        map=float(points[0]),
        estimator=art.estimator,
        n_target=int(n_target),
        n_sample=int(art.n_sample),
        k=k,
        per_query_ap=aps[0],
        baselines={},
        query_ids=art.query_ids,
        share_tail_priced=float(art.tail_priced[art.mask].mean()),
        interval=unc,
        curve=Curve(
            n=tuple(grid.tolist()),
            map=tuple(points[1:].tolist()),
            ci90=tuple(b.ci90.reported for b in bands),
        ),
        diagnostics=Diagnostics(summary),
        artifact=(source, art.metadata),
    )
