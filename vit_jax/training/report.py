"""What a run reports: its console lines, TensorBoard scalars (without TensorFlow, local or
on a bucket), summary.json and throughput; what the compiler says of its step is
compiled.py's (`compiled_line`, `loop_of`).

    tensorboard --logdir=WORKDIR

shows loss, lr, grad_norm, eval/accuracy, eval/loss, fewshot/... per step. Only the lead
process writes. For a workdir on a store (gs://, s3://) the event file is written in a
local temporary directory and uploaded whole at every flush (every 30 s) and at the end,
so TensorBoard can read it from the bucket while the run goes on.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import socket
import tempfile
import time
from collections.abc import Callable, Mapping
from typing import Any

import jax
import numpy as np

from vit_jax.base import console, files, store
from vit_jax.evaluation import fewshot as fewshot_lib
from vit_jax.models import count_params

UPLOAD_SECONDS = 30


class Throughput:
    """Images/s per device and the ETA, from the steps between two log lines.

    The first step of a run (or a resumed run) compiles, which can outlast hundreds of steps:
    `compiled(step)` restarts the clock once it is done, so neither speed nor ETA counts it;
    `update` gives none until a later step is timed. `clock` (seconds) is for tests.
    """

    def __init__(
        self,
        total_steps: int,
        batch: int | Callable[[int], int],  # NaFlex: step -> its batch
        devices: int,
        start_step: int = 0,
        clock: Callable[[], float] = time.perf_counter,
    ):
        self.total, self.batch, self.devices, self.clock = total_steps, batch, devices, clock
        self.last_step, self.last_time = start_step, clock()

    def pause(self, step: int) -> float:
        """Restarts the clock at `step` after work that is not training (evaluation,
        saving, the first step's compile); the seconds since it last started."""
        now = self.clock()
        took, self.last_step, self.last_time = now - self.last_time, step, now
        return took

    compiled = pause  # the first step (compile included) ended at `step`

    def update(self, step: int) -> dict[str, float]:
        """Speed and ETA over the steps since the last update, pause or compile;
        {} when no step was timed since (the log line right after compiling)."""
        steps = step - self.last_step
        secs = max(self.pause(step), 1e-9)
        if steps <= 0:
            return {}
        b = self.batch
        images = steps * b if isinstance(b, int) else sum(map(b, range(step - steps + 1, step + 1)))
        return {
            "img_per_sec_per_device": images / secs / self.devices,
            "eta_seconds": secs / steps * (self.total - step),
        }


# ---------------------------------------------------------------------- console lines


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
        parts.append(f"ETA {console.duration(metrics['eta_seconds'])}")
    return " | ".join(parts)


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


def finished_lines(workdir: Any, summary: dict[str, Any]) -> str:
    """'WORKDIR: finished at step 20 (summary.json); nothing to do' and its results."""
    step = summary.get("steps")
    lines = [f"{workdir}: finished at step {step} (summary.json); nothing to do"]
    if summary.get("accuracy") is not None:
        lines.append(eval_line(step, summary["accuracy"], summary.get("eval_loss")))
    return "\n".join(lines + fewshot_lines(step, summary))


def say(line: str) -> None:
    """Prints on the lead process only."""
    if jax.process_index() == 0:
        print(line, flush=True)


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


def write_summary(path: Any, summary: dict[str, Any], via: store.Store = store.PLAIN) -> None:
    """Writes a run's summary.json at `path`, whole or not at all (non-finite: null)."""
    clean = {
        k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in summary.items()
    }
    with files.atomic_write(path, "w", via=via) as f:
        json.dump(clean, f, indent=2, sort_keys=True)


# ---------------------------------------------------------------------- TensorBoard


class EventWriter(contextlib.AbstractContextManager):
    """Scalars per step into WORKDIR/events.out.tfevents.*, on the loop's thread (a full disk
    killed tensorboardX's writer thread: a traceback, then a hung loop). A failed write raises,
    naming the directory and `resume()`'s words. Flushed at once, each UPLOAD_SECONDS, at end."""

    def __init__(
        self,
        logdir: str | os.PathLike,
        resume: Callable[[], str] | None = None,
        via: store.Store = store.PLAIN,  # a run's store: its uploads retry through outages
    ):
        from tensorboardX.record_writer import RecordWriter  # noqa: PLC0415 -- TFRecord framing

        self._remote = store.path(logdir) if store.is_remote(logdir) else None
        local = tempfile.mkdtemp(prefix="vit_jax_events_") if self._remote else os.fspath(logdir)
        self._local, self._where, self._resume = local, self._remote or local, resume
        self._via = via
        name = f"{local}/events.out.tfevents.{int(time.time())}.{socket.gethostname()}"
        os.makedirs(local, exist_ok=True)
        self._file = self._guarded(lambda: RecordWriter(name))
        self._flushed = -math.inf
        self._write(file_version="brain.Event:2")

    def write_scalars(self, step: int, scalars: Mapping[str, float]) -> None:
        from tensorboardX.summary import scalar  # noqa: PLC0415

        for name, value in scalars.items():
            self._write(step=int(step), summary=scalar(name, float(np.asarray(value))))
        if time.monotonic() - self._flushed > UPLOAD_SECONDS:
            self.flush()

    def _write(self, **fields: Any) -> None:
        from tensorboardX.proto.event_pb2 import Event  # noqa: PLC0415

        event = Event(wall_time=time.time(), **fields).SerializeToString()
        self._guarded(lambda: self._file.write(event))

    def flush(self) -> None:
        self._flushed = time.monotonic()
        self._guarded(lambda: (self._file.flush(), self._upload()))

    def close(self) -> None:
        """Writes what is pending and closes the file (also when that write fails)."""
        if self._file is None:
            return
        file, self._file = self._file, None
        try:
            self._guarded(lambda: (file.close(), self._upload()))
        finally:  # the staging copy goes whether or not the store took it (the rerun rewrites)
            if self._remote is not None:
                shutil.rmtree(self._local, ignore_errors=True)

    def _guarded(self, write: Callable[[], Any]) -> Any:
        try:
            return write()
        except OSError as error:
            then = f" {self._resume()}" if self._resume else ""
            why = f"{self._where}: {store.explain(error, self._where)}.{then}"
            raise OSError(f"could not write TensorBoard events in {why}") from error

    def _upload(self) -> None:
        if self._remote is None:
            return
        for name in os.listdir(self._local):
            with open(os.path.join(self._local, name), "rb") as source:
                with files.atomic_write(self._remote / name, via=self._via) as f:
                    shutil.copyfileobj(source, f)

    def __exit__(self, kind: object, *exc: object) -> None:
        self._resume = self._resume if kind is None else None  # no waits for a suppressed error
        with contextlib.suppress(*(() if kind is None else (Exception,))):  # the run's error wins
            self.close()  # (a full disk fails the event file too: the run's error names it)


def naflex_line(lengths: Any, padded: list[int], num_prefix: int) -> str:
    """The NaFlex run's lengths, each with its batch and what attention pads it to;
    `num_prefix`: the tokens before the patches (the model's class token and registers)."""
    cls = {0: "", 1: " + class token"}.get(num_prefix, f" + {num_prefix} prefix tokens")
    cells = []
    for n, p in zip(lengths.seq_lens, padded, strict=True):
        pad = f" (padded to {p} tokens)" if p > n + num_prefix else ""
        cells.append(f"{lengths.batch(n)} images of {n} patches{cls}{pad}")
    each = f"each of the {len(cells)} lengths" if len(cells) > 1 else "its length"
    return (
        f"NaFlex, {lengths.tokens_per_batch:,} patches a step: {', '.join(cells)}; the step "
        f"compiles once for {each}"
    )


def architecture_of(source: str, model: Any) -> str:
    """'the architecture of SOURCE: width 384, depth 12, 6 heads, patch 14, registers 4,
    LayerScale': the model of an empty config.model.name, init_from's."""
    m = model
    shown = [f"width {m.width}", f"depth {m.depth}", f"{m.num_heads} heads"]
    shown += [f"patch {m.patch_size}"] + ([f"registers {m.registers}"] if m.registers else [])
    marks = (("LayerScale", m.layer_scale), ("SwiGLU", m.swiglu), (f"RoPE {m.rope}", m.rope))
    return f"the architecture of {source}: {', '.join(shown + [n for n, on in marks if on])}"


def starting(name: str, params: Any, frozen: Any, steps: int) -> str:
    """The run's line before its first step: the model, its parameters (those that
    train, with LoRA's frozen base) and the steps ahead."""
    total = count_params(params) + (count_params(frozen) if frozen else 0)
    trained = f", {count_params(params):,} trained" if frozen else ""
    return (
        f"training {name} ({total:,} parameters{trained}) for {steps} steps; compiling "
        "the first step..."
    )
