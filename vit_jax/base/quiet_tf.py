"""TensorFlow, imported without the lines its C++ start-up writes to stderr.

Importing TensorFlow prints, before any logging is set up and whatever
TF_CPP_MIN_LOG_LEVEL says, absl's "All log messages before absl::InitializeLog() is called
are written to STDERR", the oneDNN note and the CPU-instructions note. A SavedModel
export would start with them (the only switch, TF_ENABLE_ONEDNN_OPTS=0, changes the
numerics). `tensorflow()` imports it
with file descriptor 2 captured and writes every other line back; `quiet_stderr()` does
the same around later TensorFlow work that loads more of its libraries.

The library imports TensorFlow through here, and only for the SavedModel export and
gs:// reads (training, evaluation and the input pipeline never need it); a module that
then says `import tensorflow` gets the module already loaded.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
from collections.abc import Iterator
from types import ModuleType

NOISE = re.compile(
    r"All log messages before absl::InitializeLog\(\) is called are written to STDERR"
    r"|oneDNN custom operations are on"
    r"|This TensorFlow binary is optimized to use available CPU instructions"
    r"|To enable the following instructions: .* rebuild TensorFlow"
)


@contextlib.contextmanager
def quiet_stderr(noise: re.Pattern = NOISE) -> Iterator[None]:
    """Runs the block with file descriptor 2 captured, then writes back every line that
    `noise` does not match (by default TensorFlow's start-up notes). For imports, for
    TensorFlow work that loads more of its libraries (each prints the notes again:
    SavedModel export), and for native libraries' start-up lines (libtpu's: planner.py)."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            text = captured.read().decode(errors="replace")
            sys.stderr.write("".join(
                line for line in text.splitlines(keepends=True) if not noise.search(line)
            ))  # fmt: skip


def tensorflow() -> ModuleType:
    """`import tensorflow`, minus its start-up notes on stderr. Raises ImportError as
    the import does (the message of a missing TensorFlow names the extra to install)."""
    if "tensorflow" in sys.modules:
        return sys.modules["tensorflow"]
    try:
        with quiet_stderr():
            import tensorflow as tf
    except ImportError as e:
        if e.name is not None and e.name.split(".")[0] == "tensorflow":
            raise ImportError(
                "TensorFlow is needed here (the SavedModel export): pip install 'vit_jax[tf]'"
            ) from e
        raise
    return tf
