"""The safetensors file format, read and written with the `safetensors` package's NumPy side.

A safetensors file is an 8-byte little-endian header length N, N bytes of JSON
({name: {"dtype", "shape", "data_offsets": [begin, end]}, optional "__metadata__":
{str: str}}) padded with spaces, then the tensors' raw little-endian bytes. No PyTorch
is needed: the files written here are loaded by `safetensors.torch.load_file`, timm and
transformers like any other. The package checks every offset against the file's
length, so a truncated or corrupt file is an error that names it, never a silently
short tensor.
"""

from __future__ import annotations

import json
import os
import struct

import ml_dtypes
import numpy as np
import safetensors
import safetensors.numpy

from vit_jax.base import files, store
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
_MAX_HEADER = 100 * 2**20  # the reference implementation's own limit


def is_safetensors(path: str | os.PathLike) -> bool:
    """Whether `path` starts like a safetensors file (a sane header length, then '{')."""
    try:
        with store.path(path).open("rb") as f:
            head = f.read(9)
    except OSError:
        return False
    n = int.from_bytes(head[:8], "little")  # a short file: no '{' at byte 8
    return 2 <= n <= _MAX_HEADER and head[8:9] == b"{"


def read(path: str | os.PathLike) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """All tensors of a safetensors file, and its metadata.

    The `safetensors` package parses and checks the file; its NumPy loader has no
    bfloat16, so the tensors come from its raw `deserialize` through the table above.

    Returns:
      ({name: array}, {metadata key: value}); bfloat16 tensors come back as
      ml_dtypes.bfloat16 arrays.

    Raises:
      FileNotFoundError: no such file.
      CheckpointError: not a safetensors file, truncated, or with inconsistent offsets.
    """
    path = store.path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {path}: no such file")
    data = path.read_bytes()
    bad = lambda why: CheckpointError(
        f"{path} is not a readable safetensors file ({why}); if it was downloaded or copied, "
        "do it again"
    )
    try:
        entries = safetensors.deserialize(data)
    except safetensors.SafetensorError as e:
        raise bad(_plain(e, data)) from None
    (n,) = struct.unpack("<Q", data[:8])
    metadata = json.loads(data[8 : 8 + n]).get("__metadata__") or {}
    tensors = {}
    for name, info in entries:
        if info["dtype"] not in _DTYPES:
            raise bad(f"tensor {name!r} has dtype {info['dtype']}, which vit_jax does not read")
        tensors[name] = np.frombuffer(info["data"], _DTYPES[info["dtype"]]).reshape(info["shape"])
    return tensors, dict(metadata)


def read_metadata(path: str | os.PathLike) -> dict[str, str]:
    """A safetensors file's metadata alone (its header; no tensor is read).

    Raises:
      FileNotFoundError, CheckpointError: as `read`.
    """
    try:
        with store.path(path).open("rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            if not 2 <= n <= _MAX_HEADER:
                raise ValueError(n)
            return dict(json.loads(f.read(n)).get("__metadata__") or {})
    except (OSError, ValueError, struct.error):
        return read(path)[1]  # its error names what is wrong (no such file included)


def _plain(error: Exception, data: bytes) -> str:
    """The safetensors package's complaint, with what it means for a file on disk."""
    why = str(error).removeprefix("Error while deserializing: ")
    if len(data) < 8:
        return f"{why}: {len(data)} bytes, shorter than the header length"
    (n,) = struct.unpack("<Q", data[:8])
    if 8 + n > len(data):
        return f"{why}: header of {n} bytes in a file of {len(data)}: truncated"
    if "not fully covered" in why:
        return f"{why}: the tensors do not end where the file does: truncated or extended"
    return why


def write(
    path: str | os.PathLike, tensors: dict[str, np.ndarray], metadata: dict[str, str] | None = None
) -> None:
    """Write `tensors` as one safetensors file (by `safetensors.numpy.save`).

    The file is written whole under a temporary name and then renamed, so a failure
    never leaves a half-written file at `path`. Only the dtypes `read` knows are
    written, so every file written here reads back.
    """
    arrays = {}
    for name, a in tensors.items():
        a = np.ascontiguousarray(a)
        if a.dtype.newbyteorder("<") not in _DTYPES.values():
            raise ValueError(f"tensor {name!r}: dtype {a.dtype} has no safetensors name")
        arrays[name] = a
    meta = {str(k): str(v) for k, v in metadata.items()} if metadata else None
    data = safetensors.numpy.save(arrays, meta)
    with files.atomic_write(path) as f:
        f.write(data)
