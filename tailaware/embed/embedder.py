"""Embedding images with a Flax backbone: one jit-compiled, data-parallel step per bucket shape.

The step runs the backbone on a batch sharded over a `("data",)` mesh of every local device, in
bfloat16 on accelerators and float32 on CPU, and returns L2-normalised float32 descriptors;
images are decoded and resized on host threads while the device runs the previous batch.

Shapes: `B` batch (a multiple of the local device count), `E` descriptor size.
"""

import collections
import concurrent.futures
from collections.abc import Callable, Iterable, Iterator

import chex
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from tailaware.data import preprocess
from tailaware.io.progress import Progress


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
        out_ids: list[tuple[int, str]] = []
        out_feats: list[np.ndarray] = []
        pending = None
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
            progress.update(items=len(ids))

    @property
    def dim(self) -> int:
        """E, the descriptor size."""
        p = self.pre.patch_size
        shape = jax.ShapeDtypeStruct((1, p, p, 3), jnp.float32)
        y, _ = jax.eval_shape(self.module.apply, self.params, shape)
        return int(y.shape[-1])


def _bounded_map(fn: Callable, items: Iterable, workers: int, buffer: int) -> Iterator:
    """Yields `map(fn, items)`, computed on a thread pool, in order, at most `buffer` in flight."""
    with concurrent.futures.ThreadPoolExecutor(max(1, workers)) as pool:
        queue: collections.deque[concurrent.futures.Future] = collections.deque()
        for item in items:
            queue.append(pool.submit(fn, item))
            if len(queue) >= buffer:
                yield queue.popleft().result()
        while queue:
            yield queue.popleft().result()
