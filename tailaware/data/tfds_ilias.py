"""A tensorflow-datasets builder for the ILIAS core set, from a manually downloaded folder.

Needs tensorflow-datasets (the `data` extra) but not TensorFlow: prepare with
`file_format="array_record"` and read with `as_data_source` (random access, numpy). Only
`as_dataset` (a `tf.data` pipeline) needs TensorFlow.

Manual folder (`manual_dir`), as the ILIAS download unpacks:
  image_query_ids.txt  one id per line, `<instance>/query/Qxxx_yy.jpg`
  positive_ids.txt     CSV `id,scale,clutter`, ids `<instance>/pos/Pxxx_zz.jpg`
  text_query_ids.txt   one id per line; the query text is in the file of that id, or, when a
                       line reads `id<TAB>text`, in the line itself
  <instance>/...       the images and text files named by the ids

Configs: `images` (splits `image_queries`, `positives`; features `id`, `image`) and `text`
(split `text_queries`; features `id`, `text`).
"""

import os
from typing import ClassVar

import tensorflow_datasets as tfds

from tailaware.data import files as data

_MANUAL = __doc__.split("Manual folder")[1].split("Configs:")[0]


class IliasCore(tfds.core.GeneratorBasedBuilder):
    """ILIAS core: 1,232 image queries, 4,715 positives, 1,000 text queries."""

    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES: ClassVar[dict[str, str]] = {"1.0.0": "Initial release."}
    MANUAL_DOWNLOAD_INSTRUCTIONS = _MANUAL
    BUILDER_CONFIGS: ClassVar[list[tfds.core.BuilderConfig]] = [
        tfds.core.BuilderConfig(name="images", description="Image queries and positives."),
        tfds.core.BuilderConfig(name="text", description="Text queries."),
    ]

    def _info(self) -> tfds.core.DatasetInfo:
        if self.builder_config.name == "images":
            features = {"id": tfds.features.Text(), "image": tfds.features.Image()}
        else:
            features = {"id": tfds.features.Text(), "text": tfds.features.Text()}
        return tfds.core.DatasetInfo(
            builder=self,
            description="ILIAS (Kordopatis-Zilos et al., CVPR 2025), core set.",
            features=tfds.features.FeaturesDict(features),
            homepage="https://vrg.fel.cvut.cz/ilias/",
        )

    def _split_generators(self, dl_manager):
        root = dl_manager.manual_dir
        if self.builder_config.name == "images":
            return {
                "image_queries": self._generate_examples(root, "image_query_ids.txt"),
                "positives": self._generate_examples(root, "positive_ids.txt"),
            }
        return {"text_queries": self._generate_examples(root, "text_query_ids.txt")}

    def _generate_examples(self, root, id_file):
        if self.builder_config.name == "images":
            for i in data.read_id_list(os.path.join(root, id_file)):
                yield i, {"id": i, "image": os.path.join(root, *i.split("/"))}
            return
        for i, text in data.read_text_queries(root, id_file):
            yield i, {"id": i, "text": text}


def iter_split(builder: tfds.core.DatasetBuilder, split: str):
    """Yields `(id, uint8 image [H, W, 3])` of an image split through `as_data_source`."""
    source = builder.as_data_source(split=split)
    for k in range(len(source)):
        ex = source[k]
        i = ex["id"]
        yield (i.decode() if isinstance(i, bytes) else str(i)), ex["image"]
