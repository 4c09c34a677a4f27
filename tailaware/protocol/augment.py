"""The protocol around a prediction: intervals, the curve, other metrics and diagnostics.

`augment(result, scores, config, n_target)` returns the fields `predict.predict` adds to
prediction.json (paper Sec. 4: "report mAP@k at the target with a query-bootstrap interval and
a count/tail diagnostic"):

- `ci90`, `ci95` (+ `uncertainty`): nested-bootstrap intervals widened by the tail model's
  sensitivity to its threshold and to the prior on its shape (`bootstrap.intervals`,
  `threshold_maps`, `prior_maps`).
- `curve`: predicted mAP@k for N from 10^3 to 10^9 with its 90% band (and its distractor-sample
  sd when the nested bootstrap ran, which the hardness artifact keeps).
- `other_metrics`: recall@k and top-1 at N through the same law (expected ranks for recall,
  the Poisson form exp(-N x) for top-1), labelled as law predictions.
- `baselines`: the given ones plus homogeneous and the power-law / log-uniform curve fits.
- `diagnostics`: the sufficient-budget verdict (first line of `summary` when the sample is too
  small), the drift test when per-block files are given, warnings when some query's tail could
  not be fitted or the tails are fitted too low in the sample (SHALLOW TAIL), a note when some
  query's tail threshold was raised (THRESHOLD RAISED, `share_threshold_raised`), a warning when
  the prediction moves with the tail threshold by more than the query noise (THRESHOLD
  SENSITIVE) or with the prior on the tail shape (PRIOR SENSITIVE), and the share of positives
  the tail priced.

Optional config fields (read with defaults, so configs/default.py needs none of them):
`config.protocol.query_replicates` (1000), `nested_replicates` (50), `curve_points` (25),
`budget_levels` (3), `seed` (0), `blocks` (() -- sampled-scores files of disjoint id-hash
blocks of the same sample).
"""

import os
from concurrent import futures

import jax
import jax.numpy as jnp
import numpy as np

from tailaware.core import law
from tailaware.io import atomic
from tailaware.io.scores import SampledScores, load_scores
from tailaware.jobs import predict
from tailaware.protocol import bootstrap, budget, curvefit
from tailaware.tail import estimators

# Above this exceedance rate of the tail threshold (n_u / S) the summary warns (`_shallow_tail`).
SHALLOW_RATE = 1e-3

DEFAULTS = {
    "query_replicates": 1000,
    "nested_replicates": 50,
    "curve_points": 25,
    "budget_levels": 3,
    "seed": 0,
    "blocks": (),
}
CURVE_RANGE = (1e3, 1e9)


def settings(config) -> dict:
    """Returns the protocol settings: `config.protocol` over `DEFAULTS`."""
    given = config.get("protocol", None) if hasattr(config, "get") else None
    out = dict(DEFAULTS)
    if given is not None:
        out.update({k: given[k] for k in given.keys() if k in DEFAULTS})
    return out


@jax.jit
def _other_metrics(x, mask, n, k, fixed):
    recall = jax.vmap(lambda xi, mi, fi: law.recall_at_k(xi, mi, n, k, fi))(x, mask, fixed)
    top1 = jax.vmap(lambda xi, mi, fi: law.top1_accuracy(xi, mi, n, fi))(x, mask, fixed)
    return jnp.mean(recall), jnp.mean(top1)


def other_metrics(hardness: estimators.Hardness, fixed, n: float, k: int) -> dict:
    """Returns recall@k and top-1 accuracy at gallery size n through the law."""
    fx = jnp.asarray(np.where(hardness.mask, fixed, 0), jnp.float32)
    recall, top1 = _other_metrics(
        jnp.asarray(hardness.x, jnp.float32),
        jnp.asarray(hardness.mask),
        jnp.float32(n),
        jnp.float32(k),
        fx,
    )
    return {
        f"recall@{k}": float(recall),
        "top1": float(top1),
        "note": "law predictions: recall from expected ranks j + F + N x <= k; top-1 from "
        "P(no distractor above the best positive) = exp(-N x)",
    }


