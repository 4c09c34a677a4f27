"""The scoring engine: queries against a stream of distractor blocks, top-M and exact counts.

For every query the engine keeps the M highest similarities to the scored distractors (with
their ids) and counts, for each of the query's positives, the scored distractors strictly above
it (exact, also beyond the M-th score). Shards stream through in blocks, so peak memory does not
depend on how many shards there are; a checkpoint after each shard lets an interrupted run
resume, and under `jax.distributed` each process scores a deterministic subset of the shards
whose partial results merge exactly (`topk.merge_states`).

The backends that score a block (host numpy, JAX, faiss) live in `tailaware.search.backends`; this
module streams shards through one of them. The host and JAX backends speculate
(`speculates`): `score_shards` guesses each query's final M-th score from a random pilot sample
of the rows, the backend filters at that floor, and queries where the guess proves too high get
a second pass.

Shapes: Q queries, D descriptor dims, B block rows, M kept scores, P positive slots.
Distractor ids are `shard << 32 | row`, so ties order by file position.
"""

import dataclasses
import json
import os
import time
from collections.abc import Iterator, Sequence
from concurrent import futures

import numpy as np
from absl import logging

from tailaware.core import sampling
from tailaware.io import atomic, errors
from tailaware.io.ilias_folder import Shard
from tailaware.io.progress import Progress
from tailaware.search import topk
from tailaware.search.backends import (  # noqa: F401 (re-exported: the engine's public names)
    BACKEND_FACTORIES,
    BACKENDS,
    ROW_BITS,
    Backend,
    FaissBackend,
    FaissGpu,
    HostBackend,
    JaxBackend,
    choose_backend,
    global_ids,
    make_backend,
    split_ids,
)
from tailaware.search.topk import TopState

# ---------------------------------------------------------------------------------------------
# Streaming over shards, with checkpoints and a multi-process split.


@dataclasses.dataclass(frozen=True)
class SearchSpec:
    """What a search is: the same spec on resume, or the checkpoint is not used."""

    fraction: float
    seed: int
    m: int
    fingerprint: str  # e.g. a digest of the query and positive ids

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)


def assign_shards(shards: Sequence[Shard], process: int, count: int) -> list[Shard]:
    """Returns process `process`'s deterministic share of the shards (round robin by number)."""
    return [s for s in sorted(shards, key=lambda s: s.number) if s.number % count == process]


def sampled_rows(shard: Shard, fraction: float, seed: int) -> np.ndarray:
    """Returns the sorted rows of `shard` inside the uniform sample (reads only the ids)."""
    ids = shard.read_ids()
    if len(set(ids.tolist())) != len(ids):  # a set is faster than np.unique on strings
        uniq, counts = np.unique(ids, return_counts=True)
        raise ValueError(f"{shard.name}: duplicate distractor id {str(uniq[counts > 1][0])!r}")
    if fraction == 1.0:
        return np.arange(len(ids))  # every row: no need to hash the ids
    return np.flatnonzero(sampling.in_sample(ids, fraction, seed))


# Rows the floor's pilot sample scores (`_pilot_floor`).
PILOT_ROWS = 4096


