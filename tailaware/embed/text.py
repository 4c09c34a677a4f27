"""Embedding text queries with a Flax text tower (SigLIP), data-parallel like the images.

Shapes: `L` tokens per text, `E` descriptor size.
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from tailaware.embed.embedder import local_mesh


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
