"""The simulator: its laws invert, and a draw has the law of a uniform subset of a pool."""

import numpy as np
import pytest
from scipy import stats

from tailaware.core import metrics
from tailaware.sim import simulate

Q = 200


@pytest.mark.parametrize("family", simulate.FAMILIES)
def test_survival_inverts(family):
    bench = simulate.make_benchmark(20, family=family, seed=0)
    # Down to 1e-10: below it a uniform-like edge (beta = 1) has no float64 scores left.
    u = np.geomspace(1e-10, 0.99, 30)[None].repeat(20, 0)
    s = simulate.inverse_survival(bench.law, family, u)
    np.testing.assert_allclose(simulate.survival(bench.law, family, s), u, rtol=1e-6)
    assert (np.diff(s, axis=1) < 0).all()  # survival decreasing in the score
    # Positives carry their hardness: G(s_j) = x_j, and immune ones sit above the endpoint.
    x = simulate.survival(bench.law, family, np.where(bench.mask, bench.pos_scores, 0.0))
    np.testing.assert_allclose(x[bench.mask], bench.x[bench.mask], rtol=1e-6, atol=1e-300)
    endpoint = np.broadcast_to(bench.law["e"][:, None], bench.x.shape)
    above = bench.mask & (bench.pos_scores > endpoint)
    assert above.any()
    if family in simulate.BOUNDED:  # immune: exactly the positives above the endpoint
        np.testing.assert_array_equal(above, bench.mask & (bench.x == 0))
    else:  # no endpoint: the positives placed above `e` keep a tiny hardness
        assert (bench.x[above] > 0).all() and (bench.x[above] < 1e-4).all()


def test_truncnorm_is_scipys_and_a_higher_cut_conditioned_below_is_the_lower_one():
    # The premise of benchmarks/identifiability.py: the law cut at c' > c, conditioned on
    # scores below the cut at c, is the cut-at-c law; the higher cut puts mass p above c.
    bench = simulate.make_benchmark(20, family="truncnorm", seed=0)
    lw = bench.law
    z = np.linspace(-3.0, 7.5, 40)[None]
    s = lw["mu"][:, None] + lw["sd"][:, None] * z
    ref = stats.truncnorm.sf(z, -lw["c_lo"][:, None], lw["c"][:, None])
    np.testing.assert_allclose(simulate.survival(lw, "truncnorm", s), ref, rtol=1e-6, atol=1e-15)
    c_hi = lw["c"] + 1.5
    higher = dict(lw, c=c_hi, e=lw["mu"] + c_hi * lw["sd"])
    g_hi = simulate.survival(higher, "truncnorm", s)
    p = stats.truncnorm.sf(lw["c"], -lw["c_lo"], c_hi)[:, None]
    below = s <= lw["e"][:, None]
    conditioned = (g_hi - p) / (1.0 - p)
    g = simulate.survival(lw, "truncnorm", s)
    np.testing.assert_allclose(conditioned[below], g[below], rtol=1e-6, atol=1e-15)
    between = ~below & (s < higher["e"][:, None])  # above the lower cut, below the higher
    assert between.any() and (g_hi[between] > 0).all() and (g[~below] == 0).all()


