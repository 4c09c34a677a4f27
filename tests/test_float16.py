"""The fast float16 -> float32 conversion against numpy's cast, bit for bit."""

import numpy as np

from tailaware.search import float16


def test_every_finite_float16_converts_exactly():
    x = np.arange(65536, dtype=np.uint16).view(np.float16)
    x = x[np.isfinite(x)]  # subnormals, both zeros, the largest values
    out = float16.to_float32(x)
    np.testing.assert_array_equal(out.view(np.uint32), x.astype(np.float32).view(np.uint32))


def test_blocks_with_inf_or_nan_fall_back_to_numpy():
    x = np.asarray([[1.0, -np.inf], [np.nan, -2.5e-7]], np.float16)
    out = np.empty(x.shape, np.float32)
    assert float16.to_float32(x, out) is out
    np.testing.assert_array_equal(out.view(np.uint32), x.astype(np.float32).view(np.uint32))


def test_other_dtypes_and_views_are_cast_by_numpy():
    rng = np.random.default_rng(0)
    x64 = rng.standard_normal((3, 5))
    np.testing.assert_array_equal(float16.to_float32(x64), x64.astype(np.float32))
    x16 = rng.standard_normal((6, 8)).astype(np.float16)[::2, 1:]  # not contiguous
    np.testing.assert_array_equal(float16.to_float32(x16), x16.astype(np.float32))