def subsample_predictions(subsamples, config, sizes) -> np.ndarray:
    """Returns the configured estimator's mAP@k [len(subsamples), G] from each (sub-)sample.

    Uses the estimator's JAX core (`bootstrap.core_predict`: one compile for all sub-sample
    widths) when it has one, else the estimator itself.
    """
    ref = subsamples[-1]
    out = []
    for s in subsamples:
        got = bootstrap.core_predict(
            bootstrap.core(s, config, ref), config.estimator, config, sizes
        )
        if got is None:
            h = estimators.get(config.estimator)(s, config)
            got = (
                predict.per_query_ap(h, np.asarray(sizes, np.float64), config.k, s.fixed_counts, s),
            )
        out.append(got[0].mean(axis=1))
    return np.stack(out)


def estimate(scores: SampledScores, config) -> estimators.Hardness:
    """Returns the configured estimator's `Hardness`, with its threshold reruns when it has a
    tail model (one compiled program: `hardness.estimate`)."""
    method = tail_method(config.estimator)
    if method is None:
        return estimators.get(config.estimator)(scores, config)
    from tailaware.tail import (
        evt as hardness,  # the tail-aware core (imported lazily, like estimators)
    )

    return hardness.estimate(scores, config, method, reruns=True)


def threshold_maps(scores: SampledScores, config, sizes, estimated=None) -> np.ndarray | None:
    """Returns mAP@k [F, G] of the configured estimator rerun at other thresholds, or None.

    The reruns keep half and twice the excesses over the estimator's threshold (`estimate`), one
    row each, at the gallery sizes `sizes` [G]; they are taken from `estimated` when it carries
    them. None for estimators without a tail model (count, homogeneous).
    """
    if tail_method(config.estimator) is None:
        return None
    reruns = estimated.reruns if estimated is not None else ()
    reruns = reruns or estimate(scores, config).reruns
    return rerun_maps(reruns, sizes, int(config.k), scores.fixed_counts, scores)


def prior_maps(hardness: estimators.Hardness, sizes, k: int, fixed, sample) -> tuple:
    """Returns (per-query AP@k [G, Q] of the estimate, its mAP@k [T, G] under its other priors on
    the tail shape, a flatter and a steeper one, or None without them) at the sizes [G], in one
    E[AP] pass (`predict.per_query_ap(..., priors=True)`); `fixed` and `sample` as there."""
    aps, *priors = predict.per_query_ap(hardness, sizes, k, fixed, sample, priors=True)
    return aps, (np.mean(priors, axis=-1) if priors else None)


def rerun_maps(reruns, sizes, k: int, fixed, sample) -> np.ndarray | None:
    """Returns mAP@k [F, G] of each of the `reruns` (`Hardness`, a tuple) at the sizes [G], or
    None when there are none; `fixed` and `sample` as in `predict.per_query_ap`."""
    if not reruns:
        return None
    sizes = np.asarray(sizes, np.float64)
    maps = lambda h: predict.per_query_ap(h, sizes, k, fixed, sample).mean(axis=1)
    # Concurrently: a compiled E[AP] keeps ~1.2 of 2 cores busy and releases the GIL (-25%).
    with futures.ThreadPoolExecutor(len(reruns)) as pool:
        return np.stack(list(pool.map(maps, reruns)))


def tail_method(estimator: str) -> str | None:
    """Returns the tail model (`hardness.METHODS`) behind an estimator name, None without one
    (count, homogeneous): the estimators whose intervals have threshold and distractor terms."""
    from tailaware.tail import evt as hardness

    return hardness.ESTIMATOR_METHODS.get(estimator)


