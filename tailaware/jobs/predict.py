"""The predict command: a sampled-scores file in, a predicted mAP@k at gallery size N out.

`python launch.py --config=configs/predict.py --config.scores=FILE.npz --config.n_target=N
--config.k=K --workdir=DIR` writes `DIR/prediction.json` (a public interface; README lists
its fields), its curve `DIR/prediction_curve.png` and the hardness artifact `DIR/hardness.npz`
(`tailaware.io.artifact`), and prints a table of the prediction next to the baselines. With
`--config.artifact=DIR/hardness.npz` instead of `--config.scores` it predicts from the artifact
at any N and k, with the same interval, without the scores.
"""

import functools
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging

from tailaware.core import buckets, law, metrics
from tailaware.io import atomic
from tailaware.io import scores as scores_lib
from tailaware.protocol import augment as protocol
from tailaware.tail import estimators


@functools.partial(jax.jit, static_argnames=("k",))
def _expected_map(x, mask, sizes, k, fixed, weights, counts, n_sample, table, grouping):
    def over_sizes(w):
        one = lambda n: buckets.expected_map(
            x, mask, n, k, fixed, w, counts, n_sample, table, grouping
        )
        return jax.vmap(one)(sizes)

    if weights is not None and weights.ndim == 3:  # [T, Q, A]: the atoms' E[AP] do not batch
        return jax.vmap(over_sizes)(weights)
    return over_sizes(weights)


def per_query_ap(
    hardness: estimators.Hardness,
    n,
    k: int,
    fixed: np.ndarray,
    sample=None,
    priors: bool = False,
) -> np.ndarray:
    """Returns the predicted AP@k [Q] of every query at gallery size n (float64 numpy).

    `n` may also be a 1-D array of [G] sizes (one compiled call): the result is then [G, Q].
    With `priors`, a leading axis [1 + T] holds the prediction and then the predictions under
    the estimate's other priors on the tail shape (`Hardness.prior_weights`; T = 0 without
    them), in the same pass: E[AP] is linear in the atom weights, so each atom's is computed
    once.

    The prediction is E[AP@k] under K_j ~ Poisson(n x_j) (`law.expected_map`), averaged over the
    estimator's hardness atoms when it has them; given the `sample` the hardness came from (a
    `SampledScores`, or anything with `pos_counts` and `n_sample`) and n >= S, it conditions on
    the sample's own counts (the gallery contains the sample). Queries with many more positives
    than the rest are evaluated in groups of their own width (`tailaware.core.buckets`).
    """
    mask = hardness.mask
    x = hardness.x if hardness.atoms is None else hardness.atoms
    fixed = jnp.asarray(np.where(mask, fixed, 0), jnp.float32)
    w = hardness.weights
    if priors and w is not None:
        others = () if hardness.prior_weights is None else tuple(hardness.prior_weights)
        w = np.stack([w, *others])
    w = None if w is None else jnp.asarray(w, jnp.float32)
    counts, s = jnp.zeros(mask.shape, jnp.float32), jnp.float32(np.inf)
    if sample is not None:
        counts = jnp.asarray(np.where(mask, sample.pos_counts, 0), jnp.float32)
        s = jnp.float32(sample.n_sample)
    sizes = np.asarray(n, np.float64)
    aps = _expected_map(
        jnp.asarray(x, jnp.float32),
        jnp.asarray(mask),
        jnp.asarray(np.atleast_1d(sizes), jnp.float32),
        int(k),
        fixed,
        w,
        counts,
        s,
        law.rank_table(int(k)),
        buckets.groups(mask),
    )
    aps = np.asarray(jax.device_get(aps), np.float64)
    if priors and w is None:  # a point estimate: no other priors
        aps = aps[None]
    return aps if sizes.ndim else aps[..., 0, :]


def at_sample_ap(scores: scores_lib.SampledScores, k: int) -> np.ndarray:
    """Returns the exact AP@k [Q] of the sampled gallery itself (evaluate-at-S)."""
    mask = scores.mask
    counts = np.where(mask, scores.pos_counts + scores.fixed_counts, -1)
    return metrics.ap_at_k_from_counts(counts, mask, k)


