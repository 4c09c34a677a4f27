"""A census design: similarity files, the census plan, the pooled estimator and the ILIAS job.

References are independent of the code under test: brute-force counts over every item, the
census and sample rebuilt from the id hash, the official pickle layout written by hand, and a
proxy feature folder's lists ranked by brute force.
"""

import dataclasses
import json
import os
import pickle

import numpy as np
import pytest

from tailaware.configs import compare as compare_config
from tailaware.configs import predict as predict_config
from tailaware.core import design, evaluate, sampling
from tailaware.io import errors, features, similarity
from tailaware.io import scores as scores_lib
from tailaware.jobs import compare as compare_job
from tailaware.jobs import ilias, predict
from tailaware.protocol import budget, census, nested
from tailaware.search import proxy
from tailaware.tail import estimators
from tailaware.tail.settings import TailSettings
from tests.test_ilias import SHARDS, config, make_folder

# ---------------------------------------------------------------------------------------------
# The estimator: unbiased whatever the proxy.

N, Q, P = 4000, 8, 3


def _gallery(seed: int = 0, noise: float = 0.15):
    """Returns (target scores [Q, N], positives' scores [Q, P], a weak proxy's ranks [Q, 200]):
    a few near-duplicate clusters per query that both models see, the proxy as noisy as asked."""
    rng = np.random.default_rng(seed)
    scores = rng.normal(0.0, 0.1, (Q, N))
    for q in range(Q):
        cluster = rng.choice(N, 20, replace=False)
        scores[q, cluster] += rng.uniform(0.3, 0.6, 20)
    pos = np.sort(rng.uniform(0.3, 0.6, (Q, P)), axis=1)[:, ::-1]
    proxy = scores + rng.normal(0.0, noise, scores.shape)
    ranks = np.argsort(-proxy, axis=1)[:, :200]
    return scores.astype(np.float32), pos.astype(np.float32), ranks


def _file(scores, pos, d: design.Design, ids, seed: int, m: int = 50):
    """Returns the census design's sampled-scores file built by brute force: the rest's hash
    sample at the design's rate by `seed`, each query's census items by descending score at the
    systematic sample's ranks, and the census's counts."""
    rest = np.flatnonzero(~d.census & sampling.in_sample(ids, d.inclusion, seed))
    cen = np.flatnonzero(d.census)
    ranked = cen[np.argsort(-scores[:, cen], axis=1, kind="stable")]
    picks = design.systematic_ranks(cen.size, d.inclusion)
    cols = np.concatenate(
        [np.broadcast_to(rest, (len(scores), rest.size)), ranked[:, picks - 1]], 1
    )
    s = np.take_along_axis(scores, cols, 1)
    tail = np.sort(s, axis=1)[:, ::-1][:, :m]
    cen_counts = (scores[:, d.census][:, None, :] > pos[:, :, None]).sum(-1)
    return scores_lib.make_scores(
        tail, pos, (s[:, None, :] > pos[:, :, None]).sum(-1), cols.shape[1],
        census_counts=cen_counts, n_census=d.n_census, inclusion=d.inclusion,
        drawn_counts=(picks[None, None, :] <= cen_counts[..., None]).sum(-1), n_drawn=picks.size,
    )  # fmt: skip


def _pooled(sc, x, n):
    """The law's mean outranking count of a folded file's estimate `x` at N = n: the fixed
    items, the sample's own count and the unsampled share (`law`: K = c + Poisson((N - S) x))."""
    return sc.fixed_counts + sc.pos_counts + (n - sc.n_sample) * x


@pytest.mark.parametrize("noise,fill", [(0.05, False), (0.5, False), (0.05, True)])
def test_pooled_count_is_the_gallery_count_floored_by_the_census(noise, fill):
    # The count estimator on a census design: the hash sample's count of the gallery, at least
    # the census's own count, against the same computed by hand from the hash sample over 300
    # hash seeds; and against brute-force counts over every item.
    scores, pos, ranks = _gallery(noise=noise)
    ids = np.asarray([f"item{i:05d}" for i in range(N)])
    exact = (scores[:, None, :] > pos[:, :, None]).sum(-1).astype(np.float64)
    priority = design.fused([ranks], N) if fill else None
    d = design.plan(
        design.best_ranks([ranks], N), 0.05, census_share=0.5, max_depth=200, priority=priority
    )
    assert d.depth >= 1 and 0 < d.n_census <= 0.5 * 0.05 * N
    assert d.n_census + d.inclusion * (N - d.n_census) == pytest.approx(0.05 * N)
    cen = (scores[:, d.census][:, None, :] > pos[:, :, None]).sum(-1)
    picks = design.systematic_ranks(d.n_census, d.inclusion)
    drawn = (picks[None, None, :] <= cen[..., None]).sum(-1)
    pooled, by_hand, sizes = [], [], []
    for seed in range(300):
        raw = _file(scores, pos, d, ids, seed)
        sc = census.fold(raw, N)
        pooled.append(_pooled(sc, estimators.estimate(sc, "count", TailSettings()).x, N))
        # The rest's hashed items above, plus the census's systematic ones within each
        # positive's first C_j census items.
        u = ~d.census & sampling.in_sample(ids, d.inclusion, seed)
        k = (scores[:, u][:, None, :] > pos[:, :, None]).sum(-1) + drawn
        s = u.sum() + picks.size
        by_hand.append(np.maximum(k + (N - s) * k / s, cen))
        sizes.append(s)
    pooled, by_hand = np.asarray(pooled), np.asarray(by_hand)
    np.testing.assert_allclose(pooled, by_hand, rtol=1e-6)  # float32 hardness
    # The hash count is unbiased; the census's part is its expected share rounded, at most half
    # an item of the sample short (N / S items of the gallery); the floor only raises it.
    short = np.maximum(d.inclusion * cen - drawn, 0.0) * N / np.mean(sizes)
    assert np.all(short <= 0.5 * N / np.mean(sizes) + 1e-9)
    err = pooled.mean(0) - exact
    se = pooled.std(0, ddof=1) / np.sqrt(len(pooled))
    assert np.all(err >= -4 * se - short - 1e-9), (err, se, short)
    # Both kinds of positive occur: the bound above is exercised where the rounding falls short,
    # and where it does not the expectation is held to the noise alone.
    assert np.any(short > 0) and np.any(short == 0)