def model_deviations(scores: SampledScores, config, sizes, points, estimated=None) -> tuple:
    """Returns ([G], [G]) how far mAP@k moves when the tail threshold does (`threshold_maps`) and
    when the prior on the tail shape does (`prior_maps`; of `estimated` when given, which must
    then carry its reruns, as `estimate`'s do): the larger distance of the reruns from `points`
    [G] at each gallery size of `sizes` [G]; 0 without them."""
    h = estimated if estimated is not None and estimated.reruns else None
    if h is None and tail_method(config.estimator) is not None:
        h = estimate(scores, config)
    maps = threshold_maps(scores, config, sizes, h)
    priors = (
        None if h is None else prior_maps(h, sizes, int(config.k), scores.fixed_counts, scores)[1]
    )
    return _deviation(maps, points), _deviation(priors, points)


def _deviation(maps, points) -> np.ndarray:
    points = np.asarray(points, np.float64)
    return np.zeros_like(points) if maps is None else np.max(np.abs(maps - points), axis=0)


def size_intervals(aps, opts, maps, nested=None, sd_distractor=None, priors=None) -> list[dict]:
    """Returns `bootstrap.intervals` at each gallery size.

    Args:
      aps: [G, Q] predicted AP@k per size and query (the query bootstrap resamples its columns).
      opts: `settings` (query_replicates, seed).
      maps: [F, G] the threshold reruns' mAP@k (`threshold_maps`), or None.
      nested: `bootstrap.nested_bootstrap`'s replicates at the G sizes, or None.
      sd_distractor: [G] the distractor replicates' sds where only they are known (an
        artifact's), or None.
      priors: [T, G] the estimate's mAP@k under other priors on the tail shape (`prior_maps`),
        or None.

    Each dict also holds `threshold_maps` and `prior_maps`: the reruns' mAP at its size (half,
    twice the excesses; flatter, steeper prior), which `compare` pairs across two systems; None
    without them.
    """
    points = aps.mean(axis=1)
    query_reps = bootstrap.query_bootstrap(aps, int(opts["query_replicates"]), int(opts["seed"]))
    dev, dev_prior = _deviation(maps, points), _deviation(priors, points)
    listed = lambda a, g: None if a is None else [float(v) for v in a[:, g]]
    out = []
    for g in range(len(points)):
        nest = None if nested is None else {name: v[g] for name, v in nested.items()}
        sd = None if sd_distractor is None else float(sd_distractor[g])
        unc = bootstrap.intervals(float(points[g]), query_reps[g], nest, dev[g], sd, dev_prior[g])
        unc["threshold_maps"] = listed(maps, g)
        unc["prior_maps"] = listed(priors, g)
        out.append(unc)
    return out


def budget_check(subsamples, config, n_target: int, noise: float) -> dict:
    """Returns `budget.verdict` for the configured estimator on nested sub-samples."""
    preds = subsample_predictions(subsamples, config, [float(n_target)])[:, 0]
    return budget.verdict([s.n_sample for s in subsamples], preds, noise)


def drift_check(config, n_target: int, block_files) -> dict:
    """Returns the drift test over per-block sampled-scores files, or why it was not run."""
    if len(block_files) < 2:
        return {
            "checked": False,
            "reason": "needs >= 2 id-hash block files (config.protocol.blocks); a sample that "
            "is uniform within itself but curated from the pool (e.g. mini-ILIAS) can only be "
            "recognised from its ids (budget.hash_membership)",
        }
    fn = estimators.get(config.estimator)
    aps = []
    for path in block_files:
        s = load_scores(path)
        aps.append(predict.per_query_ap(fn(s, config), n_target, config.k, s.fixed_counts, s))
    out = budget.drift(np.stack(aps))
    out["checked"] = True
    return out


