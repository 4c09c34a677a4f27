"""A census design: similarity files, the census plan, the pooled estimator and the ILIAS job.

References are independent of the code under test: brute-force counts over every item, the
census and sample rebuilt from the id hash, and the official pickle layout written by hand.
"""

import json
import os
import pickle

import numpy as np
import pytest

from tailaware.configs import predict as predict_config
from tailaware.core import design, sampling
from tailaware.io import errors, features, similarity
from tailaware.io import scores as scores_lib
from tailaware.jobs import ilias, predict
from tailaware.protocol import census
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
    """Returns the census design's sampled-scores file built by brute force."""
    rest = ~d.census & sampling.in_sample(ids, d.inclusion, seed)
    s = scores[:, rest]
    tail = np.sort(s, axis=1)[:, ::-1][:, :m]
    counts = (s[:, None, :] > pos[:, :, None]).sum(-1)
    cen = (scores[:, d.census][:, None, :] > pos[:, :, None]).sum(-1)
    return scores_lib.make_scores(
        tail, pos, counts, int(rest.sum()), census_counts=cen, n_census=d.n_census,
        inclusion=d.inclusion,
    )  # fmt: skip


@pytest.mark.parametrize("noise", [0.05, 0.5])
def test_pooled_count_is_unbiased_and_a_good_proxy_beats_uniform(noise):
    scores, pos, ranks = _gallery(noise=noise)
    ids = np.asarray([f"item{i:05d}" for i in range(N)])
    exact = (scores[:, None, :] > pos[:, :, None]).sum(-1).astype(np.float64)
    d = design.plan(design.best_ranks([ranks], N), 0.05, census_share=0.5, max_depth=200)
    assert d.depth >= 1 and 0 < d.n_census <= 0.5 * 0.05 * N
    assert d.n_census + d.inclusion * (N - d.n_census) == pytest.approx(0.05 * N)
    pooled, uniform = [], []
    for seed in range(300):
        sc = census.fold(_file(scores, pos, d, ids, seed))
        x = estimators.estimate(sc, "count", TailSettings()).x
        pooled.append(sc.fixed_counts + x * (N - d.n_census))
        u = sampling.in_sample(ids, 0.05, seed)
        uniform.append((scores[:, u][:, None, :] > pos[:, :, None]).sum(-1) * N / u.sum())
    pooled, uniform = np.asarray(pooled), np.asarray(uniform)
    err = pooled.mean(0) - exact
    se = pooled.std(0, ddof=1) / np.sqrt(len(pooled))
    assert np.all(np.abs(err) <= 4 * se + 1e-9), (err, se)
    if noise < 0.1:  # the census holds the clusters: the counts vary far less than uniform's
        assert pooled.std(0).mean() < 0.7 * uniform.std(0).mean()


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


def test_file_without_census_is_uniform_and_census_round_trips(tmp_path):
    scores, pos, ranks = _gallery()
    ids = np.asarray([f"item{i:05d}" for i in range(N)])
    d = design.plan(design.best_ranks([ranks], N), 0.05)
    sc = _file(scores, pos, d, ids, 0)
    scores_lib.save_scores(tmp_path / "s.npz", sc)
    back = scores_lib.load_scores(tmp_path / "s.npz")
    assert back.n_census == d.n_census and back.inclusion == pytest.approx(d.inclusion)
    np.testing.assert_array_equal(back.census_counts, sc.census_counts)
    plain = scores_lib.make_scores(sc.tail_scores, sc.pos_scores, sc.pos_counts, sc.n_sample)
    assert plain.n_census == 0 and census.fold(plain) is plain
    with pytest.raises(errors.InputError, match="n_census"):
        scores_lib.make_scores(
            sc.tail_scores, sc.pos_scores, sc.pos_counts, sc.n_sample,
            census_counts=sc.census_counts, inclusion=0.1,
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
    # The census by brute force: distractors some query's proxy list ranks within the depth.
    with open(proxy, "rb") as f:
        top = pickle.load(f)
    depth = int(rec["depth"])
    named = {top["db_ids"][j] for j in top["ranks"][:, :depth].ravel()}
    _, pids = features.read_features(os.path.join(folder, features.POSITIVES))
    want = sorted(named - set(pids))
    assert sorted(rec["census_ids"].tolist()) == want and sc.n_census == len(want) > 0
    # Budget: census + the rest's hash sample = the total share (up to the hash's randomness).
    x_all, ids_all = [], []
    for s in range(SHARDS):
        x, ids = features.read_features(os.path.join(folder, features.distractor_name(s)))
        x_all.append(x)
        ids_all += ids
    x_all, ids_all = np.concatenate(x_all).astype(np.float32), np.asarray(ids_all)
    census_mask = np.isin(ids_all, want)
    rest = ~census_mask & sampling.in_sample(ids_all, sc.inclusion, 2)
    assert sc.n_sample == rest.sum()
    assert sc.n_census + sc.inclusion * (len(ids_all) - sc.n_census) == pytest.approx(
        0.2 * len(ids_all)
    )
    # Counts by brute force from the features.
    s_all = q.astype(np.float32) @ x_all.T
    above = lambda mask: (s_all[:, mask][:, None, :] > sc.pos_scores[:, :, None]).sum(-1)
    np.testing.assert_array_equal(np.where(sc.mask, above(census_mask), -1), sc.census_counts)
    np.testing.assert_array_equal(np.where(sc.mask, above(rest), -1), sc.pos_counts)
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
    proxy, *_ = _proxy_file(folder, tmp_path / "proxy.pkl", k=5)
    exact_run = config(folder, sample_fraction=1.0, proxy=proxy)
    with pytest.raises(errors.InputError, match="--config.proxy: expected a sampled run"):
        ilias.run(exact_run, str(tmp_path / "w0"))
    short = config(folder, top_m=20, sample_fraction=0.2, k=10, proxy=proxy, census_depth=8)
    with pytest.raises(errors.InputError, match="proxy.pkl: field 'ranks': lists of k = 5"):
        ilias.run(short, str(tmp_path / "w1"))
