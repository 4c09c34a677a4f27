"""Exact metrics against literal transcriptions of the official recipes."""

import jax.numpy as jnp
import numpy as np
import pytest

from tailaware.core import metrics


def official_ilias_ap(scores, relevant, k):
    """The ILIAS recipe, transcribed literally; ties put positives first (our stated rule)."""
    order = np.lexsort((~relevant, -scores))  # descending score, positives first among ties
    retrieved = order[:k]
    gt = set(np.flatnonzero(relevant))
    hits, ap_sum = 0, 0.0
    for i, idx in enumerate(retrieved):
        if idx in gt:
            hits += 1
            ap_sum += hits / (i + 1)
    return ap_sum / min(k, len(gt))


def official_gldv2_map(predictions, solution, max_predictions=100):
    """tensorflow/models delf google_landmarks_dataset/metrics.py MeanAveragePrecision."""
    num_test_images = len(solution)
    mean_ap = 0.0
    for key, prediction in predictions.items():
        if key not in solution:
            continue
        relevant_items = solution[key]
        already_predicted = set()
        num_correct = 0
        ap = 0.0
        for i in range(min(len(prediction), max_predictions)):
            if prediction[i] not in already_predicted and prediction[i] in relevant_items:
                num_correct += 1
                ap += num_correct / (i + 1)
            already_predicted.add(prediction[i])
        ap /= min(len(relevant_items), max_predictions)
        mean_ap += ap
    return mean_ap / num_test_images


def random_problem(rng, q=12, d=300, max_pos=14, levels=40):
    # Quantised scores make ties between positives and distractors common.
    scores = np.round(rng.uniform(-1, 1, (q, d)) * levels) / levels
    n_pos = rng.integers(1, max_pos + 1, q)
    relevant = np.zeros((q, d), bool)
    for i, n in enumerate(n_pos):
        relevant[i, rng.choice(d, n, replace=False)] = True
    # Make positives somewhat better than chance so that small k matters.
    scores = np.where(relevant, np.minimum(scores + 0.5, 1.0), scores)
    return scores.astype(np.float32), relevant


@pytest.mark.parametrize("k", [1, 5, 10, 100, 1000])
@pytest.mark.parametrize("backend", ["numpy", "jax"])
def test_ilias_map_matches_official_recipe(k, backend):
    rng = np.random.default_rng(k)
    scores, relevant = random_problem(rng)
    want = np.array([official_ilias_ap(s, r, k) for s, r in zip(scores, relevant, strict=True)])
    if backend == "jax":
        got_map, got = metrics.ilias_map_at_k(jnp.asarray(scores), jnp.asarray(relevant), k)
    else:
        got_map, got = metrics.ilias_map_at_k(scores, relevant, k)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(float(got_map), want.mean(), rtol=1e-6)


def test_more_positives_than_k_uses_k_as_divisor():
    # 8 positives all ranked first, k = 5: AP = (1/5) * 5 = 1 under min(k, |gt|).
    counts = np.zeros((1, 8), np.int64)
    ap = metrics.ap_at_k_from_counts(counts, counts >= 0, 5)
    np.testing.assert_allclose(ap, [1.0])


def test_gldv2_matches_official_recipe():
    rng = np.random.default_rng(0)
    solution, predictions, rows, n_gt = {}, {}, [], []
    for qi in range(30):
        gt = {f"db{j}" for j in rng.choice(500, rng.integers(1, 150), replace=False)}
        pred = [f"db{j}" for j in rng.choice(500, rng.integers(0, 130))]  # repeats allowed
        solution[f"q{qi}"] = gt
        predictions[f"q{qi}"] = pred
        seen, row = set(), []
        for p in pred:
            row.append(p in gt and p not in seen)
            seen.add(p)
        rows.append(row + [False] * (130 - len(row)))
        n_gt.append(len(gt))
    want = official_gldv2_map(predictions, solution)
    got, _ = metrics.gldv2_map_at_k(np.array(rows), np.array(n_gt), 100)
    np.testing.assert_allclose(got, want, rtol=1e-12)


def musgrave_map_at_r(ranked):
    """MAP@R of one ranked relevance list (Musgrave et al., ECCV 2020, Sec. 3.2), literally:
    R = the number of relevant items; (1 / R) sum_{i <= R} P(i) rel(i)."""
    r = int(ranked.sum())
    total = 0.0
    for i in range(1, r + 1):
        if ranked[i - 1]:
            total += ranked[:i].sum() / i  # P(i): the precision of the top i
    return total / r


def musgrave_r_precision(ranked):
    """R-precision: relevant items among the top R, over R."""
    r = int(ranked.sum())
    return ranked[:r].sum() / r