def test_a_deep_census_leaves_the_rest_right_by_the_whole_gallery_tail():
    # An exponential gallery (a GPD of shape 0 above any threshold) whose census is each query's
    # own top 25, deeper than the sample's spacing: the rest's tail is depleted where it is
    # sampled. The hash sample of the whole gallery still sees the gallery's tail, so the
    # gallery's count less the census's is the rest's; the same sample without the census's
    # items (the rest's alone) under-counts it. Truth: brute-force counts.
    n, q, m = 20000, 16, 4000
    rng = np.random.default_rng(7)
    scores = (0.2 + 0.04 * rng.exponential(size=(q, n))).astype(np.float32)
    ranks = np.argsort(-scores, axis=1)
    top = np.take_along_axis(scores, ranks, axis=1)
    at = np.asarray([10, 20, 40, 80])
    pos = ((top[:, at - 1] + top[:, at]) / 2).astype(np.float32)  # just below rank r's score
    ids = np.asarray([f"item{i:05d}" for i in range(n)])
    d = design.plan(design.best_ranks([ranks[:, :25]], n), 0.1, depth=25)
    exact = (scores[:, None, :] > pos[:, :, None]).sum(-1)
    raw = _file(scores, pos, d, ids, seed=0, m=m)
    folded = census.fold(raw, n)
    undrawn = raw.census_counts - raw.drawn_counts
    np.testing.assert_allclose(folded.depleted, undrawn / (n - raw.n_sample))
    settings = TailSettings()
    est = _pooled(folded, estimators.estimate(folded, "evt_averaged", settings).x, n)
    assert np.all(est >= raw.census_counts - 1e-3)
    ratio = lambda x: (x - raw.census_counts).sum() / (exact - raw.census_counts).sum()
    # A tail fitted to the rest alone (the census's items out of the sample) sees the census's
    # depletion: less the census, it under-counts the rest.
    drawn = sampling.in_sample(ids, d.inclusion, 0) & ~d.census
    rest_only = scores_lib.make_scores(
        np.sort(scores[:, drawn], axis=1)[:, ::-1][:, :m], pos,
        (scores[:, drawn][:, None, :] > pos[:, :, None]).sum(-1), int(drawn.sum()),
    )  # fmt: skip
    x_rest = estimators.estimate(rest_only, "evt_averaged", settings).x
    c = raw.census_counts
    rest_est = c + np.maximum((n - d.n_census) * x_rest - c, 0)
    assert 0.8 < ratio(est) < 1.25 and ratio(rest_est) < 0.7, (ratio(est), ratio(rest_est))
    # The traced definition (nested bootstrap, budget check) takes the same share: its mAP on
    # the sample as it is agrees with the host's, and not with the estimate without the share.
    maps = []
    for sc in (folded, dataclasses.replace(folded, depleted=None)):
        h = estimators.estimate(sc, "evt_averaged", settings)
        host = evaluate.per_query_ap(h, n, 100, sc.fixed_counts, sc).mean()
        extra = nested.nested_bootstrap(sc, "evt_averaged", settings, 100, [n], 0, extra=(sc,))
        maps.append((host, extra[1].values[0, 0, 0]))
    (host, traced), (plain, _) = maps
    assert abs(traced - host) < 0.002 and abs(plain - host) > 0.01, maps


