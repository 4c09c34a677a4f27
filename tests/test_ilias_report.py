"""The ILIAS report: exact mode against a literal transcription of the official rules, the
spec's groups and notes, `apply`, and the readers of its inputs."""

import json
import math
import os
import pickle

import jax
import jax.numpy as jnp
import numpy as np
import PIL.Image
import pytest

from tailaware.configs import ilias as ilias_config
from tailaware.io import errors, features, ilias_folder
from tailaware.io import scores as scores_lib
from tailaware.jobs import ilias
from tailaware.protocol import ilias_report, prediction, schema
from tailaware.protocol.settings import PredictSettings, ProtocolSettings

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "text_small.npz")
DIM, SHARDS, ROWS = 16, 2, 300
# Queries and positives per instance: one query or several, two positives or many.
QUERIES = (1, 2, 3, 1, 2, 2)
POSITIVES = (2, 4, 6, 3, 5, 7)
# A test taxonomy: 3 categories, 4 subcategories (one category name holds "-", which the
# official rule cuts at).
TAXONOMY = {
    "animal": {"cat": {"tabby": ["ins0", "ins1"]}, "dog": {"hound": ["ins2"], "pup": ["ins3"]}},
    "plant": {"tree": {"oak": ["ins4"]}},
    "sea-life": {"fish": {"cod": ["ins5"], "eel": ["not_in_folder"]}},
}


# ---------------------------------------------------------------------------------------------
# The official rules, transcribed (evaluation/src/dataset.py of ilias-vrg/ilias; REFERENCE.md).

OFFICIAL_SCALE_GROUPS = [
    (0, 0.06880213760855043),
    (0.06880213760855043, 0.13526567164179104),
    (0.13526567164179104, 0.2729876723163842),
    (0.2729876723163842, float("inf")),
]
OFFICIAL_CLUTTER_GROUPS = [(0, 18), (18, 33), (33, 53), (53, float("inf"))]


def official_ap(ids, sims, gt, k, excluded=frozenset()):
    """AP@k and oracle of one query's ranked list (ids, sims) after deleting `excluded`."""
    keep = np.asarray([i not in excluded for i in ids], bool)
    ids, sims = ids[keep], sims[keep]
    gt = gt - set(excluded)
    # argsort(-sims); among equal scores the query's positives first (our tie rule, for the
    # float16 text embeddings; the synthetic folders have no ties).
    order = np.lexsort((~np.isin(ids, list(gt)), -sims))
    top = ids[order][:k]
    y = np.isin(top, list(gt))
    if not y.any():
        return 0.0, 0.0
    precision_at_hits = np.cumsum(y)[y] / (np.flatnonzero(y) + 1)
    ap = precision_at_hits.sum() / min(k, len(gt))
    oracle = y.mean() * (k / len(gt))
    return ap, oracle


def official_report(query_ids, lists, positive_ids, positive_info, taxonomy_tree, k):
    """The report as the official `_evaluate_pkl(..., report=True)` builds it from each query's
    ranked list `lists[q]` = (database ids, their scores)."""
    gt = {}
    for pid in positive_ids:
        gt.setdefault(pid.split("/")[0], set()).add(pid)
    labels = None
    if taxonomy_tree is not None:
        labels = {
            q: f"{c}-{sc}"
            for c, sc_dict in taxonomy_tree.items()
            for sc, ssc_dict in sc_dict.items()
            for q_list in ssc_dict.values()
            for q in q_list
        }
    aps, oracles = [], []
    scale, clutter = {}, {}
    categories, subcategories = {}, {}
    for q, (ids, s) in zip(query_ids, lists, strict=True):
        ins = q.split("/")[0]
        ap, oracle = official_ap(ids, s, gt[ins], k)
        aps.append(ap * 100)
        oracles.append(oracle * 100)
        if labels is not None:
            category = labels[ins].split("-")[0]
            categories.setdefault(category, {}).setdefault(ins, []).append(ap * 100)
            subcategories.setdefault(labels[ins], {}).setdefault(ins, []).append(ap * 100)
        if positive_info:
            for out, groups, field in (
                (scale, OFFICIAL_SCALE_GROUPS, 0),
                (clutter, OFFICIAL_CLUTTER_GROUPS, 1),
            ):
                for t1, t2 in groups:
                    excluded = {
                        i
                        for i in gt[ins]
                        if positive_info[i][field] < t1 or positive_info[i][field] >= t2
                    }
                    if gt[ins] - excluded:
                        ap_g, _ = official_ap(ids, s, gt[ins], k, excluded)
                        out.setdefault(f"{t1}-{t2}", []).append(ap_g * 100)
    mean_of_means = lambda d: {c: np.mean([np.mean(v) for v in i.values()]) for c, i in d.items()}
    return {
        "queries": list(query_ids),
        "aps": aps,
        "map": np.mean(aps),
        "oracle": np.mean(oracles),
        "scale": {g: np.mean(v) for g, v in scale.items()},
        "clutter": {g: np.mean(v) for g, v in clutter.items()},
        "categories": mean_of_means(categories),
        "subcategories": mean_of_means(subcategories),
    }


