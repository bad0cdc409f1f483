"""Stopping on a signal: every process agrees on the step, saves it, and exits with a
status that schedulers requeue.

SIGTERM (what schedulers send before they kill) and Ctrl-C set a flag
(`progress.StopRequest`). At each step boundary the loop asks `Agreement` whether to
stop; the answer is the same on every process, so all of them save the same step
(Orbax saves are collective) even when only one received the signal. With one process
it is the flag itself. With several, each step starts an all-reduce (max) of every
process's signal number over the mesh and reads the one started a step earlier: nothing
waits for the step in flight, and all processes stop one step after the first of them
saw its signal. The run then saves that step with its integrity record and raises
`Stopped`: the command prints its one line and exits with EXIT_STATUS.
"""

from __future__ import annotations

import signal
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

# What a shell reports for a process the signal ended (128 + its number): schedulers
# that requeue preempted jobs see the same status as for a job SIGTERM killed.
EXIT_STATUS = {"SIGTERM": 128 + signal.SIGTERM, "SIGINT": 128 + signal.SIGINT}


class Stopped(KeyboardInterrupt):
    """The run stopped on a signal, its step saved; str() is the line to print."""

    def __init__(self, message: str, exit_status: int):
        super().__init__(message)
        self.exit_status = exit_status


def stopped(step: int, signal_name: str, checkpoint: str | None) -> Stopped:
    """'stopped at step 37 by SIGTERM; checkpoint 37 saved; rerun the same command to
    resume' (`checkpoint`: its directory, None when there is none yet)."""
    if checkpoint is None:
        what = "nothing to save yet; rerun the same command to start"
    else:
        what = f"checkpoint {step} saved ({checkpoint}); rerun the same command to resume"
    return Stopped(f"stopped at step {step} by {signal_name}; {what}", _status(signal_name))


def _status(name: str) -> int:
    return EXIT_STATUS.get(name, EXIT_STATUS["SIGTERM"])


class Agreement:
    """`lagged(requested)` at every step boundary, `now(requested)` elsewhere: the name of
    the signal to stop on, the same on every process, or None. `force` runs the
    all-reduce with one process too (to measure it)."""

    def __init__(self, mesh: jax.sharding.Mesh, force: bool = False):
        self.active = force or jax.process_count() > 1
        self._mesh = mesh
        self._pending: Any = None
        spread = NamedSharding(mesh, P(mesh.axis_names))  # one flag per device
        self._sharding = spread
        self._max = jax.jit(jnp.max, out_shardings=NamedSharding(mesh, P()))

    def _start(self, requested: str | None) -> jax.Array:
        number = int(signal.Signals[requested]) if requested else 0
        local = np.full((len(self._mesh.local_devices),), number, np.int32)
        flags = jax.make_array_from_process_local_data(self._sharding, local, (self._mesh.size,))
        return self._max(flags)

    @staticmethod
    def _name(result: Any) -> str | None:
        number = int(np.asarray(result)) if result is not None else 0
        return signal.Signals(number).name if number else None

    def lagged(self, requested: str | None) -> str | None:
        """At a step boundary: this process's request joins the next answer; the answer
        is from the boundary before."""
        if not self.active:
            return requested
        previous, self._pending = self._pending, self._start(requested)
        return self._name(previous)

    def now(self, requested: str | None) -> str | None:
        """Outside the loop (before the first step, after the last): waits for all."""
        if not self.active:
            return requested
        earlier = self._name(self._pending)
        self._pending = None
        return earlier or self._name(self._start(requested))
