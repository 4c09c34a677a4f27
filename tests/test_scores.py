"""The sampled-scores format: round trip, and every malformation named by field."""

import tracemalloc

import numpy as np
import pytest

from tailaware.io import scores as scores_lib


def valid_fields(q=3, m=6, p=4, s=50, seed=0):
    rng = np.random.default_rng(seed)
    tail = -np.sort(-rng.uniform(0.2, 0.6, (q, m)), axis=1).astype(np.float32)
    pos = rng.uniform(0.3, 0.9, (q, p)).astype(np.float32)
    pos[:, -1] = np.nan
    counts = (tail[:, None, :] > pos[:, :, None]).sum(axis=2)
    # Positives below the last stored score have more sampled distractors above than stored.
    below = pos < tail[:, -1:]
    counts = np.where(below, counts + 7, counts)
    counts = np.where(np.isnan(pos), -1, counts).astype(np.int64)
    return dict(tail_scores=tail, pos_scores=pos, pos_counts=counts, n_sample=np.int64(s))


def test_round_trip(tmp_path):
    f = valid_fields()
    s = scores_lib.make_scores(
        **f,
        fixed_counts=np.where(f["pos_counts"] >= 0, 1, -1),
        query_ids=["a/query/Q1", "b/query/Q2", "c/query/Q3"],
    )
    path = tmp_path / "s.npz"
    scores_lib.save_scores(path, s)
    back = scores_lib.load_scores(path)
    for name in ("tail_scores", "pos_scores", "pos_counts", "fixed_counts", "query_ids"):
        np.testing.assert_array_equal(getattr(back, name), getattr(s, name))
    assert back.n_sample == 50
    assert back.mask.sum() == 9


def test_concatenate_restores_a_split_file():
    f = valid_fields(q=5, p=4)
    f["pos_scores"][[0, 1], 2] = np.nan  # the first two queries have 2 positives, the rest 3
    f["pos_counts"][[0, 1], 2] = -1
    whole = scores_lib.make_scores(**f, query_ids=["q0", "q1", "q2", "q3", "q4"])
    first = whole.subset(np.array([0, 1]))
    first = scores_lib.make_scores(  # narrower than the rest: 2 positive slots
        first.tail_scores,
        first.pos_scores[:, :2],
        first.pos_counts[:, :2],
        first.n_sample,
        fixed_counts=first.fixed_counts[:, :2],
        query_ids=first.query_ids,
    )
    back = scores_lib.concatenate([first, whole.subset(np.array([2, 3, 4]))])
    for name in ("tail_scores", "pos_scores", "pos_counts", "fixed_counts", "query_ids"):
        np.testing.assert_array_equal(getattr(back, name), getattr(whole, name))
    assert back.n_sample == whole.n_sample
    for field, other in (("n_sample", valid_fields(s=51)), ("tail_scores", valid_fields(m=7))):
        with pytest.raises(ValueError, match=field):
            scores_lib.concatenate([whole, scores_lib.make_scores(**other)])


def corrupt(name):
    f = valid_fields()
    if name == "unsorted":
        f["tail_scores"][1, [0, 3]] = f["tail_scores"][1, [3, 0]]
    elif name == "nan_tail":
        f["tail_scores"][0, 2] = np.nan
    elif name == "out_of_range":
        f["pos_scores"][0, 0] = 3.0
    elif name == "negative_count":
        f["pos_counts"][0, 0] = -5
    elif name == "inconsistent":
        i = np.argwhere(f["pos_scores"] > f["tail_scores"][:, -1:])[0]
        f["pos_counts"][tuple(i)] += 1
    elif name == "small_s":
        f["n_sample"] = np.int64(4)
    elif name == "dtype":
        f["tail_scores"] = f["tail_scores"].astype(np.float64)
    elif name == "shape":
        f["pos_counts"] = f["pos_counts"][:, :2]
    elif name == "padding":
        f["pos_counts"][0, -1] = 3
    return f


@pytest.mark.parametrize(
    "name, field, words",
    [
        ("unsorted", "tail_scores", "descending"),
        ("nan_tail", "tail_scores", "NaN"),
        ("out_of_range", "pos_scores", "outside"),
        ("negative_count", "pos_counts", "negative"),
        ("inconsistent", "pos_counts", "inconsistent"),
        ("small_s", "n_sample", "smaller"),
        ("dtype", "tail_scores", "float32"),
        ("shape", "pos_counts", "shape"),
        ("padding", "pos_counts", "padding"),
    ],
)
def test_bad_files_name_the_file_and_field(tmp_path, name, field, words):
    path = tmp_path / f"{name}.npz"
    np.savez(path, **corrupt(name))
    with pytest.raises(ValueError) as err:
        scores_lib.load_scores(path)
    msg = str(err.value)
    assert str(path) in msg and f"'{field}'" in msg and words in msg, msg


