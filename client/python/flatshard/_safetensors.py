"""Reads safetensors files (the format flatshard checkpoints and summons use).

The format is an 8-byte little-endian header length, a JSON header naming each
tensor's dtype, shape and byte range, then the data; reading it needs numpy
alone, so offline tools work without the `safetensors` package or torch.
"""
from __future__ import annotations

import json
import struct
from typing import Dict, Tuple

import numpy as np

# bfloat16 has no numpy dtype: it is read as its raw uint16 bits and widened to
# float32 exactly (a bf16 is the top half of an fp32).
_DTYPES = {
    "F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": np.uint16,
    "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8,
    "BOOL": np.bool_,
}
_MAX_HEADER = 100 << 20


def bf16_bits_to_float32(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def read_safetensors(path: str) -> Tuple[Dict[str, np.ndarray], Dict[str, str], Dict[str, str]]:
    """Returns (tensors, dtypes by name as the file states them, metadata)."""
    with open(path, "rb") as f:
        blob = f.read()
    if len(blob) < 8:
        raise ValueError(f"{path}: not a safetensors file ({len(blob)} bytes)")
    (header_len,) = struct.unpack("<Q", blob[:8])
    if header_len > min(_MAX_HEADER, len(blob) - 8):
        raise ValueError(f"{path}: header length {header_len} runs past the file")
    header = json.loads(blob[8:8 + header_len])
    metadata = header.pop("__metadata__", {}) or {}
    data = memoryview(blob)[8 + header_len:]
    tensors: Dict[str, np.ndarray] = {}
    dtypes: Dict[str, str] = {}
    for name, entry in header.items():
        dtype = _DTYPES.get(entry["dtype"])
        if dtype is None:
            raise ValueError(f"{path}: tensor '{name}' has unsupported dtype {entry['dtype']}")
        begin, end = entry["data_offsets"]
        shape = tuple(int(d) for d in entry["shape"])
        count = int(np.prod(shape, dtype=np.int64)) if shape else 1
        if not 0 <= begin <= end <= len(data) or end - begin != count * np.dtype(dtype).itemsize:
            raise ValueError(f"{path}: tensor '{name}' has byte range [{begin}, {end}) that does "
                             f"not hold {shape} {entry['dtype']}")
        array = np.frombuffer(data[begin:end], dtype=dtype).reshape(shape).copy()
        tensors[name] = array
        dtypes[name] = entry["dtype"]
    return tensors, dtypes, metadata
