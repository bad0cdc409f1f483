"""Linear few-shot accuracy of a checkpoint's frozen representation, as a table.

    python -m vit_jax.fewshot --checkpoint=ViT-B_16.npz --dataset=fashion_mnist \\
        [--model=ViT-B_16] [--source=idx|tfds|folder --data_dir=DIR] [--shots=1,5,10,25] \\
        [--l2=1024] [--seed=0] [--image_size=224 | --seq_len=256] [--train_split=train] \\
        [--test_split=test] [--batch_size=64] [--knn_k=20]

For each dataset (comma-separated), max(shots) training images per class and the whole
test split go through the model; a regularised least-squares fit of k of them per class
to {-1, 1}^K targets classifies the test images (see vit_jax/evaluation/linear.py). Without
--source, 'fashion_mnist' is read from the idx files of the Debian package
dataset-fashion-mnist (offline), any other name from TFDS. Without --model the
architecture is read from the checkpoint; without --image_size the images are resized
to the resolution the checkpoint was made for; --seq_len=N keeps each image's aspect ratio
instead (NaFlex: N patches a row, the position embeddings resized to each image's grid).
A row DATASET_knn under each dataset's gives DINO's k-NN accuracy on the same shots
(vit_jax/evaluation/knn.py), k capped at the K * shots examples (--knn_k=0: no such row).
"""

from __future__ import annotations

from absl import flags

from vit_jax import cli
from vit_jax.evaluation import fewshot, knn


def define_flags() -> None:
    cli.define_model_flags(naflex=True)
    flags.DEFINE_list("dataset", ["fashion_mnist"], "Dataset name(s), comma-separated.")
    flags.DEFINE_enum(
        "source", None, ["idx", "tfds", "folder"], "Default: idx for fashion_mnist, else tfds."
    )
    flags.DEFINE_string("data_dir", None, "idx directory, image-folder root or TFDS data_dir.")
    flags.DEFINE_list("shots", [str(k) for k in fewshot.DEFAULT_SHOTS], "Examples per class.")
    flags.DEFINE_float("l2", fewshot.DEFAULT_L2, "L2 strength of the fit.", lower_bound=0)
    flags.DEFINE_integer("seed", 0, "Which training examples are drawn.")
    flags.DEFINE_string("train_split", "train", "Split the shots are drawn from.")
    flags.DEFINE_string("test_split", "test", "Split accuracy is measured on, e.g. test[:2000].")
    flags.DEFINE_integer("batch_size", 64, "Images per forward pass.", lower_bound=1)
    flags.DEFINE_bool("skip_corrupt", False, cli.SKIP_CORRUPT)
    flags.DEFINE_integer("knn_k", knn.DEFAULT_K, "k-NN neighbours (0: no k-NN).", lower_bound=0)
    cli.FLAGS_OF_ARGUMENTS["dataset.skip_corrupt=True"] = "--skip_corrupt"  # in its errors


def format_table(results: dict[str, dict[int, float]]) -> str:
    """{dataset: {k: accuracy}} -> one row per dataset, one column per k, in percent.

    Columns are two spaces apart and right-aligned, each as wide as its header
    ('5000-shot') or its numbers ('100.00%'), whichever is wider.
    """
    shots = sorted({k for row in results.values() for k in row})
    rows = [["dataset", *(f"{k}-shot" for k in shots)]]
    for name, row in results.items():
        rows.append([name, *(f"{100 * row[k]:.2f}%" if k in row else "-" for k in shots)])
    width, *cols = (max(map(len, column)) for column in zip(*rows, strict=True))
    return "\n".join(
        f"{name:<{width}}" + "".join(f"  {c:>{w}}" for c, w in zip(cells, cols, strict=True))
        for name, *cells in rows
    )


def main() -> None:
    f = flags.FLAGS
    try:
        shots = [int(k) for k in f.shots]
    except ValueError:
        raise ValueError(f"--shots={','.join(f.shots)}: expected integers like 1,5,10,25") from None
    loaded = cli.load_model(head=False)
    datasets = fewshot.dataset_configs(
        f.dataset,
        f.source,
        f.data_dir,
        f.train_split,
        f.test_split,
        loaded.preprocessing,
        f.skip_corrupt,
    )
    cli.naflex_note(loaded)
    model, params, size = loaded.model, loaded.params, loaded.image_size
    evaluator = fewshot.FewShotEvaluator(
        datasets, shots, f.l2, f.seed, size, f.batch_size, seq_len=f.seq_len, knn_k=f.knn_k
    )
    results = fewshot.by_dataset(evaluator.run(model, params))
    title = cli.model_title(f.model, f.checkpoint, size)
    knn_note = (
        f"; *_knn: {f.knn_k}-NN (T={knn.TEMPERATURE}, k at most K * shots)" if f.knn_k else ""
    )
    print(f"linear few-shot accuracy of {title}, l2={f.l2:g}, seed {f.seed}{knn_note}")
    print(format_table(results))


if __name__ == "__main__":
    cli.run(main, define_flags)
