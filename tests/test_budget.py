"""Sub-sample convergence and drift: thinning is uniform; the checks flag what they should."""

import numpy as np
import pytest

from tailaware.core import design, evaluate, sampling
from tailaware.io.errors import InputError
from tailaware.io.scores import make_scores
from tailaware.protocol import budget
from tailaware.sim import simulate
from tailaware.tail import estimators

Q = 200


@pytest.fixture(scope="module")
def bench():
    return simulate.make_benchmark(Q, 10**7, x_range=(1e-6, 0.05), seed=0)


def test_thin_is_a_uniform_subsample(bench):
    # Thinning a 2% sample by 1/4 has the law of a 0.5% sample: compare with direct draws.
    rng = np.random.default_rng(1)
    big = simulate.draw(bench, 0.02, 400, seed=2).scores
    small = budget.thin(big, 0.25, rng)
    direct = simulate.draw(bench, 0.005, 100, seed=3).scores
    assert abs(small.n_sample / direct.n_sample - 1.0) < 0.02
    assert small.tail_scores.shape[1] >= 60  # about a quarter of the stored scores survive
    m = bench.mask
    for a, b in ((small.pos_counts[m].sum(), direct.pos_counts[m].sum()),):
        assert abs(a / b - 1.0) < 0.05
    # The thinned tail's top score matches the direct sample's in distribution (same S).
    np.testing.assert_allclose(
        np.median(small.tail_scores[:, 0]), np.median(direct.tail_scores[:, 0]), atol=0.01
    )


def test_thin_with_ids_is_the_gallery_subsample_by_brute_force():
    # A file that names its distractors thins by one coin per distractor: the result is the
    # sample the gallery would give for the kept distractors, scored from scratch.
    rng = np.random.default_rng(7)
    q, s = 30, 500
    scores = np.tanh(rng.standard_normal((q, s)) * 0.3)
    pos = np.tanh(rng.standard_normal((q, 4)) * 0.3 + 0.6)
    order = np.argsort(-scores, axis=1, kind="stable")
    counts = (scores[:, None, :] > pos[:, :, None]).sum(axis=2)
    sc = make_scores(np.take_along_axis(scores, order, 1), pos, counts, s, tail_ids=order)
    small = budget.thin(sc, 0.5, np.random.default_rng(8))
    kept = np.unique(small.tail_ids[small.tail_ids >= 0])
    assert small.n_sample == kept.size and 200 < kept.size < 300
    sub = scores[:, kept]
    want = np.take_along_axis(sub, np.argsort(-sub, axis=1, kind="stable"), 1)
    np.testing.assert_array_equal(small.tail_scores, want.astype(np.float32))
    assert all(set(row) == set(kept) for row in small.tail_ids)
    np.testing.assert_array_equal(small.pos_counts, (sub[:, None, :] > pos[:, :, None]).sum(2))


def test_nested_subsamples_are_nested(bench):
    sc = simulate.draw(bench, 0.02, 400, seed=4).scores
    subs = budget.nested_subsamples(sc, 3, seed=5)
    sizes = [s.n_sample for s in subs]
    assert sizes[-1] == sc.n_sample
    assert all(b / a == pytest.approx(2, rel=0.1) for a, b in zip(sizes, sizes[1:], strict=False))
    for a, b in zip(subs, subs[1:], strict=False):
        assert (a.pos_counts <= b.pos_counts).all()


def test_subsample_sd_is_the_rule_written_out():
    # var(S) ~ mean_i(move_i^2 / 2^i), move_0 the last halving (S / 2 -> S); over any trailing axes.
    rng = np.random.default_rng(12)
    preds = rng.normal(0.3, 0.01, (4, 3, 2))  # [L + 1, G, M]
    want = np.zeros((3, 2))
    for g in range(3):
        for m in range(2):
            p = preds[:, g, m]
            moves = [p[3] - p[2], p[2] - p[1], p[1] - p[0]]
            want[g, m] = np.sqrt(np.mean([d * d / 2.0**i for i, d in enumerate(moves)]))
    np.testing.assert_allclose(budget.subsample_sd(preds), want, rtol=1e-12)
    np.testing.assert_array_equal(budget.subsample_sd(preds[:1]), np.zeros((3, 2)))


def test_subsample_sd_reads_the_sampling_sd_of_a_mean():
    # An estimator of known sampling sd, the mean of S unit normals (sd 1 / sqrt(S)), on nested
    # halvings S / 8 .. S: the rule's variance averages to 1 / S (an unbiased read).
    rng = np.random.default_rng(13)
    s, reads = 4096, []
    for _ in range(2000):
        x = rng.standard_normal(s)
        reads.append(budget.subsample_sd(np.array([x[: s >> i].mean() for i in (3, 2, 1, 0)])))
    assert np.mean(np.square(reads)) * s == pytest.approx(1.0, abs=0.05)


def test_verdict():
    ok = budget.verdict([1, 2, 4, 8], [0.60, 0.55, 0.53, 0.525], noise=0.01)
    assert ok.converged and ok.needed_sample is None
    # Moves halving each doubling: 0.04 -> 0.02 needs two more doublings to reach 0.005.
    short = budget.verdict([1, 2, 4, 8], [0.70, 0.62, 0.58, 0.56], noise=0.005)
    assert not short.converged and short.needed_sample == 32
    assert short.message.startswith("SAMPLE TOO SMALL")
    flat = budget.verdict([1, 2, 4, 8], [0.70, 0.66, 0.62, 0.58], noise=0.005)
    assert flat.needed_sample is None and "at least 32" in flat.message
    # One query (or equal APs): the query bootstrap has no spread; no advice, and no crash.
    alone = budget.verdict([1, 2, 4, 8], [0.5, 0.4, 0.35, 0.33], noise=0.0)
    assert not alone.converged and alone.needed_sample is None
    assert "no query noise" in alone.message and "at least 32" in alone.message


