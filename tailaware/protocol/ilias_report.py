"""The official ILIAS report: its groups of positives and how it averages the queries.

The ILIAS evaluation (`evaluation/src/dataset.py`, `evaluate(..., report=True)`) reports, in
percent: `map` (mAP@k), `oracle` (the mean of (positives in the top k) / len(top k) x k / |gt|,
recall@k when the list holds k items), mAP@k per `scale` and per `clutter` group, and per
`categories` and `subcategories` of the instances (docs/outputs.md, "The ILIAS report").

Every value is a linear functional of one per-query metric in one *view* of the positives,
value = sum_q w_q v_q, and a `ReportSpec` holds the views and the weights (`build_spec`):

- view 0 is every positive; `map` (metric "map") and `oracle` ("recall") weigh queries 1 / Q.
- A scale or clutter group [t1, t2) is a view: the positives of the query's instance outside
  the group are deleted from the ranked list (later items move up), so an in-group positive
  ranks (its rank among the in-group positives) + (non-relevant items above it), which is what
  `core.metrics.ranks_from_counts` gives on the view's mask; AP@k divides by min(k, |gt in the
  group|). A query whose instance has no positive in the group is skipped for it: the group
  weighs the queries that have it 1 / (their number), the rest 0.
- A category (or a subcategory, keyed by its label "category-subcategory") is the mean over
  its instances of the mean AP@k of each instance's queries: view 0, query weights
  1 / (instances in it x queries of the query's instance).

`apply` evaluates the items on any per-query values: exact ones (`exact_report`) or a law's
predictions and their bootstrap replicates.

The official script evaluates a stored top-k list: a positive below the k-th item that would
move into the top k once out-of-group positives are deleted is not in that list, so its group
values can be lower than here, where the full ranking is evaluated (they agree on map, oracle
and the categories, which delete nothing; docs/outputs.md).

Shapes: Q queries, P positive slots (padded), V views, I items.
"""

import math
from collections.abc import Mapping
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from tailaware.core import metrics
from tailaware.core.results import Report, ReportValue
from tailaware.io import ilias_folder

# The official groups, as `evaluation/src/dataset.py` writes their edges: keys f"{t1}-{t2}" in
# Python's float formatting ("0-0.06880213760855043", "53-inf").
SCALE_EDGES = (0, 0.06880213760855043, 0.13526567164179104, 0.2729876723163842, math.inf)
CLUTTER_EDGES = (0, 18, 33, 53, math.inf)
SECTIONS = ("map", "oracle", "scale", "clutter", "categories", "subcategories")
GROUPED = SECTIONS[2:]


class Item(NamedTuple):
    """One value of the report: value = sum_q weights[q] * v_q, v_q the metric in the view.

    Attributes:
      section: one of `SECTIONS`.
      key: its key within the section ("" for map and oracle).
      view: the index of its view in `ReportSpec.views`.
      metric: a key of `core.metrics.METRICS` ("map", or "recall" for oracle).
      weights: [Q] float64 query weights, summing to 1.
      num_instances: the instances of the queries it weighs.
    """

    section: str
    key: str
    view: int
    metric: str
    weights: np.ndarray
    num_instances: int = 0

    @property
    def num_queries(self) -> int:
        """The number of queries it averages."""
        return int((self.weights > 0).sum())


class ReportSpec(NamedTuple):
    """The official report's groups and aggregations over one set of queries.

    Attributes:
      views: [V, Q, P] bool positive masks: view 0 every positive, then the scale groups, then
        the clutter groups (only those some query has).
      view_keys: ((section, key), ...) of views 1..V-1.
      items: the report's values (`Item`), map and oracle first, each section in order.
      notes: what was skipped and why, one line each.
      query_ids: [Q] the queries.
    """

    views: np.ndarray
    view_keys: tuple[tuple[str, str], ...]
    items: tuple[Item, ...]
    notes: tuple[str, ...]
    query_ids: tuple[str, ...] = ()

    @property
    def weights(self) -> np.ndarray:
        """[I, Q] every item's query weights."""
        return np.stack([item.weights for item in self.items])

    def pairs(self) -> tuple[tuple[int, str], ...]:
        """Returns the (view, metric) pairs whose per-query values the items need, in order."""
        return tuple(dict.fromkeys((item.view, item.metric) for item in self.items))


