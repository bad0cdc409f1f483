"""The safetensors file format, read and written with NumPy alone.

A safetensors file is an 8-byte little-endian header length N, N bytes of JSON
({name: {"dtype", "shape", "data_offsets": [begin, end]}, optional "__metadata__":
{str: str}}) padded with spaces, then the tensors' raw little-endian bytes. Writing it
needs no PyTorch (and no `safetensors` package): the files written here are loaded by
`safetensors.torch.load_file`, timm and transformers like any other. Reading checks
every offset against the file's length, so a truncated or corrupt file is an error
that names it, never a silently short tensor.
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import ml_dtypes
import numpy as np

from vit_jax.base import files
from vit_jax.weights.errors import CheckpointError

_DTYPES: dict[str, np.dtype] = {
    "F64": np.dtype("<f8"),
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "I64": np.dtype("<i8"),
    "I32": np.dtype("<i4"),
    "I16": np.dtype("<i2"),
    "I8": np.dtype("i1"),
    "U8": np.dtype("u1"),
    "BOOL": np.dtype("?"),
}
_NAMES = {v: k for k, v in _DTYPES.items()}
_MAX_HEADER = 100 * 2**20  # the reference implementation's own limit


def is_safetensors(path: str | os.PathLike) -> bool:
    """Whether `path` starts like a safetensors file (a sane header length, then '{')."""
    try:
        with open(path, "rb") as f:
            head = f.read(9)
    except OSError:
        return False
    if len(head) < 9:
        return False
    (n,) = struct.unpack("<Q", head[:8])
    return 2 <= n <= _MAX_HEADER and head[8:9] == b"{"


def read(path: str | os.PathLike) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """All tensors of a safetensors file, and its metadata.

    Returns:
      ({name: array}, {metadata key: value}); bfloat16 tensors come back as
      ml_dtypes.bfloat16 arrays.

    Raises:
      FileNotFoundError: no such file.
      CheckpointError: not a safetensors file, truncated, or with inconsistent offsets.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {path}: no such file")
    data = path.read_bytes()
    bad = lambda why: CheckpointError(
        f"{path} is not a readable safetensors file ({why}); if it was downloaded or copied, "
        "do it again"
    )
    if len(data) < 8:
        raise bad(f"{len(data)} bytes, shorter than the header length")
    (n,) = struct.unpack("<Q", data[:8])
    if n > _MAX_HEADER or 8 + n > len(data):
        raise bad(f"header of {n} bytes in a file of {len(data)}: truncated")
    try:
        header = json.loads(data[8 : 8 + n])
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise bad(f"header is not JSON: {e}") from None
    if not isinstance(header, dict):
        raise bad("header is not a JSON object")
    metadata = header.pop("__metadata__", None) or {}
    body = memoryview(data)[8 + n :]
    tensors, end = {}, 0
    for name, info in header.items():
        try:
            dtype = _DTYPES[info["dtype"]]
            shape = tuple(int(s) for s in info["shape"])
            begin, stop = (int(o) for o in info["data_offsets"])
        except (KeyError, TypeError, ValueError) as e:
            raise bad(f"tensor {name!r} has a bad entry {info!r} ({e})") from None
        size = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if stop - begin != size or begin < 0:
            raise bad(f"tensor {name!r} {shape} {info['dtype']} spans bytes {begin}..{stop}")
        if stop > len(body):
            raise bad(f"tensor {name!r} ends at byte {stop} of a {len(body)}-byte body: truncated")
        tensors[name] = np.frombuffer(body[begin:stop], dtype).reshape(shape).copy()
        end = max(end, stop)
    if end != len(body):
        raise bad(f"{len(body) - end} bytes after the last tensor")
    return tensors, dict(metadata)


def write(
    path: str | os.PathLike,
    tensors: dict[str, np.ndarray],
    metadata: dict[str, str] | None = None,
) -> None:
    """Write `tensors` (C-contiguous little-endian copies) as one safetensors file.

    The file is written whole under a temporary name and then renamed, so a failure
    never leaves a half-written file at `path`.
    """
    header: dict[str, object] = {}
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    arrays, offset = [], 0
    for name in sorted(tensors):
        a = np.ascontiguousarray(tensors[name])
        if a.dtype.newbyteorder("<") in _NAMES and a.dtype.byteorder == ">":
            a = a.astype(a.dtype.newbyteorder("<"))
        if a.dtype not in _NAMES:
            raise ValueError(f"tensor {name!r}: dtype {a.dtype} has no safetensors name")
        header[name] = {
            "dtype": _NAMES[a.dtype],
            "shape": list(a.shape),
            "data_offsets": [offset, offset + a.nbytes],
        }
        arrays.append(a)
        offset += a.nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned
    with files.atomic_write(path) as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for a in arrays:
            f.write(a.tobytes())
