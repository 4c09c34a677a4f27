"""A proxy's top lists for a census design: a similarity file read, or a feature folder searched.

A proxy (`--config.proxy=PATH`) is another model's view of the run's benchmark: a similarity
file in the official ILIAS layout (`tailaware.io.similarity`), or, when PATH is a directory,
that model's ILIAS-format feature folder (`tailaware.io.ilias_folder`), of any dimension. A
folder's lists are searched here: each query's top `depth` items over the folder's positives
and distractors, by an exact search of every distractor with the run's scoring backend
(`scoring.score_shards` at fraction 1), laid out by `exact.ranked_lists` (its tie rule): the
lists an exact run of that model writes (`ranked_top{k}.pkl` at k = `depth`). The search costs
an exact run of that model's matmul and keeps no checkpoint; under `jax.distributed` every
process searches the whole folder (docs/outputs.md, "Similarity files (proxies)").

A folder must hold the run's benchmark: the same query, positive and distractor ids (in any
shard layout); otherwise, before any search, a one-line `InputError` names the folder.

Shapes: Q queries, T positives, k = depth list entries.
"""

import dataclasses
import os
from collections.abc import Sequence

import numpy as np

from tailaware.io import errors, features, ilias_folder, similarity
from tailaware.io.ilias_folder import Shard
from tailaware.search import exact, scoring


@dataclasses.dataclass(frozen=True)
class FolderSearch:
    """How a proxy's feature folder is searched (the run's own search settings).

    Attributes:
      queries: the folder's query file (`ilias_folder.QUERY_FILES`), the run's query set.
      depth: k, the entries of each query's list; the census goes no deeper.
      backend: the scoring backend (`scoring.make_backend`; "auto": the machine's fastest).
      block_size: distractor rows per block.
      matmul_dtype: the JAX backend's matmul inputs (float16, bfloat16 or float32).
    """

    queries: str = features.IMAGE_QUERIES
    depth: int = 1000
    backend: str = "auto"
    block_size: int = 32768
    matmul_dtype: str = "float16"

    def __post_init__(self) -> None:
        for name in ("depth", "block_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")


def read(
    path: str,
    search: FolderSearch,
    *,
    query_ids: np.ndarray,
    positive_ids: np.ndarray,
    distractor_ids: np.ndarray,
) -> similarity.TopLists:
    """Returns the proxy's top lists: a similarity file's, or a feature folder's searched.

    Args:
      path: a similarity file (.pkl or .json) or a feature folder.
      search: how a folder is searched.
      query_ids, positive_ids, distractor_ids: the run's, which a folder must hold (a file's
        are checked when its lists are aligned, `similarity.align`).

    Raises:
      MissingInput: no such file, or a folder's file missing (naming it).
      InputError: one line naming the file or folder: malformed, or a folder of other ids.
    """
    if not os.path.isdir(path):
        return similarity.read(path)
    queries = ilias_folder.read_split(path, search.queries)
    dim = queries.features.shape[1]  # the proxy's own: any dimension
    positives = ilias_folder.read_split(path, features.POSITIVES, dim=dim)
    shards = ilias_folder.distractor_shards(path, dim)
    _same_ids(path, "query_ids", queries.ids, query_ids)
    _same_ids(path, "positive_ids", positives.ids, positive_ids)
    _same_distractors(path, shards, np.asarray(distractor_ids).astype(str))
    _, relevant = ilias_folder.ground_truth(queries.ids, positives.ids)
    backend = scoring.make_backend(
        search.backend, queries.features, search.depth, search.block_size, search.matmul_dtype
    )
    all_scores = backend.scores(positives.features)  # [Q, T], the search's arithmetic
    spec = scoring.SearchSpec(1.0, 0, search.depth, ilias_folder.fingerprint(queries, positives))
    # The lists need no counts: one NaN positive slot per query counts nothing.
    nothing = np.full((queries.ids.size, 1), np.nan, np.float32)
    state, _ = scoring.score_shards(
        backend,
        nothing,
        shards,
        spec,
        block_size=search.block_size,
        stage=f"top-{search.depth} lists of proxy {path}",
    )
    lists = exact.ranked_lists(state, all_scores, relevant, positives.ids, shards, k=search.depth)
    lists["query_ids"] = [str(i) for i in queries.ids]
    return similarity.from_fields(lists, path)


def _same_distractors(folder: str, shards: Sequence[Shard], want: np.ndarray) -> None:
    """Raises the `InputError` naming `folder` unless its shards hold the ids `want` [N].

    The usual folder has the run's shards, so the ids are compared shard by shard in order,
    holding one shard's at a time; only another layout (or a mismatch) sorts all of them.
    """
    start = 0
    for shard in shards:
        ids = np.asarray(shard.read_ids()).astype(str)
        if not np.array_equal(ids, want[start : start + ids.size]):
            break
        start += ids.size
    else:
        if start == want.size:
            return
    names = np.concatenate([np.asarray(s.read_ids()).astype(str) for s in shards])
    _same_ids(folder, "distractor_ids", names, want)


def _same_ids(folder: str, field: str, got: np.ndarray, want: np.ndarray) -> None:
    """Raises the `InputError` naming `folder` unless `got` and `want` hold the same ids."""
    got, want = np.sort(np.asarray(got).astype(str)), np.sort(np.asarray(want).astype(str))
    if got.size == want.size and np.array_equal(got, want):
        return
    missing, extra = np.setdiff1d(want, got), np.setdiff1d(got, want)
    if missing.size:
        what = f"lacks the run's {str(missing[0])!r}"
    elif extra.size:
        what = f"holds {str(extra[0])!r}, which the run's folder does not"
    else:
        what = "repeats an id"
    raise errors.field_error(
        folder,
        field,
        f"{what} ({got.size} ids, the run's {want.size}); expected a proxy feature folder of "
        "the run's benchmark",
    )
