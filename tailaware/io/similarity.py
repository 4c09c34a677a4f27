"""A similarity file in the official ILIAS layout: per query, its top-k database ids and scores.

The official `knn_search/search.py` writes it and `evaluate.py` reads it; the `ilias` job in
exact mode writes the same layout (`ranked_top{k}.pkl`, `tailaware.search.exact.ranked_lists`).
Two forms (docs/outputs.md, "Similarity files"):

- `.pkl`: a dict with `query_ids` [Q] (str), `db_ids` [n] (str), `sims` float [Q, k] (descending
  per row) and `ranks` int [Q, k], indices into `db_ids` (-1 past the end of a shorter list).
- `.json`: `{query_id: {db_id: sim, ...}, ...}`; each query's items are ranked by descending sim.

Pickles are read through an allow-list (`_Restricted`): only numpy arrays, their dtypes and
scalars, and plain containers load; anything else is an error, never executed.

Shapes: Q queries, k list entries per query.
"""

import io
import json
import os
import pickle
from typing import Any, NamedTuple

import numpy as np

from tailaware.io import errors

# The globals a pickle of numpy arrays, lists and dicts needs (numpy 1.x and 2.x module names).
_ALLOWED = {
    ("numpy", "ndarray"),
    ("numpy", "dtype"),
    ("numpy.core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.multiarray", "scalar"),
    ("numpy._core.multiarray", "scalar"),
    ("numpy.core.numeric", "_frombuffer"),
    ("numpy._core.numeric", "_frombuffer"),
    ("_codecs", "encode"),
    ("codecs", "encode"),
    ("builtins", "list"),
    ("builtins", "dict"),
    ("builtins", "tuple"),
    ("builtins", "set"),
    ("builtins", "str"),
    ("builtins", "bytes"),
    ("builtins", "int"),
    ("builtins", "float"),
    ("collections", "OrderedDict"),
}