def build_spec(
    query_ids,
    slot_positive_ids,
    positive_info: Mapping[str, tuple[float, int]] | None = None,
    taxonomy: Mapping[str, tuple[str, str]] | None = None,
) -> ReportSpec:
    """Returns the report's views and items for these queries.

    Args:
      query_ids: [Q] query ids; a query's instance is `id.split("/")[0]`.
      slot_positive_ids: [Q, P] str, the id of each query's positive in each slot ("" at
        padding), in the slots' order (`io.ilias_folder.slot_positive_ids`).
      positive_info: positive id -> (scale, clutter) (`io.ilias_folder.read_positive_info`);
        None (no such file) or {} (ids only) skips the scale and clutter groups with a note, as
        does a positive without an entry.
      taxonomy: instance -> (category, label) (`io.ilias_folder.read_taxonomy`); None skips
        the categories and subcategories with a note; queries of instances not in it are left
        out of them, with a note.
    """
    query_ids = tuple(map(str, query_ids))
    slot_ids = np.asarray(slot_positive_ids, dtype=str)
    mask = slot_ids != ""
    q = mask.shape[0]
    instances = ilias_folder.instance_of(query_ids)
    if slot_ids.ndim != 2 or q != len(query_ids) or not mask.any(axis=1).all():
        raise ValueError(
            f"slot_positive_ids: expected [{len(query_ids)}, P] ids with a positive per query, "
            f"got shape {slot_ids.shape}"
        )
    n_instances = len(set(instances))
    uniform = np.full(q, 1.0 / q)
    items = [
        Item("map", "", 0, "map", uniform, n_instances),
        Item("oracle", "", 0, "recall", uniform, n_instances),
    ]
    views, view_keys, notes = [mask], [], []

    groups, note = _group_values(slot_ids, mask, positive_info)
    notes += note
    for g, (section, edges) in enumerate((("scale", SCALE_EDGES), ("clutter", CLUTTER_EDGES))):
        if groups is None:
            break
        for lo, hi in zip(edges[:-1], edges[1:], strict=True):
            view = mask & (groups[g] >= lo) & (groups[g] < hi)
            has = view.any(axis=1)
            if has.any():
                key = f"{lo}-{hi}"
                items.append(
                    Item(section, key, len(views), "map", has / has.sum(), _count(instances[has]))
                )
                views.append(view)
                view_keys.append((section, key))

    if taxonomy is None:
        notes.append(
            "categories, subcategories: skipped (no taxonomy holds every instance: ILIAS's is "
            "used for ILIAS's instances, --config.taxonomy gives another)"
        )
    else:
        known = np.asarray([i in taxonomy for i in instances], bool)
        if not known.all():
            unknown = sorted(set(instances[~known].tolist()))
            notes.append(
                f"categories, subcategories: {len(unknown)} instances not in the taxonomy "
                f"(e.g. {unknown[0]!r}), their {int((~known).sum())} queries left out"
            )
        items += _category_items(instances, known, taxonomy)
    return ReportSpec(np.stack(views), tuple(view_keys), tuple(items), tuple(notes), query_ids)


def label(v: ReportValue) -> str:
    """Returns a report value's name as a person writes it: "scale 0.069-0.135" for the official
    key "0.06880213760855043-0.13526567164179104" (a group's edges to 3 decimals), "map" for map.

    Only the printed text and figures use it; prediction.json keeps the official keys.
    """
    if not v.key:
        return v.section
    if v.section in ("scale", "clutter"):
        lo, hi = v.key.split("-")
        return f"{v.section} {_edge(lo)}-{_edge(hi)}"
    return f"{v.section} {v.key}"


def _edge(text: str) -> str:
    """One edge of a group's key, rounded: 3 decimals, or 2 significant digits below 0.01."""
    x = float(text)
    if math.isinf(x) or x.is_integer():
        return text
    return f"{x:.3f}".rstrip("0").rstrip(".") if abs(x) >= 0.01 else f"{x:.2g}"


def _count(instances) -> int:
    return len(set(instances.tolist()))


