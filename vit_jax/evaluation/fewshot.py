"""Linear few-shot evaluation of a frozen ViT: features in, accuracy per shot out.

The representation is the model's pre-logits output (after pooling and the optional
tanh representation layer; `apply_with_intermediates(...)[1]['pre_logits']`). Fitting
and prediction are in `vit_jax.evaluation.linear`.

Per dataset, `FewShotEvaluator` reads
  * a pool of max(shots) training examples per class: the training split's
    `examples_per_class` subset drawn with `subset_seed = seed` (so only K * max(shots)
    images go through the model, not the whole split), from which `choose_shots`
    draws k per class with the same seed, and
  * the whole test split (`test_split`, e.g. 'test[:2000]' to make it cheaper).
With `knn_k`, DINO's k-NN classifier (`vit_jax.evaluation.knn`) runs on the same shots
too ('fewshot/{name}_knn_{k}shot'), its k capped at each pool of K * shots examples.
Accuracies are deterministic for a given seed, dataset config and number of processes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import jax
import numpy as np

from vit_jax.evaluation.batched import eval_batches, over_batches
from vit_jax.evaluation.knn import DEFAULT_K, knn_accuracy
from vit_jax.evaluation.linear import choose_shots, fewshot_accuracy
from vit_jax.models import predict
from vit_jax.models.vit import VisionTransformer

DEFAULT_SHOTS = (1, 5, 10, 25)
DEFAULT_L2 = 1024.0
PREFIX = "fewshot/"


def metric_name(dataset: str, shots: int) -> str:
    """The name of one few-shot accuracy: 'fewshot/fashion_mnist_5shot'."""
    return f"{PREFIX}{dataset}_{shots}shot"


def by_dataset(metrics: Mapping[str, float]) -> dict[str, dict[int, float]]:
    """{dataset: {k: accuracy}} from the few-shot entries of a flat metrics dict (the
    inverse of `metric_name`; other entries are ignored), shots in increasing order."""
    out: dict[str, dict[int, float]] = {}
    for key in metrics:
        if key.startswith(PREFIX) and key.endswith("shot"):
            name, shots = key[len(PREFIX) : -len("shot")].rsplit("_", 1)
            out.setdefault(name, {})[int(shots)] = metrics[key]
    return {name: dict(sorted(row.items())) for name, row in out.items()}


def dataset_configs(
    names: Sequence[str],
    source: str | None = None,
    data_dir: str | None = None,
    train_split: str = "train",
    test_split: str = "test",
    preprocessing: str = "tf_bilinear",
    skip_corrupt: bool = False,
) -> list[dict]:
    """Dataset configs (fields of vit_jax.data.default_config()) for the named datasets.

    Without `source`, 'fashion_mnist' reads idx files and any other name a TFDS builder.
    `preprocessing`: the resize (`vit_jax.data.pixels.METHODS`), the checkpoint's;
    `skip_corrupt`: image folders' files that do not decode left out (dataset.skip_corrupt).
    """
    common = {"train_split": train_split, "test_split": test_split, "preprocessing": preprocessing}
    common |= {"skip_corrupt": True} if skip_corrupt else {}
    extra = {"data_dir": data_dir} if data_dir else {}
    default = lambda name: "idx" if name == "fashion_mnist" else "tfds"
    return [{"name": n, **common, "source": source or default(n), **extra} for n in names]


def section_configs(f: Any, preprocessing: str = "tf_bilinear") -> list[dict]:
    """`dataset_configs` of a run config's `fewshot` section, whose `datasets` names them
    (comma-separated)."""
    names = [n.strip() for n in f.datasets.split(",") if n.strip()]
    return dataset_configs(
        names, f.source or None, f.data_dir or None, f.train_split, f.test_split, preprocessing
    )


def evaluator_of(config: Any) -> FewShotEvaluator | None:
    """The FewShotEvaluator of a run config's `fewshot` section (its probe sees what
    training sees: the run's preprocessing), or None where it names no dataset."""
    f = config.fewshot
    datasets = section_configs(f, config.dataset.preprocessing)
    if not datasets:
        return None
    flex = config.dataset.get("naflex")  # the run's NaFlex lengths: probe at the longest
    seq_len = max(flex.seq_lens) if flex and flex.seq_lens else None
    return FewShotEvaluator(
        datasets, f.shots, f.l2, f.seed, config.image_size, f.batch_size, seq_len
    )


