"""Plan a run before renting the machine: the run's own train step, compiled ahead of time
for a TPU topology on any host (libtpu compiles for TPUs without one), and what the
compiler reports of it: bytes per device, FLOPs, its own step-time estimate.

    p = plan(config, "v3-8")   # -> Plan; p.fits, p.step_seconds, p.core_days, ...
    p = plan(config, "v5e-8", seq_len=576)   # a NaFlex batch of 576 patches a row

The step is the training loop's (`step.jit_steps` with the config's model, optimizer,
loss, mesh and remat), lowered with abstract arrays (abstract.py: nothing allocated). The
estimate is XLA's `optimal_seconds`: a lower bound from its cost model, not a promise.
Compiling for TPUs needs the `libtpu` package (`pip install "jax[tpu]"`, the package's
`[plan]` extra, or the copy `setup.sh` puts in ~/.cache/vit_jax/, which is found there);
installed in the environment of a host without TPUs, libtpu prints warnings at every
`import jax` that uses the default platforms, so keep it out of an environment that also
trains on CPU/GPU.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import re
import sys
import time
from typing import Any

import ml_collections

from vit_jax.base import console
from vit_jax.parallel import sharding
from vit_jax.training import state as state_lib
from vit_jax.training.abstract import argument_bytes, loop_step, sequence
from vit_jax.training.compiled import CHIPS, Chip, compiled_figures, loop_of

# Cloud accelerator names (vN-COUNT: TensorCores for v3/v4/v5p, chips for v5e/v6e) -> the
# chip grid libtpu takes; 'v5e:4x4'-style names pass through.
TOPOLOGIES = {
    "v3-8": "v3:2x2", "v3-32": "v3:4x4", "v3-128": "v3:8x8", "v3-512": "v3:16x16",
    "v4-8": "v4:2x2x1", "v4-16": "v4:2x2x2", "v4-32": "v4:2x2x4", "v4-64": "v4:2x4x4",
    "v4-128": "v4:4x4x4",
    "v5p-8": "v5p:2x2x1", "v5p-16": "v5p:2x2x2", "v5p-32": "v5p:2x2x4", "v5p-64": "v5p:2x4x4",
    "v5e-1": "v5e:1x1", "v5e-4": "v5e:2x2", "v5e-8": "v5e:2x4", "v5e-16": "v5e:4x4",
    "v5e-64": "v5e:8x8", "v5e-256": "v5e:16x16",
    "v6e-1": "v6e:1x1", "v6e-4": "v6e:2x2", "v6e-8": "v6e:2x4", "v6e-16": "v6e:4x4",
    "v6e-64": "v6e:8x8", "v6e-256": "v6e:16x16",
}  # fmt: skip
_GRID = re.compile(r"^v(3|4|5p|5e|6e):\d+x\d+(x\d+)?$")
# Classes of the presets' datasets (the planner needs no data on disk).
NUM_CLASSES = {
    "imagenet21k": 21843, "imagenet2012": 1000, "cifar10": 10, "cifar100": 100,
    "oxford_iiit_pet": 37, "oxford_flowers102": 102, "fashion_mnist": 10,
}  # fmt: skip
# libtpu's start-up writes warnings about the TPU host it is not on (accelerator type,
# worker hostnames, a source trace) to fd 2: silenced while it starts or compiles.
INSTALL = (
    'pip install "jax[tpu]" (libtpu, the version this JAX pins; it compiles for TPUs on any '
    "host), or this package's [plan] extra, or run ./setup.sh, whose copy in "
    "VIT_JAX_LIBTPU_DIR (default ~/.cache/vit_jax/libtpu-pyX.Y) is found"
)


@dataclasses.dataclass(frozen=True)
class Plan:
    """What one compile of a run's train step says, per device unless named otherwise."""

    topology: str
    device_kind: str
    devices: int
    batch_size: int  # global
    mesh: dict[str, int]
    remat: bool
    param_bytes: int
    optimizer_bytes: int
    batch_bytes: int
    temp_bytes: int  # the compiler's temporaries (activations kept for the backward pass)
    total_bytes: int  # arguments + outputs not aliased to them + temporaries + code
    hbm_bytes: int
    flops: float  # per device per step
    step_seconds: float  # the compiler's estimate (optimal_seconds)
    total_steps: int
    cores_per_device: int
    compiled: bool = True  # False: the compiler refused it, out of memory (no FLOPs, no time)
    compile_seconds: float = 0.0  # this host's time to lower and compile the step
    loop: str = ""  # the field whose loop XLA counts once (loop_of): no FLOPs, no time
    kernel_flops: float = 0.0  # of `flops`: a fused attention kernel's, analytic (kernel_flops)
    seq_len: int = 0  # NaFlex: patches a row (0: images of config.image_size)
    tokens: int = 0  # the blocks' sequence, a class token included
    kernel_tokens: int = 0  # after the attention kernel's padding (splash: a multiple of 128)

    @property
    def fits(self) -> bool:
        return self.compiled and self.total_bytes <= self.hbm_bytes

    @property
    def images_per_second(self) -> float:
        return self.batch_size / self.step_seconds if self.step_seconds > 0 else 0.0

    @property
    def utilisation(self) -> float:
        """FLOPs over peak FLOP/s in the estimated time: the MFU the estimate implies."""
        peak = CHIPS[self.device_kind].peak_flops if self.device_kind in CHIPS else 0.0
        return self.flops / (self.step_seconds * peak) if peak and self.step_seconds else 0.0

    @property
    def core_days(self) -> float:
        """TPU-core-days of config.total_steps at the estimated step time."""
        return self.total_steps * self.step_seconds * self.devices * self.cores_per_device / 86400

    def to_json(self) -> dict[str, Any]:
        derived = ("fits", "images_per_second", "utilisation", "core_days")
        return {**dataclasses.asdict(self), **{k: getattr(self, k) for k in derived}}