def test_systematic_sample_holds_the_census_share_rounded():
    # At the midpoint start, the middle item of every 1 / rate: within any first c ranks the
    # sample holds floor(rate c + 1/2), rate x c rounded. From a start drawn uniformly, each
    # rank is drawn with probability `rate` and within one of rate x c: checked by enumeration.
    c, rate = 37, 0.13
    half = design.systematic_ranks(c, rate)
    np.testing.assert_array_equal(half, np.ceil((np.arange(1, half.size + 1) - 0.5) / rate))
    within = np.searchsorted(half, np.arange(1, c + 1), side="right")
    np.testing.assert_array_equal(within, np.floor(rate * np.arange(1, c + 1) + 0.5))
    drawn = np.zeros(c)
    starts = 1.0 - np.random.default_rng(0).random(4000)
    for start in starts:
        ranks = design.systematic_ranks(c, rate, start)
        assert np.all(np.diff(ranks) > 0) and 1 <= ranks.min() and ranks.max() <= c
        within = np.searchsorted(ranks, np.arange(1, c + 1), side="right")
        assert np.all(np.abs(within - rate * np.arange(1, c + 1)) < 1)
        drawn[ranks - 1] += 1
    np.testing.assert_allclose(drawn / 4000, rate, atol=4 * np.sqrt(rate * (1 - rate) / 4000))
    with pytest.raises(ValueError, match="start"):
        design.systematic_ranks(c, rate, 0.0)


def test_halving_a_census_sample_halves_its_size():
    # Each query's row holds its own census items beside the rest's shared ones, so the rows'
    # distinct ids outnumber the sample: the budget check's halving must still keep half of S
    # (its sub-sample's hardness is kept rows over S'); counting distinct ids kept gave ~4 S.
    scores, pos, ranks = _gallery(noise=0.05)
    ids = np.asarray([f"item{i:05d}" for i in range(N)])
    d = design.plan(design.best_ranks([ranks], N), 0.05, census_share=0.5, max_depth=200)
    raw = _file(scores, pos, d, ids, 0, m=400)
    tail_ids = np.where(np.isfinite(raw.tail_scores), np.arange(raw.tail_scores.size).reshape(
        raw.tail_scores.shape) % N, -1)  # fmt: skip
    sc = census.fold(dataclasses.replace(raw, tail_ids=tail_ids), N)
    assert np.unique(tail_ids[tail_ids >= 0]).size > sc.n_sample
    half = budget.thin(sc, 0.5, np.random.default_rng(0))
    assert abs(half.n_sample / sc.n_sample - 0.5) < 0.05
    assert half.depleted is sc.depleted


def test_plan_depth_rule_against_brute_force():
    rng = np.random.default_rng(1)
    best = rng.integers(1, 50, 1000)
    best[rng.random(1000) < 0.5] = design.UNRANKED
    d = design.plan(best, 0.1, census_share=0.5)
    # The deepest d whose census fits in half the budget (50 items), by enumeration.
    fits = [t for t in range(0, 51) if (best <= t).sum() <= 50]
    assert d.depth == max(fits)
    assert d.n_census == (best <= d.depth).sum()
    with pytest.raises(ValueError, match="more than the budget"):
        design.plan(best, 0.01, depth=40)


def test_share_rule_shrinks_the_census_where_queries_are_many():
    rng = np.random.default_rng(3)
    n, f = 20000, 0.01  # a budget of 200 items, half of it the census's at most
    lists = [rng.permutation(n)[: q * 50].reshape(q, 50) for q in (5, 100)]
    for ranks in lists:
        best = design.best_ranks([ranks], n)
        q = ranks.shape[0]
        # By hand: 100 / Q items per query at half the budget, against ITEMS_PER_QUERY.
        share = 0.5 * min(1.0, 100 / q / design.ITEMS_PER_QUERY)
        ruled = design.plan(best, f, census_share=0.5, queries=q, priority=design.fused([ranks], n))
        fixed = design.plan(best, f, census_share=share, priority=design.fused([ranks], n))
        np.testing.assert_array_equal(ruled.census, fixed.census)
        assert ruled.n_census == int(share * 200) and ruled.inclusion == fixed.inclusion
    assert design.share(0.5, f, n, 5) == 0.5 and design.share(0.5, f, n, 100) < 0.1
    # A fixed depth is the census as asked, whatever the queries.
    deep = design.plan(best, f, depth=1, queries=100)
    assert deep.n_census == (best <= 1).sum()
    with pytest.raises(ValueError, match="queries"):
        design.share(0.5, f, n, 0)


def test_plan_fills_the_share_from_the_next_level_by_priority():
    rng = np.random.default_rng(2)
    lists = [rng.permutation(400)[:60].reshape(6, 10), rng.permutation(400)[:60].reshape(6, 10)]
    best = design.best_ranks(lists, 400)
    # Reciprocal-rank fusion by enumeration of every list entry.
    want = np.zeros(400)
    for ranks in lists:
        for row in ranks:
            for r, item in enumerate(row):
                want[item] += 1.0 / (r + 1)
    priority = design.fused(lists, 400)
    np.testing.assert_allclose(priority, want)
    # A share of 15 items: the depth-1 census (12 rows' top-1) fits, depth 2 does not.
    d = design.plan(best, 0.06, census_share=15 / 24, priority=priority)
    plain = design.plan(best, 0.06, census_share=15 / 24)
    assert d.depth == plain.depth == 1 and plain.n_census == (best <= 1).sum()
    added = np.flatnonzero(d.census & ~plain.census)
    level = np.flatnonzero(best == 2)
    top = level[np.argsort(-want[level], kind="stable")][: 15 - plain.n_census]
    np.testing.assert_array_equal(np.sort(added), np.sort(top))
    assert d.n_census == 15 and np.all(plain.census <= d.census)
    assert d.n_census + d.inclusion * (400 - d.n_census) == pytest.approx(0.06 * 400)
    # Even each query's top-1 does not fit: the fill alone makes the census.
    one = design.plan(best, 0.01, census_share=0.5, priority=priority)
    assert (
        one.depth == 0
        and one.n_census == 2
        and set(np.flatnonzero(one.census)) <= set(np.flatnonzero(best == 1))
    )


