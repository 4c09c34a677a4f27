"""Reading PyTorch checkpoints into numpy: safetensors natively, pickles through torch.

A file that is not a readable checkpoint is an `InputError` naming it (and the tensor).
"""

import json
import math
import os
import struct

import ml_dtypes
import numpy as np

from tailaware.io import errors

Array = np.ndarray


def load_state_dict(path: str | os.PathLike) -> dict[str, Array]:
    """Reads a checkpoint into numpy arrays: `.safetensors` natively, else with `torch.load`.

    safetensors files (the Hub's format) need neither torch nor the safetensors package;
    pickled PyTorch files (`.bin`, `.pt`, `.pth`) need torch (the `convert` extra) and are
    read with `weights_only=True`. A `state_dict` / `model` / `module` wrapper is unwrapped.
    """
    path = errors.require_file(path, "a checkpoint (weights are never downloaded)")
    if path.endswith(".safetensors"):
        return read_safetensors(path)
    import torch  # optional: only for pickled checkpoints

    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # torch.load raises many types (pickle, zip, runtime) on a bad file
        raise errors.InputError(
            f"{path}: not a readable PyTorch checkpoint ({type(e).__name__}: {e})"
        ) from e
    for key in ("state_dict", "model", "module"):
        if isinstance(obj, dict) and key in obj and isinstance(obj[key], dict):
            obj = obj[key]
    if not isinstance(obj, dict):
        raise errors.InputError(f"{path}: expected a state dict, got {type(obj).__name__}")
    return {k: v.detach().float().numpy() for k, v in obj.items() if hasattr(v, "detach")}


_ST_DTYPES = {
    "F64": np.float64,
    "F32": np.float32,
    "F16": np.float16,
    "BF16": ml_dtypes.bfloat16,
    "I64": np.int64,
    "I32": np.int32,
    "I16": np.int16,
    "I8": np.int8,
    "U8": np.uint8,
    "BOOL": np.bool_,
}


def read_safetensors(path: str | os.PathLike) -> dict[str, Array]:
    """Reads a `.safetensors` file (8-byte header size, JSON header, raw little-endian data).

    Every header entry is checked against the data (dtype, shape and offsets) before a tensor
    is read.

    Raises:
      InputError: naming the file and the tensor.
    """
    path = os.fspath(path)
    with open(path, "rb") as f:
        blob = f.read()
    if len(blob) < 8:
        raise errors.InputError(f"{path}: {len(blob)} bytes; not a safetensors file (truncated?)")
    (n,) = struct.unpack("<Q", blob[:8])
    if n > len(blob) - 8:
        raise errors.InputError(
            f"{path}: header of {n} bytes in a {len(blob)}-byte file; truncated or not safetensors"
        )
    try:
        header = json.loads(blob[8 : 8 + n])
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise errors.InputError(f"{path}: header is not JSON ({e}); not a safetensors file") from e
    if not isinstance(header, dict):
        raise errors.InputError(f"{path}: header is not a JSON object; not a safetensors file")
    data = memoryview(blob)[8 + n :]
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype, shape, (start, end) = _entry(path, name, info, len(data))
        arr = np.frombuffer(data[start:end], dtype=dtype).reshape(shape)
        out[name] = (
            arr.astype(np.float32)
            if arr.dtype.kind == "f" or arr.dtype == ml_dtypes.bfloat16
            else arr.copy()
        )
    return out


def _entry(path: str, name: str, info, size: int):
    """Returns (dtype, shape, offsets) of one safetensors header entry, checked against the
    `size` bytes of data."""
    fail = lambda msg: errors.field_error(path, name, msg)
    if not isinstance(info, dict) or not {"dtype", "shape", "data_offsets"} <= set(info):
        raise fail("expected a header entry with dtype, shape and data_offsets")
    if not isinstance(info["dtype"], str) or info["dtype"] not in _ST_DTYPES:
        raise fail(f"dtype {info['dtype']!r}; expected one of {sorted(_ST_DTYPES)}")
    dtype, shape, offsets = np.dtype(_ST_DTYPES[info["dtype"]]), info["shape"], info["data_offsets"]
    ints = lambda v: isinstance(v, list) and all(type(i) is int and i >= 0 for i in v)
    if not ints(shape) or not ints(offsets) or len(offsets) != 2:
        raise fail(f"shape {shape} and data_offsets {offsets}: expected lists of ints >= 0")
    start, end = offsets
    if not start <= end <= size or end - start != math.prod(shape) * dtype.itemsize:
        raise fail(
            f"data_offsets {offsets} for shape {shape} {info['dtype']} in {size} bytes of data: "
            "truncated or corrupt"
        )
    return dtype, tuple(shape), (start, end)