def topology_devices(topology: str) -> list[Any]:
    """The devices of a TPU topology ('v3-8', 'v5e:2x2', ...), compiled for on this host.

    Raises:
      ValueError: an unknown topology (the message lists the known names).
      ImportError: no libtpu (the message says how to install it).
    """
    grid = TOPOLOGIES.get(topology, topology)
    if not _GRID.match(grid):
        raise ValueError(
            f"unknown TPU topology {topology!r}: use one of {', '.join(TOPOLOGIES)}, or a chip "
            "grid such as v5e:4x4, v4:2x2x2, v5p:2x2x1"
        )
    library = os.environ.get("TPU_LIBRARY_PATH", "")
    if not os.path.isfile(library) and importlib.util.find_spec("libtpu") is None:
        if not os.path.isfile(setup_sh := _libtpu_of_setup()):
            raise ImportError(f"compiling for TPUs needs libtpu: {INSTALL}")
        os.environ["TPU_LIBRARY_PATH"] = setup_sh
    from jax.experimental import topologies

    # No TPU is used: other processes (another plan, a test worker) may load libtpu too,
    # where it would otherwise take a machine-wide lock (/tmp/libtpu_lockfile).
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    with console.silenced_stderr():
        try:
            desc = topologies.get_topology_desc(grid, "tpu", **_host_bounds(grid))
        except Exception as e:  # noqa: BLE001 - jaxlib's error types vary by version
            first = str(e).splitlines()[0]
            raise ValueError(f"TPU topology {topology!r} ({grid}): {first}") from None
    return list(desc.devices)


def _host_bounds(grid: str) -> dict[str, tuple[int, ...]]:
    """A grid smaller than a host's default 2x2 chips (v5e:1x1, one chip) is a host of its
    own: libtpu refuses it otherwise ("not divisible by ... chips_per_host_bounds")."""
    sides = [int(n) for n in grid.split(":")[1].split("x")]
    if len(sides) != 2 or min(sides) >= 2:
        return {}
    return {"chips_per_host_bounds": (min(sides[0], 2), min(sides[1], 2), 1)}


def _libtpu_of_setup() -> str:
    """Where setup.sh installs libtpu for this Python, out of the environment (the tests'
    and the planner's; VIT_JAX_LIBTPU_DIR as setup.sh reads it)."""
    py = f"libtpu-py{sys.version_info[0]}.{sys.version_info[1]}"
    home = os.path.join(os.path.expanduser("~"), ".cache", "vit_jax", py)
    return os.path.join(os.environ.get("VIT_JAX_LIBTPU_DIR", home), "libtpu", "libtpu.so")


def num_classes_of(config: ml_collections.ConfigDict) -> int:
    """The head's width without reading data: dataset.classes, else the dataset's known count."""
    if config.dataset.get("classes"):
        return len(config.dataset.classes)
    name = config.dataset.get("name") or ""
    if config.dataset.get("source", "idx") == "idx" and not name:
        name = "fashion_mnist"
    if name not in NUM_CLASSES:
        raise ValueError(
            f"the planner does not know how many classes {name!r} has: pass num_classes=K"
        )
    return NUM_CLASSES[name]


