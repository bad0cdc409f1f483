"""Low-rank adaptation (Hu et al., 2021): `W + (alpha / r) A B` on chosen projections.

A target's adapter is two parameters beside its Dense, in the same module:
`query_lora_a` [D, r] and `query_lora_b` [r, H, D/H] next to `query` (for `out`,
[H, D/H, r] and [r, D]; for the MLP's `Dense_0`, [D, r] and [r, F]). A is random and B
zero, so an adapted model starts as its base exactly. The published parameter names stay
as they are: `merge` folds the adapters into the kernels and drops them; `split` parts a
tree into what trains (adapters and head) and what stays frozen, `overlay` joins them.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from flax import traverse_util

# config.lora.targets -> the Dense modules they adapt ('mlp': the MLP's, SwiGLU's gate too)
TARGETS = {t: (t,) for t in ("query", "key", "value", "out")} | {
    "mlp": ("Dense_0", "gate", "Dense_1")
}
MARK = "_lora_"  # in every adapter's parameter name


@dataclasses.dataclass(frozen=True)
class Lora:
    """A LoRA setting: `rank` r, `alpha` (the update is scaled by alpha / r) and the
    Dense modules adapted (names of TARGETS' values)."""

    rank: int
    alpha: float
    modules: tuple[str, ...]

    @classmethod
    def of(cls, cfg: Any) -> Lora | None:
        """config.lora -> a Lora, or None for rank 0 (off)."""
        if not cfg or not cfg.rank:
            return None
        names = [t.strip() for t in cfg.targets.split(",") if t.strip()]
        modules = tuple(m for t in names for m in TARGETS[t])
        return cls(int(cfg.rank), float(cfg.alpha or cfg.rank), modules)

    @property
    def scale(self) -> float:
        return self.alpha / self.rank


def adapted(module: nn.Module, name: str, dense: nn.Module, x: jax.Array, in_axes: int = 1):
    """`dense(x)`, plus the low-rank update where `module.opts.lora` adapts `name`:
    y + s (x A) B, with x's last `in_axes` axes contracted."""
    y = dense(x)
    lora, o = module.opts.lora, module.opts
    if lora is None or name not in lora.modules:
        return y
    fan_in, out_shape = math.prod(x.shape[-in_axes:]), y.shape[x.ndim - in_axes :]
    init_a = nn.initializers.normal(1 / math.sqrt(fan_in))
    a = module.param(f"{name}{MARK}a", init_a, (*x.shape[-in_axes:], lora.rank), o.param_dtype)
    b = module.param(
        f"{name}{MARK}b", nn.initializers.zeros, (lora.rank, *out_shape), o.param_dtype
    )
    h = jnp.tensordot(x, a.astype(o.dtype), in_axes)  # [B, N, r]
    return y + (lora.scale * jnp.tensordot(h, b.astype(o.dtype), 1)).astype(y.dtype)


def trains(path: tuple[str, ...]) -> bool:
    """Whether a parameter trains under LoRA: the adapters and the head."""
    return path[0] == "head" or MARK in path[-1]


def split(params: dict) -> tuple[dict, dict]:
    """(what trains, what stays frozen): two trees that `overlay` puts back together."""
    flat = traverse_util.flatten_dict(params)
    parts = ({k: v for k, v in flat.items() if trains(k) == t} for t in (True, False))
    return tuple(traverse_util.unflatten_dict(part) for part in parts)


def overlay(*trees: Any) -> Any:
    """The trees' leaves in one tree, a later tree's where two have one (None: no tree)."""
    trees = tuple(t for t in trees if t is not None)
    if len(trees) == 1:
        return trees[0]
    flat = [traverse_util.flatten_dict(t).items() for t in trees]
    return traverse_util.unflatten_dict({k: v for items in flat for k, v in items})


def merge(params: dict, lora: Lora | None) -> dict:
    """The published layout: each adapter folded into its kernel, W + s A B, and dropped.
    Stacked (scanned) blocks carry a leading depth axis on the kernel and both factors."""
    if lora is None:
        return params
    out = {
        k: merge(v, lora) if isinstance(v, dict) else v for k, v in params.items() if MARK not in k
    }
    for name in [k.removesuffix(f"{MARK}a") for k in params if k.endswith(f"{MARK}a")]:
        a, b, w = params[f"{name}{MARK}a"], params[f"{name}{MARK}b"], out[name]["kernel"]
        product = lambda a, b: jnp.tensordot(a, b, 1)
        if a.ndim + b.ndim - 2 > w.ndim:  # [L, ...]: one product per block
            product = jax.vmap(product)
        delta = lora.scale * product(a.astype(jnp.float32), b.astype(jnp.float32))
        out[name] = {**out[name], "kernel": (w + delta).astype(w.dtype)}
    return out
