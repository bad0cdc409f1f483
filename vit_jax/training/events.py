"""TensorBoard event files without TensorFlow (tensorboardX's writer).

    tensorboard --logdir=WORKDIR

shows train/loss, train/learning_rate, eval/accuracy, fewshot/... per step. Only the
lead process writes.
"""

from __future__ import annotations

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
        self._writer.close()
