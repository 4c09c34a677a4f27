"""The ILIAS scoring job: a feature folder in, sampled scores and a prediction (or the exact
official mAP@k) out.

`python launch.py --config=configs/ilias.py --config.features=DIR --config.sample_fraction=F
--workdir=W` writes `W/sampled_scores.npz` and `W/prediction.json`; with F = 1 the evaluation
is exact (`"estimator": "exact"`, the official mAP@k) and `W/ranked_top{k}.pkl` holds the ranked
lists in the official pickle layout. See `configs/ilias.py`.

Folder layout (shared/REFERENCE.md): `features_{image,text}_queries.hdf5`,
`features_positives.hdf5`, `features_distractors_{idx:05d}.hdf5` with `features` [n, d] and
`index` [n]. Plain numpy shards work too: `NAME.npy` ([n, d]) next to `NAME.ids.txt` (one id
per line) for any of these names. Ground truth: a query's positives are the positives whose id
has the same instance prefix `id.split("/")[0]`; the other instances' positives are always in
the database and counted as non-relevant (`fixed_counts`).

Shapes: Q queries, T positives in the database, P positive slots per query (padded), D dims.
"""

import dataclasses
import glob
import hashlib
import os
import pickle
import re
import time

import h5py
import jax
import numpy as np
from absl import logging

from tailaware.core import metrics
from tailaware.io import atomic, features
from tailaware.io import scores as scores_lib
from tailaware.jobs import predict
from tailaware.search import scoring, topk

QUERY_FILES = {"image": features.IMAGE_QUERIES, "text": features.TEXT_QUERIES}
_SHARD_RE = re.compile(r"features_distractors_(\d{5})\.(hdf5|npy)$")


# ---------------------------------------------------------------------------------------------
# Reading a folder.


@dataclasses.dataclass(frozen=True)
class Split:
    """A fully read split (queries or positives): float16 descriptors and ids."""

    features: np.ndarray
    ids: np.ndarray


def read_split(folder: str, name: str, dim: int | None = None) -> Split:
    """Reads `name` (an ILIAS file name) from `folder`, as HDF5 or as `.npy` + `.ids.txt`."""
    path = os.path.join(folder, name)
    if os.path.exists(path):
        feats, ids = features.read_features(path, dim=dim)
        return Split(feats, np.asarray(ids))
    npy = _npy_path(path)
    if os.path.exists(npy):
        feats = _check_npy(npy, np.load(npy, mmap_mode="r"), dim)
        return Split(np.asarray(feats), _read_txt_ids(npy, feats.shape[0]))
    raise FileNotFoundError(f"{path}: missing (nor {os.path.basename(npy)} with its id list)")


def distractor_shards(folder: str, dim: int, expected: int = 0) -> list[scoring.Shard]:
    """Returns the distractor shards of `folder`, numbered 0..n-1 with no gaps.

    Args:
      folder: the feature folder.
      dim: the descriptor dimension every shard must have.
      expected: the number of shards there must be (0: whatever is there).

    Raises:
      FileNotFoundError / ValueError: naming the missing, unreadable or mismatched file.
    """
    found = {}
    for path in sorted(glob.glob(os.path.join(folder, "features_distractors_*"))):
        match = _SHARD_RE.search(os.path.basename(path))
        if match:
            found.setdefault(int(match.group(1)), path)
    if not found:
        raise FileNotFoundError(f"{folder}: no distractor shards features_distractors_*.hdf5")
    n = max(max(found) + 1, expected)
    missing = [i for i in range(n) if i not in found]
    if missing:
        name = features.distractor_name(missing[0])
        raise FileNotFoundError(f"{os.path.join(folder, name)}: missing distractor shard")
    return [_open_shard(i, found[i], dim) for i in range(n)]


def _open_shard(number: int, path: str, dim: int) -> scoring.Shard:
    if path.endswith(".npy"):
        try:
            arr = _check_npy(path, np.load(path, mmap_mode="r"), dim)
        except ValueError as e:
            raise ValueError(f"{path}: not a readable .npy file ({e})") from e
        read = lambda rows: take_rows(np.load(path, mmap_mode="r"), rows)
        return scoring.Shard(
            number,
            path,
            arr.shape[0],
            lambda: _read_txt_ids(path, arr.shape[0]),
            lambda rows: _finite(path, read(rows), "descriptors"),
        )
    try:
        with h5py.File(path, "r") as f:
            if "features" not in f or "index" not in f:
                raise ValueError("expected datasets 'features' and 'index'")
            shape, n_ids = f["features"].shape, f["index"].shape
    except (OSError, ValueError) as e:
        raise ValueError(f"{path}: not a readable ILIAS feature file ({e})") from e
    if len(shape) != 2 or n_ids != (shape[0],):
        raise ValueError(f"{path}: 'features' {shape} and 'index' {n_ids} do not match")
    if shape[1] != dim:
        raise ValueError(f"{path}: dimension {shape[1]}; expected {dim} (as the queries)")
    return scoring.Shard(
        number, path, shape[0], lambda: np.asarray(features.read_ids(path)), _h5_rows(path)
    )


