"""TensorBoard event files without TensorFlow (tensorboardX's writer), in a local or
object-store workdir.

    tensorboard --logdir=WORKDIR

shows loss, lr, grad_norm, eval/accuracy, eval/loss, fewshot/... per step. Only the
lead process writes. For a workdir on a store (gs://, s3://) the file is written in a
local temporary directory and uploaded whole at every flush (every 30 s) and at the end,
through the package's one path layer, so TensorBoard can read it from the bucket while
the run goes on.
"""

from __future__ import annotations

import os
import shutil
import struct
import tempfile
import time
from collections.abc import Mapping

import numpy as np

from vit_jax.base import files, store

UPLOAD_SECONDS = 30


class EventWriter:
    """Scalars per step into WORKDIR/events.out.tfevents.*."""

    def __init__(self, logdir: str | os.PathLike):
        from tensorboardX import SummaryWriter  # noqa: PLC0415 -- imports protobuf

        self._remote = store.path(logdir) if store.is_remote(logdir) else None
        local = tempfile.mkdtemp(prefix="vit_jax_events_") if self._remote else os.fspath(logdir)
        self._local = local
        self._writer = SummaryWriter(local, flush_secs=UPLOAD_SECONDS)
        self._uploaded = time.monotonic()

    def write_scalars(self, step: int, scalars: Mapping[str, float]) -> None:
        for name, value in scalars.items():
            self._writer.add_scalar(name, float(np.asarray(value)), global_step=int(step))
        if self._remote is not None and time.monotonic() - self._uploaded > UPLOAD_SECONDS:
            self.flush()

    def flush(self) -> None:
        self._writer.flush()
        self._upload()

    def close(self) -> None:
        """Writes what is pending and ends the writer's thread."""
        if self._writer is None:
            return
        self._writer.close()
        self._writer = None
        self._upload()
        if self._remote is not None:
            shutil.rmtree(self._local, ignore_errors=True)

    def _upload(self) -> None:
        if self._remote is None:
            return
        self._uploaded = time.monotonic()
        for name in os.listdir(self._local):
            with open(os.path.join(self._local, name), "rb") as source:
                with files.atomic_write(self._remote / name) as f:
                    shutil.copyfileobj(source, f)

    def __enter__(self) -> EventWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_scalars(logdir: str | os.PathLike) -> dict[str, list[tuple[int, float]]]:
    """{tag: [(step, value), ...]} in step order, from the event files in `logdir`.

    Event files are TFRecord-framed `Event` protos: per record a little-endian uint64
    length, its CRC, the bytes, their CRC (not checked here).
    """
    from tensorboardX.proto import event_pb2  # noqa: PLC0415

    out: dict[str, list[tuple[int, float]]] = {}
    logdir = store.path(logdir)
    for path in sorted(logdir.glob("events.out.tfevents.*")):
        data, at = path.read_bytes(), 0
        while at + 12 <= len(data):
            (length,) = struct.unpack("<Q", data[at : at + 8])
            event = event_pb2.Event.FromString(data[at + 12 : at + 12 + length])
            at += 12 + length + 4
            for v in event.summary.value:
                out.setdefault(v.tag, []).append((int(event.step), float(v.simple_value)))
    return {tag: sorted(rows) for tag, rows in out.items()}
