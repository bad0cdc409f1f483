"""When to log, evaluate and save; readable console lines; progress bars; summary.json.

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
import sys
import time
from collections.abc import Iterable, Iterator
from typing import Any, TypeVar

from vit_jax import files

T = TypeVar("T")


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


def duration(seconds: float) -> str:
    """3725 -> '1h02m05s'."""
    s = int(round(seconds))
    h, m, s = s // 3600, s % 3600 // 60, s % 60
    return f"{h}h{m:02d}m{s:02d}s" if h else f"{m}m{s:02d}s" if m else f"{s}s"


class Throughput:
    """Images/s per device and the ETA, from the steps between two log lines."""

    def __init__(self, total_steps: int, batch: int, devices: int, start_step: int = 0):
        self.total, self.batch, self.devices = total_steps, batch, devices
        self.last_step, self.last_time = start_step, time.perf_counter()

    def pause(self, step: int) -> None:
        """Restart the clock after work that is not training (evaluation, saving)."""
        self.last_step, self.last_time = step, time.perf_counter()

    def update(self, step: int) -> dict[str, float]:
        now = time.perf_counter()
        steps, secs = step - self.last_step, max(now - self.last_time, 1e-9)
        self.last_step, self.last_time = step, now
        per_step = secs / max(steps, 1)
        return {
            "img_per_sec_per_device": steps * self.batch / secs / self.devices,
            "eta_seconds": per_step * (self.total - step),
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


def bar(items: Iterable[T], total: int | None, desc: str, enabled: bool = True) -> Iterator[T]:
    """A progress bar on stderr for long loops (evaluation passes)."""
    start, width = time.perf_counter(), 30
    for i, item in enumerate(items, 1):
        yield item
        if enabled and total:
            done = min(i / total, 1.0)
            fill = "#" * int(width * done)
            sys.stderr.write(
                f"\r{desc} [{fill:<{width}}] {i}/{total} {duration(time.perf_counter() - start)}"
            )
            sys.stderr.flush()
    if enabled and total:
        sys.stderr.write("\n")


def write_summary(workdir: str, summary: dict[str, Any]) -> str:
    """Write `summary.json` (atomically) and return its path."""
    path = os.path.join(workdir, "summary.json")
    clean = {
        k: (None if isinstance(v, float) and not math.isfinite(v) else v)
        for k, v in summary.items()
    }
    with files.atomic_write(path, "w") as f:
        json.dump(clean, f, indent=2, sort_keys=True)
    return path
