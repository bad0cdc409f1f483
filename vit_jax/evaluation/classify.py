"""Top-1 and top-5 accuracy of a classifier checkpoint on a dataset split.

The images go through `vit_jax.data.eval_iterator`, the preprocessing of the training
loop's own evaluation (resize to the model's resolution, values in [-1, 1]), so a
checkpoint trained here scores exactly what its training run reported. A head whose
class order differs from the dataset's (e.g. an ImageNet-21k head on a subset) takes a
`label_map`: entry i is the head class of the dataset's class i. A head trained on a
class subset (the config's `dataset.classes`, e.g. the recipe's classes 5-9) is evaluated
on the same subset, relabelled 0..K-1 in the listed order as training does: pass
`{'classes': (5, 6, 7, 8, 9)}` in `dataset`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from vit_jax import data
from vit_jax.base import console
from vit_jax.data import config as data_config
from vit_jax.evaluation.batched import eval_batches, over_batches
from vit_jax.models import predict
from vit_jax.models.vit import VisionTransformer

TOP_K = (1, 5)


def counts(
    model: VisionTransformer,
    params: Any,
    batches: Iterable[Mapping[str, np.ndarray]],
    label_map: Sequence[int] | None = None,
    ks: Sequence[int] = TOP_K,
) -> dict[str, int]:
    """{'examples': n, 'top1': hits, 'top5': hits} over every real example of `batches`
    ({'image', 'label' one-hot [b, K_data], 'mask' [b]} as eval_iterator yields them)."""
    apply = predict.logits_fn(model)
    lut = None if label_map is None else np.asarray(label_map, np.int64)
    out = {"examples": 0, **{f"top{k}": 0 for k in ks}}
    for logits, label in over_batches(lambda p, b: apply(p, b["image"]), params, batches):
        # logits [b, K_head] and labels [b] of the real examples
        if lut is not None:
            if label.size and label.max() >= len(lut):
                raise ValueError(
                    f"the label map has {len(lut)} entries, the dataset has class "
                    f"{label.max()}: give one head class per dataset class"
                )
            label = lut[label]
        order = np.argsort(-logits, axis=-1, kind="stable")  # ties: lower index first
        for k in ks:
            out[f"top{k}"] += int(np.sum(order[:, :k] == label[:, None]))
        out["examples"] += len(label)
    return out


def evaluate(
    model: VisionTransformer,
    params: Any,
    dataset: Mapping[str, Any],
    split: str,
    image_size: int | tuple[int, int],
    batch_size: int = 64,
    label_map: Sequence[int] | None = None,
    progress: bool = True,
    head_labels: Sequence[str] | None = None,
) -> dict[str, Any]:
    """Top-1/top-5 accuracy of `model` on `split` of `dataset` (fields of
    `vit_jax.data.default_config()`, e.g. {'source': 'tfds', 'name': 'cifar10'}; with
    {'naflex': {'seq_lens': (N,)}} each image at its own aspect ratio, in N patches).

    Only `split` is read (an image folder needs no train/ directory). `dataset['classes']`
    keeps those classes, relabelled 0..K-1 in their order (as training does). With
    `head_labels` (the class names the checkpoint holds) and a dataset that names its
    classes, the classes are matched by name where no label map is given: the dataset's
    classes the head knows are kept, each scored against the head class of its name.

    Returns:
      {'dataset', 'split', 'classes', 'examples', 'top1', 'top5', 'matched_by_name'}
      with accuracies in [0, 1]; 'classes' is the subset's list or None; top-k only for
      k below the head's classes (top-5 of 5 classes is always 100%).

    Raises:
      ValueError: a head narrower than the dataset's classes without a label map (the
        message names the flag to pass), or a label map that names classes the head
        lacks.
    """
    cfg = data.default_config()
    cfg.update(dict(dataset))
    cfg.train_split = split  # nothing else is read: an image folder needs only this split
    k_head = model.num_classes or 0
    label_map, matched = head_classes(cfg, k_head, label_map, head_labels)
    n = data.num_examples(cfg, split)
    batches = eval_batches(cfg, split, batch_size, image_size, model.patch_size)
    ks = [k for k in TOP_K if k == 1 or k < k_head]
    with batches:
        bar = console.bar(batches, -(-n // batch_size), f"evaluate {cfg.name} {split}", progress)
        got = counts(model, params, bar, label_map, ks)
    m = max(got["examples"], 1)
    return {
        "dataset": cfg.name,
        "split": split,
        "classes": None if cfg.classes is None else list(cfg.classes),
        "matched_by_name": matched,
        "examples": got["examples"],
        **{f"top{k}": got[f"top{k}"] / m for k in ks},
    }


def head_classes(
    cfg: Any, k_head: int, label_map: Sequence[int] | None, head_labels: Sequence[str] | None
) -> tuple[Sequence[int] | None, bool]:
    """(label map, matched by name): which head class scores each class of the dataset
    config `cfg`. Without a label map, `head_labels` match the classes by name
    (`match_by_name`), which sets `cfg.classes` to the dataset classes the head knows.

    Raises:
      ValueError: a label map outside the head's `k_head` classes, or a head narrower than
        the dataset and no label map (`NarrowHead`).
    """
    matched = False
    if label_map is None and head_labels is not None:
        found = match_by_name(data.class_names(cfg), cfg.classes, list(head_labels))
        if found is not None:
            matched = found != (cfg.classes, None)  # not the dataset as it is
            cfg.classes, label_map = found
    k_data = data.num_classes(cfg)
    if label_map is not None and (min(label_map) < 0 or max(label_map) >= k_head):
        raise ValueError(f"the label map names head classes outside 0..{k_head - 1}")
    if label_map is None and k_data > k_head:
        raise NarrowHead(cfg, k_data, k_head)
    return label_map, matched


def match_by_name(
    names: Sequence[str] | None, classes: Sequence[int] | None, head: Sequence[str]
) -> tuple[tuple[int, ...] | None, list[int] | None] | None:
    """(dataset classes to keep, label map or None for the identity) that score each
    dataset class the head knows against the head class of the same name; None when
    names do not say (the dataset names none, or none of them is the head's).

    `names`: the dataset's class names after `classes` (its subset, or None for all).
    """
    if names is None:
        return None
    ids = list(classes) if classes is not None else list(range(len(names)))
    known = [(i, n) for i, n in zip(ids, names, strict=True) if n in head]
    if not known or (classes is not None and len(known) < len(ids)):
        return None
    kept = tuple(i for i, _ in known)
    label_map = [list(head).index(n) for _, n in known]
    if classes is None and kept == tuple(range(len(names))):
        kept = None  # every class of the dataset: no subset
    return kept, None if label_map == list(range(len(head))) else label_map


class NarrowHead(ValueError):
    """A dataset with more classes than the head: which classes (or which label map) to
    pass. Its message names the arguments; `advice(classes, labels)` says it in another
    vocabulary (the evaluate command's flags)."""

    def __init__(self, cfg: Any, k_data: int, k_head: int):
        self.name, self.classes, self.k_data, self.k_head = cfg.name, cfg.classes, k_data, k_head
        first, second = data_config.FASHION_MNIST_HALVES  # the recipe's two heads
        recipe = cfg.name == "fashion_mnist" and cfg.classes is None and k_head == len(first)
        self.recipe = (first, second) if recipe else None
        super().__init__(self.advice(lambda ids: f"dataset classes={ids}", "label_map"))

    def advice(self, classes: Any, labels: str) -> str:
        """The message, with `classes(ids)` naming how the classes are passed and `labels`
        how a label map is."""
        subset = "" if self.classes is None else f" ({classes(tuple(self.classes))})"
        recipe = ""
        if self.recipe:
            first, second = self.recipe
            recipe = (
                f"; the recipe's pretrain/final.npz: {classes(first)}, its "
                f"finetune/ and scratch/ final.npz: {classes(second)}"
            )
        return (
            f"{self.name}{subset} has {self.k_data} classes, the checkpoint's head "
            f"{self.k_head}: pass {classes('ID,...')} with the {self.k_head} dataset class ids "
            f"the head was trained on, in its order (the training config's dataset.classes"
            f"{recipe}), or {labels} with the head class of each dataset class"
        )
