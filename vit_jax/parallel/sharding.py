"""The device mesh, and how batches, parameters and optimizer state lie on it.

The mesh has two axes: 'data' and 'fsdp'. Batches are split over both (every device
sees its own examples). Parameters and optimizer state are replicated, unless
`fsdp > 1`: then each large array is split along one of its dimensions over the
'fsdp' axis (the largest dimension that divides evenly), and small ones stay
replicated. XLA inserts the gathers and reduce-scatters that this layout implies.
With fsdp = all devices, each holds about 1/fsdp of the parameters and of Adam's
moments (benchmarks/memory.py: ViT-H/14's 7.1 GiB of state -> 0.89 GiB per device on 8).
Several processes (vit_jax/parallel/distributed.py) share one mesh; each feeds the batch rows
of its own devices, and arrays may span processes.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

BATCH_AXES = ("data", "fsdp")
FSDP_MIN_SIZE = 2**14  # arrays smaller than this stay replicated


def make_mesh(data: int = -1, fsdp: int = 1, devices: list | None = None) -> Mesh:
    """A ('data', 'fsdp') mesh over all devices; -1 for `data` takes what is left.

    Devices are ordered process by process, so that each process's devices hold one
    contiguous block of the batch: the block its input pipeline reads
    (`global_batch`). The 'fsdp' axis may span processes.
    """
    devices = jax.devices() if devices is None else devices
    devices = sorted(devices, key=lambda d: (d.process_index, d.id))
    n = len(devices)
    if data == -1:
        if n % fsdp:
            raise ValueError(f"fsdp={fsdp} does not divide the {n} devices")
        data = n // fsdp
    if data * fsdp != n:
        raise ValueError(
            f"mesh data={data} x fsdp={fsdp} needs {data * fsdp} devices, "
            f"there are {n}: set config.mesh.data=-1 to use them all"
        )
    return Mesh(np.asarray(devices).reshape(data, fsdp), BATCH_AXES)


def on_mesh(mesh: Mesh, fn: Any) -> Any:
    """`fn`, traced with `mesh` in context: the fused attention kernels run in a shard_map
    over it, and compile for its devices (models/attention.py)."""

    def traced(*args: Any, **kwargs: Any) -> Any:
        with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
            return fn(*args, **kwargs)

    return traced


def batch_sharding(mesh: Mesh) -> NamedSharding:
    """Leading (batch) axis split over all devices."""
    return NamedSharding(mesh, P(BATCH_AXES))


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, P())


def spec_for(shape: tuple[int, ...], fsdp: int) -> P:
    """Split the largest evenly divisible dimension over 'fsdp'; replicate small arrays."""
    if fsdp == 1 or int(np.prod(shape)) < FSDP_MIN_SIZE:
        return P()
    for dim in sorted(range(len(shape)), key=lambda d: -shape[d]):
        if shape[dim] % fsdp == 0:
            return P(*[("fsdp" if d == dim else None) for d in range(len(shape))])
    return P()


def tree_shardings(mesh: Mesh, tree: Any) -> Any:
    """NamedShardings for a tree of arrays or ShapeDtypeStructs (state, params)."""
    fsdp = mesh.shape["fsdp"]
    return jax.tree.map(lambda x: NamedSharding(mesh, spec_for(tuple(x.shape), fsdp)), tree)


def put(tree: Any, shardings: Any) -> Any:
    """Host arrays (the same on every process) -> global arrays laid out by `shardings`.

    Each process copies only the slices its own devices hold, so this also works when
    the arrays span several processes (where `jax.device_put` of a host array does not).
    """

    def one(x, s):
        x = np.asarray(x)
        return jax.make_array_from_callback(x.shape, s, lambda index: x[index])

    return jax.tree.map(one, tree, shardings)


def bytes_per_device(tree: Any, shardings: Any) -> int:
    """Bytes one device holds of a tree of arrays or ShapeDtypeStructs laid out by
    `shardings` (the most loaded device; all are equal for even splits)."""

    one = lambda x, s: math.prod(s.shard_shape(tuple(x.shape))) * np.dtype(x.dtype).itemsize
    return sum(jax.tree.leaves(jax.tree.map(one, tree, shardings)))


def global_batch(local: dict[str, Any], mesh: Mesh) -> dict[str, jax.Array]:
    """This process's share of a batch (NumPy; a NaFlex 'image' is a dict) -> global arrays
    split over the mesh."""
    sharding = batch_sharding(mesh)
    return jax.tree.map(lambda v: jax.make_array_from_process_local_data(sharding, v), local)
