"""Comparing two systems evaluated on the same queries: is A better than B at gallery size N?

The queries are shared, so the comparison is paired (paper App. C, ranking resolution): the
bootstrap resamples queries once per replicate and takes the mean AP difference of the two
systems on the same resample, which cancels the between-query variance both share. When the
systems' distractor-sample noise is known (nested bootstrap sds), it is added in quadrature:
the two samples are independent given the queries. When the tail model's sensitivities of the
difference are given (`paired_deviation`: how far A - B moves when both estimates are rerun at
other tail thresholds, and under other priors on the tail shape), they are added too, as
`bootstrap.intervals` adds a single system's.

Reported: the difference and its intervals, P(A beats B) (the share of replicates with a
positive difference), and the smallest margin the sample can resolve: the difference at which
the 90% interval would just exclude 0, i.e. z_0.95 times the difference's sd.

From two predict jobs' prediction.json files (`predictions`, or the command):
  python launch.py --config=configs/compare.py --config.a=A/prediction.json \
      --config.b=B/prediction.json --workdir=DIR
writes DIR/comparison.json. Either may instead be a hardness artifact (`A/hardness.npz`, which
the predict job writes beside its prediction): it is predicted at `--config.n_target` and
`--config.k` first (`artifact.prediction`, with the same interval terms), so two systems can be
compared at any N without their scores.
"""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging
from scipy import stats

from tailaware.io import atomic
from tailaware.protocol import bootstrap


def paired(
    aps_a,
    aps_b,
    num_replicates: int = 1000,
    seed: int = 0,
    sd_distractor_a: float = 0.0,
    sd_distractor_b: float = 0.0,
    deviation: float = 0.0,
    prior_deviation: float = 0.0,
) -> dict:
    """Returns the paired-bootstrap comparison of systems A and B on the same queries.

    Args:
      aps_a, aps_b: [Q] per-query AP@k of each system at the target N (same query order).
      num_replicates: B.
      seed: PRNG seed.
      sd_distractor_a, sd_distractor_b: distractor-sample sds of each system's mAP (nested
        bootstrap), added in quadrature; 0 for query noise alone.
      deviation: the difference's threshold sensitivity (`paired_deviation`), added in
        quadrature as a normal error of sd `bootstrap.THRESHOLD_SD` x deviation.
      prior_deviation: the difference's sensitivity to the prior on the tail shape
        (`paired_deviation` of the prior reruns), sd `bootstrap.PRIOR_SD` x prior_deviation.

    Returns:
      {"difference", "ci90", "ci95", "sd", "p_a_beats_b", "resolvable_margin", "resolved"}.
    """
    a = np.asarray(aps_a, np.float64)
    b = np.asarray(aps_b, np.float64)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"need two [Q] vectors over the same queries, got {a.shape}, {b.shape}")
    diff = a - b
    reps = bootstrap.query_bootstrap(diff, num_replicates, seed)  # [B]
    sd_model = np.hypot(
        bootstrap.THRESHOLD_SD * float(deviation), bootstrap.PRIOR_SD * float(prior_deviation)
    )
    extra = float(np.sqrt(sd_distractor_a**2 + sd_distractor_b**2 + sd_model**2))
    if extra > 0:
        noise = jax.random.normal(jax.random.key(seed + 1), reps.shape, jnp.float32)
        reps = reps + extra * np.asarray(jax.device_get(noise), np.float64)
    point = float(diff.mean())
    sd = float(np.std(reps, ddof=1))
    out = {"difference": point, "sd": sd}
    for level in bootstrap.LEVELS:
        lo, hi = bootstrap.percentile_interval(reps, level)
        out[f"ci{int(round(level * 100))}"] = bootstrap.in_range(lo, hi, low=-1.0)
    out["p_a_beats_b"] = float(np.mean(reps > 0))
    out["resolvable_margin"] = float(stats.norm.ppf(0.95) * sd)
    out["resolved"] = bool(out["ci90"][0] > 0 or out["ci90"][1] < 0)
    return out


def paired_deviation(prediction_a: dict, prediction_b: dict, field="threshold_maps") -> float:
    """Returns how far the difference A - B moves when both tails' thresholds (or priors) do.

    From two prediction.json dicts (`map` and `uncertainty.threshold_maps`: each estimate rerun
    with half and twice the excesses): the larger of |(A_r - B_r) - (A - B)| over the two
    reruns r. A shift that moves both systems alike cancels. 0 when either has no reruns (an
    estimator without a tail model). `field="prior_maps"` pairs the reruns under a flatter and a
    steeper prior on the tail shape the same way.
    """
    maps = [p.get("uncertainty", {}).get(field) for p in (prediction_a, prediction_b)]
    if any(m is None for m in maps):
        return 0.0
    moves = [
        np.asarray(m, np.float64) - p["map"]
        for m, p in zip(maps, (prediction_a, prediction_b), strict=True)
    ]
    return float(np.max(np.abs(moves[0] - moves[1])))