@pytest.mark.parametrize("backend", ["numpy", "jax"])
def test_per_query_cutoff_metrics_match_brute_force(backend):
    # Sort each gallery (descending score, positives first among ties: our rule), compute
    # directly; quantised scores make ties common, and R runs from 1 to 14.
    rng = np.random.default_rng(1)
    scores, relevant = random_problem(rng, q=40, levels=30)
    ranked = [r[np.lexsort((~r, -s))] for s, r in zip(scores, relevant, strict=True)]
    want = {
        "map_at_r": [musgrave_map_at_r(r) for r in ranked],
        "r_precision": [musgrave_r_precision(r) for r in ranked],
        "top1": [float(r[0]) for r in ranked],
    }
    xp = jnp if backend == "jax" else np
    scores, relevant = xp.asarray(scores), xp.asarray(relevant)
    pos, mask = metrics.positives_from_dense(scores, relevant)
    counts = metrics.counts_from_scores(scores, relevant, xp.where(mask, pos, 0.0), mask)
    for name, values in want.items():
        for k in (1, 5, 1000):  # a per-query cut-off does not depend on k
            got = metrics.value_from_counts(metrics.get(name), counts, mask, k)
            np.testing.assert_allclose(np.asarray(got), values, rtol=1e-6, err_msg=name)


def test_recall_and_top1_match_brute_force():
    rng = np.random.default_rng(1)
    scores, relevant = random_problem(rng, levels=1000)
    pos, mask = metrics.positives_from_dense(scores, relevant)
    counts = metrics.counts_from_scores(scores, relevant, np.where(mask, pos, 0.0), mask)
    for k in (1, 7, 50):
        want = []
        for s, r in zip(scores, relevant, strict=True):
            order = np.lexsort((~r, -s))
            want.append(r[order[:k]].sum() / r.sum())
        got = metrics.value_from_counts(metrics.METRICS["recall"], counts, mask, k)
        np.testing.assert_allclose(got, want)
    top1 = [float(r[np.lexsort((~r, -s))[0]]) for s, r in zip(scores, relevant, strict=True)]
    for name, k in (("top1", 1000), ("hit", 1)):
        got = metrics.value_from_counts(metrics.get(name), counts, mask, k)
        np.testing.assert_array_equal(got, top1)


def _ranked_relevance(rng, q, d, p_rel):
    """Dense scores and ground truth; the ranked relevance lists of the official recipe."""
    scores = rng.normal(size=(q, d))
    relevant = rng.uniform(size=(q, d)) < p_rel
    relevant[:, 0] = True
    order = np.argsort(-scores, axis=1, kind="stable")
    return scores, relevant, np.take_along_axis(relevant, order, axis=1)


@pytest.mark.parametrize("k", [1, 5, 40])
def test_every_metric_matches_its_recipe_on_a_ranked_list(k):
    # Literal recipes on the ranked relevance list (independent of the rank kernel).
    rng = np.random.default_rng(3)
    scores, relevant, ranked = _ranked_relevance(rng, 30, 60, 0.08)
    n_gt = relevant.sum(axis=1)
    top = ranked[:, :k]
    hits = top.sum(axis=1)
    i = np.arange(1, k + 1)
    first = np.where(top.any(axis=1), top.argmax(axis=1) + 1, np.inf)
    ideal = np.array([(1.0 / np.log2(1 + np.arange(1, min(k, n) + 1))).sum() for n in n_gt])
    recipes = {
        "map": (np.cumsum(top, axis=1) / i * top).sum(axis=1) / np.minimum(k, n_gt),
        "recall": top.mean(axis=1) * (k / n_gt),  # ILIAS's oracle, a list of k items
        "precision": hits / k,
        "ndcg": (top / np.log2(1 + i)).sum(axis=1) / ideal,
        "hit": np.isfinite(first).astype(float),
        "mrr": np.where(np.isfinite(first), 1.0 / first, 0.0),
        "map_at_r": np.array([musgrave_map_at_r(r) for r in ranked]),
        "r_precision": np.array([musgrave_r_precision(r) for r in ranked]),
        "top1": ranked[:, 0].astype(float),
    }
    pos, mask = metrics.positives_from_dense(scores, relevant)
    counts = metrics.counts_from_scores(scores, relevant, np.where(mask, pos, 0.0), mask)
    assert set(recipes) == set(metrics.METRICS)
    for name, want in recipes.items():
        got = metrics.value_from_counts(metrics.get(name), counts, mask, k)
        np.testing.assert_allclose(got, want, rtol=1e-12, err_msg=name)
