"""The identifiability floors' building blocks against brute force: the law cut lower, its
samples' total variation, the fixed gallery's cut and the floor's per-query maximum."""

import numpy as np
import pytest

from tailaware.core import metrics
from tailaware.io.scores import SCORE_BOUND, make_scores
from tailaware.protocol import floors, validation
from tailaware.sim import simulate

P_CUT = 0.01  # mass above the lower cut in the law tests
DRAWS = 20_000  # Monte Carlo samples; the tolerances below are ~4 binomial sds


def test_truncnorm_cut_lower_is_the_lower_cut_hardness_and_gap():
    # Cutting a truncated Gaussian lower is again a truncated Gaussian: its hardness from the
    # survival function must be `cut_below`'s, and `law_gaps` the E[AP] difference it gives.
    bench = simulate.make_benchmark(30, 1_000_000, "truncnorm", seed=3, x_range=(1e-6, 0.1))
    lw = bench.law
    t = simulate.inverse_survival(lw, "truncnorm", np.full((30, 1), P_CUT))[:, 0]
    c_new = (t - lw["mu"]) / lw["sd"]
    lower = simulate.with_law(bench, dict(lw, c=c_new, e=t))
    x_cut = floors.cut_below(bench.x, P_CUT)
    np.testing.assert_allclose(np.where(bench.mask, x_cut, 0.0), lower.x, rtol=1e-6, atol=1e-12)
    assert ((x_cut == 0) & bench.mask & (bench.x > 0)).any()  # some positives become immune
    ap, gaps, masses = floors.law_gaps(bench, 100, cuts=[0.0, P_CUT * bench.n_pool])
    np.testing.assert_allclose(masses, [0.0, P_CUT])
    np.testing.assert_array_equal(gaps[0], 0.0)
    want = validation.expected_aps(lower, 100) - validation.expected_aps(bench, 100)
    np.testing.assert_allclose(gaps[1], want, atol=2e-6)
    assert (gaps[1] >= -1e-6).all() and gaps[1].max() > 0.1


def test_samples_of_a_law_and_of_its_lower_cut_differ_by_the_hit_probability():
    # S scores drawn from a gpd law: the share of samples with a score above the cut is
    # 1 - (1 - p)^S, and the scores of the other samples are distributed as under the cut law.
    bench = simulate.make_benchmark(1, 1_000_000, "gpd", seed=0)
    s = 40
    rng = np.random.default_rng(0)
    scores = simulate.inverse_survival(bench.law, "gpd", rng.uniform(size=(1, DRAWS * s)))
    scores = scores.reshape(DRAWS, s)
    t = simulate.inverse_survival(bench.law, "gpd", np.full((1, 1), P_CUT))[0, 0]
    hit = (scores > t).any(axis=1)
    want = floors.hit_probability(P_CUT, s)
    assert abs(hit.mean() - want) < 4 * np.sqrt(want * (1 - want) / DRAWS)
    # Given no hit, the sample's survival at a few scores is the cut law's.
    kept = scores[~hit].ravel()
    at = simulate.inverse_survival(bench.law, "gpd", np.asarray([[0.02, 0.05, 0.2, 0.6]]))
    g_cut = floors.cut_below(simulate.survival(bench.law, "gpd", at), P_CUT)[0]
    seen = (kept[:, None] > at[0][None, :]).mean(axis=0)
    np.testing.assert_allclose(seen, g_cut, atol=4 * np.sqrt(0.25 / kept.size))


def _gallery(rng, q=6, d=400, p=4, n_fixed=30):
    """A dense gallery of cosine-like scores: distractors, other instances' (fixed) items, and
    positives mostly above them."""
    dis = np.clip(rng.normal(0.0, 0.25, (q, d)), -0.99, 0.99)
    fixed = np.clip(rng.normal(0.12, 0.25, (q, n_fixed)), -0.99, 0.99)
    pos = np.clip(rng.normal(0.55, 0.18, (q, p)), -0.99, 0.99)
    return dis.astype(np.float32), fixed.astype(np.float32), pos.astype(np.float32)