def _group_values(slot_ids, mask, positive_info):
    """Returns ([2, Q, P] scale and clutter of every slot (NaN at padding) or None, notes)."""
    if positive_info is None:
        return None, ["scale, clutter: skipped (no positive_ids.txt with scale and clutter)"]
    if not positive_info:
        return None, ["scale, clutter: skipped (positive_ids.txt holds ids only)"]
    missing = sorted({p for p in slot_ids[mask].tolist() if p not in positive_info})
    if missing:
        return None, [
            f"scale, clutter: skipped ({len(missing)} positives have no line in "
            f"positive_ids.txt, e.g. {missing[0]!r})"
        ]
    out = np.full((2, *mask.shape), np.nan)
    rows, cols = np.nonzero(mask)
    out[:, rows, cols] = np.asarray([positive_info[p] for p in slot_ids[mask].tolist()]).T
    return out, []


def _category_items(instances, known, taxonomy) -> list[Item]:
    """The categories then the subcategories (in the taxonomy's order) of the known queries."""
    queries_of: dict[str, int] = {}  # instance -> its number of queries
    for i in instances[known].tolist():
        queries_of[i] = queries_of.get(i, 0) + 1
    per_query = np.asarray([queries_of.get(i, 0) for i in instances.tolist()], np.float64)
    items = []
    for section, which in (("categories", 0), ("subcategories", 1)):
        members: dict[
            str, list[str]
        ] = {}  # key -> its instances with queries, in the taxonomy's order
        for instance, names in taxonomy.items():
            if instance in queries_of:
                members.setdefault(names[which], []).append(instance)
        for key, insts in members.items():
            inside = np.isin(instances, insts)
            weights = np.where(inside, 1.0 / (len(insts) * np.maximum(per_query, 1.0)), 0.0)
            items.append(Item(section, key, 0, "map", weights, len(insts)))
    return items


def apply(spec: ReportSpec, per_query: Mapping[tuple[int, str], object], multiplicity=None):
    """Returns each item's value [..., I] from per-query values.

    value_i = sum_q w_iq m_q v_q / sum_q w_iq m_q, v_q = `per_query[(item.view, item.metric)]`
    [..., Q]; numpy or jax.numpy (jit- and vmap-able).

    Args:
      spec: the report's items.
      per_query: (view, metric) -> [..., Q] per-query values (`spec.pairs()` lists the keys
        needed), e.g. exact AP@k, predicted AP@k at N, or its replicates [B, Q].
      multiplicity: None, or [..., Q] query multiplicities of a query bootstrap (the ratio form
        keeps every item a weighted mean; NaN where an item keeps no query).
    """
    values = [per_query[(item.view, item.metric)] for item in spec.items]
    xp = jnp if any(isinstance(v, jax.Array) for v in values) else np
    stacked = xp.stack([xp.asarray(v) for v in values], axis=-2)  # [..., I, Q]
    weights = xp.asarray(spec.weights, stacked.dtype)
    if multiplicity is None:
        return xp.einsum("...iq,iq->...i", stacked, weights)
    m = xp.asarray(multiplicity, stacked.dtype)
    num = xp.einsum("...iq,iq,...q->...i", stacked, weights, m)
    den = xp.einsum("iq,...q->...i", weights, m)
    return xp.where(den > 0, num / xp.where(den > 0, den, 1.0), xp.nan)


def exact_report(spec: ReportSpec, counts, mask, k: int) -> Report:
    """Returns the official report of a fixed gallery, exactly, in percent.

    Args:
      spec: the report's views and items (`build_spec`).
      counts: [Q, P] int, every non-relevant item strictly above each positive (distractors
        and other instances' positives); -1 at padding.
      mask: [Q, P] bool, real positives (view 0 of `spec`).
      k: the cut-off.
    """
    counts, mask = np.asarray(counts), np.asarray(mask, bool)
    if counts.shape != mask.shape or spec.views.shape[1:] != mask.shape:
        raise ValueError(f"counts {counts.shape}, mask {mask.shape}: expected the spec's [Q, P]")
    per_query = {
        (v, m): np.asarray(
            metrics.value_from_counts(metrics.METRICS[m], counts, spec.views[v] & mask, k)
        )
        for v, m in spec.pairs()
    }
    values = 100.0 * np.asarray(apply(spec, per_query), np.float64)
    return Report(
        values=tuple(
            ReportValue(it.section, it.key, float(v), it.num_queries, it.num_instances)
            for it, v in zip(spec.items, values, strict=True)
        ),
        query_ids=spec.query_ids,
        aps=100.0 * per_query[(0, "map")],
        notes=spec.notes,
    )
