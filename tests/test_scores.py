"""The sampled-scores format: round trip, and every malformation named by field."""

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
        first.fixed_counts[:, :2],
        first.query_ids,
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