def _h5_rows(path: str):
    def read(rows: np.ndarray) -> np.ndarray:
        rows = np.asarray(rows, np.int64)
        try:
            with h5py.File(path, "r") as f:
                ds = f["features"]
                x = take_rows(ds, rows) if rows.size else np.zeros((0, ds.shape[1]), ds.dtype)
        except OSError as e:
            raise ValueError(f"{path}: unreadable features ({e})") from e
        return _finite(path, x, "field 'features'")

    return read


def take_rows(array, rows: np.ndarray) -> np.ndarray:
    """Returns `array[rows]` (a dataset, memory map or array); a contiguous range of rows is read
    as one slice (fastest; a view of an in-memory array)."""
    rows = np.asarray(rows, np.int64)
    if rows.size and rows[-1] - rows[0] + 1 == rows.size:
        return np.asarray(array[rows[0] : rows[-1] + 1])
    return np.asarray(array[rows])


def _finite(path: str, x: np.ndarray, what: str) -> np.ndarray:
    if not np.isfinite(x).all():
        raise ValueError(f"{path}: {what}: NaN or infinite values; expected finite descriptors")
    return x


def _npy_path(path: str) -> str:
    return os.path.splitext(path)[0] + ".npy"


def _check_npy(path, arr, dim):
    if arr.ndim != 2:
        raise ValueError(f"{path}: expected [n, d] descriptors, got shape {arr.shape}")
    if dim is not None and arr.shape[1] != dim:
        raise ValueError(f"{path}: dimension {arr.shape[1]}; expected {dim} (as the queries)")
    return arr


def _read_txt_ids(npy: str, n: int) -> np.ndarray:
    path = os.path.splitext(npy)[0] + ".ids.txt"
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: missing id list for {npy}")
    with open(path) as f:
        ids = np.asarray([line.rstrip("\n") for line in f if line.strip()])
    if ids.size != n:
        raise ValueError(f"{path}: {ids.size} ids for {n} descriptors in {npy}")
    return ids


# ---------------------------------------------------------------------------------------------
# Ground truth.


def instance_of(ids) -> np.ndarray:
    """Returns each id's instance: the prefix before the first '/'."""
    return np.asarray([str(i).split("/")[0] for i in ids])


def ground_truth(query_ids, positive_ids) -> tuple[np.ndarray, np.ndarray]:
    """Returns (slots [Q, P] int64 indices into the positives, -1 padded; relevant [Q, T] bool).

    Raises:
      ValueError: on duplicate ids or a query without positives (naming it).
    """
    for label, ids in (("query", query_ids), ("positive", positive_ids)):
        uniq, counts = np.unique(np.asarray(ids), return_counts=True)
        if (counts > 1).any():
            raise ValueError(f"duplicate {label} id {str(uniq[counts > 1][0])!r}")
    relevant = instance_of(query_ids)[:, None] == instance_of(positive_ids)[None, :]
    n_pos = relevant.sum(axis=1)
    if (n_pos == 0).any():
        raise ValueError(f"query {str(query_ids[int(np.argmin(n_pos))])!r} has no positives")
    order = np.argsort(~relevant, axis=1, kind="stable")[:, : n_pos.max()]
    slots = np.where(np.take_along_axis(relevant, order, axis=1), order, -1)
    return slots.astype(np.int64), relevant


def positive_scores(all_scores, slots, relevant):
    """Returns (pos_scores [Q, P] NaN-padded, fixed_counts [Q, P] -1 padded).

    `fixed_counts` counts the other instances' positives strictly above each positive.
    """
    mask = slots >= 0
    pos = np.where(mask, np.take_along_axis(all_scores, np.maximum(slots, 0), axis=1), np.nan)
    nonrel = np.where(relevant, -np.inf, all_scores)
    fixed = np.zeros(pos.shape, np.int64)
    for s in range(0, pos.shape[0], 64):  # chunks keep the [q, P, T] comparison small
        fixed[s : s + 64] = (nonrel[s : s + 64, None, :] > pos[s : s + 64, :, None]).sum(axis=2)
    return pos.astype(np.float32), np.where(mask, fixed, -1).astype(np.int64)


