"""Top-1 and top-5 accuracy of a classifier checkpoint on a dataset split.

    python -m vit_jax.evaluate --checkpoint=PATH --dataset=NAME [--model=NAME] \\
        [--source=tfds|idx] [--data_dir=DIR] [--split=test] [--image_size=N | --seq_len=N] \\
        [--classes=5,6,7,8,9] [--labels=MAP] [--batch_size=64] [--knn_train=train --knn_k=20]
    python -m vit_jax.evaluate --checkpoint=PATH --source=folder --data_dir=DIR [--split=test]

PATH is any checkpoint format (published .npz, timm .safetensors, Hugging Face
directory, or a published file's gs:// path). The preprocessing is the fine-tuning
evaluation's; a progress bar goes to stderr, then one line of text and one JSON line of
the results. E.g. a ViT-B/16 fine-tuned on CIFAR-10 at 384 (the original repository
reports 98.9-99.0% top-1) is checked with

    python -m vit_jax.evaluate --checkpoint=cifar10_ViT-B_16.npz --dataset=cifar10

and the published ImageNet one (84.6% reported; ImageNet prepared for TFDS) with

    python -m vit_jax.evaluate --dataset=imagenet2012 --split=validation \\
        --checkpoint=gs://vit_models/imagenet21k+imagenet2012/ViT-B_16.npz

A head trained on a class subset (the training config's dataset.classes) is evaluated on
the same subset: --classes lists the dataset class ids in the head's order, relabelled
0..K-1 as training does. The main job's fine-tuned checkpoint (classes 5-9):

    python -m vit_jax.evaluate --checkpoint=workdirs/recipe/finetune/final.npz \\
        --dataset=fashion_mnist --classes=5,6,7,8,9

--labels maps the dataset's classes (after --classes) to the head's when their order
differs: head class indices, one per dataset class, comma-separated or one a line in a
file. A checkpoint that names its classes (every file this package writes does) needs
neither where the dataset names its classes too: the classes are matched by name (the
main job's fine-tuned checkpoint on fashion_mnist keeps classes 5-9 by itself). Without
--source, 'fashion_mnist' is read from the Debian idx files, any other name from TFDS;
--source=folder reads DIR/<split>/<class>/*.jpg (--data_dir=DIR, no --dataset), only
the evaluated split. Top-k is reported for k below the head's classes.

--seq_len=N evaluates each image at its own aspect ratio (NaFlex, plain ViTs): resized to
the most patches that fit N (the dataset config's naflex.seq_lens = (N,)), the
checkpoint's position embeddings resized to each image's grid; the JSON line says
"seq_len" (null without it).

--knn_train=SPLIT adds DINO's k-NN top-1 (vit_jax/evaluation/knn.py): the pre-logits
features of the evaluated images classified by their --knn_k nearest of SPLIT's.
"""

from __future__ import annotations

import json

from absl import flags

from vit_jax import cli
from vit_jax.evaluation import knn


def define_flags() -> None:
    cli.define_model_flags(naflex=True)
    flags.DEFINE_string(
        "dataset", None, "Dataset name, e.g. cifar10 (with --source=folder: the folder's name)."
    )
    flags.DEFINE_enum(
        "source", None, ["idx", "tfds", "folder"], "Default: idx for fashion_mnist, else tfds."
    )
    flags.DEFINE_string("data_dir", None, "idx directory, image-folder root or TFDS data_dir.")
    flags.DEFINE_string("split", "test", "Split, e.g. test, validation, test[:2000].")
    flags.DEFINE_list(
        "classes",
        None,
        "Dataset class ids the head was trained on, in its order (the training config's "
        "dataset.classes), e.g. 5,6,7,8,9; the others are left out.",
    )
    flags.DEFINE_string("labels", None, "Head class of each dataset class (list or file).")
    flags.DEFINE_integer("batch_size", 64, "Images per forward pass.", lower_bound=1)
    flags.DEFINE_bool("progress", True, "Show a progress bar on stderr.")
    flags.DEFINE_bool("skip_corrupt", False, cli.SKIP_CORRUPT)
    flags.DEFINE_string("knn_train", None, "Split whose features the k-NN classifier votes with.")
    flags.DEFINE_integer("knn_k", knn.DEFAULT_K, "k-NN neighbours.", lower_bound=1)
    cli.FLAGS_OF_ARGUMENTS["dataset.skip_corrupt=True"] = "--skip_corrupt"  # in its errors


