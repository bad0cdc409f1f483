"""When to log, evaluate and save; throughput; the run's console lines and TensorBoard
scalars; summary.json.

Why not clu.periodic_actions (ReportProgress, PeriodicCallback): importing it imports
TensorFlow, and the loop needs one decision per step for all four actions in a fixed
order (the non-finite guard before a save); ReportProgress reports through absl logging
rather than the console line below. Cadence is that one tested decision.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

from vit_jax.base import files
from vit_jax.base.console import duration
from vit_jax.evaluation import fewshot as fewshot_lib


@dataclasses.dataclass(frozen=True)
class Cadence:
    """Decides, for the number of completed steps, whether to log, evaluate, run the
    few-shot evaluation or save.

    Each happens every `*_every` steps (0: never on a cadence) and always after the
    last step; logging also after the first step (the end of the first compile).
    """

    total_steps: int
    log_every: int
    eval_every: int
    save_every: int
    fewshot_every: int = 0

    def due(self, what: str, step: int) -> bool:
        every = {
            "log": self.log_every,
            "eval": self.eval_every,
            "save": self.save_every,
            "fewshot": self.fewshot_every,
        }[what]
        if step == self.total_steps or (what == "log" and step == 1):
            return True
        return every > 0 and step % every == 0

    def after(self, step: int, stopping: str | None = None, fewshot: bool = True) -> Due:
        """What follows `step`. A stop (`stopping`, the agreed signal) saves the step now
        and leaves its evaluations to the rerun; `fewshot` False: no few-shot evaluator."""
        log, ev, save = (self.due(what, step) for what in ("log", "eval", "save"))
        few = fewshot and self.due("fewshot", step) and not stopping
        return Due(log, ev and not stopping, few, save or bool(stopping), stopping)


@dataclasses.dataclass(frozen=True)
class Due:
    """What the loop does after one step, in this order: check and log the metrics,
    evaluate, few-shot, save; then stop, where `stopping` names the signal."""

    log: bool
    eval: bool
    fewshot: bool
    save: bool
    stopping: str | None = None


class StopRequest:
    """SIGTERM and Ctrl-C (SIGINT) during a run, as a request the loop honours between
    steps: it finishes the step in flight, saves it and stops (`training/preemption.py`).

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


class Throughput:
    """Images/s per device and the ETA, from the steps between two log lines.

    The first step of a run (or of a resumed run) compiles the train step, which can
    take longer than hundreds of steps: `compiled(step)` restarts the clock once it is
    done, so neither the speed nor the ETA counts it. Until a step after that has been
    timed, `update` returns no speed and no ETA. `clock` (seconds) is for tests.
    """

    def __init__(
        self,
        total_steps: int,
        batch: int,
        devices: int,
        start_step: int = 0,
        clock: Callable[[], float] = time.perf_counter,
    ):
        self.total, self.batch, self.devices, self.clock = total_steps, batch, devices, clock
        self.last_step, self.last_time = start_step, clock()

    def compiled(self, step: int) -> float:
        """The first step (compilation included) ended at `step`: restart the clock;
        returns the seconds that step took."""
        now = self.clock()
        took = now - self.last_time
        self.last_step, self.last_time = step, now
        return took

    def pause(self, step: int) -> None:
        """Restart the clock after work that is not training (evaluation, saving)."""
        self.last_step, self.last_time = step, self.clock()

    def update(self, step: int) -> dict[str, float]:
        """Speed and ETA over the steps since the last update, pause or compile;
        {} when no step was timed since (the log line right after compiling)."""
        now = self.clock()
        steps, secs = step - self.last_step, max(now - self.last_time, 1e-9)
        self.last_step, self.last_time = step, now
        if steps <= 0:
            return {}
        return {
            "img_per_sec_per_device": steps * self.batch / secs / self.devices,
            "eta_seconds": secs / steps * (self.total - step),
        }


def console_line(step: int, total: int, metrics: dict[str, float]) -> str:
    """'step 100/1000 | loss 1.234 | lr 1.0e-03 | grad_norm 0.52 | 812 img/s/device | ETA 3m20s'."""
    parts = [f"step {step}/{total}"]
    for key, fmt in (
        ("loss", "loss {:.4f}"),
        ("lr", "lr {:.2e}"),
        ("grad_norm", "grad_norm {:.3f}"),
        ("img_per_sec_per_device", "{:.0f} img/s/device"),
    ):
        if key in metrics:
            parts.append(fmt.format(metrics[key]))
    if metrics.get("skipped"):
        parts.append(f"skipped {metrics['skipped']:.0f} non-finite")
    if "eta_seconds" in metrics:
        parts.append(f"ETA {duration(metrics['eta_seconds'])}")
    return " | ".join(parts)


def finished_lines(workdir: Any, summary: dict[str, Any]) -> str:
    """'WORKDIR: finished at step 20 (summary.json); nothing to do' and its results."""
    step = summary.get("steps")
    lines = [f"{workdir}: finished at step {step} (summary.json); nothing to do"]
    if summary.get("accuracy") is not None:
        lines.append(eval_line(step, summary["accuracy"], summary.get("eval_loss")))
    return "\n".join(lines + fewshot_lines(step, summary))


def eval_line(step: int, accuracy: float, loss: float | None) -> str:
    """'step 400: test accuracy 0.7758, loss 0.5990' (the loss left out where unknown)."""
    loss_part = f", loss {loss:.4f}" if isinstance(loss, float) else ""
    return f"step {step}: test accuracy {accuracy:.4f}{loss_part}"


def fewshot_lines(step: int, evals: dict) -> list[str]:
    """'step 400: few-shot fashion_mnist 1/5/10/25-shot 41.2/63.0/70.1/76.5%', a dataset
    a line, from the few-shot entries of `evals` (or of a stored summary)."""
    lines = []
    for name, row in fewshot_lib.by_dataset(evals).items():
        shots, accs = "/".join(map(str, row)), "/".join(f"{100 * a:.1f}" for a in row.values())
        lines.append(f"step {step}: few-shot {name} {shots}-shot {accs}%")
    return lines


def write(writer: Any, step: int, total: int, metrics: dict, evals: dict | None = None) -> None:
    """The console line and TensorBoard scalars of a log step, or of an evaluation."""
    if writer is None:
        return
    if evals is None:
        print(console_line(step, total, metrics), flush=True)
        writer.write_scalars(step, {k: v for k, v in metrics.items() if k != "eta_seconds"})
    else:
        accuracy, loss = evals["accuracy"], evals["loss"]
        print(eval_line(step, accuracy, loss), flush=True)
        writer.write_scalars(step, {"eval/accuracy": accuracy, "eval/loss": loss})


def write_fewshot(writer: Any, step: int, evals: dict) -> None:
    """The few-shot lines (`fewshot_lines`) and their TensorBoard scalars."""
    if writer is None:
        return
    for line in fewshot_lines(step, evals):
        print(line, flush=True)
    writer.write_scalars(step, {k: v for k, v in evals.items() if k.startswith(fewshot_lib.PREFIX)})


def write_summary(path: Any, summary: dict[str, Any]) -> None:
    """Write a run's summary.json at `path`, whole or not at all (non-finite numbers as
    null)."""
    clean = {
        k: (None if isinstance(v, float) and not math.isfinite(v) else v)
        for k, v in summary.items()
    }
    with files.atomic_write(path, "w") as f:
        json.dump(clean, f, indent=2, sort_keys=True)
