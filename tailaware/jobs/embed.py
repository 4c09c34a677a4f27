"""The embedding job: images to ILIAS-format descriptor files, data-parallel over local devices.

Command: `python launch.py --config=configs/embed.py:<preset> --workdir=DIR --config.model...`
(see configs/embed.py). Each output file is one *work unit* (the image queries, the positives,
or one distractor file of `tars_per_file` tars); a unit whose file exists is skipped, so a
rerun resumes. With `jax.distributed` each process takes units `process_index::process_count`.

The jit-compiled step runs the backbone on a batch sharded over a `("data",)` mesh of every
local device, in bfloat16 on accelerators and float32 on CPU, and returns L2-normalised float32
descriptors; `write_features` stores them as float16 (the ILIAS format).

Shapes: `B` batch (a multiple of the local device count), `E` descriptor size.
"""

import functools
import glob
import os
from collections.abc import Callable, Iterator

import jax
import jax.numpy as jnp
from absl import logging

from tailaware.core import sampling
from tailaware.data import files, preprocess
from tailaware.io import features
from tailaware.io.errors import MissingInput
from tailaware.io.progress import Progress
from tailaware.jobs import config as config_lib

# The backbones need the `embed` extra (flax, chex), which the base install leaves out.
EMBED_EXTRA = ("flax", "chex")
try:
    from tailaware import models
    from tailaware.embed import embedder, text
except ModuleNotFoundError as e:
    if e.name not in EMBED_EXTRA:
        raise
    raise ModuleNotFoundError(
        f'the embed job needs {e.name}, in the embed extra: pip install "tailaware[embed]"',
        name=e.name,
    ) from e


def build_model(mc, embed_cfg=None):
    """Returns `(module, variables, preprocess)` from a `config.model` block.

    `mc.checkpoint` names a `.safetensors` / `.bin` / `.pth` file converted with the name table
    of `mc.source`; an empty name gives random weights (tests and benchmarks only).
    """
    overrides = {k: mc[k] for k in ("act", "pos_interp") if mc.get(k)}
    spec = models.spec_for(mc.source, mc.family, mc.variant, mc.pos_grid, mc.proj_dim, **overrides)
    module = models.ViT(spec, dtype=embedder.compute_dtype(mc.get("dtype", "auto")))
    if mc.checkpoint:
        variables = models.load(mc.checkpoint, mc.source, spec)
    else:
        logging.warning("model.checkpoint is empty: RANDOM weights (for tests only)")
        dummy = jnp.zeros((1, spec.patch_size, spec.patch_size, 3), jnp.float32)
        variables = models.vit.random_variables(module, dummy, mc.get("seed", 0))
    pre = preprocess.Preprocess(
        resolution=mc.resolution,
        patch_size=spec.patch_size,
        norm=mc.get("norm") or preprocess.FAMILY_NORM[mc.family],
        num_buckets=embed_cfg.num_buckets if embed_cfg is not None else 4,
    )
    return module, variables, pre


def work_units(ec) -> list[tuple[str, Callable[[], Iterator]]]:
    """Returns `(output file name, example iterator factory)` for a `config.embed` block."""
    keep = None
    if ec.sample_fraction < 1.0:
        fraction, seed = ec.sample_fraction, ec.sample_seed
        keep = lambda i: bool(sampling.in_sample([i], fraction, seed)[0])
    if ec.input == "ilias_core":
        out: list[tuple[str, Callable[[], Iterator]]] = []
        for name, ids_file in (
            (features.IMAGE_QUERIES, "image_query_ids.txt"),
            (features.POSITIVES, "positive_ids.txt"),
        ):
            ids = files.read_id_list(os.path.join(ec.folder, ids_file))
            out.append((name, functools.partial(files.iter_files, ec.folder, ids)))
        return out
    if ec.input == "folder":
        return [(ec.output or "features_images.hdf5", lambda: files.iter_files(ec.folder))]
    if ec.input == "tars":
        paths = sorted(glob.glob(ec.tars))
        if not paths:
            raise MissingInput(f"--config.embed.tars={ec.tars}: no tar shard matches")
        groups = files.group_shards(paths, ec.tars_per_file)
        return [
            (features.distractor_name(ec.first_file + k), _tar_stream(group, keep))
            for k, group in enumerate(groups)
        ]
    if ec.input == "tfds":
        import tensorflow_datasets as tfds

        from tailaware.data import tfds_ilias  # optional: the `data` extra

        builder = tfds.builder(ec.tfds_name, data_dir=ec.tfds_data_dir or None)
        name = ec.output or _SPLIT_FILES.get(ec.tfds_split, f"features_{ec.tfds_split}.hdf5")
        return [(name, lambda: tfds_ilias.iter_split(builder, ec.tfds_split))]
    raise ValueError(f"unknown embed.input {ec.input!r}: ilias_core, folder, tars or tfds")


_SPLIT_FILES = {"image_queries": features.IMAGE_QUERIES, "positives": features.POSITIVES}


def _tar_stream(paths, keep):
    def stream():
        for p in paths:
            yield from files.iter_tar(p, keep)

    return stream


def _run_text(config, workdir: str) -> list[str]:
    """Embeds the ILIAS text queries with `config.text` (on process 0 only)."""
    tc = config.text
    path = os.path.join(workdir, features.TEXT_QUERIES)
    if jax.process_index() != 0 or os.path.exists(path):
        return []
    spec = models.text_spec(tc.variant, vocab_size=tc.vocab_size, max_len=tc.max_len)
    module = models.TextTransformer(
        spec, dtype=embedder.compute_dtype(config.model.get("dtype", "auto"))
    )
    variables = models.load(tc.checkpoint, tc.source, spec)
    queries = files.read_text_queries(config.embed.folder)
    tokens = text.tokenize([t for _, t in queries], tc.tokenizer, tc.max_len, tc.pad_id)
    feats = text.embed_tokens(module, variables, tokens, config.embed.batch_size)
    features.write_features(path, feats, [i for i, _ in queries])
    return [path]


def run(config, workdir: str) -> list[str]:
    """Embeds every work unit of this process into `workdir`; returns the files it wrote."""
    config_lib.check_embed(config, models.TABLES, models.FAMILIES)
    ec = config.embed
    if ec.distributed:
        jax.distributed.initialize()
    units = work_units(ec)
    mine = units[jax.process_index() :: jax.process_count()]
    todo = [(n, f) for n, f in mine if not os.path.exists(os.path.join(workdir, n))]
    written = []
    if ec.input == "ilias_core" and config.text.checkpoint:
        written += _run_text(config, workdir)
    logging.info(
        "process %d/%d: %d of %d units, %d already done",
        jax.process_index(),
        jax.process_count(),
        len(mine),
        len(units),
        len(mine) - len(todo),
    )
    if not todo:
        return written
    module, variables, pre = build_model(config.model, ec)
    images = embedder.Embedder(module, variables, pre, ec.batch_size, workers=ec.workers)
    with Progress(
        "embedding",
        f"{len(todo)} files",
        total=len(todo),
        unit="files",
        items="images",
        every_s=ec.log_every_s,
    ) as progress:
        for name, make_examples in todo:
            ids, feats = images.embed(make_examples(), progress)
            path = os.path.join(workdir, name)
            features.write_features(path, feats, ids)
            written.append(path)
            progress.update(1, name=name)
    return written
