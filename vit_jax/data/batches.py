"""Batches made ahead of their consumer, by Grain, and stopped when closed.

`make(i)` (assemble.py's TrainBatch or EvalBatch) is a pure function of the batch
number i; Grain runs it on threads or in worker processes. Closing a `Batches` leaves no
thread of it running, so a run that closes every iterator it opens leaves none behind.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterator

import grain
import numpy as np

from vit_jax.data import naflex

Batch = dict[str, np.ndarray]


class Batches(Iterator[Batch]):
    """`make(i)` for each i of `indices`, prepared ahead of the consumer by Grain
    (`MapDataset.range(...).map(make).to_iter_dataset(ReadOptions)`): on `threads` threads,
    or with `workers` > 0 in Grain's worker processes (`mp_prefetch`), each on one thread.
    `close()` (or the end of a `with` block) stops the work and, Grain's own close not
    waiting for them, waits for the batches in flight: no thread of the pipeline outlives it.
    """

    lengths: naflex.Lengths | None = None  # a NaFlex run's: each step's length and batch

    def __init__(self, make: Callable[[int], Batch], indices: range, threads: int, workers: int):
        self._busy, self._ran, self._done = 0, set(), threading.Condition()
        ds = grain.MapDataset.range(indices.start, indices.stop)
        if workers > 0:
            from absl import flags  # noqa: PLC0415

            if not flags.FLAGS.is_parsed():  # Grain reads its absl flags (defaults will do)
                flags.FLAGS.mark_as_parsed()
            ds = ds.map(make).to_iter_dataset(
                grain.ReadOptions(num_threads=1, prefetch_buffer_size=2)
            )
            self._it = iter(ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=workers)))
        else:
            options = grain.ReadOptions(num_threads=threads, prefetch_buffer_size=2 * threads)
            self._it = iter(ds.map(functools.partial(self._counted, make)).to_iter_dataset(options))

    def _counted(self, make: Callable[[int], Batch], i: int) -> Batch:
        with self._done:
            self._busy += 1
            self._ran.add(threading.current_thread())
        try:
            return make(i)
        finally:
            with self._done:
                self._busy -= 1
                self._done.notify_all()

    def __next__(self) -> Batch:
        if self._it is None:
            raise StopIteration
        try:
            return next(self._it)  # an error in make() is raised here
        except StopIteration:
            self.close()  # the last batch taken: nothing is left running
            raise

    def close(self) -> None:
        """Cancels the batches not started, waits for the running ones; idempotent."""
        if self._it is not None:
            self._it.close()  # cancels; stops and joins Grain's worker processes
            self._it = None
        with self._done:
            self._done.wait_for(lambda: self._busy == 0)
        for thread in self._ran - {threading.current_thread()}:
            thread.join()  # each ends once idle: Grain has shut its pool down
        self._ran.clear()

    def __enter__(self) -> Batches:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