def _shallow_tail(hardness: estimators.Hardness, n_sample: int, n_target: int) -> str:
    """Returns a warning when the tails are fitted too low in the sample to extrapolate far.

    The threshold's exceedance rate n_u / S (median over queries) above `SHALLOW_RATE` means
    the "tail" is the top tenth of a percent of the sample or more: a GPD there is a poor
    model of the decades beyond it (on the simulator, S = 50k for N = 10^8 errs by 0.03-0.1).
    """
    info = hardness.info
    if "n_exceed" not in info or n_target <= n_sample:
        return ""
    rate = float(np.median(info["n_exceed"])) / float(n_sample)
    if rate <= SHALLOW_RATE:
        return ""
    return (
        f"SHALLOW TAIL: the tails are fitted to the top {rate:.2%} of the sample (median n_u / S) "
        f"and extrapolated to 1 / N = {1.0 / n_target:.0e}; predictions from thresholds this low "
        "are biased by several points on simulated laws: sample more distractors"
    )


def _raised_thresholds(hardness: estimators.Hardness) -> tuple[float, str]:
    """Returns the share of queries whose tail threshold was raised, and a note when any was.

    `evt_averaged` raises a query's threshold where its excesses over the default one fail a
    goodness-of-fit test for the GPD (`hardness.select_threshold`), e.g. a near-duplicate
    cluster far above the rest of the excesses.
    """
    info = hardness.info
    if "n_exceed_selected" not in info:
        return 0.0, ""
    raised = np.asarray(info["n_exceed_selected"]) < np.asarray(info["n_exceed"])
    if not raised.any():
        return 0.0, ""
    return float(raised.mean()), (
        f"THRESHOLD RAISED for {int(raised.sum())} of {raised.size} queries: their excesses over "
        "the default threshold are not GPD-shaped (e.g. a near-duplicate cluster above the rest); "
        "their tails are fitted to the top half or quarter"
    )


# The model terms' warnings: (`bootstrap.intervals` field, name, what moves, what it means).
_SENSITIVE = (
    (
        "threshold_deviation",
        "THRESHOLD SENSITIVE",
        "when the tail threshold keeps half or twice the excesses",
        "the tail model is unsettled here: sample more distractors",
    ),
    (
        "prior_deviation",
        "PRIOR SENSITIVE",
        "under a flatter or a steeper prior on the tail shape",
        "the sample leaves the tails' shape beyond it to the prior: sample more distractors, or "
        "predict at a smaller N",
    ),
)


def _model_sensitive(unc: dict, k: int) -> list[str]:
    """Returns warnings when the prediction moves with the tail threshold or with the prior on
    the tail shape beyond query noise.

    `unc` is `bootstrap.intervals`' output at the target: the interval already includes the
    moves; the warnings say why it is wide and what would narrow it.
    """
    sd_q = unc["sd_query"]
    return [
        f"{name}: mAP@{k} moves by {unc[key]:.4f} {how}, more than the query noise (sd "
        f"{sd_q:.4f}); the interval includes it, but {why}"
        for key, name, how, why in _SENSITIVE
        if unc.get(key, 0.0) > sd_q
    ]


