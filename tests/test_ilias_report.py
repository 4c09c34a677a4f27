"""The ILIAS report: the spec's groups and notes, `apply`, the exact report, and the readers
of its inputs."""

import json
import math
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tailaware.io import errors, ilias_folder
from tailaware.protocol import ilias_report, schema

# A test taxonomy: 3 categories, 4 subcategories (one category name holds "-", which the
# official rule cuts at).
TAXONOMY = {
    "animal": {"cat": {"tabby": ["ins0", "ins1"]}, "dog": {"hound": ["ins2"], "pup": ["ins3"]}},
    "plant": {"tree": {"oak": ["ins4"]}},
    "sea-life": {"fish": {"cod": ["ins5"], "eel": ["not_in_folder"]}},
}


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
