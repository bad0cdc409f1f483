"""Stopping on a signal: every process agrees on the step, saves it, and exits with a
status that schedulers requeue.

SIGTERM (what schedulers send before they kill) and Ctrl-C set a flag
(`progress.StopRequest`). At each step boundary the loop asks `Agreement` whether to
stop; the answer is the same on every process, so all of them save the same step
(Orbax saves are collective) even when only one received the signal. With one process
it is the flag itself. With several, every process's signal number rides in each
step's batch and the step takes their maximum; the loop reads that of the step before:
nothing waits for the step in flight, and all processes stop one step after the first
of them saw its signal. The run then saves that step with its integrity record and
raises `Stopped`: the command prints its one line and exits with EXIT_STATUS.
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


def stop_if_asked(loop: Any, state: Any, agree: Agreement | None = None) -> None:
    """Stops the run (`Stopped`) when a signal came outside the steps: during start-up or
    the last step's evaluation; the step reached is saved already, if any. `loop`: the
    training loop's (train.Loop: its mesh, stop request, saver and writer)."""
    agree = agree or Agreement(loop.mesh)
    if name := agree.now(loop.stop.requested):
        stop(loop, int(jax.device_get(state.step)), name, saved=False)


def stop(loop: Any, step: int, signal_name: str, saved: bool) -> None:
    """Waits for the save of `step`, flushes the event file, and raises `Stopped` naming
    the checkpoint (`saved`: the loop saved `step` for this stop)."""
    loop.saver.wait()
    if loop.writer is not None:
        loop.writer.flush()
    checkpoint = f"{loop.saver.directory}/{step}"
    if not saved and step not in loop.saver.steps():
        checkpoint = None
    raise stopped(step, signal_name, checkpoint)


def _status(name: str) -> int:
    return EXIT_STATUS.get(name, EXIT_STATUS["SIGTERM"])


class Agreement:
    """Which signal, if any, every process stops on: the same answer on all of them.

    With one process it is the flag itself (`active` False). With several, each step
    carries every process's signal number in its batch (`into`: one per example of the
    process's share) and the step reduces them with the rest of its work (metric
    'stop'); `lagged` reads the one of the step before, which is done by then, so nothing
    waits for the step in flight and all processes stop one step after the first of them
    saw its signal. (A separate all-reduce per step, in flight beside the train step,
    could be taken up in a different order on different devices: XLA's CPU collectives
    then deadlock.) `now` runs its own all-reduce where no step is in flight.
    `force` makes one process behave as several (to measure it)."""

    def __init__(self, mesh: jax.sharding.Mesh, force: bool = False):
        self.active = force or jax.process_count() > 1
        self._mesh = mesh
        self._previous: Any = None
        self._max = jax.jit(jnp.max, out_shardings=NamedSharding(mesh, P()))

    def into(self, local: dict[str, np.ndarray], requested: str | None) -> dict[str, np.ndarray]:
        """This process's batch share with its signal number as 'stop' [b] (if active)."""
        if not self.active:
            return local
        b = len(next(iter(local.values())))
        return {**local, "stop": np.full((b,), _number(requested), np.int32)}

    def lagged(self, requested: str | None, metrics: dict[str, Any]) -> str | None:
        """At a step boundary, `metrics` those of the step just started: the agreed
        signal of the step before it (this process's own flag with one process)."""
        if not self.active:
            return requested
        previous, self._previous = self._previous, metrics
        return None if previous is None else _name(previous["stop"])

    def now(self, requested: str | None) -> str | None:
        """Where no step is in flight (before the first, after the last): waits for all."""
        if not self.active:
            return requested
        earlier = None if self._previous is None else _name(self._previous["stop"])
        self._previous = None
        if earlier:
            return earlier
        spread = NamedSharding(self._mesh, P(self._mesh.axis_names))  # one flag per device
        local = np.full((len(self._mesh.local_devices),), _number(requested), np.int32)
        flags = jax.make_array_from_process_local_data(spread, local, (self._mesh.size,))
        return _name(self._max(flags))


def _number(requested: str | None) -> int:
    return int(signal.Signals[requested]) if requested else 0


def _name(result: Any) -> str | None:
    number = int(np.asarray(result))
    return signal.Signals(number).name if number else None
