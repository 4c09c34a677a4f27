"""Reading PyTorch checkpoints into numpy: safetensors natively, pickles through torch."""

import json
import os
import struct

import ml_dtypes
import numpy as np

Array = np.ndarray


def load_state_dict(path: str | os.PathLike) -> dict[str, Array]:
    """Reads a checkpoint into numpy arrays: `.safetensors` natively, else with `torch.load`.

    safetensors files (the Hub's format) need neither torch nor the safetensors package;
    pickled PyTorch files (`.bin`, `.pt`, `.pth`) need torch (the `convert` extra) and are
    read with `weights_only=True`. A `state_dict` / `model` / `module` wrapper is unwrapped.
    """
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: no such checkpoint (weights are never downloaded)")
    if path.endswith(".safetensors"):
        return read_safetensors(path)
    import torch  # optional: only for pickled checkpoints

    obj = torch.load(path, map_location="cpu", weights_only=True)
    for key in ("state_dict", "model", "module"):
        if isinstance(obj, dict) and key in obj and isinstance(obj[key], dict):
            obj = obj[key]
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
    """Reads a `.safetensors` file (8-byte header size, JSON header, raw little-endian data)."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        start, end = info["data_offsets"]
        arr = np.frombuffer(data[start:end], dtype=_ST_DTYPES[info["dtype"]])
        arr = arr.reshape(info["shape"])
        out[name] = (
            arr.astype(np.float32)
            if arr.dtype.kind == "f" or arr.dtype == ml_dtypes.bfloat16
            else arr
        )
    return out
