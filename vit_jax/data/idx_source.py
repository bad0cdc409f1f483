"""MNIST-format idx files (Fashion-MNIST, MNIST, KMNIST), parsed with numpy into memory.

An idx file is a big-endian header -- two zero bytes, a type code, the number of
dimensions d, then d uint32 sizes -- followed by the data. A split 'train' reads
``train-images-idx3-ubyte[.gz]`` and ``train-labels-idx1-ubyte[.gz]``; 'test' reads the
``t10k-*`` files, the names the MNIST and Fashion-MNIST projects publish.
"""

from __future__ import annotations

import functools
import gzip

import numpy as np

from vit_jax.base import store

INSTALL_HINT = (
    "apt-get install dataset-fashion-mnist (Debian/Ubuntu), or download the four idx "
    "files from the Fashion-MNIST project and set dataset.data_dir=DIR"
)
PREFIXES = {"train": "train", "test": "t10k"}
# idx type code -> numpy dtype (big-endian as stored).
_DTYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def read_idx(path: str) -> np.ndarray:
    """Reads one idx file (local or on a store), gzip-compressed or not, into an array of
    its stored shape."""
    raw = store.path(path).read_bytes()
    if path.endswith(".gz"):
        raw = gzip.decompress(raw)
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _DTYPES:
        raise ValueError(
            f"{path}: not an idx file (magic bytes {raw[:4].hex()}, expected 0000 + a type "
            f"code in {sorted(_DTYPES)} + the number of dimensions)."
        )
    dtype, ndim = np.dtype(_DTYPES[raw[2]]), raw[3]
    header = 4 + 4 * ndim
    shape = tuple(int(d) for d in np.frombuffer(raw[4:header], ">u4"))
    expected = header + int(np.prod(shape)) * dtype.itemsize
    if len(raw) != expected:
        raise ValueError(
            f"{path}: the header promises shape {shape} ({expected} bytes) but the file "
            f"has {len(raw)} bytes; the file is truncated or corrupt, download it again."
        )
    return np.frombuffer(raw, dtype, offset=header).reshape(shape).astype(dtype.newbyteorder("="))


def _find(data_dir: str, prefix: str, kind: str) -> str:
    """Path of '<prefix>-<kind>-ubyte' with or without .gz, or a FileNotFoundError."""
    names = [f"{prefix}-{kind}-ubyte", f"{prefix}-{kind}-ubyte.gz"]
    names += [n.replace(f"-{kind}", f".{kind}") for n in names]  # train-images.idx3-ubyte
    root = store.path(data_dir)
    for name in names:
        if (root / name).exists():
            return str(root / name)
    if not root.is_dir():
        raise FileNotFoundError(f"idx directory {data_dir} does not exist. {INSTALL_HINT}.")
    found = sorted(p.name for p in root.iterdir())
    raise FileNotFoundError(
        f"idx directory {data_dir} has no {names[1]} (found: {found}). {INSTALL_HINT}."
    )


@functools.lru_cache(maxsize=8)
def load_split(data_dir: str, name: str) -> tuple[np.ndarray, np.ndarray]:
    """Reads a whole split of an idx directory.

    Args:
        data_dir: Directory with the four idx files.
        name: 'train' or 'test'.

    Returns:
        (images uint8 [N, H, W, 1] or [N, H, W, 3], labels int64 [N]).
    """
    if name not in PREFIXES:
        raise ValueError(
            f"idx split {name!r}: the idx source has splits {list(PREFIXES)} (optionally "
            "sliced, e.g. 'train[:90%]')."
        )
    images_path = _find(data_dir, PREFIXES[name], "images-idx3")
    labels_path = _find(data_dir, PREFIXES[name], "labels-idx1")
    images, labels = read_idx(images_path), read_idx(labels_path)
    if images.ndim == 3:
        images = images[..., None]  # [N, H, W, 1]
    if images.ndim != 4 or images.shape[-1] not in (1, 3) or images.dtype != np.uint8:
        raise ValueError(
            f"{images_path}: expected uint8 images [N, H, W] or [N, H, W, 1|3], "
            f"got {images.dtype} {images.shape}."
        )
    if labels.ndim != 1 or len(labels) != len(images):
        raise ValueError(
            f"{labels_path}: expected {len(images)} labels (one per image of {images_path}), "
            f"got shape {labels.shape}."
        )
    images.flags.writeable = False
    return images, labels.astype(np.int64)


def num_classes(data_dir: str) -> int:
    """Number of classes: the largest label of the train split plus one."""
    return int(load_split(data_dir, "train")[1].max()) + 1
