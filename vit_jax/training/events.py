"""TensorBoard event files without TensorFlow (tensorboardX's writer).

    tensorboard --logdir=WORKDIR

shows train/loss, train/learning_rate, eval/accuracy, fewshot/... per step. Only the
lead process writes.
"""

from __future__ import annotations

import glob
import os
import struct
from collections.abc import Mapping

import numpy as np


class EventWriter:
    """Scalars per step into WORKDIR/events.out.tfevents.*."""

    def __init__(self, logdir: str):
        from tensorboardX import SummaryWriter  # noqa: PLC0415 -- imports protobuf

        self._writer = SummaryWriter(logdir, flush_secs=30)

    def write_scalars(self, step: int, scalars: Mapping[str, float]) -> None:
        for name, value in scalars.items():
            self._writer.add_scalar(name, float(np.asarray(value)), global_step=int(step))

    def flush(self) -> None:
        self._writer.flush()

    def close(self) -> None:
        """Writes what is pending and ends the writer's thread."""
        self._writer.close()

    def __enter__(self) -> EventWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_scalars(logdir: str) -> dict[str, list[tuple[int, float]]]:
    """{tag: [(step, value), ...]} in step order, from the event files in `logdir`.

    Event files are TFRecord-framed `Event` protos: per record a little-endian uint64
    length, its CRC, the bytes, their CRC (not checked here).
    """
    from tensorboardX.proto import event_pb2  # noqa: PLC0415

    out: dict[str, list[tuple[int, float]]] = {}
    for path in sorted(glob.glob(os.path.join(logdir, "events.out.tfevents.*"))):
        with open(path, "rb") as f:
            while len(header := f.read(12)) == 12:
                (length,) = struct.unpack("<Q", header[:8])
                event = event_pb2.Event.FromString(f.read(length))
                f.read(4)
                for v in event.summary.value:
                    out.setdefault(v.tag, []).append((int(event.step), float(v.simple_value)))
    return {tag: sorted(rows) for tag, rows in out.items()}
