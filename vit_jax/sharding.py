"""The device mesh, and how batches, parameters and optimizer state lie on it.

The mesh has two axes: 'data' and 'fsdp'. Batches are split over both (every device
sees its own examples). Parameters and optimizer state are replicated, unless
`fsdp > 1`: then each large array is split along one of its dimensions over the
'fsdp' axis (the largest dimension that divides evenly), and small ones stay
replicated. XLA inserts the gathers and reduce-scatters that this layout implies.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

BATCH_AXES = ("data", "fsdp")
FSDP_MIN_SIZE = 2**14  # arrays smaller than this stay replicated


def make_mesh(data: int = -1, fsdp: int = 1, devices: list | None = None) -> Mesh:
    """A ('data', 'fsdp') mesh over all devices; -1 for `data` takes what is left."""
    devices = jax.devices() if devices is None else devices
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


def global_batch(local: dict[str, np.ndarray], mesh: Mesh) -> dict[str, jax.Array]:
    """This process's share of a batch -> global arrays split over the mesh's devices."""
    sharding = batch_sharding(mesh)
    return {k: jax.make_array_from_process_local_data(sharding, v) for k, v in local.items()}
