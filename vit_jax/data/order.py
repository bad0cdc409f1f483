"""Which example sits at each position of a process's share: the data order.

Training reads an infinite stream of positions p = step * G + i (G = the global batch,
i < G); process k of n takes slots i in [k * b, (k + 1) * b), b = G / n. Position p is
example ``permutation(epoch = p // N)[p % N]``: a fresh permutation of the whole split
every epoch, drawn from (seed, epoch). So the batch of a step is a pure function of
(seed, step) -- a run resumed at step s reads what an uninterrupted run reads -- and
the union of the processes' shares is the same global batch for any process count.

Evaluation gives each process a contiguous share of the split, in order.
"""

from __future__ import annotations

import functools

import numpy as np

from vit_jax.data import augment


@functools.lru_cache(maxsize=4)
def _permutation(n: int, seed: int, epoch: int) -> np.ndarray:
    return augment.generator(seed, augment.SHUFFLE_SALT, epoch).permutation(n)


def train_share(
    n: int,
    step: int,
    *,
    global_batch: int,
    process_index: int,
    process_count: int,
    seed: int,
    first: int | None = None,
) -> tuple[np.ndarray, slice]:
    """This process's share of a train step whose first example is at position `first`
    (default step * global_batch; NaFlex steps differ in size: naflex.Lengths.offset).

    Returns:
        (table indices int64 [b], the slots of the global batch it holds).
    """
    b = global_batch // process_count
    slots = slice(process_index * b, (process_index + 1) * b)
    start = step * global_batch if first is None else first
    positions = start + np.arange(slots.start, slots.stop, dtype=np.int64)  # [b]
    epochs = positions // n
    index = np.empty(b, np.int64)
    for epoch in np.unique(epochs):  # one epoch, or two where the step straddles a boundary
        mine = epochs == epoch
        index[mine] = _permutation(n, seed, int(epoch))[positions[mine] % n]
    return index, slots
