"""Image sources: id lists, folders, webdataset tars, and the tfds ILIAS core builder."""

import io
import os
import tarfile

import numpy as np
import pytest
import tensorflow_datasets as tfds
from PIL import Image

from tailaware.data import files as data
from tailaware.data import tfds_ilias

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def jpeg(h, w, seed=0):
    """Returns JPEG bytes of a random h x w RGB image."""
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(buf, format="JPEG")
    return buf.getvalue()


def write_tar(path, members):
    """Writes a tar with `members` = {name: bytes}."""
    with tarfile.open(path, "w") as tar:
        for name, payload in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(payload)
            tar.addfile(info, io.BytesIO(payload))


def make_core(root, n_instances=3, size=(40, 30)):
    """Writes a miniature ILIAS core folder; returns (query ids, positive ids)."""
    queries, positives = [], []
    for k in range(n_instances):
        inst = f"inst{k:02d}"
        for kind, prefix, n, ids in (("query", "Q", 1, queries), ("pos", "P", 2, positives)):
            for j in range(n):
                rel = f"{inst}/{kind}/{prefix}{k:03d}_{j:02d}.jpg"
                os.makedirs(os.path.join(root, inst, kind), exist_ok=True)
                h, w = size if j % 2 == 0 else size[::-1]
                with open(os.path.join(root, rel), "wb") as f:
                    f.write(jpeg(h + k, w, seed=len(ids) + 7 * k))
                ids.append(rel)
        with open(os.path.join(root, inst, "text.txt"), "w") as f:
            f.write(f"a photo of object {k}\n")
    with open(os.path.join(root, "image_query_ids.txt"), "w") as f:
        f.write("\n".join(queries) + "\n")
    with open(os.path.join(root, "positive_ids.txt"), "w") as f:
        f.write("id,scale,clutter\n" + "".join(f"{i},0.5,low\n" for i in positives))
    with open(os.path.join(root, "text_query_ids.txt"), "w") as f:
        f.write("".join(f"inst{k:02d}/text.txt\n" for k in range(n_instances)))
    return queries, positives


def test_read_id_list_skips_the_csv_header(tmp_path):
    (tmp_path / "p.txt").write_text("id,scale,clutter\na/pos/P1.jpg,0.1,x\n\nb/pos/P2.jpg,0.2,y\n")
    assert data.read_id_list(tmp_path / "p.txt") == ["a/pos/P1.jpg", "b/pos/P2.jpg"]


def test_iter_files_follows_the_id_list(tmp_path):
    queries, _ = make_core(tmp_path)
    got = list(data.iter_files(tmp_path, queries[::-1]))
    assert [i for i, _ in got] == queries[::-1]
    assert all(Image.open(io.BytesIO(b)).size[0] > 0 for _, b in got)
    all_ids = [i for i, _ in data.iter_files(tmp_path)]
    assert all_ids == sorted(all_ids) and len(all_ids) == 9
    with pytest.raises(FileNotFoundError, match="missing.jpg"):
        list(data.iter_files(tmp_path, ["missing.jpg"]))


def test_iter_tar_gives_webdataset_ids_and_filters_before_reading(tmp_path):
    members = {
        "000001.jpg": jpeg(8, 8),
        "000001.json": b"{}",  # metadata of the same key: not an image
        "sub/000002.png": jpeg(8, 8),
        "000003.JPEG": jpeg(8, 8),
    }
    write_tar(tmp_path / "yfcc_0007.tar", members)
    ids = [i for i, _ in data.iter_tar(tmp_path / "yfcc_0007.tar")]
    assert ids == ["yfcc_0007/000001", "yfcc_0007/sub/000002", "yfcc_0007/000003"]
    asked = []
    kept = list(data.iter_tar(tmp_path / "yfcc_0007.tar", lambda i: asked.append(i) or "3" in i))
    assert [i for i, _ in kept] == ["yfcc_0007/000003"] and len(asked) == 3


def test_group_shards_is_sorted_and_consecutive():
    paths = [f"s/{k:03d}.tar" for k in (4, 0, 3, 1, 2)]
    assert data.group_shards(paths, 2) == [
        ["s/000.tar", "s/001.tar"],
        ["s/002.tar", "s/003.tar"],
        ["s/004.tar"],
    ]


def test_tfds_builder_reads_the_manual_folder_without_tensorflow(tmp_path):
    queries, positives = make_core(tmp_path / "manual")
    config = tfds.download.DownloadConfig(manual_dir=str(tmp_path / "manual"))
    builder = tfds_ilias.IliasCore(config="images", data_dir=str(tmp_path / "tfds"))
    builder.download_and_prepare(download_config=config, file_format="array_record")
    got = list(tfds_ilias.iter_split(builder, "positives"))
    assert sorted(i for i, _ in got) == sorted(positives)
    image = dict(got)[positives[0]]
    assert image.dtype == np.uint8 and image.shape == (40, 30, 3)

    text = tfds_ilias.IliasCore(config="text", data_dir=str(tmp_path / "tfds"))
    text.download_and_prepare(download_config=config, file_format="array_record")
    source = text.as_data_source(split="text_queries")
    texts = sorted(source[k]["text"].decode() for k in range(len(source)))
    assert texts[0] == "a photo of object 0"


def test_tfds_mock_data():
    with tfds.testing.mock_data(num_examples=5):
        builder = tfds.builder("ilias_core/images")
        got = list(tfds_ilias.iter_split(builder, "image_queries"))
    assert len(got) == 5
    assert all(img.ndim == 3 and img.dtype == np.uint8 for _, img in got)