def test_file_without_census_is_uniform_and_census_round_trips(tmp_path):
    scores, pos, ranks = _gallery()
    ids = np.asarray([f"item{i:05d}" for i in range(N)])
    d = design.plan(design.best_ranks([ranks], N), 0.05)
    sc = _file(scores, pos, d, ids, 0)
    scores_lib.save_scores(tmp_path / "s.npz", sc)
    back = scores_lib.load_scores(tmp_path / "s.npz")
    assert back.n_census == d.n_census and back.inclusion == pytest.approx(d.inclusion)
    np.testing.assert_array_equal(back.census_counts, sc.census_counts)
    np.testing.assert_array_equal(back.drawn_counts, sc.drawn_counts)
    assert back.n_drawn == sc.n_drawn
    plain = scores_lib.make_scores(sc.tail_scores, sc.pos_scores, sc.pos_counts, sc.n_sample)
    assert plain.n_census == 0 and census.fold(plain, N) is plain
    with pytest.raises(errors.InputError, match="n_census"):
        scores_lib.make_scores(
            sc.tail_scores, sc.pos_scores, sc.pos_counts, sc.n_sample,
            census_counts=sc.census_counts, inclusion=0.1,
        )  # fmt: skip
    # A census file of the first layout (the rest alone, no drawn census) is refused by field.
    with pytest.raises(errors.InputError, match="field 'drawn_counts': missing"):
        scores_lib.make_scores(
            sc.tail_scores, sc.pos_scores, sc.pos_counts, sc.n_sample,
            census_counts=sc.census_counts, n_census=sc.n_census, inclusion=sc.inclusion,
        )  # fmt: skip
    with pytest.raises(errors.InputError, match="field 'drawn_counts'"):
        scores_lib.make_scores(
            sc.tail_scores, sc.pos_scores, sc.pos_counts, sc.n_sample,
            census_counts=sc.census_counts, n_census=sc.n_census, inclusion=sc.inclusion,
            drawn_counts=sc.census_counts + 1, n_drawn=sc.n_drawn,
        )  # fmt: skip


# ---------------------------------------------------------------------------------------------
# Similarity files: the official layout, and one-line errors naming the file and field.


def _official(path, qids, dbids, sims, ranks):
    with open(path, "wb") as f:
        pickle.dump(
            {"query_ids": list(qids), "db_ids": list(dbids), "sims": sims, "ranks": ranks}, f
        )
    return str(path)


def test_reads_pickle_and_json_alike(tmp_path):
    sims = np.float32([[0.9, 0.5], [0.8, 0.7]])
    ranks = np.int64([[2, 0], [1, 2]])
    pkl = similarity.read(_official(tmp_path / "a.pkl", ["q0", "q1"], ["a", "b", "c"], sims, ranks))
    (tmp_path / "a.json").write_text(
        json.dumps({"q0": {"a": 0.5, "c": 0.9}, "q1": {"b": 0.8, "c": 0.7}})
    )
    js = similarity.read(tmp_path / "a.json")
    for top in (pkl, js):
        rows = similarity.align(top, np.asarray(["q1", "q0"]), np.asarray(["c", "a", "b"]), [])
        np.testing.assert_array_equal(rows, [[2, 0], [0, 1]])


@pytest.mark.parametrize(
    "change, field",
    [
        (lambda d: d.pop("ranks"), "ranks"),
        (lambda d: d.update(ranks=np.int64([[5, 0], [1, 2]])), "ranks"),
        (lambda d: d.update(sims=np.float32([[0.1, 0.5], [0.8, 0.7]])), "sims"),
        (lambda d: d.update(query_ids=["q0", "q0"]), "query_ids"),
        (lambda d: d.update(ranks=np.int64([[0, 0], [1, 2]])), "ranks"),
    ],
)
def test_malformed_file_names_file_and_field(tmp_path, change, field):
    obj = {
        "query_ids": ["q0", "q1"],
        "db_ids": ["a", "b", "c"],
        "sims": np.float32([[0.9, 0.5], [0.8, 0.7]]),
        "ranks": np.int64([[2, 0], [1, 2]]),
    }
    change(obj)
    path = tmp_path / "bad.pkl"
    with open(path, "wb") as f:
        pickle.dump(obj, f)
    with pytest.raises(errors.InputError, match=f"bad.pkl: field '{field}'"):
        similarity.read(path)


