"""Why a run stops before its last step, each with one message that says where a rerun
goes on: a signal (SIGTERM, Ctrl-C) that every process agrees on, a non-finite value, a
second Ctrl-C.

SIGTERM (what schedulers send before they kill) and Ctrl-C set a flag (`StopRequest`).
At each step boundary the loop asks `Agreement` whether to stop; the answer is the same
on every process, so all of them save the same step (Orbax saves are collective) even
when only one received the signal. The run then saves that step with its integrity
record and raises `Stopped`: the command prints its one line and exits 128 + the
signal's number (143 for SIGTERM, 130 for Ctrl-C), what schedulers that requeue
preempted jobs expect.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import threading
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from vit_jax.workdir.checkpoints import Checkpoints

SKIPPED_IN_A_ROW = 10  # with skip_nonfinite: more non-finite steps in a row stop the run


class Stopped(KeyboardInterrupt):
    """The run stopped on a signal, its step saved; str() is the line to print."""

    def __init__(self, message: str, exit_status: int):
        super().__init__(message)
        self.exit_status = exit_status


class Interrupted(KeyboardInterrupt):
    """Ctrl-C twice: stopped at once; str() says where (`where_stopped`)."""


def stopped(step: int, signal_name: str, checkpoint: str | None) -> Stopped:
    """'stopped at step 37 by SIGTERM; checkpoint 37 saved (DIR/37); rerun the same
    command to resume' (`checkpoint`: its directory, None when there is none yet)."""
    if checkpoint is None:
        what = "nothing to save yet; rerun the same command to start"
    else:
        what = f"checkpoint {step} saved ({checkpoint}); rerun the same command to resume"
    status = 128 + int(signal.Signals[signal_name])
    return Stopped(f"stopped at step {step} by {signal_name}; {what}", status)


def where_stopped(step: int | None, checkpoints: Checkpoints | None) -> str:
    """'interrupted at step 37. The newest intact checkpoint is step 30 (DIR/30); a rerun
    resumes there' (after the save in flight, if any, ends: it is the newest)."""
    sentence = "There is no intact checkpoint yet; a rerun starts from step 0"
    if checkpoints is not None:
        with contextlib.suppress(BaseException):  # a second Ctrl-C, a failed save
            checkpoints.wait()
        sentence = checkpoints.newest_intact_sentence()
    at = "before the first step" if step is None else f"at step {step}"
    return f"interrupted {at}. {sentence}"


class StopRequest:
    """SIGTERM and Ctrl-C (SIGINT) during a run, as a request the loop honours between
    steps: it finishes the step in flight, saves it and stops.

    Python's own SIGINT handler raises KeyboardInterrupt wherever the main thread is, and
    where that is a callback (JAX's garbage-collection hook runs during compilation)
    Python prints "Exception ignored" and the run goes on; where native threads are still
    compiling, the interpreter's shutdown can crash. SIGTERM's default ends the process
    at once, losing every step since the last checkpoint. So, inside `with StopRequest():`
    (on the main thread), the first signal only sets `requested` (its name, 'SIGTERM' or
    'SIGINT') and says so on stderr. After it, SIGTERM ends the process at once (its
    default: the scheduler's impatience wins; the workdir stays resumable, Orbax's saves
    being atomic) and Ctrl-C raises KeyboardInterrupt at once. The previous handlers are
    restored on exit.
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM)
    NOTICE = b"\nCtrl-C: saving the step in flight, then stopping (Ctrl-C again to stop at once)\n"
    TERM_NOTICE = b"\nSIGTERM: saving the step in flight, then stopping (SIGTERM again: at once)\n"

    def __init__(self) -> None:
        self.requested: str | None = None
        self.step: int | None = None  # the last step dispatched: where a run stopped at once was
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StopRequest:
        if threading.current_thread() is threading.main_thread():
            for s in self.SIGNALS:
                self._previous[s] = signal.signal(s, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for s, previous in self._previous.items():
            signal.signal(s, previous)
        self._previous = {}

    def _handle(self, signum: int, frame: object) -> None:
        if self.requested:
            raise KeyboardInterrupt  # Ctrl-C again (a second SIGTERM no longer comes here)
        self.requested = signal.Signals(signum).name
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        # not print: the main thread may be inside a write
        os.write(2, self.TERM_NOTICE if signum == signal.SIGTERM else self.NOTICE)


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
        b = len(jax.tree.leaves(local)[0])  # every leaf is [b, ...]; NaFlex nests a dict
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
        if earlier := self.lagged(requested, None):  # the step before's, taken
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


@dataclasses.dataclass
class FiniteGuard:
    """Stops the run on non-finite values; checked at every log and save step, before
    the save, so nothing non-finite is ever written over a good checkpoint.

    Without `skip`, a step whose loss, gradient norm or new state is non-finite
    ('finite' metric 0) stops the run. With `skip` (config.skip_nonfinite) such steps
    left the state unchanged inside the jitted step; the run stops only when at least
    SKIPPED_IN_A_ROW steps in a row were skipped (as far as the checks can tell: a
    window between two checks with one good step in it breaks the row). The checkpoint
    it names is the newest with a complete integrity record whose files are all there at
    their sizes (`Checkpoints.newest_intact_sentence`), never a damaged one.
    """

    checkpoints: Checkpoints
    skip: bool
    last_step: int = 0  # the step of the last check, and the skipped count then
    last_skipped: int = 0

    def __post_init__(self):
        self.row_from = self.last_step  # every step after this one was skipped

    def check(self, metrics: dict[str, float], step: int) -> None:
        skipped = int(metrics["skipped"])
        if self.skip:
            if skipped - self.last_skipped < step - self.last_step:
                self.row_from = step  # a good step since the last check
            if step - self.row_from >= SKIPPED_IN_A_ROW:
                self._stop(
                    f"steps {self.row_from + 1} to {step} all had a non-finite loss or "
                    f"gradient and were skipped (loss {metrics['loss']})"
                )
        elif not metrics["finite"]:
            since = "" if step == self.last_step + 1 else f" (it began after step {self.last_step})"
            self._stop(
                f"non-finite loss {metrics['loss']}, gradient norm {metrics['grad_norm']} or "
                f"new state at step {step}{since}; nothing non-finite was saved"
            )
        self.last_step, self.last_skipped = step, skipped

    def _stop(self, what: str) -> None:
        with contextlib.suppress(Exception):  # a failed save is not the checkpoint named
            self.checkpoints.wait()  # a save in flight holds a checked state
        where = self.checkpoints.newest_intact_sentence()  # whole, with its record
        raise FloatingPointError(
            f"{what}. {where}: lower the learning rate, clip gradients "
            "(config.optimizer.grad_clip) or set config.skip_nonfinite=True, and run it again"
        )