def test_missing_field_and_missing_file(tmp_path):
    f = valid_fields()
    del f["n_sample"]
    np.savez(tmp_path / "x.npz", **f)
    with pytest.raises(ValueError, match="'n_sample': missing"):
        scores_lib.load_scores(tmp_path / "x.npz")
    with pytest.raises(FileNotFoundError, match="nope.npz"):
        scores_lib.load_scores(tmp_path / "nope.npz")


def test_count_above_matches_a_brute_force_count():
    rng = np.random.default_rng(3)
    q, m, p = 7, 30, 6
    # Scores on a coarse grid so that ties between positives and stored scores are common.
    tail = -np.sort(-rng.integers(0, 12, (q, m)) / 12.0, axis=1).astype(np.float32)
    tail[:2, 20:] = -np.inf  # short rows
    pos = (rng.integers(0, 13, (q, p)) / 12.0).astype(np.float32)
    pos[:, -1] = np.nan
    for strict, op in ((True, np.greater), (False, np.greater_equal)):
        want = np.where(np.isnan(pos), 0, op(tail[:, None, :], pos[:, :, None]).sum(axis=2))
        np.testing.assert_array_equal(scores_lib.count_above(tail, pos, strict), want)


def float32_tie_fields(q=4, m=40, p=5, s=3000, seed=0):
    """Scores drawn in float64, counts computed in float64, scores stored in float32: one
    distractor just above one positive rounds to the positive's own float32 value (the issue's
    file). Returns (fields, (query, positive) of the tie)."""
    rng = np.random.default_rng(seed)
    dist = rng.uniform(0.1, 0.6, (q, s))
    pos = np.sort(rng.uniform(0.3, 0.8, (q, p)), axis=1)
    qi, pi = 1, p - 1  # a positive high in the tail
    p32 = np.float32(pos[qi, pi])
    # A float64 value above the positive's float64 score that rounds to the same float32.
    dist[qi, 0] = np.nextafter(pos[qi, pi], 1.0)
    assert np.float32(dist[qi, 0]) == p32 and dist[qi, 0] > pos[qi, pi]
    counts = (dist[:, None, :] > pos[:, :, None]).sum(axis=2)  # float64 counts
    tail = -np.sort(-dist, axis=1)[:, :m]
    fields = dict(
        tail_scores=tail.astype(np.float32),
        pos_scores=pos.astype(np.float32),
        pos_counts=counts.astype(np.int64),
        n_sample=np.int64(s),
    )
    return fields, (qi, pi)


def test_float32_ties_are_reconciled_to_the_strict_rule(tmp_path):
    fields, (qi, pi) = float32_tie_fields()
    path = tmp_path / "ties.npz"
    np.savez(path, **fields)
    sc = scores_lib.load_scores(path)
    assert sc.reconciled == 1
    # Independent reference: the strict rule applied to the stored float32 values, by brute force.
    tail, pos = fields["tail_scores"], fields["pos_scores"]
    strict = (tail[:, None, :] > pos[:, :, None]).sum(axis=2)
    covered = pos >= tail[:, -1:]
    want = np.where(covered, strict, fields["pos_counts"])
    np.testing.assert_array_equal(sc.pos_counts, want)
    assert sc.pos_counts[qi, pi] == fields["pos_counts"][qi, pi] - 1
    # Saved back, the file is consistent: nothing left to reconcile.
    scores_lib.save_scores(tmp_path / "back.npz", sc)
    assert scores_lib.load_scores(tmp_path / "back.npz").reconciled == 0
    # One above the ties is a real disagreement, still an error.
    fields["pos_counts"][qi, pi] += 1
    np.savez(path, **fields)
    with pytest.raises(ValueError, match=rf"query {qi} positive {pi}: count .* inconsistent"):
        scores_lib.load_scores(path)


def test_count_check_allocates_no_q_by_p_by_m_array():
    q, m, p = 150, 2000, 40  # Q x P x M booleans would be 12 MB
    f = valid_fields(q=q, m=m, p=p, s=100_000)
    tracemalloc.start()
    scores_lib.make_scores(**f)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < q * p * m / 4, peak


def test_malformed_ids_and_shapes_are_named(tmp_path):
    f = valid_fields()
    cases = {
        "duplicate id": dict(f, query_ids=np.array(["a", "b", "a"])),
        "empty id": dict(f, query_ids=np.array(["a", " ", "c"])),
        "strings": dict(f, query_ids=np.arange(3)),
        "Q, M >= 1": dict(f, tail_scores=np.zeros((3, 0), np.float32)),
    }
    for words, fields in cases.items():
        path = tmp_path / "x.npz"
        np.savez(path, **fields)
        with pytest.raises(ValueError, match=f"x.npz: field '.*': .*{words}"):
            scores_lib.load_scores(path)
