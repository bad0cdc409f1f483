"""Training runs in subprocesses (`python -m vit_jax.main`) for the resume and
multi-host tests: each with its own emulated CPU devices, read line by line, and always
killed when the test is done with it.

A test waits on events, never on time: an output line (`wait_for`) or a state of the
files (`wait_until`). Their deadline, HANG by default, only ends a run that hangs: a
machine under load (a 2-core CI runner beside other jobs) takes longer, never fails."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time

from helpers import ROOT

HANG = 900.0  # seconds: far beyond any run here on a loaded machine; only a hang reaches it


def tiny_flags(workdir: str, **overrides) -> list[str]:
    """Command-line flags of configs/fashion_mnist.py:tiny with `overrides`."""
    flags = ["--config=fashion_mnist:tiny", f"--workdir={workdir}"]
    return flags + [f"--config.{k}={v}" for k, v in overrides.items()]


def env_path() -> str:
    """The PYTHONPATH of this process."""
    return os.environ.get("PYTHONPATH", "")


class Run:
    """One `python -m vit_jax.main` process with `devices` emulated CPU devices."""

    def __init__(
        self, flags: list[str], devices: int, env: dict[str, str] | None = None, cwd: str = ROOT
    ):
        """`cwd`: where it runs (the repository's root; elsewhere, this checkout's
        vit_jax is found through PYTHONPATH)."""
        full_env = dict(
            os.environ,
            XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}",
            JAX_PLATFORMS="cpu",
            PYTHONUNBUFFERED="1",
            TF_CPP_MIN_LOG_LEVEL="2",
            **(env or {}),
        )
        if cwd != ROOT:
            full_env["PYTHONPATH"] = os.pathsep.join(filter(None, [ROOT, env_path()]))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "vit_jax.main", *flags],
            cwd=cwd,
            env=full_env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,  # its own process group: killed as a whole
        )
        self.log: list[str] = []
        self._lines: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self._lines.put(line.rstrip("\n"))
        self._lines.put(None)  # end of output

    def wait_for(self, predicate, timeout: float = HANG) -> str:
        """The first new output line for which `predicate` holds."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self._lines.get(timeout=max(deadline - time.monotonic(), 0.01))
            except queue.Empty:
                raise TimeoutError(f"no matching line in {timeout}s:\n" + self.tail()) from None
            if line is None:
                raise RuntimeError("the run ended without a matching line:\n" + self.tail())
            self.log.append(line)
            if predicate(line):
                return line

    def wait_until(self, condition, timeout: float = HANG, every: float = 0.001) -> None:
        """Polls `condition()` (the files a run writes) every `every` seconds until it
        holds, while the process runs; its output keeps being read meanwhile."""
        deadline = time.monotonic() + timeout
        while not condition():
            if self.proc.poll() is not None:
                self._drain()
                raise RuntimeError("the run ended before the condition held:\n" + self.tail())
            if time.monotonic() > deadline:
                self._drain()
                raise TimeoutError(f"the condition did not hold in {timeout}s:\n" + self.tail())
            time.sleep(every)

    def _drain(self) -> None:
        """Moves the lines read so far into `log` (for `tail`), without waiting."""
        while True:
            try:
                line = self._lines.get_nowait()
            except queue.Empty:
                return
            if line is None:
                self._lines.put(None)  # the end stays marked for a later wait_for
                return
            self.log.append(line)

    def finish(self, timeout: float = HANG) -> int:
        """Reads the output to the end; the exit status."""
        try:
            self.wait_for(lambda line: False, timeout)
        except RuntimeError:
            pass
        return self.proc.wait(timeout=30)

    def kill(self) -> None:
        """SIGKILL to the process group (no clean-up runs), then reap it."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)

    def tail(self, n: int = 40) -> str:
        return "\n".join(self.log[-n:])

    def __enter__(self) -> Run:
        return self

    def __exit__(self, *exc) -> None:
        self.kill()