@pytest.mark.parametrize("family", ["kumaraswamy", "truncnorm", "normal"])
def test_second_system_is_paired_and_consistent(family):
    a = simulate.make_benchmark(400, family=family, seed=0)
    b = simulate.second_system(a, seed=1, shift=0.3, spread=0.5)
    np.testing.assert_array_equal(b.mask, a.mask)
    assert not np.allclose(b.law["e"], a.law["e"])  # a distractor law of its own
    # Its positives carry its hardness under its own law; immune ones sit above its endpoint.
    x = simulate.survival(b.law, family, np.where(b.mask, b.pos_scores, 0.0))
    np.testing.assert_allclose(x[b.mask], b.x[b.mask], rtol=1e-6, atol=1e-300)
    assert (np.diff(np.where(b.mask, b.x, 2.0), axis=1) >= 0).all()  # sorted by hardness
    if family in simulate.BOUNDED:
        immune = b.mask & (b.x == 0)
        np.testing.assert_array_equal(immune, a.mask & (a.x == 0))
        assert (
            b.pos_scores[immune] > np.broadcast_to(b.law["e"][:, None], b.x.shape)[immune]
        ).all()
    # Paired: hardness correlated with the first system's, harder by the shift on average.
    both = a.mask & (a.x > 1e-12) & (b.x > 1e-12)
    la, lb = np.log(a.x[both]), np.log(b.x[both])
    assert np.corrcoef(la, lb)[0, 1] > 0.8
    assert np.median(lb - la) == pytest.approx(0.3, abs=0.15)


@pytest.mark.parametrize("family", simulate.FAMILIES)
def test_draw_matches_brute_force_law(family):
    # A small pool drawn literally (N uniforms, a uniform S-subset) against the simulator: the
    # counts, the truth and the stored tail must have the same distribution.
    n, f, m = 10_000, 0.1, 50
    bench = simulate.make_benchmark(Q, n, family, x_range=(1e-4, 0.05), seed=1)
    d = simulate.draw(bench, f, m, seed=2)
    s = d.scores.n_sample
    assert s == 1000 and d.scores.tail_scores.shape == (Q, m)

    rng = np.random.default_rng(3)
    u = rng.uniform(size=(Q, n))
    sampled = u[:, :s]  # the first S of iid uniforms are a uniform subset
    x = bench.x
    brute_counts = (sampled[:, None, :] < x[:, :, None]).sum(axis=2)
    brute_truth = (u[:, None, :] < x[:, :, None]).sum(axis=2)
    brute_uM = np.sort(sampled, axis=1)[:, m - 1]

    mask = bench.mask
    pairs = ((d.scores.pos_counts, brute_counts, s), (d.truth_counts, brute_truth, n))
    for sim, brute, size in pairs:
        # Centred on the binomial mean per positive, the two samples share one distribution.
        z_sim, z_bru = (sim - x * size)[mask], (brute - x * size)[mask]
        assert stats.ks_2samp(z_sim, z_bru).pvalue > 1e-3
    u_m = simulate.survival(bench.law, family, d.scores.tail_scores[:, -1].astype(np.float64))
    assert stats.ks_2samp(u_m, brute_uM).pvalue > 1e-3


def test_counts_are_exact_inside_the_tail_and_nested():
    bench = simulate.make_benchmark(Q, 10**8, seed=4)
    d = simulate.draw(bench, 0.01, 200, seed=5)
    c, t, mask = d.scores.pos_counts, d.truth_counts, bench.mask
    assert ((t >= c) | ~mask).all()
    # Sorted by hardness, both count vectors are non-decreasing within a query.
    for counts in (c, t):
        diffs = np.diff(np.where(mask, counts, np.iinfo(np.int64).max), axis=1)
        assert (diffs[mask[:, 1:]] >= 0).all()
    # Immune positives are never outranked, at any size.
    assert (c[mask & (bench.x == 0)] == 0).all() and (t[mask & (bench.x == 0)] == 0).all()


def test_truth_mean_matches_the_binomial_law():
    # E[K_j] = N x_j: the realized full-pool counts average to the law's expectation.
    bench = simulate.make_benchmark(2000, 10**8, x_range=(1e-7, 1e-3), immune_share=0.0, seed=6)
    d = simulate.draw(bench, 0.05, 100, seed=7)
    m = bench.mask
    ratio = d.truth_counts[m].sum() / (bench.x[m] * bench.n_pool).sum()
    assert abs(ratio - 1.0) < 0.02
    assert metrics.map_from_counts(d.truth_counts, 1000) == pytest.approx(
        float(metrics.ap_at_k_from_counts(d.truth_counts, m, 1000).mean())
    )
