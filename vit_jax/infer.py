"""Classify images with a ViT checkpoint and print the top-k classes.

    python -m vit_jax.infer --checkpoint=ViT-B_16.npz --image=cat.jpg --image=dog.png \\
        [--model=ViT-B_16] [--image_size=384 | --seq_len=256] [--labels=FILE] [--top_k=5]
        [--batch_size=32] [--preprocessing=tf_bilinear|pil_antialias] [--json]

Without --model the architecture is read from the checkpoint (so the models this
package trains, e.g. workdirs/recipe/finetune/final.npz, need no name). The number of
classes is the checkpoint's head. Class names: --labels (one name a line), else the
checkpoint's own (every file this package writes keeps the names of the classes it was
trained on), else the ImageNet-1k ones for 1000 classes (vit_jax/data/imagenet_classes.txt),
else `class i`. Without --image_size the images are resized to the
resolution the checkpoint's position embeddings were made for, by the preprocessing the
checkpoint records (--preprocessing chooses another; vit_jax/data/pixels.py).

--seq_len=N classifies each image at its own aspect ratio (NaFlex, plain ViTs only): resized
to the largest size whose grid of patches has at most N of them (vit_jax/data/naflex.py;
the preprocessing then names the JPEG decode, mean and std), the checkpoint's position embeddings
resized to that grid, which each image's block names: `cat.jpg  (grid 12x21)`.

--json prints one JSON object a line, one per image, for scripts:
  {"image": PATH, "image_size": [H, W], "preprocessing": METHOD,
   "top_k": [{"index": 281, "label": "tabby", "probability": 0.8123...}, ...]}
with the probabilities at full (float32) precision; with --seq_len also "seq_len": N,
"grid": [rows, cols] and "resize": "naflex" (big_vision's antialiased resize_to_sequence;
"preprocessing" then names the JPEG decode, mean and std), and "image_size" is the size the image
was resized to.
"""

from __future__ import annotations

import json
from typing import Any

from absl import flags

from vit_jax import cli
from vit_jax.data import images
from vit_jax.models import predict


def define_flags() -> None:
    cli.define_model_flags(naflex=True)
    flags.DEFINE_multi_string("image", None, "Image file; repeat for more.", required=True)
    flags.DEFINE_string(
        "labels", None, "Class names, one a line (default: the checkpoint's, else ImageNet's)."
    )
    flags.DEFINE_integer("top_k", 5, "Classes printed per image.", lower_bound=1)
    flags.DEFINE_integer("batch_size", 32, "Images per forward pass.", lower_bound=1)
    flags.DEFINE_bool("json", False, "One JSON object a line per image instead of the table.")


def read_images(loaded: Any) -> tuple[Any, list[dict]]:
    """--image as the model's input, and what --json says of each one's shape: its
    image_size, and with --seq_len its grid (each image at its own aspect ratio)."""
    f, model = flags.FLAGS, loaded.model
    if not f.seq_len:
        x = images.load_images(f.image, loaded.image_size, loaded.preprocessing)
        return x, [{"image_size": list(loaded.image_size)}] * len(f.image)
    cli.naflex_note(loaded)
    x, grids = images.load_naflex(f.image, model.patch_size, f.seq_len, loaded.preprocessing)
    p = model.patch_size
    shapes = [
        {"seq_len": f.seq_len, "grid": g, "image_size": [g[0] * p, g[1] * p], "resize": "naflex"}
        for g in grids.tolist()
    ]
    return x, shapes


def main() -> None:
    f = flags.FLAGS
    images.check_images_exist(f.image)  # before the checkpoint is read
    loaded = cli.load_model(head=True)
    model = loaded.model
    if not model.num_classes:
        raise ValueError(f"{f.checkpoint} has no classification head: nothing to classify with")
    names = images.class_names(model.num_classes, f.labels, loaded.labels)
    x, shapes = read_images(loaded)
    probs = predict.predict(model, loaded.params, x, f.batch_size)
    indices, values = predict.top_k(probs, f.top_k)
    if not f.json:
        grid = lambda s: f"  (grid {s['grid'][0]}x{s['grid'][1]})" if "grid" in s else ""  # noqa: E731
        titles = [path + grid(s) for path, s in zip(f.image, shapes, strict=True)]
        print(predict.format_predictions(titles, indices, values, names))
        return
    rows = zip(f.image, shapes, indices.tolist(), values.tolist(), strict=True)
    for path, shape, row_idx, row_val in rows:
        top = [
            {"index": i, "label": names[i], "probability": p}
            for i, p in zip(row_idx, row_val, strict=True)
        ]
        line = {"image": path, **shape, "preprocessing": loaded.preprocessing}
        print(json.dumps({**line, "top_k": top}))


if __name__ == "__main__":
    cli.run(main, define_flags)
