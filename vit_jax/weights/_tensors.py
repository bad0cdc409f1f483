"""Shared pieces of the PyTorch-layout formats (timm, Hugging Face).

Conversions are written once over "array-likes" so that the same code turns
parameters into the other layout and computes that layout's shape table from
shapes alone (`Shape`), without allocating a model's worth of zeros.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import numpy as np

from vit_jax.weights.errors import CheckpointError, mismatches


class Shape:
    """A shape that transposes, reshapes and concatenates like an array."""

    def __init__(self, shape: Sequence[int]):
        self.shape = tuple(int(s) for s in shape)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def transpose(self, *axes: int) -> Shape:  # as NumPy's: no axes reverses them
        return Shape(np.empty(self.shape, np.uint8).transpose(*axes).shape)  # no copy of data

    @property
    def T(self) -> Shape:  # noqa: N802 (NumPy's name)
        return self.transpose()

    def reshape(self, *shape: int) -> Shape:  # as NumPy's: reshape(a, b) or reshape((a, b))
        return Shape(np.empty(self.shape, np.uint8).reshape(*shape).shape)  # no copy of data


def torch_names(modules: dict[str, str]) -> dict[str, str]:
    """{original module: torch module} -> {original leaf: torch leaf}: a norm's scale and a
    Dense's or conv's kernel are torch's weight, a bias its bias."""
    out = {}
    for o, t in modules.items():
        out[f"{o}/{'scale' if 'norm' in o.lower() else 'kernel'}"] = f"{t}.weight"
        out[f"{o}/bias"] = f"{t}.bias"
    return out


def leaf_to_torch(name: str, a: Any) -> Any:
    """An attention or MLP tensor at `name` (its original key's tail) -> torch's Linear
    layout: q, k, v kernels [D, H, d] -> [H*d, D], out [H, d, D] -> [D, H*d], q, k, v
    biases [H, d] -> [H*d], Dense kernels transposed, conv kernels [kh, kw, in, out] ->
    [out, in, kh, kw]; the rest (tokens, position embeddings, norms) as they are."""
    if a.ndim == 4:
        return a.transpose(3, 2, 0, 1)
    if name.endswith("out/kernel"):
        return a.reshape(-1, a.shape[-1]).T
    if re.search(r"(query|key|value)/kernel$", name):
        return a.reshape(a.shape[0], -1).T
    if re.search(r"(query|key|value)/bias$", name):
        return a.reshape(-1)
    return a.T if name.endswith("kernel") else a


def leaf_from_torch(name: str, a: np.ndarray, num_heads: int) -> np.ndarray:
    """`leaf_to_torch` undone: torch's tensor for `name` in the original layout."""
    if a.ndim == 4:
        return np.ascontiguousarray(a.transpose(2, 3, 1, 0))
    if name.endswith("out/kernel"):
        return a.T.reshape(num_heads, -1, a.shape[0])
    if re.search(r"(query|key|value)/kernel$", name):
        return a.T.reshape(a.shape[1], num_heads, -1)
    if re.search(r"(query|key|value)/bias$", name):
        return a.reshape(num_heads, -1)
    return a.T if name.endswith("kernel") else a


def concat(parts: Sequence[Any], axis: int = 0) -> Any:
    """np.concatenate for arrays, the concatenated shape for `Shape`s."""
    if isinstance(parts[0], Shape):
        shape = list(parts[0].shape)
        shape[axis] = sum(p.shape[axis] for p in parts)
        return Shape(shape)
    return np.concatenate(parts, axis=axis)


def unfuse(at: str, names: Sequence[str], a: np.ndarray, num_heads: int) -> dict[str, np.ndarray]:
    """`concat` undone: torch's fused rows (timm's q, k, v or k, v) as `names` under `at`."""
    leaf = "kernel" if a.ndim == 2 else "bias"
    parts = zip(names, np.split(a, len(names)), strict=True)
    return {f"{at}/{n}/{leaf}": leaf_from_torch(f"{n}/{leaf}", p, num_heads) for n, p in parts}


def check_table(
    got: dict[str, Any], want: dict[str, Shape], source: str, layout: str, fix: str
) -> None:
    """Every tensor of `want` in `got` with its shape, and nothing else; else an error
    that names each missing, extra and mis-shaped tensor (the first 12)."""
    shown = mismatches(got, want, "expected", f"not in the {layout} layout")
    if shown:
        raise CheckpointError(
            f"{source} is not a complete {layout} checkpoint:\n  " + "\n  ".join(shown) + f"\n{fix}"
        )