def test_mismatched_file_and_unsafe_pickle(tmp_path):
    good = _official(
        tmp_path / "g.pkl", ["q0", "q1"], ["a", "b", "zz"], np.float32([[0.9], [0.8]]),
        np.int64([[2], [1]]),
    )  # fmt: skip
    top = similarity.read(good)
    with pytest.raises(errors.InputError, match="g.pkl: field 'db_ids': id 'zz'"):
        similarity.align(top, np.asarray(["q0", "q1"]), np.asarray(["a", "b"]), [])
    with pytest.raises(errors.InputError, match="g.pkl: field 'query_ids': lacks query 'q2'"):
        similarity.align(top, np.asarray(["q0", "q2"]), np.asarray(["a", "b", "zz"]), [])
    with open(tmp_path / "evil.pkl", "wb") as f:
        pickle.dump({"x": os.getcwd}, f)
    with pytest.raises(errors.InputError, match="evil.pkl: not a readable similarity pickle"):
        similarity.read(tmp_path / "evil.pkl")


# ---------------------------------------------------------------------------------------------
# The ILIAS job with a proxy made by brute force from a second embedding.


def _proxy_file(folder, path, k=40, seed=3):
    """Writes the official pickle of a second embedding (the target's features, perturbed):
    every query's top-k over positives and distractors, ranked by brute force."""
    rng = np.random.default_rng(seed)
    q, qids = features.read_features(os.path.join(folder, features.IMAGE_QUERIES))
    p, pids = features.read_features(os.path.join(folder, features.POSITIVES))
    xs, dids = [p], list(pids)
    for s in range(SHARDS):
        x, ids = features.read_features(os.path.join(folder, features.distractor_name(s)))
        xs.append(x)
        dids += ids
    db = np.concatenate(xs).astype(np.float32)
    db = db + rng.normal(0, 0.1, db.shape).astype(np.float32)
    sims = q.astype(np.float32) @ db.T
    ranks = np.argsort(-sims, axis=1, kind="stable")[:, :k]
    top = np.take_along_axis(sims, ranks, 1)
    return _official(path, qids, dids, top, ranks), q, db, dids


def test_ilias_job_with_a_proxy_end_to_end(tmp_path):
    folder = make_folder(str(tmp_path / "f"))
    proxy, q, _, dids = _proxy_file(folder, tmp_path / "proxy.pkl")
    work = str(tmp_path / "w")
    c = config(folder, top_m=20, sample_fraction=0.2, k=10, proxy=proxy, seed=2)
    result = ilias.run(c, work)
    sc = scores_lib.load_scores(os.path.join(work, "sampled_scores.npz"))
    rec = np.load(os.path.join(work, "design.npz"))
    x_all, ids_all = [], []
    for s in range(SHARDS):
        x, ids = features.read_features(os.path.join(folder, features.distractor_name(s)))
        x_all.append(x)
        ids_all += ids
    x_all, ids_all = np.concatenate(x_all).astype(np.float32), np.asarray(ids_all)
    # The census by brute force: distractors some query's proxy list ranks within the depth,
    # then those at the next rank with the largest sums of 1 / rank (ties in gallery order)
    # up to half the budget.
    with open(proxy, "rb") as f:
        top = pickle.load(f)
    depth = int(rec["depth"])
    _, pids = features.read_features(os.path.join(folder, features.POSITIVES))
    best, fused = {}, {}
    for row in top["ranks"]:
        for r, j in enumerate(row):
            name = top["db_ids"][j]
            if name not in pids:
                best[name] = min(best.get(name, r + 1), r + 1)
                fused[name] = fused.get(name, 0.0) + 1.0 / (r + 1)
    want = [n for n in ids_all if best.get(n, 10**9) <= depth]
    level = [n for n in ids_all if best.get(n) == depth + 1]
    level = sorted(level, key=lambda n: -fused[n])  # stable: gallery order among ties
    # The share rule: half the budget holds 0.5 x 0.2 x N / Q = 5 items per query, fewer than
    # ITEMS_PER_QUERY, so the share shrinks in proportion.
    per_query = 0.5 * 0.2 * len(ids_all) / len(top["ranks"])
    share = 0.5 * min(1.0, per_query / design.ITEMS_PER_QUERY)
    assert share < 0.5
    want = sorted(want + level[: max(int(share * 0.2 * len(ids_all)) - len(want), 0)])
    assert sorted(rec["census_ids"].tolist()) == want and sc.n_census == len(want) > 0
    assert sc.n_census == int(share * 0.2 * len(ids_all))  # the fill takes the whole share
    # Budget: census + the rest's hash sample = the total share (up to the hash's randomness).
    # The file holds the hash sample of the whole gallery, the census items it draws included.
    census_mask = np.isin(ids_all, want)
    rest = ~census_mask & sampling.in_sample(ids_all, sc.inclusion, 2)
    picks = design.systematic_ranks(int(census_mask.sum()), sc.inclusion)
    assert sc.n_sample == rest.sum() + picks.size and sc.n_drawn == picks.size
    assert sc.n_census + sc.inclusion * (len(ids_all) - sc.n_census) == pytest.approx(
        0.2 * len(ids_all)
    )
    # Counts by brute force from the features.
    s_all = q.astype(np.float32) @ x_all.T
    above = lambda mask: (s_all[:, mask][:, None, :] > sc.pos_scores[:, :, None]).sum(-1)
    np.testing.assert_array_equal(np.where(sc.mask, above(census_mask), -1), sc.census_counts)
    drawn = (picks[None, None, :] <= above(census_mask)[..., None]).sum(-1)
    np.testing.assert_array_equal(np.where(sc.mask, drawn, 0), sc.drawn_counts)
    np.testing.assert_array_equal(np.where(sc.mask, above(rest) + drawn, -1), sc.pos_counts)
    # The stored tail: the rest's hashed scores and each query's census scores at the picks.
    by_score = -np.sort(-s_all[:, census_mask], axis=1)
    union = np.concatenate([s_all[:, rest], by_score[:, picks - 1]], axis=1)
    top = -np.sort(-union, axis=1)[:, : sc.tail_scores.shape[1]]
    np.testing.assert_allclose(sc.tail_scores, top, atol=1e-6)
    # The prediction: the whole gallery's N, the uniform-only value beside it, the summary.
    assert result.n_target == len(ids_all)
    assert "uniform_only" in result.baselines
    assert any(line.startswith("CENSUS:") for line in result.diagnostics.summary)
    with open(os.path.join(work, "prediction.json")) as f:
        written = json.load(f)
    assert written["n_target"] == len(ids_all) and "uniform_only" in written["baselines"]
    # The predict job reads the census from the file alone and predicts the same.
    pc = predict_config.get_config()
    pc.scores = os.path.join(work, "sampled_scores.npz")
    pc.n_target, pc.k, pc.evt.top_m = len(ids_all), 10, 20
    pc.protocol.nested_replicates = 0
    predict.run(pc, str(tmp_path / "p"))
    with open(tmp_path / "p" / "prediction.json") as f:
        again = json.load(f)
    assert again["map"] == pytest.approx(result.map, abs=1e-9)


