"""The uniform distractor sample: a seeded hash of each id against a fraction.

The paper's law needs a uniform random sample of the distractor pool (Sec. 4). Hashing the id
makes the sample stable across runs, machines and shard layouts, and nested: every id in the 1%
sample is in the 5% sample of the same seed, because membership is `u(id) < fraction` for one
fixed pseudo-uniform `u(id)` in [0, 1).
"""

import hashlib
from collections.abc import Iterable

import numpy as np


def hash_uniform(ids: Iterable[str | bytes], seed: int = 0) -> np.ndarray:
    """Returns u(id) in [0, 1) for each id: the first 8 bytes of blake2b(seed, id), as float64."""
    key = int(seed).to_bytes(8, "little", signed=False)
    out = []
    for i in ids:
        data = i if isinstance(i, bytes) else str(i).encode("utf-8")
        digest = hashlib.blake2b(data, digest_size=8, key=key).digest()
        out.append(int.from_bytes(digest, "little"))
    return np.asarray(out, dtype=np.uint64).astype(np.float64) / 2.0**64


def in_sample(ids: Iterable[str | bytes], fraction: float, seed: int = 0) -> np.ndarray:
    """Returns a bool mask: which ids belong to the `fraction` sample of this seed."""
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"sample fraction must be in (0, 1], got {fraction}")
    ids = list(ids)
    if fraction == 1.0:
        return np.ones(len(ids), dtype=bool)
    return hash_uniform(ids, seed) < fraction


def hash_block(ids: Iterable[str | bytes], n_blocks: int, seed: int = 0) -> np.ndarray:
    """Returns a block index in [0, n_blocks) per id, independent of sample membership.

    A second key (seed + 1) keeps the split uncorrelated with `in_sample`, so each block of a
    sample is itself a uniform sample (used by drift checks).
    """
    return np.minimum((hash_uniform(ids, seed + 1) * n_blocks).astype(np.int64), n_blocks - 1)
