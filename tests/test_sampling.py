"""The id-hash sample: a literal transcription of the hash, nesting, uniformity, stability."""

import numpy as np
import scipy.stats

from tailaware.core import sampling

MASK = (1 << 64) - 1


def splitmix64(z):
    z ^= z >> 30
    z = (z * 0xBF58476D1CE4E5B9) & MASK
    z ^= z >> 27
    z = (z * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def reference_u(id_, seed):
    """FNV-1a 64 over UTF-8 bytes from a seeded offset, splitmix64 finish, top 53 bits."""
    h = splitmix64(seed) ^ 0xCBF29CE484222325
    for b in id_.encode("utf-8"):
        h = ((h ^ b) * 0x100000001B3) & MASK
    return (splitmix64(h) >> 11) / 2.0**53


def test_matches_python_transcription_for_mixed_lengths_and_unicode():
    ids = ["a", "img/query/Q001_01.jpg", "tar00017/0000123", "", "é/ñ", "x" * 70]
    for seed in (0, 7):
        want = [reference_u(i, seed) for i in ids]
        np.testing.assert_array_equal(sampling.hash_uniform(ids, seed), want)


def test_independent_of_batch_and_bytes_input():
    ids = [f"tar{i % 7:05d}/{i}" for i in range(300)]
    alone = np.array([sampling.hash_uniform([i])[0] for i in ids[:20]])
    np.testing.assert_array_equal(sampling.hash_uniform(ids)[:20], alone)
    np.testing.assert_array_equal(
        sampling.hash_uniform([i.encode() for i in ids]), sampling.hash_uniform(ids)
    )


def test_nested_and_uniform():
    ids = [f"tar{i // 1000:05d}/{i:08d}" for i in range(50_000)]
    one, five = sampling.in_sample(ids, 0.01), sampling.in_sample(ids, 0.05)
    assert not (one & ~five).any()
    assert abs(five.mean() - 0.05) < 4 * np.sqrt(0.05 * 0.95 / len(ids))
    assert scipy.stats.kstest(sampling.hash_uniform(ids, seed=3), "uniform").pvalue > 1e-3
    other = sampling.in_sample(ids, 0.05, seed=1)
    assert abs((five & other).mean() - 0.05**2) < 0.002  # seeds give independent samples
    assert sampling.in_sample(ids, 1.0).all()


def test_blocks_are_balanced_and_independent_of_membership():
    ids = [f"d/{i}" for i in range(40_000)]
    blocks = sampling.hash_block(ids, 4)
    counts = np.bincount(blocks, minlength=4)
    assert counts.min() > 9_500
    inside = sampling.in_sample(ids, 0.25)
    np.testing.assert_allclose(
        np.bincount(blocks[inside], minlength=4) / inside.sum(), 0.25, atol=0.02
    )