def test_two_models_on_one_census_compare_paired(tmp_path):
    # Two models' ILIAS jobs with the same proxy, budget and seed embed the same census and the
    # same hash sample of the rest; the compare job then pairs their sampling errors item by
    # item. Checked against the files: the two design records, and the correlation of the two
    # prediction.json's nested replicates computed here.
    folders = {name: make_folder(str(tmp_path / name), seed) for name, seed in (("a", 0), ("b", 1))}
    proxy, *_ = _proxy_file(folders["a"], tmp_path / "proxy.pkl")
    for name, folder in folders.items():
        c = config(folder, top_m=20, sample_fraction=0.2, k=10, proxy=proxy, seed=2)
        c.protocol.nested_replicates = 20
        ilias.run(c, str(tmp_path / f"w{name}"))
    rec = [np.load(tmp_path / f"w{name}" / "design.npz") for name in "ab"]
    np.testing.assert_array_equal(rec[0]["census_ids"], rec[1]["census_ids"])
    assert rec[0]["census_ids"].size > 0 and rec[0]["inclusion"] == rec[1]["inclusion"]
    preds = [json.loads((tmp_path / f"w{name}" / "prediction.json").read_text()) for name in "ab"]
    reps = [p["metrics"]["map@10"]["uncertainty"]["distractor_replicates"] for p in preds]
    assert len(reps[0]) == len(reps[1]) == 20
    cfg = compare_config.get_config()
    cfg.a, cfg.b = (str(tmp_path / f"w{name}" / "prediction.json") for name in "ab")
    compare_job.run(cfg, str(tmp_path / "wc"))
    out = json.loads((tmp_path / "wc" / "comparison.json").read_text())["metrics"]["map@10"]
    assert out["difference"] == pytest.approx(preds[0]["map"] - preds[1]["map"], abs=1e-12)
    rho = np.corrcoef(reps[0], reps[1])[0, 1]
    assert out["sampling_correlation"] == pytest.approx(rho, abs=1e-9) and rho != 0.0


def test_ilias_job_holds_the_census_designs_own_sample_to_the_floor(tmp_path):
    # A floor the budget reaches (0.2 N) but the sample the tail is fitted to, the rest's rate
    # times N, does not: refused after the plan, before anything is scored.
    folder = make_folder(str(tmp_path / "f"))
    proxy, _, _, dids = _proxy_file(folder, tmp_path / "proxy.pkl")
    n = len(dids) - len(features.read_features(os.path.join(folder, features.POSITIVES))[1])
    floor = int(0.2 * n)
    c = config(folder, top_m=20, sample_fraction=0.2, k=10, proxy=proxy, min_sample=floor)
    with pytest.raises(
        errors.InputError,
        match=r"^--config\.sample_fraction=0\.2 with --config\.proxy: the census takes \d+ of the "
        rf"~{floor} embedded distractors .* so the tail is fitted to ~\d+ of {n};",
    ):
        ilias.run(c, str(tmp_path / "w"))
    assert not os.path.exists(tmp_path / "w" / "sampled_scores.npz")
    # Without the proxy the same budget passes the floor.
    uniform = config(folder, top_m=20, sample_fraction=0.2, k=10, min_sample=floor)
    ilias.run(uniform, str(tmp_path / "u"))