def score_shards(
    backend: Backend,
    pos_scores: np.ndarray,
    shards: Sequence[Shard],
    spec: SearchSpec,
    *,
    block_size: int,
    checkpoint: str | None = None,
    checkpoint_every_s: float = 0.0,
    pilot_rows: int = PILOT_ROWS,
    floor: np.ndarray | None = None,
    stage: str = "scoring",
) -> tuple[TopState, int]:
    """Streams `shards` through `backend`; returns the sorted state and the sample size S.

    A backend that `speculates` filters at a guess of each query's final M-th score from a
    random pilot sample of `pilot_rows` rows (`_pilot_floor`), or at the given `floor` [Q];
    queries where the floor proves too high get a second pass over the shards.

    With `checkpoint`, the state is written there atomically after a shard (at most every
    `checkpoint_every_s` seconds, always the exact final state), and a run that finds a
    checkpoint of the same spec resumes after the shards it names. `stage` starts each progress
    line (`Progress`), e.g. to tell a proxy's search from the run's.
    """
    shards = sorted(shards, key=lambda s: s.number)
    state = topk.empty_state(pos_scores.shape[0], spec.m, pos_scores.shape[1])
    done, n_sample = [], 0
    if checkpoint and os.path.exists(checkpoint):
        state, done, n_sample = load_checkpoint(checkpoint, spec)
        if done != [s.number for s in shards[: len(done)]]:
            raise ValueError(
                f"{checkpoint}: covers shards {done}, not a prefix of this process's shards; "
                "remove it to start over"
            )
        logging.info("resuming after %d shards from %s", len(done), checkpoint)
    todo = shards[len(done) :]
    if state.floor is None and backend.speculates:
        if floor is None:
            floor = _pilot_floor(backend, shards, spec, pilot_rows)
        state = state._replace(floor=floor)
    backend.start(pos_scores, state)
    total = sum(s.num_rows for s in todo)
    with Progress(stage, f"{len(todo)} shards", total=total, unit="rows") as progress:
        last_write = time.monotonic()
        try:
            for shard, rows, blocks in _read_ahead(todo, spec, block_size):
                for start, x in blocks:
                    backend.add(x, global_ids(shard.number, rows[start : start + x.shape[0]]))
                n_sample += rows.size
                done.append(shard.number)
                progress.update(shard.num_rows, name=shard.name)
                # Not after the last shard: a partial naming all the shards must be the final one.
                last = shard is todo[-1]
                if checkpoint and not last and time.monotonic() - last_write >= checkpoint_every_s:
                    # Continue from the canonical state, so a resumed run repeats exactly this path.
                    state = backend.state()
                    save_checkpoint(checkpoint, state, done, n_sample, spec)
                    backend.start(pos_scores, state)
                    last_write = time.monotonic()
            state = backend.state()
        except BaseException:
            _abandon(backend)
            raise
    if not topk.exact_rows(state).all():
        state = _rescan(backend, state, shards, spec, block_size)
    state = TopState(state.vals, state.ids, state.counts)  # exact now: no floor
    if checkpoint:  # the final partial, also for a process with no shards (merged by process 0)
        save_checkpoint(checkpoint, state, done, n_sample, spec)
    return state, n_sample


def _abandon(backend: Backend) -> None:
    """Lets a backend that scores asynchronously finish, so a failed search leaves no work
    behind (the error being raised is the one reported)."""
    try:
        getattr(backend, "drain", lambda: None)()
    except Exception:  # a consequence of the error being raised
        pass


def _pilot_floor(
    backend: Backend, shards: Sequence[Shard], spec: SearchSpec, pilot_rows: int
) -> np.ndarray | None:
    """Returns [Q] a cautious guess of each query's final M-th score (`topk.guess_floor`).

    It scores `pilot_rows` rows drawn at random from all of `shards` (seeded, so a resumed run
    draws the same), not from the sample: the sample is a hash of the ids, independent of the
    scores, so the two draws are alike and this one needs no ids. A random draw, unlike the
    first rows of the stream, makes the guess valid whatever the order of the shards.
    """
    sizes = np.asarray([s.num_rows for s in shards], np.int64)
    total = int(sizes.sum())
    expected = round(spec.fraction * total)
    if expected < 4 * spec.m:
        return None  # a large share of the scores is kept anyway: little to gain
    pick = np.random.default_rng(spec.seed).choice(total, min(pilot_rows, total), replace=False)
    pick = np.sort(pick)
    starts = np.cumsum(sizes) - sizes
    owner = np.searchsorted(starts, pick, side="right") - 1  # skips empty shards
    x = np.concatenate(
        [shards[i].read_rows(pick[owner == i] - starts[i]) for i in np.unique(owner)]
    )
    scores = backend.scores(x)
    floor = topk.guess_floor(scores, spec.m, expected)
    if floor is not None and hasattr(backend, "expect_share"):
        # The device pass sizes its candidate slots by the share of rows above the floor.
        backend.expect_share(float(np.mean(scores >= floor[:, None], axis=1).max()))
    return floor


def _rescan(
    backend: Backend, state: TopState, shards, spec: SearchSpec, block_size: int
) -> TopState:
    """Returns `state` with the top-M of its inexact rows redone by a plain pass over `shards`.

    Speculation never touches counts, so only the kept scores of the rows where it guessed too
    high (`topk.exact_rows`) are recomputed, by a backend for those queries alone.
    """
    redo = np.flatnonzero(~topk.exact_rows(state))
    logging.warning(
        "rescanning %d queries whose guessed floor proved too high (expected for about one "
        "query in a million)",
        redo.size,
    )
    sub = backend.subset(redo)
    m = state.vals.shape[1]
    sub.start(np.full((redo.size, 1), np.nan, np.float32), topk.empty_state(redo.size, m, 1))
    for shard, rows, blocks in _read_ahead(shards, spec, block_size):
        for start, x in blocks:
            sub.add(x, global_ids(shard.number, rows[start : start + x.shape[0]]))
    fixed = sub.state()
    vals, ids = state.vals.copy(), state.ids.copy()
    vals[redo], ids[redo] = fixed.vals, fixed.ids
    return TopState(vals, ids, state.counts)


