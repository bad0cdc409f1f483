"""Exits that cannot hang (vit_jax/base/exits.py): once a thread has set `exits.leaving`
(outage.give_up) the process ends with its status, even when stdout or stderr is a broken
pipe or closed, and even when the leaver fails on its way out. Each case runs in a
subprocess of its own, given HANG seconds: a hang is a failure, not a wait."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
from helpers import ROOT

HANG = 60.0  # seconds: each process ends in about one; only a hang reaches it

GIVE_UP = """
    from vit_jax import cli
    from vit_jax.base import outage

    def main():  # a store operation on the main thread gave up (outage.Window.failed)
        outage.give_up("the store at gs://b did not answer", together=False)

    cli.run(main, argv=["prog"])
"""

# A thread sets `leaving`, then fails before os._exit (a bug, an error on the way out); the
# main thread's command fails meanwhile, as the distributed runtime shut under it would.
FAILED_LEAVER = """
    import threading
    from vit_jax import cli
    from vit_jax.base import exits

    def leave():
        exits.leaving.set()
        raise RuntimeError("the leaver fails before os._exit")

    def main():
        thread = threading.Thread(target=leave)
        thread.start()
        thread.join()
        raise OSError("the runtime shut under the main thread")

    cli.run(main, argv=["prog"])
"""


def run(script: str, stdout=None, stderr=None, shell_redirect: str = ""):
    """`script` in a fresh Python, with these stdout and stderr (or `shell_redirect` applied
    by a shell); its exit status, or pytest.fail when it hangs."""
    command = [sys.executable, "-c", textwrap.dedent(script)]
    if shell_redirect:
        command = ["sh", "-c", f'exec "$0" "$@" {shell_redirect}', *command]
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT)
    try:
        done = subprocess.run(
            command, stdout=stdout, stderr=stderr, cwd=ROOT, env=env, timeout=HANG
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"the process hung (killed after {HANG:g} s)")
    return done.returncode


def broken_pipe() -> int:
    """The write end of a pipe whose read end is closed: every write fails (EPIPE)."""
    read, write = os.pipe()
    os.close(read)
    return write


def test_give_up_says_its_one_line_and_exits_75():
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(GIVE_UP)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=ROOT),
        timeout=HANG,
    )
    assert done.returncode == 75, done.stderr
    assert done.stderr == "error: the store at gs://b did not answer\n"


@pytest.mark.parametrize("streams", ["stderr", "stdout and stderr"])
def test_give_up_exits_75_when_its_streams_are_broken_pipes(streams):
    """Its `error:` line fails (BrokenPipeError): before, that error reached the command's
    own `fail`, whose last word waited forever for the leaver, itself."""
    pipe = broken_pipe()
    try:
        stdout = pipe if streams == "stdout and stderr" else subprocess.DEVNULL
        assert run(GIVE_UP, stdout=stdout, stderr=pipe) == 75
    finally:
        os.close(pipe)


@pytest.mark.parametrize("redirect", ["2>/dev/full", "2>&-"])
def test_give_up_exits_75_when_stderr_is_full_or_closed(redirect):
    """stderr on a full disk (ENOSPC): before, it waited forever, as with a broken pipe.
    Closed (`2>&-`): whatever file the process opens next takes its descriptor, so each
    write fails or lands somewhere; either way the process ends with 75."""
    assert run(GIVE_UP, stdout=subprocess.DEVNULL, shell_redirect=redirect) == 75


def test_a_leaver_that_fails_still_ends_the_process():
    """The main thread's last word finds the leaver gone without ending the process, and
    ends it with the leaver's status (before: it waited forever)."""
    assert run(FAILED_LEAVER, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) == 75