def predict(
    scores: scores_lib.SampledScores,
    config,
    n_target: int,
    hardness: estimators.Hardness | None = None,
) -> dict:
    """Returns the prediction.json fields for `config.estimator` at gallery size `n_target`.

    `hardness` is the estimate to predict from (`protocol.estimate(scores, config)` when None:
    the configured estimator with its threshold reruns, which the interval needs).
    """
    if n_target < 1:
        raise ValueError(f"n_target must be a positive gallery size, got {n_target}")
    k = int(config.k)
    if hardness is None:
        hardness = protocol.estimate(scores, config)
    aps = per_query_ap(hardness, n_target, k, scores.fixed_counts, scores)
    count_aps = per_query_ap(estimators.count(scores), n_target, k, scores.fixed_counts, scores)
    mask = scores.mask
    result = {
        "map": float(aps.mean()),
        "estimator": config.estimator,
        "n_target": int(n_target),
        "n_sample": int(scores.n_sample),
        "k": k,
        "num_queries": int(scores.num_queries),
        "per_query_ap": [float(a) for a in aps],
        "baselines": {
            "at_sample": float(at_sample_ap(scores, k).mean()),
            "count": float(count_aps.mean()),
        },
        "share_tail_priced": float(hardness.tail_priced[mask].mean()),
    }
    if scores.query_ids is not None:
        result["query_ids"] = [str(q) for q in scores.query_ids]
    # Intervals, the curve, other metrics, more baselines and the budget/drift diagnostics.
    result.update(protocol.augment(result, scores, config, n_target, hardness))
    return result


def format_table(result: dict) -> str:
    """Returns a plain-text table of a prediction and its baselines."""
    k, n = result["k"], result["n_target"]
    warnings = result.get("diagnostics", {}).get("summary", [])[:-1]
    lines = [
        *warnings,
        f"mAP@{k} at N = {n:,} from S = {result['n_sample']:,} sampled distractors "
        f"({result['num_queries']} queries)",
        f"  {'estimator':<22}{'mAP@' + str(k):>10}",
        f"  {result['estimator'] + ' (prediction)':<22}{result['map']:>10.4f}",
    ]
    if "ci90" in result:
        lo, hi = result["ci90"]
        lines[-1] += f"   90% CI [{lo:.4f}, {hi:.4f}]"
    for name, value in result["baselines"].items():
        label = {"at_sample": "evaluate-at-S", "count": "count (K/S)"}.get(name, name)
        lines.append(f"  {label:<22}{value:>10.4f}")
    return "\n".join(lines)


def write_prediction(result: dict, workdir: str) -> str:
    """Writes `workdir/prediction.json` atomically, prints the table, returns the path."""
    path = os.path.join(workdir, "prediction.json")
    atomic.write_json(path, result)
    print(format_table(result))
    logging.info("wrote %s", path)
    return path


def report(
    scores: scores_lib.SampledScores,
    config,
    n_target: int,
    workdir: str,
    extra: dict | None = None,
    metadata: dict | None = None,
) -> dict:
    """Predicts at `n_target` and writes prediction.json (with the `extra` fields), its curve
    plot and the hardness artifact `hardness.npz` (its reruns and the distractor sds included;
    `metadata` and `config.metadata`, a JSON object, join its provenance); returns the result."""
    from tailaware.io import artifact  # it builds on this module

    hardness = protocol.estimate(scores, config)
    result = {**predict(scores, config, n_target, hardness), **(extra or {})}
    metadata = {"evt": config.evt.to_dict(), **(metadata or {})}
    if config.get("metadata", ""):
        metadata.update(_metadata(config.metadata))
    art = artifact.from_hardness(
        hardness, scores, config.estimator, metadata, artifact.distractor_sd_of(result)
    )
    artifact.save(os.path.join(workdir, "hardness.npz"), art)
    write_prediction(result, workdir)
    protocol.plot_curve(os.path.join(workdir, "prediction_curve.png"), result)
    return result


def _metadata(text: str) -> dict:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"--config.metadata: not JSON ({e}): {text!r}") from e
    if not isinstance(value, dict):
        raise ValueError(f"--config.metadata: expected a JSON object, got {text!r}")
    return value


def run(config, workdir: str) -> None:
    """The predict job: reads `config.scores` (or `config.artifact`), predicts at
    `config.n_target`."""
    if bool(config.scores) == bool(config.get("artifact", "")):
        raise ValueError(
            "give exactly one of --config.scores (a sampled-scores .npz file) and "
            "--config.artifact (a hardness artifact .npz)"
        )
    if config.n_target < 1:
        raise ValueError("--config.n_target must be the target gallery size N (>= 1)")
    if config.scores:
        scores = scores_lib.load_scores(config.scores)
        report(scores, config, int(config.n_target), workdir, metadata={"scores": config.scores})
        return
    from tailaware.io import artifact

    art = artifact.load(config.artifact)
    result = artifact.prediction(art, config, int(config.n_target), str(config.artifact))
    write_prediction(result, workdir)
    protocol.plot_curve(os.path.join(workdir, "prediction_curve.png"), result)
