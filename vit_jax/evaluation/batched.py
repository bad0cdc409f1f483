"""One batched apply over an evaluation iterator: the training loop's evaluation, the
`evaluate` command's top-k and few-shot's features all run their model through it.

    with eval_batches(cfg, split, batch_size, image_size, patch_size, mesh) as batches:
        for out, labels in over_batches(fn, params, batches, mesh):  # real examples only
            ...

Each batch's outputs are fetched before the next batch is sent, so one step is in flight
at a time: independent steps with collectives, several in flight at once, can deadlock
XLA's CPU collectives (benchmarks/collectives.py measures it).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import jax
import numpy as np

from vit_jax.parallel import sharding


def over_batches(
    fn: Callable[[Any, dict], Any],
    params: Any,
    batches: Iterable[Mapping[str, Any]],
    mesh: jax.sharding.Mesh | None = None,
) -> Iterator[tuple[Any, np.ndarray]]:
    """`fn(params, batch)` on every batch, with the padding dropped.

    Args:
      fn: (params, {'image' [b, H, W, C], 'label' one-hot [b, K]}) -> a tree of arrays with
        the batch as their leading axis (jitted; e.g. logits, features, per-example loss).
      params: passed through, as they lie.
      batches: {'image', 'label' one-hot [b, K], 'mask' [b] (0: padding)} as
        `vit_jax.data.eval_iterator` yields them; without 'mask' every row counts.
      mesh: each batch is this process's share of a global batch: it is laid out over the
        mesh (`sharding.global_batch`) and the outputs of all processes are gathered back.
        None: one process, each batch used as it is.

    Yields:
      (outputs as NumPy, each leaf [n, ...], labels int64 [n]) of each batch's n real examples.
    """
    for batch in batches:
        images, onehot = batch["image"], batch["label"]
        mask = np.asarray(batch.get("mask", np.ones(len(onehot), np.float32)))
        label = np.argmax(onehot, -1).astype(np.int32)  # gathered: [b], not [b, K]
        if mesh is None:
            out = fn(params, {"image": images, "label": onehot})
        else:
            from jax.experimental import multihost_utils

            local = {"image": images, "label": onehot, "class": label, "mask": mask}
            arrays = sharding.global_batch(local, mesh)
            batch = {"image": arrays["image"], "label": arrays["label"]}
            out = sharding.on_mesh(mesh, fn)(params, batch)  # attention kernels: its shard_map
            out, label, mask = multihost_utils.process_allgather(
                (out, arrays["class"], arrays["mask"]), tiled=True
            )
        keep = np.asarray(mask) > 0
        rows = jax.tree.map(lambda x, k=keep: np.asarray(x)[k], out)
        yield rows, np.asarray(label, np.int64)[keep]


def eval_batches(
    cfg: Any, split: str, batch_size: int, image_size: Any, patch_size: int, mesh: Any = None
) -> Any:
    """`vit_jax.data.eval_iterator` over `split` of the dataset config `cfg` in batches of
    `batch_size`: with a mesh, this process's share of global batches; without, one
    process's. `patch_size`: the model's, NaFlex's patches (cfg.naflex.seq_lens)."""
    from vit_jax import data  # the input pipeline: only needed to read a split

    index, count = (jax.process_index(), jax.process_count()) if mesh is not None else (0, 1)
    return data.eval_iterator(
        cfg,
        split,
        global_batch=batch_size,
        image_size=image_size,
        patch_size=patch_size,
        process_index=index,
        process_count=count,
    )