def predictions(prediction_a: dict, prediction_b: dict, num_replicates=1000, seed=0) -> dict:
    """Returns `paired` on two predict jobs' outputs (prediction.json dicts), with every term.

    The per-query AP, the distractor-sample sds (`uncertainty.sd_distractor`, when the nested
    bootstrap ran) and the difference's threshold and prior sensitivities (`paired_deviation`)
    come from the predictions. They must be of the same queries in the same order (`query_ids`,
    when both have them), at the same N and k.

    Raises:
      ValueError: naming the field in which the two predictions disagree.
    """
    a, b = prediction_a, prediction_b
    for field in ("n_target", "k", "per_query_ap"):
        if field not in a or field not in b:
            raise ValueError(
                f"field {field!r}: missing from prediction {'a' if field not in a else 'b'}"
            )
    for field in ("n_target", "k"):
        if a[field] != b[field]:
            raise ValueError(
                f"field {field!r}: {a[field]} in a, {b[field]} in b; compare at one N and k"
            )
    if len(a["per_query_ap"]) != len(b["per_query_ap"]):
        raise ValueError(
            f"field 'per_query_ap': {len(a['per_query_ap'])} queries in a, "
            f"{len(b['per_query_ap'])} in b; a paired comparison needs the same queries"
        )
    ids_a, ids_b = a.get("query_ids"), b.get("query_ids")
    if ids_a is not None and ids_b is not None and list(ids_a) != list(ids_b):
        first = next(i for i, (x, y) in enumerate(zip(ids_a, ids_b, strict=True)) if x != y)
        raise ValueError(
            f"field 'query_ids': query {first} is {ids_a[first]!r} in a, {ids_b[first]!r} in b; "
            "a paired comparison needs the same queries in the same order"
        )
    sd = lambda p: float(p.get("uncertainty", {}).get("sd_distractor", 0.0))
    dev, dev_prior = paired_deviation(a, b), paired_deviation(a, b, "prior_maps")
    out = paired(
        a["per_query_ap"], b["per_query_ap"], num_replicates, seed, sd(a), sd(b), dev, dev_prior
    )
    out["threshold_deviation"] = dev
    out["prior_deviation"] = dev_prior
    return {"n_target": a["n_target"], "k": a["k"], "map_a": a["map"], "map_b": b["map"], **out}


def _read(path: str, config) -> dict:
    """Returns the prediction.json at `path`, or a hardness artifact's prediction at
    `config.n_target` and `config.k` (a `.npz` path)."""
    if str(path).endswith(".npz"):
        from tailaware.io import artifact  # it builds on predict and protocol

        n_target = int(config.get("n_target", 0))
        if n_target < 1:
            raise ValueError(
                f"{path}: a hardness artifact needs --config.n_target, the N to compare at"
            )
        return artifact.prediction(artifact.load(path), config, n_target, str(path))
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: not a readable prediction.json ({e})") from e


def run(config, workdir: str) -> None:
    """The compare job: reads `config.a` and `config.b` (prediction.json or hardness artifact),
    writes `workdir/comparison.json`."""
    preds = []
    for name in ("a", "b"):
        path = config[name]
        if not path:
            raise ValueError(
                f"--config.{name} must name a prediction.json or hardness.npz (the predict job's)"
            )
        preds.append(_read(path, config))
    try:
        out = predictions(*preds, int(config.replicates), int(config.seed))
    except ValueError as e:
        raise ValueError(f"{config.a} vs {config.b}: {e}") from e
    out["a"], out["b"] = os.path.abspath(config.a), os.path.abspath(config.b)
    os.makedirs(workdir, exist_ok=True)
    atomic.write_json(os.path.join(workdir, "comparison.json"), out)
    lo, hi = out["ci90"]
    logging.info(
        "mAP@%d at N = %s: A - B = %+.4f, 90%% CI [%+.4f, %+.4f], P(A > B) = %.3f, resolvable "
        "margin %.4f%s",
        out["k"],
        f"{out['n_target']:,}",
        out["difference"],
        lo,
        hi,
        out["p_a_beats_b"],
        out["resolvable_margin"],
        "" if out["resolved"] else " (not resolved)",
    )