def _sample(dis, fixed_items, pos, kept, m_stored):
    """The sampled-scores file of the distractors `kept` [D] (all stored: S <= m_stored)."""
    tail = np.full((dis.shape[0], m_stored), -np.inf)
    tail[:, : kept.sum()] = -np.sort(-dis[:, kept], axis=1)
    counts = (dis[:, None, kept] > pos[:, :, None]).sum(axis=2)
    fixed = (fixed_items[:, None, :] > pos[:, :, None]).sum(axis=2)
    return make_scores(tail, pos, counts, int(kept.sum()), fixed_counts=fixed)


def test_gallery_cut_moves_the_top_distractors_below_everything():
    rng = np.random.default_rng(1)
    dis, fixed_items, pos = _gallery(rng)
    q, p, k = pos.shape[0], pos.shape[1], 20
    mask = np.ones((q, p), bool)
    counts = (dis[:, None, :] > pos[:, :, None]).sum(axis=2)
    fixed = (fixed_items[:, None, :] > pos[:, :, None]).sum(axis=2)
    ap, gaps, moved = floors.gallery_gaps(counts, fixed, k, cuts=[0, 1, 2, 3, 5, 8, 13, 40])
    assert counts.max() >= 13
    relevant = np.concatenate([np.zeros_like(dis, bool), np.zeros_like(fixed_items, bool), mask], 1)
    for row, m in zip(gaps, moved, strict=True):
        cut = dis.copy()
        top = np.argsort(-dis, axis=1)[:, :m]
        np.put_along_axis(cut, top, -100.0, axis=1)  # below every positive and every other item
        dense = np.concatenate([cut, fixed_items, pos], axis=1)
        np.testing.assert_allclose(row, metrics.ilias_map_at_k(dense, relevant, k)[1] - ap)
    np.testing.assert_array_equal(gaps[0], 0.0)
    assert gaps[-1].max() > 0.3

    # The sample of the cut gallery, from the sample of the gallery and its top scores.
    m = np.asarray([0, 1, 3, 8, 13, 2])
    cut = dis.copy()
    for i, mi in enumerate(m):
        cut[i, np.argsort(-dis[i])[:mi]] = -SCORE_BOUND
    kept = rng.uniform(size=dis.shape[1]) < 0.1
    want = _sample(cut, fixed_items, pos, kept, 64)
    got = floors.cut_sample(_sample(dis, fixed_items, pos, kept, 64), -np.sort(-dis, 1), m)
    np.testing.assert_array_equal(got.tail_scores, want.tail_scores)
    np.testing.assert_array_equal(got.pos_counts, want.pos_counts)
    assert (got.pos_counts < _sample(dis, fixed_items, pos, kept, 64).pos_counts).any()

    # An id sample (each distractor kept with probability f): the query's sampled scores under
    # the two galleries coincide exactly when no moved id is drawn, which has the hit
    # probability of f over m trials.
    f, m = 0.05, 8
    top = np.argsort(-dis[0])[:m]
    cut = dis[0].copy()
    cut[top] = -100.0
    kept = rng.uniform(size=(DRAWS, dis.shape[1])) < f
    same = np.asarray([np.array_equal(np.sort(dis[0][r]), np.sort(cut[r])) for r in kept])
    np.testing.assert_array_equal(same, ~kept[:, top].any(axis=1))
    want = floors.hit_probability(f, m)
    assert abs((~same).mean() - want) < 4 * np.sqrt(want * (1 - want) / DRAWS)


def test_floor_takes_each_querys_best_cut_and_no_cut_when_none_helps():
    gaps = np.asarray([[0.0, 0.0, 0.0], [0.5, 0.1, 0.2], [0.9, 0.2, 0.3]])  # [C, Q]
    tvs = np.asarray([0.0, 0.3, 0.5])[:, None]
    np.testing.assert_allclose(floors.margins(gaps, tvs), [0.4, 0.0, 0.0])
    np.testing.assert_array_equal(floors.best_cuts(gaps, tvs, [0, 5, 9]), [9, 0, 0])
    np.testing.assert_array_equal(floors.best_cuts(gaps[1:], tvs[1:], [5, 9]), [9, 0, 0])
    assert floors.floor(gaps, tvs) == pytest.approx(0.4 / 3 / 2)
    assert floors.floor(gaps[1:], tvs[1:]) == floors.floor(gaps, tvs)  # never below 0
    np.testing.assert_allclose(floors.hit_probability(0.5, [0, 1, 3]), [0.0, 0.5, 0.875])