def test_ilias_job_rejects_a_proxy_of_other_queries(tmp_path):
    folder = make_folder(str(tmp_path / "f"))
    bad = _official(
        tmp_path / "other.pkl", ["elsewhere/q.jpg"], ["tar000/000001"], np.float32([[0.5]]),
        np.int64([[0]]),
    )  # fmt: skip
    c = config(folder, top_m=20, sample_fraction=0.2, k=10, proxy=bad)
    with pytest.raises(errors.InputError, match="other.pkl: field 'query_ids'"):
        ilias.run(c, str(tmp_path / "w"))


def test_proxy_flags_are_checked(tmp_path):
    folder = make_folder(str(tmp_path / "f"))
    path, *_ = _proxy_file(folder, tmp_path / "proxy.pkl", k=5)
    exact_run = config(folder, sample_fraction=1.0, proxy=path)
    with pytest.raises(errors.InputError, match="--config.proxy: expected a sampled run"):
        ilias.run(exact_run, str(tmp_path / "w0"))
    short = config(folder, top_m=20, sample_fraction=0.2, k=10, proxy=path, census_depth=8)
    with pytest.raises(errors.InputError, match="proxy.pkl: field 'ranks': lists of k = 5"):
        ilias.run(short, str(tmp_path / "w1"))
    sampled = dict(top_m=20, sample_fraction=0.2, k=10)
    missing = config(folder, proxy=str(tmp_path / "nowhere"), **sampled)
    with pytest.raises(errors.MissingInput, match="nowhere: no such file; expected .* or an ILIAS"):
        ilias.run(missing, str(tmp_path / "w2"))
    shallow = config(folder, proxy=folder, proxy_depth=5, census_depth=8, **sampled)
    with pytest.raises(
        errors.InputError, match=r"^--config.proxy_depth: expected at least --config.census_depth"
    ):
        ilias.run(shallow, str(tmp_path / "w3"))
    with pytest.raises(errors.InputError, match=r"^--config.proxy_depth: expected a list depth"):
        ilias.run(config(folder, proxy=folder, proxy_depth=0, **sampled), str(tmp_path / "w4"))


# ---------------------------------------------------------------------------------------------
# A proxy given as another model's feature folder: searched exactly, then planned as a file is.

PROXY_DIM = 64  # the proxy model's dimension, not the target's


def _proxy_folder(folder, path, seed=3, flips=12):
    """Writes a second embedding of `folder` as an ILIAS-format folder of PROXY_DIM dims: each
    row's entries (+-1/4) tiled four times at +-1/8 with `flips` signs flipped at random, so
    every row is a unit vector, every score exact in float16 and float32, and ties common."""
    rng = np.random.default_rng(seed)
    distractors = [features.distractor_name(s) for s in range(SHARDS)]
    for name in (features.IMAGE_QUERIES, features.POSITIVES, *distractors):
        x, ids = features.read_features(os.path.join(folder, name))
        y = np.tile(x.astype(np.float32), 4) / 2
        for row in y:
            flip = rng.choice(PROXY_DIM, flips, replace=False)
            row[flip] = -row[flip]
        features.write_features(os.path.join(path, name), y, ids)
    return str(path)


def _brute_lists(path, k):
    """Returns (query_ids, db_ids, sims [Q, k], ranks [Q, k]): the official pickle's fields of
    each query's top-k over the folder's positives and distractors, by brute force. Order: score
    descending, then the query's own positives, other positives, distractors, each in file
    order (the tie rule of docs/outputs.md); -1 and NaN past the end of the database."""
    q, qids = features.read_features(os.path.join(path, features.IMAGE_QUERIES))
    p, pids = features.read_features(os.path.join(path, features.POSITIVES))
    xs, dids = [p], list(pids)
    s = 0
    while os.path.exists(os.path.join(path, features.distractor_name(s))):
        x, ids = features.read_features(os.path.join(path, features.distractor_name(s)))
        xs.append(x)
        dids += ids
        s += 1
    db = np.concatenate(xs).astype(np.float32)
    sims = q.astype(np.float32) @ db.T
    n = len(dids)
    is_positive = np.arange(n) < len(pids)
    instance = np.asarray([d.split("/")[0] for d in dids])
    ranks = np.full((len(qids), k), -1, np.int64)
    top = np.full((len(qids), k), np.nan, np.float32)
    for i, qid in enumerate(qids):
        own = is_positive & (instance == qid.split("/")[0])
        group = np.where(own, 0, np.where(is_positive, 1, 2))
        order = np.lexsort((np.arange(n), group, -sims[i]))[:k]
        ranks[i, : order.size], top[i, : order.size] = order, sims[i, order]
    return qids, dids, top, ranks


