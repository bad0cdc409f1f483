"""Multi-host runs on JAX's distributed runtime, and host copies of global arrays.

One process per host (or per accelerator group) runs the same program. Process 0
also hosts the coordinator that the others connect to. `initialize` joins them from
`config.distributed`:

    coordinator_address  'host:port' of process 0 ('' = not set)
    num_processes        number of processes (0 = not set)
    process_id           this process, 0 .. num_processes - 1 (-1 = not set)
    auto                 let JAX detect what is not set (Slurm, Open MPI, Cloud TPU,
                         Kubernetes, or the JAX_COORDINATOR_ADDRESS variable)
    timeout_seconds      how long to wait for every process to join

Nothing set and `auto` off: a single process. After `initialize`, `jax.devices()` is
every process's devices and `jax.local_devices()` this process's; each process feeds
its share of every batch (`vit_jax.data.train_iterator` with process_index /
process_count) and all of them take part in each Orbax save and restore.
On CPU the processes exchange data with Gloo (JAX's default CPU collectives).
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils


def wanted(cfg: Any) -> bool:
    """Whether `cfg` (config.distributed) asks for a multi-process run."""
    return bool(cfg.coordinator_address or cfg.auto or cfg.num_processes > 1)


def initialize(cfg: Any) -> None:
    """Joins this process to the others of the run, as `cfg` (config.distributed) says.

    Call it before anything else uses jax (before any device or array exists). Does
    nothing for a single-process run.

    Raises:
        ValueError: explicit settings that cannot work (a process count without a
            coordinator, a process id outside [0, num_processes)).
        RuntimeError: the processes did not all join within cfg.timeout_seconds.
    """
    if not wanted(cfg):
        return
    if not cfg.auto and not (cfg.coordinator_address and cfg.num_processes and cfg.process_id >= 0):
        raise ValueError(
            "config.distributed: set all of coordinator_address ('host:port' of process 0), "
            "num_processes and process_id, or set auto=True to detect them (Slurm, Open MPI, "
            f"Cloud TPU, Kubernetes); got {dict(cfg)}"
        )
    if cfg.process_id < -1 or (cfg.num_processes and cfg.process_id >= cfg.num_processes):
        raise ValueError(
            f"config.distributed.process_id={cfg.process_id} is not in "
            f"[0, num_processes={cfg.num_processes}): number the processes 0, 1, ..."
        )
    try:
        jax.distributed.initialize(
            coordinator_address=cfg.coordinator_address or None,
            num_processes=cfg.num_processes or None,
            process_id=cfg.process_id if cfg.process_id >= 0 else None,
            initialization_timeout=cfg.timeout_seconds,
        )
    except (ValueError, RuntimeError) as e:
        raise RuntimeError(
            f"joining the run failed with config.distributed={dict(cfg)}: {e}. Start every "
            "process with the same coordinator_address (process 0's host:port, reachable from "
            "the others) and num_processes, and a different process_id"
        ) from e
    print(
        f"process {jax.process_index()} of {jax.process_count()}: "
        f"{jax.local_device_count()} of {jax.device_count()} devices",
        flush=True,
    )


def is_lead() -> bool:
    """Whether this process writes what is written once (logs, summaries, exports)."""
    return jax.process_index() == 0


def to_host(tree: Any) -> Any:
    """Numpy copies of a tree of global arrays, whole on every process.

    Arrays split over several processes (FSDP across hosts) are gathered; every
    process must call this together. Arrays this process holds whole are just copied.
    """
    if all(getattr(x, "is_fully_addressable", True) for x in jax.tree.leaves(tree)):
        return jax.tree.map(np.asarray, jax.device_get(tree))
    return jax.tree.map(np.asarray, multihost_utils.process_allgather(tree, tiled=True))