def parse_classes(items: list[str]) -> tuple[int, ...]:
    """['5', '6', '7'] (the --classes list) -> (5, 6, 7); a ValueError for anything else."""
    try:
        classes = tuple(int(c) for c in items)
    except ValueError:
        classes = ()
    if not classes or min(classes) < 0 or len(set(classes)) != len(classes):
        raise ValueError(
            f"--classes={','.join(items)}: expected distinct dataset class ids >= 0 in the "
            "head's order, e.g. --classes=5,6,7,8,9"
        )
    return classes


def parse_labels(spec: str) -> list[int]:
    """--labels: '3,1,2' or a file with one head class index a line -> [3, 1, 2]."""
    from vit_jax.base import store

    path = store.path(spec)
    text = path.read_text() if path.is_file() else spec.replace(",", "\n")
    try:
        return [int(t) for t in text.split()]
    except ValueError:
        raise ValueError(
            f"--labels={spec}: expected head class indices, one per dataset class "
            "(comma-separated, or a file with one a line)"
        ) from None


def main() -> None:
    from vit_jax.base import store
    from vit_jax.evaluation import classify, fewshot

    f = flags.FLAGS
    if not f.dataset and f.source != "folder":
        raise ValueError(
            "--dataset is required: a TFDS name such as cifar10, or fashion_mnist (the idx "
            "files); an image folder needs --source=folder --data_dir=DIR instead"
        )
    source = f.source or ("idx" if f.dataset == "fashion_mnist" else "tfds")
    if source == "folder" and not f.data_dir:
        raise ValueError(
            "--source=folder needs --data_dir=DIR, the image folder with "
            f"DIR/{f.split.split('[')[0]}/<class>/*.jpg (one directory per class)"
        )
    name = f.dataset or store.path(f.data_dir.rstrip("/")).name
    dataset = {"source": source, "name": name, "test_split": f.split}
    if f.data_dir:
        dataset["data_dir"] = f.data_dir
    if f.classes:
        dataset["classes"] = parse_classes(f.classes)
    if f.skip_corrupt:
        dataset["skip_corrupt"] = True
    if f.seq_len:  # each image at its own aspect ratio, as patches (vit_jax/data/naflex.py)
        dataset["naflex"] = {"seq_lens": (f.seq_len,)}
    mapping = parse_labels(f.labels) if f.labels else None
    loaded = cli.load_model(head=True)
    cli.naflex_note(loaded)
    dataset["preprocessing"] = loaded.preprocessing
    model, params, size = loaded.model, loaded.params, loaded.image_size
    if not model.num_classes:
        raise ValueError(f"{f.checkpoint} has no classification head: nothing to evaluate")
    try:
        result = classify.evaluate(
            model, params, dataset, f.split, size, f.batch_size, mapping, f.progress, loaded.labels
        )
    except classify.NarrowHead as e:  # said in flags
        ids = lambda c: f"--classes={c if isinstance(c, str) else ','.join(map(str, c))}"  # noqa: E731
        raise ValueError(e.advice(ids, "--labels")) from None
    title = cli.model_title(f.model, f.checkpoint, size)
    subset = f" classes {','.join(map(str, result['classes']))}" if result["classes"] else ""
    if result["matched_by_name"]:
        subset += " (matched to the head's classes by name)"
    scores = ", ".join(
        f"top-{k} {100 * result[f'top{k}']:.2f}%" for k in classify.TOP_K if f"top{k}" in result
    )
    if f.knn_train:  # the same images, dataset labels (the head plays no part)
        on = {**dataset, "classes": result["classes"] and tuple(result["classes"])}
        args = (model, params, on, f.knn_train, f.split, size, f.batch_size, f.knn_k)
        result |= {"knn_top1": fewshot.knn_top1(*args), "knn_k": f.knn_k, "knn_train": f.knn_train}
        scores += f"; {f.knn_k}-NN top-1 {100 * result['knn_top1']:.2f}% (against {f.knn_train})"
    print(f"{title} on {name} {f.split}{subset} ({result['examples']} images): {scores}")
    shape = {"image_size": None if f.seq_len else list(size), "seq_len": f.seq_len}
    print(json.dumps({"checkpoint": f.checkpoint, **shape, **result}))


if __name__ == "__main__":
    cli.run(main, define_flags)