def _block_aps(blocks):
    return np.stack(
        [evaluate.per_query_ap(estimators.count(b), 1e5, 100, b.fixed_counts) for b in blocks]
    )


def test_drift_flags_a_shifted_block_only(bench):
    blocks = [simulate.draw(bench, 0.005, 100, seed=10 + i).scores for i in range(4)]
    clean = budget.drift(_block_aps(blocks))
    assert not clean.flag and clean.dof == 3
    # A convenience block: its distractors come from a harder law (endpoint moved up).
    hard = simulate.with_law(bench, dict(bench.law, e=bench.law["e"] + 0.05))
    blocks[0] = simulate.draw(hard, 0.005, 100, seed=20).scores
    assert budget.drift(_block_aps(blocks)).flag


def test_drift_null_calibration():
    # Under the null (blocks = noisy copies of one truth) p-values are roughly uniform.
    rng = np.random.default_rng(0)
    ps = [
        budget.drift(rng.uniform(size=Q) + 0.1 * rng.standard_normal((5, Q))).p_value
        for _ in range(300)
    ]
    assert 0.005 < np.mean(np.asarray(ps) < 0.05) < 0.1


def test_hash_membership():
    ids = [f"tar{i // 100:04d}/{i:06d}" for i in range(5000)]
    uniform = [i for i, keep in zip(ids, sampling.in_sample(ids, 0.1, 3), strict=True) if keep]
    assert budget.hash_membership(uniform, 0.1, 3)["uniform"]
    curated = ids[:500]
    got = budget.hash_membership(curated, 0.1, 3)
    assert not got["uniform"] and got["share_in_hash_sample"] < 0.2


def test_a_sample_below_the_floor_is_refused_naming_the_smallest_fraction():
    # The case: 0.0001 of a 200k folder samples ~20 distractors.
    with pytest.raises(InputError) as e:
        budget.require_sample(0.0001, 200_000)
    assert str(e.value) == (
        "--config.sample_fraction=0.0001: samples ~20 of 200,000 distractors; the interval's "
        f"coverage is established from S = {budget.MIN_SAMPLE:,} sampled distractors on "
        f"(docs/validation.md); raise it to at least {budget.MIN_SAMPLE / 200_000:g}, or set "
        "--config.min_sample=0 to predict anyway"
    )
    budget.require_sample(budget.MIN_SAMPLE / 200_000, 200_000)  # at the floor: accepted
    budget.require_sample(1.0, 600)  # exact: no interval, no floor
    budget.require_sample(0.5, 600, min_sample=0)
    with pytest.raises(InputError, match=r"samples ~300 of 600 .* use 1\.0 \(exact\), or set"):
        budget.require_sample(0.5, 600)
    # The fraction it names reaches the floor, rounded up to two significant digits.
    for n in (123_457, 300_000, 10_001, 5_000_000_000):
        with pytest.raises(InputError) as e:
            budget.require_sample(1e-7, n)
        least = float(str(e.value).split("at least ")[1].split(",")[0])
        assert least * n >= budget.MIN_SAMPLE
        assert (least - 10 ** (np.floor(np.log10(least)) - 1)) * n < budget.MIN_SAMPLE


def test_a_census_designs_own_sample_is_held_to_the_floor():
    # 200 queries' proxy lists over 300,000 items: at 5% the budget (15,000) clears the floor,
    # but the census takes up to half of it and the tail is fitted to the rest's rate alone.
    rng = np.random.default_rng(0)
    n, queries = 300_000, 200
    lists = [rng.choice(n, size=(queries, 1000), replace=True)]
    best = design.best_ranks(lists, n)
    priority = design.fused(lists, n)

    def plan(f):
        return design.plan(best, f, queries=queries, max_depth=1000, priority=priority)

    d = plan(0.05)
    assert d.n_census > 0 and d.inclusion * n < budget.MIN_SAMPLE <= 0.05 * n
    budget.require_sample(0.05, n)  # the budget alone passes
    with pytest.raises(InputError) as e:
        budget.require_census_sample(0.05, d.inclusion, d.n_census, n, 0.5)
    msg = str(e.value)
    assert msg.startswith(
        f"--config.sample_fraction=0.05 with --config.proxy: the census takes {d.n_census:,} of "
        "the ~15,000 embedded distractors"
    )
    assert msg.endswith("or set --config.min_sample=0 to predict anyway")
    # The fraction it names, planned again by the same rule, fits the tail to the floor or more.
    least = float(msg.split("at least ")[1].split(" ")[0])
    again = plan(least)
    assert again.inclusion * n >= budget.MIN_SAMPLE
    budget.require_census_sample(least, again.inclusion, again.n_census, n, 0.5)
    # A fixed census of the same size at that fraction reaches it too.
    fixed_rate = (least * n - d.n_census) / (n - d.n_census)
    assert fixed_rate * n >= budget.MIN_SAMPLE
    budget.require_census_sample(0.05, d.inclusion, d.n_census, n, 0.5, min_sample=0)