def _named(db_ids, ranks):
    """Returns [Q, k] the ids a list names ("" past its end)."""
    return np.where(ranks >= 0, np.asarray(db_ids)[np.maximum(ranks, 0)], "")


@pytest.mark.parametrize("backend, depth", [("host", 40), ("jax", 40), ("host", 700)])
def test_folder_proxy_lists_equal_brute_force(tmp_path, backend, depth):
    folder = make_folder(str(tmp_path / "f"))
    other = _proxy_folder(folder, tmp_path / "proxy")
    qids, dids, sims, ranks = _brute_lists(other, depth)
    _, pids = features.read_features(os.path.join(folder, features.POSITIVES))
    search = proxy.FolderSearch(depth=depth, backend=backend, block_size=64)
    top = proxy.read(
        other,
        search,
        query_ids=np.asarray(qids),
        positive_ids=np.asarray(pids),
        distractor_ids=np.asarray(dids[len(pids) :]),
    )
    assert top.source == other and top.depth == depth
    np.testing.assert_array_equal(top.query_ids, qids)
    np.testing.assert_array_equal(_named(top.db_ids, top.ranks), _named(dids, ranks))
    np.testing.assert_array_equal(top.sims, sims)  # exact scores: equal, NaN past the end
    assert (np.diff(sims, axis=1) == 0).any()  # ties occur: the tie rule is tested
    assert (ranks < 0).any() == (depth > len(dids))  # 700 > 618 items: the lists end early


def test_a_folder_proxy_in_another_shard_layout_gives_the_same_lists(tmp_path):
    folder = make_folder(str(tmp_path / "f"))
    other = _proxy_folder(folder, tmp_path / "proxy")
    files = [os.path.join(other, features.distractor_name(s)) for s in range(SHARDS)]
    parts = [features.read_features(f) for f in files]
    x, ids = np.concatenate([x for x, _ in parts]), [i for _, part in parts for i in part]
    for f in files:
        os.remove(f)
    half = len(ids) // 2  # two shards in the same order: the same file order, other files
    features.write_features(os.path.join(other, features.distractor_name(0)), x[:half], ids[:half])
    features.write_features(os.path.join(other, features.distractor_name(1)), x[half:], ids[half:])
    qids, dids, sims, ranks = _brute_lists(other, 40)
    _, pids = features.read_features(os.path.join(folder, features.POSITIVES))
    top = proxy.read(
        other,
        proxy.FolderSearch(depth=40, block_size=64),
        query_ids=np.asarray(qids),
        positive_ids=np.asarray(pids),
        distractor_ids=np.asarray(sorted(ids, reverse=True)),  # the run's, in another order
    )
    np.testing.assert_array_equal(_named(top.db_ids, top.ranks), _named(dids, ranks))
    np.testing.assert_array_equal(top.sims, sims)


def test_ilias_job_with_a_folder_proxy_equals_its_pickle(tmp_path):
    folder = make_folder(str(tmp_path / "f"))
    other = _proxy_folder(folder, tmp_path / "proxy")
    pkl = _official(tmp_path / "proxy.pkl", *_brute_lists(other, 40))
    runs = {}
    for name, path in (("folder", other), ("file", pkl)):
        c = config(folder, top_m=20, sample_fraction=0.2, k=10, proxy=path, proxy_depth=40, seed=2)
        ilias.run(c, str(tmp_path / name))
        with np.load(tmp_path / name / "design.npz") as rec:
            census_ids, depth = rec["census_ids"], int(rec["depth"])
        with open(tmp_path / name / "prediction.json") as f:
            runs[name] = (census_ids, depth, json.load(f))
    (ids, depth, pred), (file_ids, file_depth, file_pred) = runs["folder"], runs["file"]
    assert 0 < depth == file_depth and ids.size > 0
    np.testing.assert_array_equal(ids, file_ids)
    for key in ("n_target", "n_sample", "metrics", "baselines"):
        assert pred[key] == file_pred[key], key


@pytest.mark.parametrize(
    "name, field",
    [
        (features.IMAGE_QUERIES, "query_ids"),
        (features.POSITIVES, "positive_ids"),
        (features.distractor_name(SHARDS - 1), "distractor_ids"),
    ],
)
def test_a_folder_proxy_of_other_ids_is_refused_naming_it(tmp_path, name, field):
    folder = make_folder(str(tmp_path / "f"))
    other = _proxy_folder(folder, tmp_path / "other")
    x, ids = features.read_features(os.path.join(other, name))
    features.write_features(os.path.join(other, name), x, [*ids[:-1], "i000/elsewhere.jpg"])
    c = config(folder, top_m=20, sample_fraction=0.2, k=10, proxy=other, proxy_depth=40)
    with pytest.raises(errors.InputError) as raised:
        ilias.run(c, str(tmp_path / "w"))
    message = str(raised.value)
    assert message.startswith(f"{other}: field '{field}': lacks the run's {ids[-1]!r}"), message
    assert "\n" not in message