def plan(
    config: ml_collections.ConfigDict,
    topology: str,
    num_classes: int | None = None,
    seq_len: int | None = None,
) -> Plan:
    """Compiles `config`'s train step for `topology` and reads the compiler's figures; with
    `seq_len`, for NaFlex batches of that many patches a row."""
    return plan_on(config, topology_devices(topology), topology, num_classes, seq_len)


def plan_on(
    config: ml_collections.ConfigDict,
    devices: list[Any],
    name: str,
    num_classes: int | None = None,
    seq_len: int | None = None,
) -> Plan:
    """`plan` for a list of devices (a topology's, or this host's own)."""
    classes = num_classes or num_classes_of(config)
    mesh = sharding.make_mesh(config.mesh.data, config.mesh.fsdp, devices)
    step, state, batch = loop_step(config, mesh, classes, seq_len)
    model = state_lib.planned_model(config, classes)
    tokens, padded, how = sequence(model, mesh, config.image_size, seq_len)
    held = argument_bytes(state, batch)
    kind = devices[0].device_kind
    chip = CHIPS.get(kind, Chip(0, 0.0, getattr(devices[0], "num_cores", 1) or 1))
    known = dict(
        topology=name,
        device_kind=kind,
        devices=len(devices),
        batch_size=config.batch_size,
        mesh=dict(mesh.shape),
        remat=bool(config.model.remat),
        **held,
        total_steps=config.total_steps,
        cores_per_device=chip.cores,
        loop=loop_of(config) or "",
        seq_len=seq_len or 0,
        tokens=tokens,
        kernel_tokens=padded,
    )
    began, hbm, kernel = time.perf_counter(), chip.hbm_bytes, 0.0
    try:
        with console.silenced_stderr():
            compiled = step.lower(state, batch).compile()
    except Exception as e:  # noqa: BLE001 - XLA's out-of-memory refusal, as jaxlib raises it
        out = out_of_memory(str(e))
        if out is None:
            raise
        compiled, (temp, hbm) = None, out  # no FLOPs, no time
        total, flops, seconds = sum(held.values()) + temp, 0.0, 0.0
    else:
        temp, total, flops, seconds = compiled_figures(compiled)
        seconds = seconds if chip.estimates else 0.0
        if known["loop"]:
            flops, seconds = 0.0, 0.0
        elif how != "xla":  # compiled.kernel_flops' count, at the sequence's tokens
            kernel = 12.0 * config.batch_size / len(devices) * tokens**2 * model.width * model.depth
            seconds += kernel / chip.peak_flops if seconds and chip.peak_flops else 0.0
    return Plan(
        **known,
        temp_bytes=temp,
        total_bytes=total,
        hbm_bytes=hbm,
        flops=flops + kernel,
        step_seconds=seconds,
        compiled=compiled is not None,
        compile_seconds=time.perf_counter() - began,
        kernel_flops=kernel,
    )


_OOM = re.compile(
    r"RESOURCE_EXHAUSTED.*?temporaries \(([\d.]+)([KMGT])\).*?available HBM \(([\d.]+)([KMGT])\)",
    re.S,
)


def out_of_memory(message: str) -> tuple[int, int] | None:
    """(temporaries, usable HBM) in bytes from XLA's refusal of a step that does not fit
    ('... HLO temporaries (20.55G) exceeds available HBM (15.48G)'); None for other errors."""
    m = _OOM.search(message)
    if not m:
        return None
    unit = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
    return int(float(m[1]) * unit[m[2]]), int(float(m[3]) * unit[m[4]])


def fit(
    config: ml_collections.ConfigDict,
    devices: list[Any],
    name: str,
    num_classes: int | None = None,
    max_compiles: int = 8,
) -> tuple[Plan | None, Plan | None, int]:
    """The largest global batch (a multiple of the devices x accum_steps) whose step fits:
    doubling from config.batch_size until one does not fit (or halving until one does),
    then bisecting. Returns (largest that fits, smallest seen that does not, compiles)."""
    unit, seen = len(devices) * config.accum_steps, []
    good = bad = None
    batch = max(unit, config.batch_size // unit * unit)
    while batch and len(seen) < max_compiles:
        c = ml_collections.ConfigDict(config.to_dict())
        c.batch_size = batch
        seen.append(p := plan_on(c, devices, name, num_classes))
        good, bad = (p, bad) if p.fits else (good, p)
        if good and bad:  # bisect between them, to one unit apart
            mid = (good.batch_size + bad.batch_size) // 2 // unit * unit
            batch = mid if bad.batch_size - good.batch_size > unit else 0
        elif good:
            batch = good.batch_size * 2
        else:
            batch = max(unit, bad.batch_size // 2 // unit * unit) if bad.batch_size > unit else 0
    return good, bad, len(seen)