def augment(
    result: dict,
    scores: SampledScores,
    config,
    n_target: int,
    hardness: estimators.Hardness | None = None,
) -> dict:
    """Returns the extra prediction.json fields for `result` (see the module docstring).

    Args:
      result: `predict.predict`'s output (its `map` and `per_query_ap` are used).
      scores: the sample it came from.
      config: the job config.
      n_target: N.
      hardness: the estimate `result` came from (recomputed when None).
    """
    opts = settings(config)
    k = int(config.k)
    if hardness is None:
        hardness = estimate(scores, config)
    fixed = scores.fixed_counts
    grid = np.geomspace(*CURVE_RANGE, int(opts["curve_points"]))
    sizes = np.concatenate([[float(n_target)], grid])
    aps, priors = prior_maps(hardness, sizes, k, fixed, scores)  # [G, Q], [T, G] or None
    points = aps.mean(axis=1)

    nested = None
    if int(opts["nested_replicates"]) > 0:
        nested = bootstrap.nested_bootstrap(
            scores, config.estimator, config, sizes, int(opts["nested_replicates"]), opts["seed"]
        )
    maps = threshold_maps(scores, config, sizes, hardness)
    unc, *bands = size_intervals(aps, opts, maps, nested=nested, priors=priors)

    try:
        subs = budget.nested_subsamples(scores, int(opts["budget_levels"]), int(opts["seed"]))
    except ValueError as e:  # a sample too small to halve (some query keeps no stored score)
        subs = None
        message = (
            f"BUDGET NOT CHECKED: the sample (S = {scores.n_sample:,}) is too small to halve "
            f"{int(opts['budget_levels'])} times (a sub-sample leaves some query without a stored "
            "score); treat the prediction as unverified and sample more distractors"
        )
        bud = {"converged": False, "checked": False, "message": message, "reason": str(e)}
        fits = {}
    if subs is not None:
        bud = budget_check(subs, config, n_target, unc["sd_query"])
        fits = curvefit.extrapolate(subs, k, n_target)
    homog = predict.per_query_ap(estimators.homogeneous(scores), n_target, k, fixed, scores).mean()
    drift = drift_check(config, n_target, tuple(opts["blocks"]))

    mask = scores.mask
    summary = [bud["message"]] if not bud["converged"] else []
    unfitted = int(np.sum(~hardness.info.get("fitted", True)))  # tail-aware estimators only
    if unfitted:
        summary.append(
            f"TAIL NOT FITTED for {unfitted} of {scores.num_queries} queries (no stored score "
            "above the threshold: ties or too few scores); their positives are priced by counts"
        )
    shallow = _shallow_tail(hardness, scores.n_sample, n_target)
    if shallow:
        summary.append(shallow)
    summary += _model_sensitive(unc, k)
    raised, note = _raised_thresholds(hardness)
    if note:
        summary.append(note)
    if drift.get("flag"):
        summary.append(
            f"DRIFT: block predictions differ beyond sampling noise (p = {drift['p_value']:.1e}); "
            "the sample is not uniform, the law's prediction is not reliable"
        )
    summary.append(
        f"mAP@{k} at N = {n_target:,}: {points[0]:.4f}, 90% CI [{unc['ci90'][0]:.4f}, "
        f"{unc['ci90'][1]:.4f}] ({unc['ci_method']} bootstrap, widened by the tail model's "
        f"sensitivity to its threshold, {unc['threshold_deviation']:.4f}, and to the prior on its "
        f"shape, {unc['prior_deviation']:.4f})"
    )
    return {
        "ci90": unc["ci90"],
        "ci95": unc["ci95"],
        "uncertainty": unc,
        "curve": {
            "n": grid.tolist(),
            "map": points[1:].tolist(),
            "ci90": [b["ci90"] for b in bands],
            **({} if nested is None else {"sd_distractor": [b["sd_distractor"] for b in bands]}),
        },
        "other_metrics": other_metrics(hardness, fixed, n_target, k),
        "baselines": {**result.get("baselines", {}), "homogeneous": float(homog), **fits},
        "diagnostics": {
            "summary": summary,
            "budget": bud,
            "drift": drift,
            "share_tail_priced": float(hardness.tail_priced[mask].mean()),
            "share_threshold_raised": raised,
        },
    }


def plot_curve(path: str | os.PathLike, result: dict) -> None:
    """Writes a PNG of the predicted mAP@k curve with its 90% band and the target point."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curve = result["curve"]
    band = np.asarray(curve["ci90"])
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.fill_between(curve["n"], band[:, 0], band[:, 1], alpha=0.25, label="90% band")
    ax.plot(curve["n"], curve["map"], "-", label=f"{result['estimator']} (predicted)")
    lo, hi = result["ci90"]
    err = [[result["map"] - lo], [hi - result["map"]]]
    ax.errorbar([result["n_target"]], [result["map"]], err, fmt="ko", capsize=3, label="target N")
    ax.axvline(result["n_sample"], color="grey", ls=":", label="sample size S")
    ax.set_xscale("log")
    ax.set_xlabel("gallery size N (distractors)")
    ax.set_ylabel(f"mAP@{result['k']}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    atomic.save_figure(fig, path)
    plt.close(fig)
