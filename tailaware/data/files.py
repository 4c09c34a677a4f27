"""Image sources for embedding: folders, ILIAS id lists and webdataset tar shards.

Nothing here needs TensorFlow or tensorflow-datasets (the tfds builder is in `tfds_ilias.py`).

Ids follow ILIAS: a core image's id is its path relative to the core folder
(`<instance>/query/Qxxx_yy.jpg`, `<instance>/pos/Pxxx_zz.jpg`); a distractor's id is
`<tar name>/<key>` with the tar's file name less its `.tar` suffix and the webdataset key (the
member path up to the first dot of its base name).
"""

import os
import tarfile
from collections.abc import Callable, Iterator

from tailaware.io import errors, features

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".webp", ".bmp")


def read_id_list(path: str | os.PathLike) -> list[str]:
    """Reads an ILIAS id list: one id per line, or CSV whose first field is the id.

    A header line whose first field is `id` is skipped (`positive_ids.txt` is `id,scale,clutter`).

    Raises:
      MissingInput: no such file.
      InputError: naming the file: no ids, a repeated id, or not UTF-8 text.
    """
    path = errors.require_file(path, "an ILIAS id list (one id per line)")
    ids = []
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                first = line.strip().split(",")[0].split("\t")[0].strip()
                if first and first != "id":
                    ids.append(first)
    except UnicodeDecodeError as e:
        raise errors.InputError(f"{path}: not a text id list ({e})") from e
    if not ids:
        raise errors.InputError(f"{path}: no ids; expected one id per line")
    features.check_ids(ids, path, "ids")
    return ids


def read_text_queries(root: str | os.PathLike, id_file: str = "text_query_ids.txt"):
    """Returns `[(id, text)]` of the ILIAS text queries under `root`.

    Each line of `id_file` is an id whose text is the file of that id under `root`, or
    `id<TAB>text` with the text inline.
    """
    out = []
    ids_path = errors.require_file(os.path.join(root, id_file), "the text query ids")
    with open(ids_path, encoding="utf-8") as f:
        for line in f:
            i, _, text = line.rstrip("\n").partition("\t")
            if not i.strip():
                continue
            if not text:
                path = errors.require_file(os.path.join(root, *i.split("/")), f"the text of {i!r}")
                with open(path, encoding="utf-8") as g:
                    text = g.read().strip()
            out.append((i, text))
    features.check_ids([i for i, _ in out], ids_path, "ids")
    return out


def iter_files(
    root: str | os.PathLike, ids: list[str] | None = None
) -> Iterator[tuple[str, bytes]]:
    """Yields `(id, encoded bytes)` for images under `root`, in sorted id order.

    Args:
      root: a folder; ids are paths relative to it with `/` separators.
      ids: only these (e.g. from `image_query_ids.txt`), in this order; a missing file raises.
    """
    root = os.fspath(root)
    if ids is None:
        ids = sorted(
            os.path.relpath(os.path.join(d, f), root).replace(os.sep, "/")
            for d, _, files in os.walk(root)
            for f in files
            if f.lower().endswith(IMAGE_EXTENSIONS)
        )
    for i in ids:
        path = os.path.join(root, *i.split("/"))
        if not os.path.exists(path):
            raise errors.MissingInput(f"{path}: image of id {i!r} not found under {root}")
        with open(path, "rb") as f:
            yield i, f.read()


def tar_name(path: str | os.PathLike) -> str:
    """Returns the id prefix of a tar shard: its file name less `.tar` (and `.gz`)."""
    name = os.path.basename(os.fspath(path))
    for suffix in (".gz", ".tgz", ".tar"):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
    return name


def iter_tar(
    path: str | os.PathLike, keep: Callable[[str], bool] | None = None
) -> Iterator[tuple[str, bytes]]:
    """Streams `(id, encoded bytes)` for the images of one webdataset tar shard.

    The tar is read sequentially (works on pipes and network file systems). `keep(id)` is asked
    before an image is read, so skipped images cost no decoding and no copy.
    """
    prefix = tar_name(path)
    with tarfile.open(os.fspath(path), mode="r|*") as tar:
        for member in tar:
            if not member.isfile():
                continue
            base = os.path.basename(member.name)
            if not base.lower().endswith(IMAGE_EXTENSIONS) or base.startswith("."):
                continue
            dirname = os.path.dirname(member.name)
            key = base.split(".", 1)[0]
            key = f"{dirname}/{key}" if dirname else key
            image_id = f"{prefix}/{key}"
            if keep is not None and not keep(image_id):
                continue
            f = tar.extractfile(member)
            if f is not None:
                yield image_id, f.read()


def group_shards(paths: list[str], per_file: int) -> list[list[str]]:
    """Splits sorted tar paths into consecutive groups of `per_file`: one output file each.

    ILIAS has 1,000 tars of 100K images and one feature file per 1M, so `per_file` = 10 gives
    `features_distractors_{k:05d}.hdf5` for tars [10k, 10k + 10).
    """
    paths = sorted(paths)
    return [paths[i : i + per_file] for i in range(0, len(paths), per_file)]
