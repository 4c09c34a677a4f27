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

import collections
import concurrent.futures
import glob
import os
import time
from collections.abc import Callable, Iterable, Iterator

import chex
import jax
import jax.numpy as jnp
import numpy as np
from absl import logging
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from tailaware import models
from tailaware.core import sampling
from tailaware.data import files as data
from tailaware.data import preprocess
from tailaware.io import features


def compute_dtype(name: str = "auto") -> jnp.dtype:
    """Returns the compute dtype: "auto" is bfloat16 on accelerators and float32 on CPU."""
    if name == "auto":
        return jnp.float32 if jax.default_backend() == "cpu" else jnp.bfloat16
    return jnp.dtype(name)


def local_mesh() -> Mesh:
    """Returns a 1-D `("data",)` mesh over this process's devices."""
    return Mesh(np.asarray(jax.local_devices()), ("data",))


class Embedder:
    """Embeds images with one jit-compiled, data-parallel step per bucket shape.

    Attributes:
      module: a `models.ViT`.
      params: its variables (replicated onto every local device once).
      pre: the preprocessing, which fixes the buckets.
      batch_size: B, rounded up to a multiple of the local device count.
      workers: host threads that decode and resize images (PIL releases the GIL).
    """

    def __init__(self, module, params, pre: preprocess.Preprocess, batch_size: int, workers=4):
        self.module = module
        self.pre = pre
        self.mesh = local_mesh()
        n = self.mesh.size
        self.batch_size = -(-batch_size // n) * n
        self.workers = workers
        replicated = NamedSharding(self.mesh, PartitionSpec())
        self.batch_sharding = NamedSharding(self.mesh, PartitionSpec("data"))
        self.params = jax.device_put(params, replicated)
        # One trace per bucket shape, never per image: a guard against silent recompiles.
        max_shapes = 2 * len(pre.levels())
        step = chex.assert_max_traces(self._step, n=max_shapes)
        self._jit_step = jax.jit(
            step,
            in_shardings=(replicated, self.batch_sharding, self.batch_sharding),
            out_shardings=self.batch_sharding,
        )

    def _step(self, params, images, grid):
        y, _ = self.module.apply(params, images, grid)
        y = y.astype(jnp.float32)
        norm = jnp.linalg.norm(y, axis=-1, keepdims=True)
        return y / jnp.maximum(norm, 1e-12)

    def embed_batch(self, batch: preprocess.Batch) -> jax.Array:
        """Returns the [B, E] descriptors of a padded batch (asynchronously, on device)."""
        images = jax.device_put(batch.images, self.batch_sharding)
        grid = jax.device_put(batch.grid, self.batch_sharding)
        return self._jit_step(self.params, images, grid)

    def embed(
        self, examples: Iterable[tuple[str, object]], progress: "Progress | None" = None
    ) -> tuple[list[str], np.ndarray]:
        """Embeds `(id, image)` pairs; returns ids and [n, E] float32 descriptors, in input order.

        Images are decoded on `workers` threads while the device runs the previous batch.
        """

        def prepare(numbered):
            k, (image_id, image) = numbered
            pixels, grid = self.pre(image)
            return (k, image_id), pixels, grid

        prepared = _bounded_map(prepare, enumerate(examples), self.workers, 4 * self.batch_size)
        out_ids, out_feats, pending = [], [], None
        for batch in preprocess.batches(prepared, self.pre, self.batch_size):
            result = (batch.ids, self.embed_batch(batch))
            if pending is not None:
                self._collect(pending, out_ids, out_feats, progress)
            pending = result
        if pending is not None:
            self._collect(pending, out_ids, out_feats, progress)
        if not out_ids:
            return [], np.zeros((0, self.dim), np.float32)
        order = np.argsort([k for k, _ in out_ids])
        feats = np.concatenate(out_feats)[order]
        return [out_ids[i][1] for i in order], feats

    def _collect(self, pending, out_ids, out_feats, progress):
        ids, y = pending
        y = np.asarray(jax.device_get(y))[: len(ids)]
        out_ids.extend(ids)
        out_feats.append(y)
        if progress is not None:
            progress.update(len(ids))

    @property
    def dim(self) -> int:
        """E, the descriptor size."""
        p = self.pre.patch_size
        shape = jax.ShapeDtypeStruct((1, p, p, 3), jnp.float32)
        y, _ = jax.eval_shape(self.module.apply, self.params, shape)
        return int(y.shape[-1])


def _bounded_map(fn: Callable, items: Iterable, workers: int, buffer: int) -> Iterator:
    """`map(fn, items)` on a thread pool, in order, with at most `buffer` items in flight."""
    with concurrent.futures.ThreadPoolExecutor(max(1, workers)) as pool:
        queue = collections.deque()
        for item in items:
            queue.append(pool.submit(fn, item))
            if len(queue) >= buffer:
                yield queue.popleft().result()
        while queue:
            yield queue.popleft().result()


class Progress:
    """Logs images/s and the ETA of the job (units left x mean seconds per unit so far)."""

    def __init__(self, units_total: int, every_s: float = 30.0):
        self.units_total, self.units_done, self.every_s = units_total, 0, every_s
        self.start = self.last = time.monotonic()
        self.images = 0
        self.unit_seconds: list[float] = []
        self.unit_start = self.start

    def start_unit(self):
        self.unit_start = time.monotonic()

    def update(self, n: int):
        self.images += n
        now = time.monotonic()
        if now - self.last >= self.every_s:
            self.last = now
            logging.info("%d images, %.1f images/s", self.images, self.rate())

    def end_unit(self, name: str):
        now = time.monotonic()
        self.unit_seconds.append(now - self.unit_start)
        self.units_done += 1
        left = self.units_total - self.units_done
        eta = left * float(np.mean(self.unit_seconds))
        logging.info(
            "%s done (%d/%d units), %.1f images/s, ETA %.0f s",
            name,
            self.units_done,
            self.units_total,
            self.rate(),
            eta,
        )

    def rate(self) -> float:
        return self.images / max(time.monotonic() - self.start, 1e-9)


def build_model(mc, embed_cfg=None):
    """Returns `(module, variables, preprocess)` from a `config.model` block.

    `mc.checkpoint` names a `.safetensors` / `.bin` / `.pth` file converted with the name table
    of `mc.source`; an empty name gives random weights (tests and benchmarks only).
    """
    overrides = {k: mc[k] for k in ("act", "pos_interp") if mc.get(k)}
    spec = models.spec_for(mc.source, mc.family, mc.variant, mc.pos_grid, mc.proj_dim, **overrides)
    module = models.ViT(spec, dtype=compute_dtype(mc.get("dtype", "auto")))
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
        out = []
        for name, ids_file in (
            (features.IMAGE_QUERIES, "image_query_ids.txt"),
            (features.POSITIVES, "positive_ids.txt"),
        ):
            ids = data.read_id_list(os.path.join(ec.folder, ids_file))
            out.append((name, lambda ids=ids: data.iter_files(ec.folder, ids)))
        return out
    if ec.input == "folder":
        return [(ec.output or "features_images.hdf5", lambda: data.iter_files(ec.folder))]
    if ec.input == "tars":
        paths = sorted(glob.glob(ec.tars))
        if not paths:
            raise FileNotFoundError(f"no tar shard matches {ec.tars!r}")
        groups = data.group_shards(paths, ec.tars_per_file)
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
            yield from data.iter_tar(p, keep)

    return stream


def tokenize(texts: list[str], tokenizer: str, max_len: int, pad_id: int) -> np.ndarray:
    """Returns [n, L] int32 token ids, truncated and padded to exactly `max_len` (SigLIP).

    `tokenizer` is a Hugging Face `tokenizer.json` (the `tokenizers` package, installed with
    the `convert` extra); it must add the end-of-sequence token as the checkpoint's does.
    """
    import tokenizers  # optional: only for text queries

    tok = tokenizers.Tokenizer.from_file(tokenizer)
    tok.enable_truncation(max_len)
    tok.enable_padding(length=max_len, pad_id=pad_id)
    return np.asarray([e.ids for e in tok.encode_batch(texts)], np.int32)


def embed_tokens(module, variables, tokens: np.ndarray, batch_size: int) -> np.ndarray:
    """Returns L2-normalised [n, E] float32 text descriptors, data-parallel like `Embedder`."""
    mesh = local_mesh()
    batch_size = -(-batch_size // mesh.size) * mesh.size
    sharding = NamedSharding(mesh, PartitionSpec("data"))
    variables = jax.device_put(variables, NamedSharding(mesh, PartitionSpec()))

    @jax.jit
    def step(v, t):
        y = module.apply(v, t)[0].astype(jnp.float32)
        return y / jnp.maximum(jnp.linalg.norm(y, axis=-1, keepdims=True), 1e-12)

    out = []
    for start in range(0, len(tokens), batch_size):
        chunk = tokens[start : start + batch_size]
        padded = np.zeros((batch_size, tokens.shape[1]), np.int32)
        padded[: len(chunk)] = chunk
        out.append(np.asarray(step(variables, jax.device_put(padded, sharding)))[: len(chunk)])
    return np.concatenate(out) if out else np.zeros((0, 0), np.float32)


def _run_text(config, workdir: str) -> list[str]:
    """Embeds the ILIAS text queries with `config.text` (on process 0 only)."""
    tc = config.text
    path = os.path.join(workdir, features.TEXT_QUERIES)
    if jax.process_index() != 0 or os.path.exists(path):
        return []
    spec = models.text_spec(tc.variant, vocab_size=tc.vocab_size, max_len=tc.max_len)
    module = models.TextTransformer(spec, dtype=compute_dtype(config.model.get("dtype", "auto")))
    variables = models.load(tc.checkpoint, tc.source, spec)
    queries = data.read_text_queries(config.embed.folder)
    tokens = tokenize([t for _, t in queries], tc.tokenizer, tc.max_len, tc.pad_id)
    feats = embed_tokens(module, variables, tokens, config.embed.batch_size)
    features.write_features(path, feats, [i for i, _ in queries])
    return [path]


def run(config, workdir: str) -> list[str]:
    """Embeds every work unit of this process into `workdir`; returns the files it wrote."""
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
    embedder = Embedder(module, variables, pre, ec.batch_size, workers=ec.workers)
    progress = Progress(len(todo), every_s=ec.log_every_s)
    for name, make_examples in todo:
        progress.start_unit()
        ids, feats = embedder.embed(make_examples(), progress)
        path = os.path.join(workdir, name)
        features.write_features(path, feats, ids)
        written.append(path)
        progress.end_unit(name)
    return written