def save_checkpoint(path, state: TopState, done, n_sample, spec: SearchSpec) -> None:
    """Writes a partial result atomically (state, shards done, S, spec)."""
    floor = {} if state.floor is None else {"floor": state.floor}
    atomic.write_npz(
        path,
        vals=state.vals,
        ids=state.ids,
        counts=state.counts,
        done=np.asarray(done, np.int64),
        n_sample=np.int64(n_sample),
        spec=np.asarray(spec.to_json()),
        **floor,
    )


# A partial result's fields: (dtype kinds, ndim); `floor` [Q] float is optional.
_PARTIAL = {
    "vals": ("f", 2),
    "ids": ("iu", 2),
    "counts": ("iu", 2),
    "done": ("iu", 1),
    "n_sample": ("iu", 0),
    "spec": ("U", 0),
}


def load_checkpoint(path, spec: SearchSpec | None = None):
    """Reads a partial result: (state, shards done, S); checks the spec when given.

    Raises:
      InputError: naming the file, when it is unreadable, malformed or of another search.
    """
    what = "a partial result of the ILIAS job (remove it to start over)"
    fields = atomic.read_npz(path, what, _PARTIAL)
    if spec is not None and str(fields["spec"]) != spec.to_json():
        raise errors.InputError(
            f"{path}: partial result of a different search ({fields['spec']}); expected "
            f"{spec.to_json()}; remove it or use another workdir"
        )
    q, m = fields["vals"].shape
    for name, shape in (("ids", (q, m)), ("counts", (q,)), ("floor", (q,))):
        if name in fields and fields[name].shape[: len(shape)] != shape:
            raise errors.field_error(
                path, name, f"expected shape {shape}..., got {fields[name].shape}"
            )
    state = TopState(fields["vals"], fields["ids"], fields["counts"], fields.get("floor"))
    return state, [int(d) for d in fields["done"]], int(fields["n_sample"])


def _read_ahead(shards, spec, block_size) -> Iterator:
    """Yields (shard, sampled rows, blocks), reading ahead in background threads.

    The next shard's sample (its ids, hashed) and the next block's rows are prepared while the
    current block is scored.
    """
    with futures.ThreadPoolExecutor(1) as reader, futures.ThreadPoolExecutor(1) as hasher:
        sample = lambda s: hasher.submit(sampled_rows, s, spec.fraction, spec.seed)
        upcoming = sample(shards[0]) if shards else None
        for i, shard in enumerate(shards):
            assert upcoming is not None  # submitted for every shard before its turn
            rows = upcoming.result()
            upcoming = sample(shards[i + 1]) if i + 1 < len(shards) else None

            def blocks(shard=shard, rows=rows):
                pending = None
                for start in range(0, rows.size, block_size):
                    nxt = reader.submit(shard.read_rows, rows[start : start + block_size])
                    if pending is not None:
                        yield pending[0], pending[1].result()
                    pending = (start, nxt)
                if pending is not None:
                    yield pending[0], pending[1].result()

            yield shard, rows, blocks()


def merge_processes(partials, count, spec, state, *, n_sample, n_shards):
    """Returns process 0's merged (state, S): waits for the other processes' final partials in
    `partials` and merges them in order into its own."""
    for p in range(1, count):
        path = os.path.join(partials, f"process_{p:03d}_of_{count:03d}.npz")
        want = {s for s in range(n_shards) if s % count == p}
        deadline = time.monotonic() + 24 * 3600
        while True:
            if os.path.exists(path):
                other, other_done, other_n = load_checkpoint(path, spec)
                if set(other_done) == want:
                    break
            if time.monotonic() > deadline:
                raise TimeoutError(f"{path}: process {p} did not finish")
            time.sleep(0.2)
        state = topk.merge_states(state, other)
        n_sample += other_n
    return topk.sorted_state(state), n_sample
