"""Exact float16 -> float32 conversion, faster than numpy's cast on the host.

numpy converts float16 one element at a time, which costs the host scoring pass a noticeable
share of its matmul (benchmarks/README.md, "scoring.py"). Three vectorised integer and float
passes give the same values: the float16 sign, exponent and mantissa bits shifted into a
float32 (a value 2^-112 times too small, exact also for float16 subnormals, which land on
float32 subnormals) and one exact multiplication by 2^112. Infinities and NaN come out as
finite values of magnitude >= 2^16 (no finite float16 reaches it), so a block holding any falls
back to numpy's cast.
"""

import numpy as np

_SCALE = np.float32(2.0**112)  # 2^(127 - 15): the float32 and float16 exponent biases
_CLEAR = np.int32(~0x70000000)  # the three bits the sign extension shifts into the exponent
_FINITE_MAX = 65504.0  # the largest finite float16


def to_float32(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """Returns `x` as float32 (into `out`, same shape, when given); exact, NaN and inf included.

    Only float16 input takes the fast path; other dtypes are cast by numpy.
    """
    if out is None:
        out = np.empty(x.shape, np.float32)
    if x.dtype != np.float16:
        np.copyto(out, x, casting="unsafe")
        return out
    bits = out.view(np.int32)
    # int16 -> int32 sign-extends: the sign lands in bit 31 and in bits 28-30, which are cleared.
    np.left_shift(np.ascontiguousarray(x).view(np.int16), 13, out=bits, dtype=np.int32)
    np.bitwise_and(bits, _CLEAR, out=bits)
    np.multiply(out, _SCALE, out=out)
    if out.size and (out.max() > _FINITE_MAX or out.min() < -_FINITE_MAX):
        np.copyto(out, x)
    return out
