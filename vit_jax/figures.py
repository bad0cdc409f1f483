"""Figures of the paper's section 4.5 for a checkpoint, with the numbers behind them.

    python -m vit_jax.figures --checkpoint=ViT-B_16.npz --out=DIR [--model=ViT-B_16] \\
        [--image=cat.jpg --image=dog.png] [--image_size=224 | --seq_len=256] [--num_images=8] \\
        [--data_dir=/usr/share/datasets/fashion-mnist] [--relevance [--class=K ...]]

writes to DIR:
  filters_pca.png          first 28 principal components of the patch-embedding filters
                           (plain ViTs only: a hybrid's filters act on ResNet features,
                           so this figure is skipped for hybrids, with a message)
  posemb_similarity.png    cosine similarity of each position embedding with all others
  attention_distance.png   mean attention distance (input pixels) of every head vs depth
  attention_rollout.png    attention rollout maps over the images (first 8), each
                           labelled with its file name (or `test image i`)
  relevance.png            with --relevance: each image's class-specific relevance map
                           (Chefer et al. 2021) for each --class (the head's index or
                           name; default: the image's predicted class), with its name
                           and probability
  inspect.npz              the arrays behind every figure (see vit_jax/inspection/report.py)
  inspect.json             sizes, definitions, mean distances, the images' names,
                           skipped figures
The figures are titled with --model, else the checkpoint's file name, and the resolution.
Without --image, the first --num_images test images of the embedded Fashion-MNIST (idx
files, --data_dir) are used. Without --model the architecture is read from the
checkpoint; images are resized to --image_size, by default the checkpoint's own
resolution. --seq_len=N draws the maps on each image's own grid instead (NaFlex: the image
at its aspect ratio in at most N patches, the position embeddings resized to its grid;
inspect.npz then holds rollout/0, rollout/1, ..., each [rows, cols] of that image).
Needs matplotlib: pip install "vit_jax[plot]".
"""

from __future__ import annotations

from typing import Any

import jax
from absl import flags

from vit_jax import cli, inspection
from vit_jax.base import store
from vit_jax.data import images
from vit_jax.inspection import plots


def define_flags() -> None:
    cli.define_model_flags(naflex=True)
    flags.DEFINE_multi_string("image", [], "Image file; repeat for more. Default: a sample.")
    flags.DEFINE_string("out", None, "Directory for the figures and numbers.", required=True)
    flags.DEFINE_integer("num_images", 8, "Sample size without --image.", lower_bound=1)
    flags.DEFINE_string("data_dir", None, "idx directory of the sample (Fashion-MNIST).")
    flags.DEFINE_integer("batch_size", 8, "Images per forward pass.", lower_bound=1)
    flags.DEFINE_bool("relevance", False, "Also class-specific relevance maps (relevance.png).")
    flags.DEFINE_multi_string(
        "class",
        [],
        "With --relevance: a class to explain, the "
        "head's index or name; repeat. Default: the prediction.",
    )


def main() -> None:
    f = flags.FLAGS
    plots.pyplot()  # fail early, before any work, when matplotlib is missing
    if f.image:
        images.check_images_exist(f.image)
    if f["class"].value and not f.relevance:
        raise ValueError("--class names the classes of --relevance: add --relevance")
    loaded = cli.load_model(head=f.relevance)
    cli.naflex_note(loaded)
    model, params, size = loaded.model, loaded.params, loaded.image_size
    x, names = read_images(loaded)
    result = inspection.compute(model, params, x, batch_size=f.batch_size)
    if f.relevance:
        inspection.explain(result, model, params, x, f["class"].value, loaded.labels, f.batch_size)
    at = f"NaFlex {f.seq_len} patches" if f.seq_len else f"{size[0]}x{size[1]}"
    title = f"{f.model or store.path(f.checkpoint.rstrip('/')).name} at {at}"
    for message in result.skipped.values():
        print(message)
    drawn = inspection.naflex_images(x, model.patch_size) if f.seq_len else x  # each its shape
    for path in inspection.write(result, drawn, f.out, title, names):
        print(f"wrote {path}")


def read_images(loaded: Any) -> tuple[Any, list[str]]:
    """The images to inspect (--image, else the sample; a NaFlex batch with --seq_len) and
    their names."""
    f, size, method = flags.FLAGS, loaded.image_size, loaded.preprocessing
    if not f.image:
        p = loaded.model.patch_size
        x = inspection.sample_images(f.num_images, size, f.data_dir, method, f.seq_len, p)
        return x, [f"test image {i}" for i in range(len(jax.tree.leaves(x)[0]))]
    if f.seq_len:
        x = images.load_naflex(f.image, loaded.model.patch_size, f.seq_len, method)[0]
    else:
        x = images.load_images(f.image, size, method)
    names = [store.path(p).name for p in f.image]
    if len(set(names)) < len(names):  # a/cat.jpg and b/cat.jpg: the paths tell them apart
        names = list(f.image)
    return x, names


if __name__ == "__main__":
    cli.run(main, define_flags)