def full_lists(db_ids, sims):
    """Every query's ranked list over the whole database (sims [Q, D])."""
    return [(np.asarray(db_ids), row) for row in sims]


def assert_reports_equal(got, want, atol=1e-4):
    assert got["queries"] == want["queries"]
    np.testing.assert_allclose(got["aps"], want["aps"], atol=atol, rtol=0)
    for key in ("map", "oracle"):
        assert got[key] == pytest.approx(want[key], abs=atol), key
    for key in ilias_report.GROUPED:
        assert set(got[key]) == set(want[key]), key
        for group, value in want[key].items():
            assert got[key][group] == pytest.approx(value, abs=atol), (key, group)


# ---------------------------------------------------------------------------------------------
# A folder with scale, clutter and a taxonomy; scores exact in float32 and without ties.


def quantized(rng, n, centre=None, noise=1.0):
    """[n, DIM] vectors of norm 0.995 (unit within the readers' tolerance, and below 1) in
    multiples of 2^-11: float16 holds them and every dot product is exact in float32, so the job
    and the transcription see the same scores (2^-22 apart at least: continuous enough that no
    positive ties, which `make_folder` checks)."""
    x = rng.standard_normal((n, DIM)) * noise + (0.0 if centre is None else centre)
    x = 0.995 * x / np.linalg.norm(x, axis=1, keepdims=True)
    return np.round(x * 2048) / 2048


def scale_clutter(rng, n):
    """n (scale, clutter) pairs over a few of the official groups, edges included."""
    scales = rng.choice([0.01, 0.06880213760855043, 0.1, 0.13526567164179104, 0.2, 0.5], n)
    clutters = rng.choice([0, 5, 18, 20, 33, 40, 53, 90], n)
    return [(float(s), int(c)) for s, c in zip(scales, clutters, strict=True)]


def make_folder(path, names, seed=0, info_where="positive_ids.txt", header=True):
    """Writes the folder; returns (query ids, db ids, sims [Q, D] float64, positive_info)."""
    rng = np.random.default_rng(seed)
    qs, ps, qids, pids = [], [], [], []
    for i, name in enumerate(names):
        centre = rng.standard_normal(DIM)
        qs.append(quantized(rng, QUERIES[i], centre, 1.2))
        ps.append(quantized(rng, POSITIVES[i], centre, 1.2))
        qids += [f"{name}/query/Q{i:03d}_{j:02d}.jpg" for j in range(QUERIES[i])]
        pids += [f"{name}/pos/P{i:03d}_{j:02d}.jpg" for j in range(POSITIVES[i])]
    q, p = np.concatenate(qs), np.concatenate(ps)
    features.write_features(os.path.join(path, features.IMAGE_QUERIES), q, qids)
    features.write_features(os.path.join(path, features.POSITIVES), p, pids)
    db, dids = [p], list(pids)
    for s in range(SHARDS):
        x = quantized(rng, ROWS)
        ids = [f"tar{s:03d}/{j:06d}" for j in range(ROWS)]
        features.write_features(os.path.join(path, features.distractor_name(s)), x, ids)
        db.append(x)
        dids += ids
    info = dict(zip(pids, scale_clutter(rng, len(pids)), strict=True))
    info_path = os.path.join(path, info_where)
    os.makedirs(os.path.dirname(info_path), exist_ok=True)
    with open(info_path, "w") as f:
        f.write("id,scale,clutter\n" if header else "")
        f.writelines(f"{i},{s!r},{c}\n" for i, (s, c) in info.items())
    sims = q.astype(np.float64) @ np.concatenate(db).astype(np.float64).T
    for qid, row in zip(qids, sims, strict=True):  # no positive ties with a non-relevant item
        own = np.asarray([d.split("/")[0] == qid.split("/")[0] for d in dids])
        assert not np.isin(row[own], row[~own]).any()
    return qids, dids, sims, info