class _Restricted(pickle.Unpickler):
    """An unpickler that loads only `_ALLOWED` globals (numpy arrays and plain containers)."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _ALLOWED or module.startswith("numpy.dtypes"):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"refusing to load {module}.{name} (not an array or list)")


class TopLists(NamedTuple):
    """One similarity file's top lists.

    Attributes:
      query_ids: [Q] str.
      db_ids: [n] str, the database items the lists name.
      ranks: [Q, k] int64 indices into `db_ids`, best first; -1 past the end of a list.
      sims: [Q, k] float32 scores, NaN past the end of a list.
      source: the file (or the feature folder they were searched in), for messages.
    """

    query_ids: np.ndarray
    db_ids: np.ndarray
    ranks: np.ndarray
    sims: np.ndarray
    source: str

    @property
    def depth(self) -> int:
        """k, the entries per list."""
        return int(self.ranks.shape[1])


def read(path: str | os.PathLike) -> TopLists:
    """Reads and checks a similarity file (`.pkl` or `.json`, the module docstring).

    Raises:
      MissingInput: no such file.
      InputError: one line naming the file and the field.
    """
    src = errors.require_file(path, "a similarity file (.pkl or .json, the official layout)")
    if src.endswith(".json"):
        return _from_json(src)
    try:
        with open(src, "rb") as f:
            obj = _Restricted(io.BytesIO(f.read())).load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError) as e:
        raise errors.InputError(f"{src}: not a readable similarity pickle ({e})") from None
    if not isinstance(obj, dict):
        raise errors.InputError(f"{src}: expected a dict with query_ids, db_ids, sims, ranks")
    return from_fields(obj, src)


def from_fields(obj: dict, src: str) -> TopLists:
    """Returns the checked `TopLists` of the pickle layout's fields (`obj`, the dict of the
    module docstring, e.g. `tailaware.search.exact.ranked_lists`'s), named `src` in errors.

    Raises:
      InputError: one line naming `src` and the field.
    """

    def fail(field: str, msg: str) -> None:
        raise errors.field_error(src, field, msg)

    for name in ("query_ids", "db_ids", "sims", "ranks"):
        if name not in obj:
            fail(name, "missing (the official layout has query_ids, db_ids, sims, ranks)")
    qids = _strings(obj["query_ids"], "query_ids", fail)
    dbids = _strings(obj["db_ids"], "db_ids", fail)
    ranks, sims = np.asarray(obj["ranks"]), np.asarray(obj["sims"])
    if ranks.dtype.kind not in "iu" or ranks.ndim != 2:
        fail("ranks", f"expected an integer [Q, k] array, got {ranks.dtype} {ranks.shape}")
    if ranks.shape[0] != qids.size or ranks.shape[1] < 1:
        fail("ranks", f"expected [Q, k] with Q = {qids.size} queries, k >= 1; got {ranks.shape}")
    if sims.dtype.kind != "f" or sims.shape != ranks.shape:
        fail("sims", f"expected a float array of the shape of ranks {ranks.shape}")
    ranks = ranks.astype(np.int64)
    if (ranks < -1).any() or (ranks >= dbids.size).any():
        fail("ranks", f"indices outside [0, {dbids.size}) (len(db_ids)); -1 only as padding")
    pad = ranks < 0
    if (pad[:, :-1] & ~pad[:, 1:]).any():
        fail("ranks", "padding (-1) before a real entry; lists must be filled from the front")
    sims = np.where(pad, np.nan, sims).astype(np.float32)
    if np.isnan(sims[~pad]).any():
        fail("sims", "NaN at a real entry")
    if (sims[:, 1:] > sims[:, :-1]).any():
        row = int(np.argwhere(sims[:, 1:] > sims[:, :-1])[0, 0])
        fail("sims", f"row {row} ({qids[row]}) is not in descending order")
    ordered = np.sort(ranks, axis=1)
    if ((ordered[:, 1:] == ordered[:, :-1]) & (ordered[:, 1:] >= 0)).any():
        fail("ranks", "an item repeats within a query's list")
    return TopLists(qids, dbids, ranks, sims, src)


def _strings(value: Any, field: str, fail: Any) -> np.ndarray:
    arr = np.asarray(value)
    if arr.ndim != 1 or arr.size == 0 or arr.dtype.kind not in "UO":
        fail(field, f"expected a non-empty list of id strings, got {arr.dtype} {arr.shape}")
    if arr.dtype.kind == "O" and not all(isinstance(v, str) for v in arr):
        fail(field, "expected id strings")
    arr = arr.astype(str)
    if np.unique(arr).size != arr.size:
        fail(field, "an id repeats")
    return arr


def _from_json(src: str) -> TopLists:
    try:
        with open(src, encoding="utf-8") as f:
            obj = json.load(f)
    except (ValueError, UnicodeDecodeError) as e:
        raise errors.InputError(f"{src}: not valid JSON ({e})") from None
    if not isinstance(obj, dict) or not obj:
        raise errors.InputError(f"{src}: expected {{query_id: {{db_id: sim}}}}, non-empty")
    qids = list(obj)
    db: dict[str, int] = {}
    lists = []
    for q in qids:
        row = obj[q]
        if not isinstance(row, dict) or not row:
            raise errors.field_error(src, str(q), "expected a non-empty {db_id: sim} object")
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in row.values()):
            raise errors.field_error(src, str(q), "expected numeric similarities")
        items = sorted(row.items(), key=lambda kv: -float(kv[1]))
        lists.append([(db.setdefault(i, len(db)), float(s)) for i, s in items])
    k = max(len(r) for r in lists)
    ranks = np.full((len(qids), k), -1, np.int64)
    sims = np.full((len(qids), k), np.nan, np.float64)
    for i, r in enumerate(lists):
        ranks[i, : len(r)] = [j for j, _ in r]
        sims[i, : len(r)] = [s for _, s in r]
    fields = {"query_ids": qids, "db_ids": list(db), "ranks": ranks, "sims": sims}
    return from_fields(fields, src)


def align(
    lists: TopLists, query_ids: np.ndarray, gallery_ids: np.ndarray, known_ids: np.ndarray
) -> np.ndarray:
    """Returns [Q, k] int64 each list entry's index into `gallery_ids` (-1: padding or an item
    of `known_ids`, e.g. a positive, which is always in the database), rows in `query_ids` order.

    Raises:
      InputError: naming the file (`lists.source`), when its queries are not exactly `query_ids`
        or it names an id that is neither in `gallery_ids` nor in `known_ids`.
    """
    query_ids = np.asarray(query_ids).astype(str)
    order = np.argsort(lists.query_ids)
    where = np.searchsorted(lists.query_ids, query_ids, sorter=order)
    where = np.minimum(where, lists.query_ids.size - 1)
    found = lists.query_ids[order[where]] == query_ids
    if not found.all() or lists.query_ids.size != query_ids.size:
        missing = query_ids[~found]
        what = (
            f"lacks query {str(missing[0])!r}"
            if missing.size
            else f"holds {lists.query_ids.size} queries, not the {query_ids.size} scored"
        )
        raise errors.field_error(lists.source, "query_ids", f"{what}; expected the same queries")
    ranks = lists.ranks[order[where]]
    gallery = np.asarray(gallery_ids).astype(str)
    g_order = np.argsort(gallery)
    pos = np.minimum(np.searchsorted(gallery, lists.db_ids, sorter=g_order), gallery.size - 1)
    in_gallery = gallery[g_order[pos]] == lists.db_ids
    other = np.isin(lists.db_ids, np.asarray(known_ids).astype(str))
    used = np.zeros(lists.db_ids.size, bool)
    used[ranks[ranks >= 0]] = True
    unknown = used & ~in_gallery & ~other
    if unknown.any():
        raise errors.field_error(
            lists.source,
            "db_ids",
            f"id {str(lists.db_ids[np.flatnonzero(unknown)[0]])!r} is neither a distractor nor a "
            "positive of this folder; expected a similarity file of this benchmark",
        )
    index = np.where(in_gallery, g_order[pos], -1)
    return np.where(ranks >= 0, index[np.maximum(ranks, 0)], -1)
