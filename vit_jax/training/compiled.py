"""What the compiler says of the train step, compiled: bytes per device, FLOPs, its
step-time estimate, set against the TPU chips' own figures (memory, peak FLOP/s, cores).

The loop prints `compiled_line` after its first step (train.py); the
planner (planner.py) reads the same figures of a step compiled ahead of time for a TPU
topology.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax

from vit_jax.base import console
from vit_jax.models import attention


@dataclasses.dataclass(frozen=True)
class Chip:
    """One JAX device of a TPU generation: its memory, peak bf16 rate, TensorCores."""

    hbm_bytes: int
    peak_flops: float  # bf16 FLOP/s
    cores: int  # TensorCores per device (core-days count these, as the paper's TPUv3-core-days)
    # Whether libtpu's cost model times its steps: on v4 and v5e (libtpu 0.0.42.1) it gives
    # ViT steps negative times, and tiny steps a positive one that is not a time either
    # (fashion_mnist on v5e-4: 0.5 ms, "2% of peak"): none is reported.
    estimates: bool = True


GiB = 2**30
# Google Cloud's published figures per chip, divided per JAX device: a v3 or v4 device is
# one TensorCore (two per chip), a v5p device a megacore chip (two cores), v5e and v6e
# chips one core each.
CHIPS = {
    "TPU v3": Chip(16 * GiB, 123e12 / 2, 1),
    "TPU v4": Chip(16 * GiB, 275e12 / 2, 1, estimates=False),
    "TPU v5": Chip(95 * GiB, 459e12, 2),  # v5p
    "TPU v5 lite": Chip(16 * GiB, 197e12, 1, estimates=False),  # v5e
    "TPU v6 lite": Chip(32 * GiB, 918e12, 1),  # v6e (Trillium)
}


def compiled_figures(compiled: Any) -> tuple[int, int, float, float]:
    """(temporaries, total bytes per device, FLOPs per device, the compiler's step-time
    estimate in seconds, 0 where it gives none) of a compiled step."""
    memory = compiled.memory_analysis()
    cost = compiled.cost_analysis()
    cost = (cost[0] if isinstance(cost, (list, tuple)) else cost) or {}
    total = (
        memory.argument_size_in_bytes
        + memory.output_size_in_bytes
        - memory.alias_size_in_bytes
        + memory.temp_size_in_bytes
        + memory.generated_code_size_in_bytes
    )
    seconds = float(cost.get("optimal_seconds") or 0.0)
    # Measured: libtpu 0.0.42.1's cost model gives ViT-B/16 at 384 px on v4-8 a negative
    # time (-90 s); an estimate that is not a positive number is no estimate.
    seconds = seconds if math.isfinite(seconds) and seconds > 0 else 0.0
    return memory.temp_size_in_bytes, total, float(cost.get("flops", 0.0)), seconds


def loop_of(config: Any) -> str | None:
    """The config field that makes the train step a loop ('model.scan': the blocks;
    'accum_steps': the micro-batches), or None. XLA's cost analysis counts a loop's body
    once, so such a step's FLOPs and time are a fraction of the step's (measured: B/16
    scanned gave 1/11 of the FLOPs and 1/5 of the time; accum_steps=2 halves the FLOPs)."""
    if config.model.get("scan"):
        return "model.scan"
    return "accum_steps" if config.accum_steps > 1 else None


def tokens_of(model: Any, x: Any) -> int:
    """The tokens a row of input `x` makes: images [B, H, W, C] or a NaFlex dict."""
    n = x["patches"].shape[1] if isinstance(x, dict) else math.prod(model.grid(x.shape[1:3]))
    return n + model.num_prefix


def kernel_flops(model: Any, n: int, per_device: float) -> float:
    """A fused attention kernel's FLOPs per device per step at `n` tokens a row, which XLA's
    cost analysis leaves out (a splash forward and backward counts as thousands): 12 B H N² hd
    a block, the two products forward and four backward (not the kernel's recomputation, as
    MFU counts); 0 where `model` computes attention with XLA on the compile target in context."""
    how = attention.choose(model.attention, n, model.dtype, model.attention_dropout)
    return 0.0 if how == "xla" else 12.0 * per_device * n * n * model.width * model.depth


def compiled_line(
    step: Any, state: Any, batch: Any, loop: str | None = None, model: Any = None
) -> str | None:
    """One line of what the compiler says of the loop's own step on this host's devices,
    after its first call (whose executable the lowering finds again: no second compile):
    bytes per device, FLOPs per step (with a fused kernel's: `kernel_flops` of `model`),
    and its step-time estimate where the backend gives one (TPU); `loop` (`loop_of`) or a
    GPU: no FLOPs or time, which the compiler counts a part of. None where the backend reports no
    memory analysis."""
    abstract = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), (state, batch)
    )
    try:
        temp, total, flops, seconds = compiled_figures(step.lower(*abstract).compile())
    except Exception:  # noqa: BLE001 - a backend without the analyses: say nothing
        return None
    kind, b = jax.devices()[0].device_kind, len(batch["label"])
    chip = CHIPS.get(kind, Chip(0, 0.0, 1))
    per_device = b / jax.device_count()
    kernel = kernel_flops(model, tokens_of(model, batch["image"]), per_device) if model else 0.0
    of = f" of {console.size(chip.hbm_bytes)}" if chip.hbm_bytes else ""
    line = f"compiled step: {console.size(total)} per device{of} ({console.size(temp)} temporaries)"
    if loop:
        return line + f"; no FLOPs or step time: XLA counts the {loop} loop's body once"
    if jax.default_backend() == "gpu":  # measured, an H200: 4.7 of B/16's 105.5 GFLOP an image
        return line + "; no FLOPs: XLA:GPU's count leaves out the cuBLAS and cuDNN calls"
    flops += kernel
    amount = f"{flops / 1e12:.3g} TFLOP" if flops >= 1e12 else f"{flops / 1e9:.3g} GFLOP"
    line += f", {amount} per device per step"
    if kernel:
        line += f", {kernel / flops:.0%} of them the attention kernel's (analytic)"
    if seconds and chip.estimates:  # the kernel at peak FLOP/s, as the planner counts it
        seconds += kernel / chip.peak_flops if chip.peak_flops else 0.0
        images = b / seconds
        return line + f"; the compiler predicts {seconds * 1e3:.0f} ms a step ({images:,.0f} img/s)"
    return line + f" (the {jax.default_backend()} backend gives no step-time estimate)"