def config(folder, k, **overrides):
    c = ilias_config.get_config()
    c.features, c.sample_fraction, c.k = str(folder), 1.0, k
    c.evt.top_m, c.block_size, c.checkpoint_every_s = 60, 128, 0.0
    c.min_sample = 0  # tiny folders: no sample reaches the floor
    for key, value in overrides.items():
        setattr(c, key, value)
    return c


def ilias_names(n):
    """n instance names of ILIAS's taxonomy (the packaged copy), spread over its categories."""
    with open(ilias_folder.ILIAS_TAXONOMY) as f:
        tree = json.load(f)
    names = [ssc[0] for c in tree.values() for sc in c.values() for ssc in list(sc.values())[:1]]
    return names[:: max(1, len(names) // n)][:n], tree


def taxonomy_file(tmp_path):
    path = tmp_path / "taxonomy.json"
    path.write_text(json.dumps(TAXONOMY))
    return str(path)


@pytest.mark.parametrize("case", ["test_taxonomy", "ilias_default"])
def test_exact_report_equals_the_official_rules(tmp_path, capsys, case):
    folder = tmp_path / "features"
    folder.mkdir()
    if case == "test_taxonomy":  # positive_ids.txt in the folder, with a header; k = 10
        names, tree, k = [f"ins{i}" for i in range(len(QUERIES))], TAXONOMY, 10
        qids, dids, sims, info = make_folder(str(folder), names)
        c = config(folder, k, taxonomy=taxonomy_file(tmp_path))
    else:  # ILIAS's instances and taxonomy, its image_ids/positive_ids.txt (no header); k = 50
        (names, tree), k = ilias_names(len(QUERIES)), 50
        qids, dids, sims, info = make_folder(
            str(folder), names, seed=1, info_where="image_ids/positive_ids.txt", header=False
        )
        c = config(folder, k)
    result = ilias.run(c, str(tmp_path / "work"))
    got = json.loads((tmp_path / "work" / "prediction.json").read_text())["report"]
    pids = [d for d in dids if "/pos/" in d]
    want = official_report(qids, full_lists(dids, sims), pids, info, tree, k)
    assert_reports_equal(got, want)
    # Every section is there and non-trivial: groups some instances lack, several categories.
    assert 1.0 < got["map"] < 99.0 and got["map"] == pytest.approx(100 * result.map, abs=1e-9)
    assert len(got["scale"]) >= 3 and len(got["clutter"]) >= 3 and len(got["categories"]) >= 3
    assert len(got["subcategories"]) >= 4 and got["notes"] == []
    assert min(got["num_queries"]["scale"].values()) < len(qids)
    assert sum(got["num_instances"]["categories"].values()) == len(names)
    assert "0-0.06880213760855043" in got["scale"] and "53-inf" in got["clutter"]
    out = capsys.readouterr().out
    assert f"ILIAS report at k = {k}" in out
    # Printed as a person writes them; the JSON keeps ILIAS's keys.
    written = {
        "0-0.06880213760855043": "0-0.069",
        "0.06880213760855043-0.13526567164179104": "0.069-0.135",
        "0.13526567164179104-0.2729876723163842": "0.135-0.273",
        "0.2729876723163842-inf": "0.273-inf",
    }
    assert all(f"  scale {written[key]} " in out for key in got["scale"])
    assert all(f"  clutter {key} " in out for key in got["clutter"])  # integers, as they are
    assert "0.0688" not in out and "0.1352" not in out
    # The report's figure: one bar per value.
    with PIL.Image.open(tmp_path / "work" / "ilias_report.png") as png:
        assert png.format == "PNG" and png.size[1] > 300
    # The official script evaluates the stored top-k list: there a positive that deletions would
    # lift into the top k is missing, so its group values can only be lower; no deletion, no
    # difference (map, oracle, categories).
    with open(tmp_path / "work" / f"ranked_top{k}.pkl", "rb") as f:
        lists = pickle.load(f)
    db = np.asarray(lists["db_ids"])
    pairs = zip(lists["ranks"], lists["sims"], strict=True)
    stored_lists = [(db[r[r >= 0]], s[r >= 0]) for r, s in pairs]
    stored = official_report(qids, stored_lists, pids, info, tree, k)
    for key in ("map", "oracle"):
        assert stored[key] == pytest.approx(got[key], abs=1e-4)
    assert stored["categories"] == pytest.approx(got["categories"], abs=1e-4)
    lower = [stored[s][g] - got[s][g] for s in ("scale", "clutter") for g in stored[s]]
    assert max(lower) < 1e-4
    if case == "test_taxonomy":  # k = 10: some positive is lifted into the top 10
        assert min(lower) < -0.5


def test_real_text_benchmark_map_and_oracle(tmp_path):
    z = np.load(DATA)
    folder = tmp_path / "features"
    qids, pids, dids = (list(map(str, z[f"{s}_ids"])) for s in ("query", "positive", "distractor"))
    features.write_features(folder / features.IMAGE_QUERIES, z["query_features"], qids)
    features.write_features(folder / features.POSITIVES, z["positive_features"], pids)
    features.write_features(folder / features.distractor_name(0), z["distractor_features"], dids)
    k = 100
    ilias.run(config(folder, k, backend="host"), str(tmp_path / "work"))
    got = json.loads((tmp_path / "work" / "prediction.json").read_text())["report"]
    q = z["query_features"].astype(np.float64)
    db = np.concatenate([z["positive_features"], z["distractor_features"]]).astype(np.float64)
    sims = q @ db.T  # exact: float16 products summed in float64
    want = official_report(qids, full_lists(pids + dids, sims), pids, None, None, k)
    assert_reports_equal(got, want)
    assert 5.0 < got["map"] < 95.0 and got["oracle"] > got["map"]
    assert all(got[s] == {} for s in ilias_report.GROUPED)
    assert len(got["notes"]) == 2 and "positive_ids.txt" in got["notes"][0]
    assert "taxonomy" in got["notes"][1]


# ---------------------------------------------------------------------------------------------
# The spec: groups, weights and what it skips.


def slots(ids_per_query):
    width = max(map(len, ids_per_query))
    return np.asarray([list(ids) + [""] * (width - len(ids)) for ids in ids_per_query])


def test_build_spec_groups_weights_and_keys():
    qids = ["a/q/1", "a/q/2", "b/q/1", "c/q/1"]
    slot_ids = slots([["a/p1", "a/p2"], ["a/p1", "a/p2"], ["b/p1"], ["c/p1", "c/p2", "c/p3"]])
    info = {
        "a/p1": (0.0, 17),  # first scale group, first clutter group
        "a/p2": (0.06880213760855043, 18),  # an edge: the upper group (half-open)
        "b/p1": (0.5, 53),
        "c/p1": (0.01, 0),
        "c/p2": (0.3, 100),
        "c/p3": (0.2729876723163842, 54),
    }
    taxonomy = {"a": ("x", "x-1"), "b": ("x", "x-2"), "c": ("y", "y-1")}
    spec = ilias_report.build_spec(qids, slot_ids, info, taxonomy)
    assert spec.notes == () and spec.query_ids == tuple(qids)
    keys = [(it.section, it.key) for it in spec.items]
    assert keys == [
        ("map", ""),
        ("oracle", ""),
        ("scale", "0-0.06880213760855043"),
        ("scale", "0.06880213760855043-0.13526567164179104"),
        ("scale", "0.2729876723163842-inf"),  # no positive in [0.135, 0.273): no such group
        ("clutter", "0-18"),
        ("clutter", "18-33"),
        ("clutter", "53-inf"),
        ("categories", "x"),
        ("categories", "y"),
        ("subcategories", "x-1"),
        ("subcategories", "x-2"),
        ("subcategories", "y-1"),
    ]
    assert spec.views.shape == (7, 4, 3) and spec.view_keys == tuple(keys[2:8])
    np.testing.assert_array_equal(spec.views[0], slot_ids != "")
    np.testing.assert_array_equal(spec.views[1], [[1, 0, 0], [1, 0, 0], [0, 0, 0], [1, 0, 0]])
    np.testing.assert_array_equal(spec.views[3], [[0, 0, 0], [0, 0, 0], [1, 0, 0], [0, 1, 1]])
    np.testing.assert_allclose(spec.weights.sum(axis=1), 1.0)
    by_key = {k: it for k, it in zip(keys, spec.items, strict=True)}
    first = by_key["scale", "0-0.06880213760855043"]
    np.testing.assert_allclose(first.weights, np.asarray([1, 1, 0, 1]) / 3)
    assert first.num_queries == 3
    # Instances weigh equally: a's two queries share a's half of category x.
    np.testing.assert_allclose(by_key["categories", "x"].weights, [0.25, 0.25, 0.5, 0])
    assert by_key["categories", "x"].num_instances == 2
    assert by_key["oracle", ""].metric == "recall" and by_key["map", ""].metric == "map"
    assert spec.pairs() == ((0, "map"), (0, "recall"), *((v, "map") for v in range(1, 7)))


def test_build_spec_skips_with_a_note():
    qids = ["a/q/1", "b/q/1"]
    slot_ids = slots([["a/p1"], ["b/p1", "b/p2"]])
    only_map_oracle = lambda spec: [it.section for it in spec.items] == ["map", "oracle"]
    spec = ilias_report.build_spec(qids, slot_ids, None, None)
    assert only_map_oracle(spec) and spec.views.shape == (1, 2, 2)
    assert spec.notes == (
        "scale, clutter: skipped (no positive_ids.txt with scale and clutter)",
        "categories, subcategories: skipped (no taxonomy holds every instance: ILIAS's is used "
        "for ILIAS's instances, --config.taxonomy gives another)",
    )
    spec = ilias_report.build_spec(qids, slot_ids, {}, None)
    assert spec.notes[0] == "scale, clutter: skipped (positive_ids.txt holds ids only)"
    info = {"a/p1": (0.1, 1), "b/p1": (0.1, 1)}
    spec = ilias_report.build_spec(qids, slot_ids, info, {"a": ("x", "x-y")})
    assert spec.notes == (
        "scale, clutter: skipped (1 positives have no line in positive_ids.txt, e.g. 'b/p2')",
        "categories, subcategories: 1 instances not in the taxonomy (e.g. 'b'), their 1 queries "
        "left out",
    )
    assert [(it.section, it.key) for it in spec.items[2:]] == [
        ("categories", "x"),
        ("subcategories", "x-y"),
    ]
    np.testing.assert_allclose(spec.items[2].weights, [1.0, 0.0])
    with pytest.raises(ValueError, match="a positive per query"):
        ilias_report.build_spec(qids, slots([["a/p1"], [""]]), None, None)


def test_exact_report_deletes_out_of_group_positives():
    # One query, 3 positives: non-relevant items above them 0, 2, 5; ranks 1, 4, 8 (k = 10).
    counts, mask = np.asarray([[0, 2, 5]]), np.ones((1, 3), bool)
    slot_ids = np.asarray([["a/p1", "a/p2", "a/p3"]])
    info = {"a/p1": (0.5, 0), "a/p2": (0.01, 0), "a/p3": (0.5, 0)}
    spec = ilias_report.build_spec(["a/q"], slot_ids, info, {"a": ("x", "x-y")})
    report = ilias_report.exact_report(spec, counts, mask, 10)
    values = {(v.section, v.key): v.value for v in report.values}
    assert values["map", ""] == pytest.approx(100 * (1 / 1 + 2 / 4 + 3 / 8) / 3)
    assert values["oracle", ""] == pytest.approx(100.0)
    # [0.27, inf): p2 deleted, p3 moves up to rank 2 + 5 = 7.
    assert values["scale", "0.2729876723163842-inf"] == pytest.approx(100 * (1 + 2 / 7) / 2)
    assert values["scale", "0-0.06880213760855043"] == pytest.approx(100 * (1 / 3))
    assert values["clutter", "0-18"] == values["map", ""] == values["categories", "x"]
    np.testing.assert_allclose(report.aps, [values["map", ""]])
    at_k2 = ilias_report.exact_report(spec, counts, mask, 2).values
    at_k2 = {(v.section, v.key): v.value for v in at_k2}
    assert at_k2["oracle", ""] == pytest.approx(100 / 3) and at_k2["map", ""] == pytest.approx(50)


def test_apply_numpy_jit_vmap_and_multiplicities():
    rng = np.random.default_rng(0)
    qids = [f"{i}/q/{j}" for i in "abc" for j in range(2)]
    slot_ids = slots([[f"{q.split('/')[0]}/p{j}" for j in range(3)] for q in qids])
    info = {p: (float(rng.uniform(0, 0.3)), int(rng.integers(0, 60))) for p in slot_ids.ravel()}
    spec = ilias_report.build_spec(qids, slot_ids, info, {"a": ("x", "x-1"), "b": ("x", "x-2")})
    reps = {pair: rng.uniform(size=(5, len(qids))) for pair in spec.pairs()}  # [B, Q]
    one = lambda b: ilias_report.apply(spec, {p: v[b] for p, v in reps.items()})
    loop = np.stack([one(b) for b in range(5)])
    np.testing.assert_allclose(ilias_report.apply(spec, reps), loop, rtol=1e-12)
    np.testing.assert_allclose(
        ilias_report.apply(spec, reps, multiplicity=np.ones(len(qids))), loop, rtol=1e-12
    )
    as_jax = {p: jnp.asarray(v, jnp.float32) for p, v in reps.items()}
    jitted = jax.jit(lambda d: ilias_report.apply(spec, d))(as_jax)
    vmapped = jax.vmap(lambda d: ilias_report.apply(spec, d))(as_jax)
    np.testing.assert_allclose(jitted, loop, rtol=1e-5)
    np.testing.assert_allclose(vmapped, loop, rtol=1e-5)
    # A query bootstrap's multiplicities: each item is a weighted mean of the kept queries.
    m = np.asarray([2.0, 0.0, 1.0, 1.0, 0.0, 3.0])
    v = {p: r[0] for p, r in reps.items()}
    got = ilias_report.apply(spec, v, multiplicity=m)
    assert got[0] == pytest.approx(np.average(v[0, "map"], weights=m))
    cat_x = next(i for i, it in enumerate(spec.items) if it.key == "x")
    w = spec.items[cat_x].weights * m  # a: 1/4 per query (2 queries), b: 1/4 each
    assert got[cat_x] == pytest.approx((w * v[0, "map"]).sum() / w.sum())
    m_none_of_b = np.asarray([1.0, 1.0, 0.0, 0.0, 1.0, 1.0])
    sub_b = next(i for i, it in enumerate(spec.items) if it.key == "x-2")
    assert math.isnan(ilias_report.apply(spec, v, multiplicity=m_none_of_b)[sub_b])


def test_report_json_and_table_layout():
    spec = ilias_report.build_spec(
        ["a/q"], np.asarray([["a/p"]]), {"a/p": (0.5, 60)}, {"a": ("x", "x-y")}
    )
    report = ilias_report.exact_report(spec, np.asarray([[1]]), np.ones((1, 1), bool), 10)
    out = schema.report_json(report)
    assert list(out) == [
        "units",
        "map",
        "oracle",
        "scale",
        "clutter",
        "categories",
        "subcategories",
        "num_queries",
        "num_instances",
        "queries",
        "aps",
        "notes",
    ]
    assert out["map"] == out["scale"]["0.2729876723163842-inf"] == pytest.approx(50.0)
    assert out["num_queries"] == {
        "map": 1,
        "oracle": 1,
        "scale": {"0.2729876723163842-inf": 1},
        "clutter": {"53-inf": 1},
        "categories": {"x": 1},
        "subcategories": {"x-y": 1},
    }
    json.dumps(out)  # JSON types only
    with_ci = report._replace(values=tuple(v._replace(ci90=(1.0, 2.0)) for v in report.values))
    assert schema.report_json(with_ci)["ci90"]["clutter"] == {"53-inf": [1.0, 2.0]}
    lines = schema.report_lines(with_ci, 10)
    assert lines[0] == "ILIAS report at k = 10, percent (and the number of queries averaged)"
    assert lines[1].split() == ["map", "50.00", "(1)", "90%", "CI", "[1.00,", "2.00]"]


# ---------------------------------------------------------------------------------------------
# The readers of its inputs.


def test_read_positive_info(tmp_path):
    path = tmp_path / "positive_ids.txt"
    path.write_text("a/pos/1.jpg,0.5,3\n\nb/pos/2.jpg, 0.06880213760855043 ,18\n")
    assert ilias_folder.read_positive_info(path) == {
        "a/pos/1.jpg": (0.5, 3),
        "b/pos/2.jpg": (0.06880213760855043, 18),
    }
    path.write_text("id,scale,clutter\na/pos/1.jpg,0.5,3\n")
    assert ilias_folder.read_positive_info(path) == {"a/pos/1.jpg": (0.5, 3)}
    path.write_text("a/pos/1.jpg\nb/pos/2.jpg\n")  # ids only: no groups
    assert ilias_folder.read_positive_info(path) == {}
    for text, message in (
        ("a,0.5,3\nb,x,3\n", r"positive_ids.txt: line 2: field 'scale': expected a finite "),
        ("a,0.5,3\nb,nan,3\n", r"line 2: field 'scale': .* got 'nan'"),
        ("a,-0.1,3\n", r"line 1: field 'scale': expected a finite number >= 0, got '-0.1'"),
        ("id,scale,clutter\na,0.5,3.0\n", r"line 2: field 'clutter': expected an integer >= 0"),
        ("a,0.5,3\nb,0.5\n", r"positive_ids.txt: line 2: 2 fields; expected 3 as on line 1"),
        ("a,0.5\n", r"line 1: 2 fields; expected id,scale,clutter or an id"),
        ("a,0.5,3\n,0.5,3\n", r"line 2: field 'id': empty"),
        ("a,0.5,3\nb,1,1\na,0.5,3\n", r"line 3: field 'id': 'a' repeats line 1"),
        ("id,scale,clutter\n", r"positive_ids.txt: no ids"),
    ):
        path.write_text(text)
        with pytest.raises(errors.InputError, match=message):
            ilias_folder.read_positive_info(path)
    with pytest.raises(errors.MissingInput, match="nope.txt: no such file"):
        ilias_folder.read_positive_info(tmp_path / "nope.txt")


def test_find_positive_info(tmp_path):
    assert ilias_folder.find_positive_info(str(tmp_path)) is None
    (tmp_path / "image_ids").mkdir()
    (tmp_path / "image_ids" / "positive_ids.txt").write_text("a,1,1\n")
    assert ilias_folder.find_positive_info(str(tmp_path)).endswith("image_ids/positive_ids.txt")
    (tmp_path / "positive_ids.txt").write_text("a,1,1\n")
    assert ilias_folder.find_positive_info(str(tmp_path)) == str(tmp_path / "positive_ids.txt")


def test_read_taxonomy(tmp_path):
    path = tmp_path / "taxonomy.json"
    path.write_text(json.dumps(TAXONOMY))
    taxonomy = ilias_folder.read_taxonomy(path)
    assert taxonomy["ins0"] == ("animal", "animal-cat")
    assert taxonomy["ins3"] == ("animal", "animal-dog")
    assert taxonomy["ins5"] == ("sea", "sea-life-fish")  # cut at the first "-", as officially
    assert list(taxonomy) == ["ins0", "ins1", "ins2", "ins3", "ins4", "ins5", "not_in_folder"]
    for tree, message in (
        ([], r"taxonomy.json: field '\(top level\)': expected an object"),
        ({"a": []}, r"field 'a': expected an object: subcategory"),
        ({"a": {"b": {"c": "x"}}}, r"field 'a.b.c': expected a list of instance names"),
        ({"a": {"b": {"c": ["x", ""]}}}, r"field 'a.b.c': expected a list of instance names"),
        ({"a": {"b": {"c": ["x"]}, "d": {"e": ["x"]}}}, r"field 'a.d.e': instance 'x' is also "),
        ({}, r"taxonomy.json: no instances"),
    ):
        path.write_text(json.dumps(tree))
        with pytest.raises(errors.InputError, match=message):
            ilias_folder.read_taxonomy(path)
    path.write_text("{")
    with pytest.raises(errors.InputError, match="taxonomy.json: not a JSON file"):
        ilias_folder.read_taxonomy(path)


def test_ilias_taxonomy_is_the_default_for_ilias_instances(tmp_path):
    ilias_tax = ilias_folder.read_taxonomy(ilias_folder.ILIAS_TAXONOMY)
    assert len(ilias_tax) == 1000 and len({c for c, _ in ilias_tax.values()}) == 8
    names, _ = ilias_names(5)
    assert ilias_folder.report_taxonomy(names) == ilias_tax
    assert ilias_folder.report_taxonomy([*names, "not_ilias"]) is None
    assert ilias_folder.report_taxonomy(["ins0"], taxonomy_file(tmp_path))["ins0"][0] == "animal"
    licence = os.path.join(os.path.dirname(ilias_folder.ILIAS_TAXONOMY), "ilias_taxonomy.LICENSE")
    with open(licence) as f:
        assert f.readline().strip() == "MIT License"


def test_config_names_a_missing_taxonomy_or_positive_info(tmp_path):
    for flag in ("taxonomy", "positive_info"):
        c = config(tmp_path, 10, **{flag: str(tmp_path / "nope")})
        with pytest.raises(errors.MissingInput, match=rf"^--config.{flag}=.*nope: no such file"):
            ilias.run(c, str(tmp_path / "w"))


def test_predicted_report_at_the_sample_is_the_exact_report(tmp_path):
    # At N = S, conditioned on a full sample's own counts, the law's prediction of every report
    # value is the gallery's realized one (count estimator: x = K / S); the sampled ilias job
    # predicts the report with an interval around every value.
    folder = tmp_path / "features"
    folder.mkdir()
    names, k = [f"ins{i}" for i in range(len(QUERIES))], 10
    make_folder(str(folder), names)
    c = config(folder, k, taxonomy=taxonomy_file(tmp_path))
    exact = ilias.run(c, str(tmp_path / "exact"))
    scores = scores_lib.load_scores(tmp_path / "exact" / "sampled_scores.npz")
    queries = ilias_folder.read_split(str(folder), ilias_folder.QUERY_FILES["image"])
    positives = ilias_folder.read_split(str(folder), features.POSITIVES)
    slots, _ = ilias_folder.ground_truth(queries.ids, positives.ids)
    spec = ilias.report_spec(c, queries.ids, positives.ids, slots)
    fast = ProtocolSettings(query_replicates=200, nested_replicates=3, curve_points=3)
    settings = PredictSettings(estimator="count", k=k, protocol=fast)
    got = prediction.predict(scores, settings, scores.n_sample, report=spec).report
    for want, value in zip(exact.report.values, got.values, strict=True):
        assert (value.section, value.key) == (want.section, want.key)
        assert value.value == pytest.approx(want.value, abs=1e-3)  # percent, float32 law
        assert value.ci90[0] <= value.value + 1e-9 and value.value <= value.ci90[1] + 1e-9
    np.testing.assert_allclose(got.aps, exact.report.aps, atol=1e-3)

    c.sample_fraction, c.protocol.nested_replicates, c.protocol.query_replicates = 0.5, 3, 200
    sampled = ilias.run(c, str(tmp_path / "sampled"))
    report = json.loads((tmp_path / "sampled" / "prediction.json").read_text())["report"]
    assert report["map"] == pytest.approx(100 * sampled.map, abs=1e-6)
    assert report["oracle"] == pytest.approx(100 * sampled.metrics[f"recall@{k}"].value, abs=1e-6)
    assert set(report["ci90"]["scale"]) == set(report["scale"])
    assert any(line.startswith("FEW QUERIES") for line in sampled.diagnostics.summary)