def extract_features(
    model: VisionTransformer,
    params: Any,
    batches: Iterable[Mapping[str, np.ndarray]],
    mesh: jax.sharding.Mesh | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Pre-logits features and integer labels of every real example of `batches`.

    Args:
      model: the (frozen) model; its head is not used.
      params: its parameters (any sharding).
      batches: dicts {'image': [b, H, W, C] or NaFlex, 'label': one-hot [b, K], 'mask': [b]}
        as `vit_jax.data.eval_iterator` yields them; examples with mask 0 (padding)
        are dropped. Without a 'mask' every example counts.
      mesh: if given, each batch is this process's share of a global batch, and the
        features of all processes are gathered back (`batched.over_batches`). None:
        single-process, batches used as they are.

    Returns:
      (features [n, D] float32, labels [n] int64), in batch order.
    """
    features = predict.features_fn(model)
    parts = list(over_batches(lambda p, b: features(p, b["image"]), params, batches, mesh))
    if not parts:
        raise ValueError("no batches to extract features from: is the split empty?")
    features, labels = zip(*parts, strict=True)
    return np.concatenate(features).astype(np.float32), np.concatenate(labels)


class FewShotEvaluator:
    """Linear few-shot accuracy on one or more datasets, for a training loop to call.

    Example:
      evaluator = FewShotEvaluator([{"source": "idx", "name": "fashion_mnist"}],
                                   image_size=224)
      evaluator.run(model, params)  # {'fewshot/fashion_mnist_1shot': 0.41, ...}
    """

    def __init__(
        self,
        datasets: Sequence[Mapping[str, Any]],
        shots: Sequence[int] = DEFAULT_SHOTS,
        l2: float = DEFAULT_L2,
        seed: int = 0,
        image_size: int | tuple[int, int] = 224,
        batch_size: int = 256,
        seq_len: int | None = None,
        knn_k: int = 0,
    ):
        """Checks the dataset configs; nothing is read until `run`.

        Args:
          datasets: dataset configs, each a dict of fields of
            `vit_jax.data.default_config()` (source, name, data_dir, train_split,
            test_split, classes, ...) overriding its defaults. `name` names the
            metrics, so it must differ between datasets.
          shots: examples per class, e.g. (1, 5, 10, 25).
          l2: L2 strength of the least-squares fit (`vit_jax.evaluation.linear.fit`).
          seed: which training examples are drawn.
          image_size: resolution the images are resized to (the model's).
          batch_size: images per forward pass (global; a multiple of the device count
            when `run` is given a mesh).
          seq_len: NaFlex patches a row, each image at its own aspect ratio (the datasets'
            naflex.seq_lens); None: square images of `image_size`.
          knn_k: neighbours of the k-NN classifier on the same shots (0: none).
        """
        from vit_jax import data  # the input pipeline: only needed by the evaluator

        if not datasets:
            raise ValueError("FewShotEvaluator needs at least one dataset config")
        shots = tuple(int(k) for k in shots)
        if not shots or min(shots) < 1:
            raise ValueError(f"shots={shots}: expected positive numbers of examples per class")
        self.configs = []
        for i, fields in enumerate(datasets):
            cfg = data.default_config()
            unknown = sorted(set(fields) - set(cfg.keys()))
            if unknown:
                raise ValueError(
                    f"few-shot dataset {i}: unknown field(s) {unknown}; the fields are "
                    f"{sorted(cfg.keys())} (vit_jax.data.default_config())"
                )
            cfg.update(dict(fields))
            if seq_len:
                cfg.naflex.seq_lens = (seq_len,)
            cfg.examples_per_class = max(shots)  # the pool of training examples
            cfg.subset_seed = seed
            self.configs.append(cfg)
        names = [c.name for c in self.configs]
        if len(set(names)) != len(names):
            raise ValueError(
                f"few-shot datasets {names} share a name; metrics are named after it, so "
                "give each config a distinct 'name'"
            )
        self.shots, self.l2, self.seed = shots, float(l2), seed
        self.image_size, self.batch_size, self.knn_k = image_size, batch_size, knn_k

    def features(
        self, model: VisionTransformer, params: Any, cfg: Any, split: str, mesh: Any = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """(features [n, D], labels [n]) of one split of one dataset config."""
        if mesh is not None and self.batch_size % mesh.devices.size:
            raise ValueError(
                f"few-shot batch_size={self.batch_size} does not split over the mesh's "
                f"{mesh.devices.size} devices: use a multiple of {mesh.devices.size}"
            )
        args = (cfg, split, self.batch_size, self.image_size, model.patch_size, mesh)
        with eval_batches(*args) as batches:
            return extract_features(model, params, batches, mesh)

    def run(
        self, model: VisionTransformer, params: Any, mesh: jax.sharding.Mesh | None = None
    ) -> dict[str, float]:
        """Few-shot accuracies of `model` with `params`.

        Args:
          model: the model being trained (its head is ignored).
          params: its parameters, as they lie (e.g. `state.params`).
          mesh: the training mesh to spread the batches over (see `extract_features`);
            None runs on the default device of one process.

        Returns:
          {f'fewshot/{name}_{k}shot': accuracy in [0, 1]} for every dataset and k.
        """
        from vit_jax import data

        out = {}
        for cfg in self.configs:
            train = self.features(model, params, cfg, cfg.train_split, mesh)  # (x, y)
            test = self.features(model, params, cfg, cfg.test_split, mesh)
            accuracy = fewshot_accuracy(
                *train, *test, self.shots, self.l2, self.seed, num_classes=data.num_classes(cfg)
            )
            out.update({metric_name(cfg.name, k): acc for k, acc in accuracy.items()})
            if self.knn_k:  # on the shots the linear fit draws
                for k in self.shots:
                    pool = choose_shots(train[1], k, self.seed)
                    acc = knn_accuracy(train[0][pool], train[1][pool], *test, self.knn_k)
                    out[metric_name(f"{cfg.name}_knn", k)] = acc
        return out


def knn_top1(
    model: VisionTransformer,
    params: Any,
    dataset: Mapping[str, Any],
    train_split: str,
    split: str,
    image_size: int | tuple[int, int],
    batch_size: int = 64,
    k: int = DEFAULT_K,
) -> float:
    """DINO's k-NN top-1 accuracy on `split` of `dataset` (fields of
    `vit_jax.data.default_config()`) against the pre-logits features of `train_split`."""
    from vit_jax import data

    cfg = data.default_config()
    cfg.update(dict(dataset))

    def features(split: str) -> tuple[np.ndarray, np.ndarray]:  # [n, D], [n]
        with eval_batches(cfg, split, batch_size, image_size, model.patch_size) as batches:
            return extract_features(model, params, batches)

    return knn_accuracy(*features(train_split), *features(split), k)
