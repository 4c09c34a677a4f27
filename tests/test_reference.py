"""A related model's exact run correcting a new model's sampled estimate: the reference-counts
file, the estimator against brute-force truth on paired galleries, and the jobs end to end."""

import os

import numpy as np
import pytest

from tailaware.io import errors, features, reference_counts
from tailaware.io import scores as scores_lib
from tailaware.jobs import ilias
from tests.test_ilias import ROWS, SHARDS, config, make_folder, official_map


def small_reference(q=3, p=2):
    counts = np.arange(q * p, dtype=np.int64).reshape(q, p)
    counts[1, 1] = -1
    pos_ids = np.where(counts >= 0, np.char.add("p", counts.astype(str)), "")
    return reference_counts.make(
        counts,
        [f"q{i}" for i in range(q)],
        pos_ids,
        n_distractors=100,
        k=10,
        metric_names=["map@10"],
        metric_values=[0.25],
    )


def test_reference_counts_round_trip(tmp_path):
    ref = small_reference()
    path = tmp_path / "ref.npz"
    reference_counts.save(path, ref)
    got = reference_counts.load(path)
    np.testing.assert_array_equal(got.counts, ref.counts)
    np.testing.assert_array_equal(got.query_ids, ref.query_ids)
    np.testing.assert_array_equal(got.positive_ids, ref.positive_ids)
    assert (got.n_distractors, got.k, got.metric_names) == (100, 10, ("map@10",))
    np.testing.assert_array_equal(got.metric_values, [0.25])


def test_reference_counts_mismatches_name_the_file_and_field(tmp_path):
    ref = small_reference()
    pos = np.where(ref.mask, 0.5, np.nan)
    tail = np.full((3, 4), 0.9, np.float32)
    sample = scores_lib.make_scores(
        tail, pos, np.where(ref.mask, 4, -1), 20, query_ids=["q0", "q1", "q2"]
    )
    reference_counts.check(ref, sample, k=10, source="R.npz")  # a match passes
    wrong_ids = scores_lib.make_scores(
        tail, pos, np.where(ref.mask, 4, -1), 20, query_ids=["q0", "q2", "q1"]
    )
    other_mask = ref.mask.copy()
    other_mask[1, 1] = True
    wrong_pos = scores_lib.make_scores(
        tail, np.where(other_mask, 0.5, np.nan), np.where(other_mask, 4, -1), 20,
        query_ids=["q0", "q1", "q2"],
    )  # fmt: skip
    big = scores_lib.make_scores(
        tail, pos, np.where(ref.mask, 4, -1), 200, query_ids=["q0", "q1", "q2"]
    )
    for field, target, k in (
        ("query_ids", wrong_ids, 10),
        ("positive_ids", wrong_pos, 10),
        ("k", sample, 20),
        ("n_distractors", big, 10),
    ):
        with pytest.raises(errors.InputError, match=f"R.npz: field '{field}'"):
            reference_counts.check(ref, target, k=k, source="R.npz")
    path = tmp_path / "bad.npz"
    np.savez(path, counts=ref.counts)
    with pytest.raises(errors.InputError, match="bad.npz: field 'query_ids'"):
        reference_counts.load(path)


def test_exact_ilias_run_writes_the_brute_force_counts(tmp_path):
    folder = make_folder(str(tmp_path / "f"))
    work = tmp_path / "w"
    result = ilias.run(config(folder, sample_fraction=1.0, k=10), str(work))
    ref = reference_counts.load(work / "reference_counts.npz")
    aps, _ = official_map(folder, "image", 10)
    assert ref.n_distractors == SHARDS * ROWS and ref.k == 10
    assert ref.metric_names[0] == "map@10"
    assert ref.metric_values[0] == pytest.approx(aps.mean(), rel=1e-12) == result.map
    # Brute force: every distractor strictly above each positive (the scores are exact).
    q, qids = features.read_features(os.path.join(folder, features.IMAGE_QUERIES))
    p, pids = features.read_features(os.path.join(folder, features.POSITIVES))
    d = np.concatenate(
        [features.read_features(os.path.join(folder, features.distractor_name(s)))[0]
         for s in range(SHARDS)]
    )  # fmt: skip
    sims, pos = q.astype(np.float32) @ d.T.astype(np.float32), q.astype(np.float32) @ p.T
    np.testing.assert_array_equal(ref.query_ids, qids)
    for i, qid in enumerate(qids):
        mine = [j for j, pid in enumerate(pids) if pid.split("/")[0] == qid.split("/")[0]]
        want = sorted((sims[i][None, :] > pos[i, mine][:, None]).sum(axis=1))
        got = sorted(ref.counts[i][ref.mask[i]])
        assert got == want
        assert set(ref.positive_ids[i][ref.mask[i]]) == {pids[j] for j in mine}
    sample = scores_lib.load_scores(work / "sampled_scores.npz")
    np.testing.assert_array_equal(sample.tail_ids >= 0, np.isfinite(sample.tail_scores))