# ---------------------------------------------------------------------------------------------
# Exact mode: the official mAP@k and the ranked lists.


def ranked_lists(state, all_scores, relevant, positive_ids, shards, k):
    """Returns the official pickle layout of the top-k database items of every query.

    The database is positives + distractors; order: score descending, and among equal scores
    the query's own positives, then other positives, then distractors (our tie rule), each by
    file position. `db_ids` lists the positives, then the distractors that appear in some list.

    Returns:
      dict with `db_ids` [n], `sims` [Q, k] float32 and `ranks` [Q, k] int64 (indices into
      `db_ids`; -1 past the end of a list: fewer than k items, or k > M and the list stops
      where the kept distractors run out).
    """
    q, t = all_scores.shape
    dist_ids = np.unique(state.ids[:, :k][state.ids[:, :k] >= 0])
    # Candidates per query: every positive and its k best distractors, as columns.
    vals = np.concatenate([all_scores.astype(np.float32), state.vals[:, :k]], axis=1)
    group = np.concatenate([np.where(relevant, 0, 1), np.full(state.vals[:, :k].shape, 2)], 1)
    col = np.concatenate(
        [np.broadcast_to(np.arange(t), (q, t)), t + np.searchsorted(dist_ids, state.ids[:, :k])],
        axis=1,
    )
    # With k > M the kept distractors run out: a positive below the M-th kept score may have
    # unkept distractors above it, so each list stops there (never an issue for k <= M).
    floor = np.where(np.isfinite(state.vals[:, -1]), state.vals[:, -1], -np.inf)
    valid = np.isfinite(vals) & ((group == 2) | (vals >= floor[:, None]))
    order = np.lexsort((col, group, np.where(valid, -vals, np.inf)), axis=1)[:, :k]
    sims = np.take_along_axis(vals, order, axis=1)
    ranks = np.where(
        np.take_along_axis(valid, order, axis=1), np.take_along_axis(col, order, axis=1), -1
    )
    db_ids = list(map(str, positive_ids)) + _distractor_id_strings(dist_ids, shards)
    return {"db_ids": db_ids, "sims": sims.astype(np.float32), "ranks": ranks.astype(np.int64)}


def _distractor_id_strings(ids, shards) -> list[str]:
    by_number = {s.number: s for s in shards}
    shard_no, rows = scoring.split_ids(ids)
    out = []
    for number in np.unique(shard_no):
        names = by_number[int(number)].read_ids()
        out.extend(str(names[r]) for r in rows[shard_no == number])
    return out


# ---------------------------------------------------------------------------------------------
# The job.


