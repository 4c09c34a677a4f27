"""The ILIAS report's inputs: the readers of positive_ids.txt and of a taxonomy."""

import json
import os

import pytest

from tailaware.io import errors, ilias_folder

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
