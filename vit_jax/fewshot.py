"""Linear few-shot accuracy of a checkpoint's frozen representation, as a table.

    python -m vit_jax.fewshot --model=ViT-B_16 --checkpoint=ViT-B_16.npz \\
        --dataset=fashion_mnist [--source=idx|tfds|folder --data_dir=DIR] \\
        [--shots=1,5,10,25] [--l2=1024] [--seed=0] [--image_size=224] \\
        [--train_split=train] [--test_split=test] [--batch_size=64]

For each dataset (comma-separated), max(shots) training images per class and the whole
test split go through the model; a regularised least-squares fit of k of them per class
to {-1, 1}^K targets classifies the test images (see vit_jax/evaluate/linear.py). Without
--source, 'fashion_mnist' is read from the idx files of the Debian package
dataset-fashion-mnist (offline), any other name from TFDS. Without --image_size the
images are resized to the resolution the checkpoint was made for.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TextIO

from absl import app, flags

from vit_jax.evaluate.fewshot import DEFAULT_L2, DEFAULT_SHOTS


def dataset_configs(
    names: Sequence[str],
    source: str | None = None,
    data_dir: str | None = None,
    train_split: str = "train",
    test_split: str = "test",
) -> list[dict]:
    """Dataset configs (fields of vit_jax.data.default_config()) for the named datasets.

    Without `source`, 'fashion_mnist' reads idx files and any other name a TFDS builder.
    """
    configs = []
    for name in names:
        cfg = {"name": name, "train_split": train_split, "test_split": test_split}
        cfg["source"] = source or ("idx" if name == "fashion_mnist" else "tfds")
        if data_dir:
            cfg["data_dir"] = data_dir
        configs.append(cfg)
    return configs


def format_table(results: dict[str, dict[int, float]]) -> str:
    """{dataset: {k: accuracy}} -> one row per dataset, one column per k, in percent."""
    shots = sorted({k for row in results.values() for k in row})
    width = max([len("dataset")] + [len(name) for name in results])
    lines = [f"{'dataset':<{width}}" + "".join(f"{f'{k}-shot':>9}" for k in shots)]
    for name, row in results.items():
        cells = "".join(f"{100 * row[k]:8.2f}%" if k in row else f"{'-':>9}" for k in shots)
        lines.append(f"{name:<{width}}{cells}")
    return "\n".join(lines)


def run(
    model_name: str,
    checkpoint_path: str,
    datasets: Sequence[dict],
    shots: Sequence[int] = DEFAULT_SHOTS,
    l2: float = DEFAULT_L2,
    seed: int = 0,
    image_size: int | str | Sequence[int] | None = None,
    batch_size: int = 64,
    out: TextIO | None = None,
) -> dict[str, dict[int, float]]:
    """Loads a checkpoint without its head, evaluates it few-shot and prints the table.

    Args:
      model_name: variant for `get_model` ('ViT-B_16', 'testing', ...); pooling and the
        representation layer come from the checkpoint.
      checkpoint_path: .npz in a published layout.
      datasets: dataset configs (see `dataset_configs`).
      shots, l2, seed: see `vit_jax.evaluate.FewShotEvaluator`.
      image_size: N or (H, W); None: the checkpoint's own resolution.
      batch_size: images per forward pass.
      out: where to print; None: stdout.

    Returns:
      {dataset name: {k: accuracy in [0, 1]}}.
    """
    from vit_jax import checkpoint
    from vit_jax.evaluate import FewShotEvaluator, by_dataset
    from vit_jax.infer import parse_image_size
    from vit_jax.models import get_model

    params = checkpoint.load_npz(checkpoint_path)
    model = get_model(model_name, None, **checkpoint.model_overrides(params))  # no head
    size = parse_image_size(image_size) or checkpoint.native_image_size(params, model)
    params = checkpoint.adapt(params, model, size, source=str(checkpoint_path))
    evaluator = FewShotEvaluator(datasets, shots, l2, seed, size, batch_size)
    results = by_dataset(evaluator.run(model, params))
    print(
        f"linear few-shot accuracy of {model_name} ({checkpoint_path}) at "
        f"{size[0]}x{size[1]}, l2={l2:g}, seed {seed}",
        file=out or sys.stdout,
    )
    print(format_table(results), file=out or sys.stdout)
    return results


def define_flags() -> None:
    """The command's flags (defined only when run as a command)."""
    flags.DEFINE_string("model", "ViT-B_16", "Model variant, e.g. ViT-B_16, R50+ViT-B_16.")
    flags.DEFINE_string("checkpoint", None, "Checkpoint .npz (published layout).", required=True)
    flags.DEFINE_list("dataset", ["fashion_mnist"], "Dataset name(s), comma-separated.")
    flags.DEFINE_enum(
        "source", None, ["idx", "tfds", "folder"], "Default: idx for fashion_mnist, else tfds."
    )
    flags.DEFINE_string("data_dir", None, "idx directory, image-folder root or TFDS data_dir.")
    flags.DEFINE_list("shots", [str(k) for k in DEFAULT_SHOTS], "Examples per class.")
    flags.DEFINE_float("l2", DEFAULT_L2, "L2 strength of the least-squares fit.", lower_bound=0)
    flags.DEFINE_integer("seed", 0, "Which training examples are drawn.")
    flags.DEFINE_string("image_size", None, "Resolution N or H,W; default: the checkpoint's.")
    flags.DEFINE_string("train_split", "train", "Split the shots are drawn from.")
    flags.DEFINE_string("test_split", "test", "Split accuracy is measured on, e.g. test[:2000].")
    flags.DEFINE_integer("batch_size", 64, "Images per forward pass.", lower_bound=1)


def main(argv: Sequence[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    f = flags.FLAGS
    try:
        shots = [int(k) for k in f.shots]
    except ValueError:
        raise app.UsageError(
            f"--shots={','.join(f.shots)}: expected integers like 1,5,10,25"
        ) from None
    configs = dataset_configs(f.dataset, f.source, f.data_dir, f.train_split, f.test_split)
    try:
        run(f.model, f.checkpoint, configs, shots, f.l2, f.seed, f.image_size, f.batch_size)
    except (OSError, ValueError) as e:
        sys.exit(f"error: {e}")


if __name__ == "__main__":
    define_flags()
    app.run(main)