def run(config, workdir: str) -> dict:
    """Scores `config.features` and writes sampled_scores.npz and prediction.json to workdir.

    Returns the prediction.json fields (process 0) or {} (other processes).
    """
    if not config.features:
        raise ValueError("--config.features must name an ILIAS-format feature folder")
    if config.queries not in QUERY_FILES:
        raise ValueError(f"--config.queries must be one of {sorted(QUERY_FILES)}")
    if config.distributed:
        jax.distributed.initialize()
    t0 = time.monotonic()
    queries = read_split(config.features, QUERY_FILES[config.queries])
    dim = queries.features.shape[1]
    positives = read_split(config.features, features.POSITIVES, dim=dim)
    shards = distractor_shards(config.features, dim, config.expected_shards)
    _check_distinct(queries.ids, positives.ids)
    slots, relevant = ground_truth(queries.ids, positives.ids)
    n_distractors = sum(s.num_rows for s in shards)
    logging.info(
        "%d %s queries, %d positives, %d distractors in %d shards (dim %d)",
        len(queries.ids),
        config.queries,
        len(positives.ids),
        n_distractors,
        len(shards),
        dim,
    )

    m = int(config.evt.top_m)
    backend = scoring.make_backend(
        config.backend, queries.features, m, config.block_size, config.matmul_dtype
    )
    all_scores = backend.scores(positives.features)  # [Q, T], the same arithmetic as the search
    pos, fixed = positive_scores(all_scores, slots, relevant)
    spec = scoring.SearchSpec(
        float(config.sample_fraction), int(config.seed), m, _fingerprint(queries, positives)
    )
    process, count = jax.process_index(), jax.process_count()
    partials = os.path.join(workdir, "partials")
    mine = scoring.assign_shards(shards, process, count)
    state, n_sample = scoring.score_shards(
        backend,
        pos,
        mine,
        spec,
        block_size=config.block_size,
        checkpoint=os.path.join(partials, f"process_{process:03d}_of_{count:03d}.npz"),
        checkpoint_every_s=config.checkpoint_every_s,
    )
    if process != 0:
        return {}
    state, n_sample = _merge_processes(partials, count, spec, state, n_sample, len(shards))
    if n_sample == 0:
        raise ValueError(
            f"{config.features}: no distractor in the {config.sample_fraction} sample of "
            f"{n_distractors}; raise --config.sample_fraction"
        )
    counts = np.where(slots >= 0, state.counts, -1)
    scores = scores_lib.make_scores(
        state.vals, pos, counts, n_sample, fixed, queries.ids, source=workdir
    )
    scores_lib.save_scores(os.path.join(workdir, "sampled_scores.npz"), scores)
    n_target = int(config.n_target) or n_distractors
    if config.sample_fraction == 1.0:
        if n_target != n_distractors:
            logging.warning("exact mode evaluates the %d distractors present", n_distractors)
        result = exact_result(scores, int(config.k), n_distractors)
        lists = ranked_lists(state, all_scores, relevant, positives.ids, shards, int(config.k))
        lists["query_ids"] = [str(i) for i in queries.ids]
        _write_pickle(os.path.join(workdir, f"ranked_top{config.k}.pkl"), lists)
        result["queries"] = config.queries
        predict.write_prediction(result, workdir)
    else:  # prediction.json, its curve and the hardness artifact
        provenance = {"features": config.features, "queries": config.queries}
        extra = {"queries": config.queries}
        result = predict.report(scores, config, n_target, workdir, extra, provenance)
    logging.info("scored and evaluated in %.1f s", time.monotonic() - t0)
    return result


def exact_result(scores: scores_lib.SampledScores, k: int, n_target: int) -> dict:
    """Returns the prediction.json fields of an exact evaluation (every distractor scored)."""
    mask = scores.mask
    counts = np.where(mask, scores.pos_counts + scores.fixed_counts, -1)
    aps = metrics.ap_at_k_from_counts(counts, mask, k)
    result = {
        "map": float(aps.mean()),
        "estimator": "exact",
        "n_target": int(n_target),
        "n_sample": int(scores.n_sample),
        "k": int(k),
        "num_queries": int(scores.num_queries),
        "per_query_ap": [float(a) for a in aps],
        "baselines": {},
    }
    if scores.query_ids is not None:
        result["query_ids"] = [str(q) for q in scores.query_ids]
    return result


def _merge_processes(partials, count, spec, state, n_sample, n_shards):
    """Process 0: waits for the other processes' final partials and merges them in order."""
    for p in range(1, count):
        path = os.path.join(partials, f"process_{p:03d}_of_{count:03d}.npz")
        want = {s for s in range(n_shards) if s % count == p}
        deadline = time.monotonic() + 24 * 3600
        while True:
            if os.path.exists(path):
                other, other_done, other_n = scoring.load_checkpoint(path, spec)
                if set(other_done) == want:
                    break
            if time.monotonic() > deadline:
                raise TimeoutError(f"{path}: process {p} did not finish")
            time.sleep(0.2)
        state = topk.merge_states(state, other)
        n_sample += other_n
    return topk.sorted_state(state), n_sample


def _check_distinct(query_ids, positive_ids):
    overlap = set(map(str, query_ids)) & set(map(str, positive_ids))
    if overlap:
        raise ValueError(f"id {sorted(overlap)[0]!r} is both a query and a positive")


def _fingerprint(queries: Split, positives: Split) -> str:
    h = hashlib.blake2b(digest_size=16)
    for split in (queries, positives):
        h.update(np.ascontiguousarray(split.features).tobytes())
        h.update("\n".join(map(str, split.ids)).encode())
    return h.hexdigest()


def _write_pickle(path: str, obj: dict) -> None:
    with atomic.atomic_path(path) as tmp, open(tmp, "wb") as f:
        pickle.dump(obj, f, protocol=pickle.HIGHEST_PROTOCOL)
