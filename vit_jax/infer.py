"""Classify images with a ViT checkpoint and print the top-k classes.

    python -m vit_jax.infer --checkpoint=ViT-B_16.npz --image=cat.jpg --image=dog.png \\
        [--model=ViT-B_16] [--image_size=384] [--labels=FILE] [--top_k=5] [--batch_size=32]
        [--preprocessing=tf_bilinear|pil_antialias] [--json]

Without --model the architecture is read from the checkpoint (so the models this
package trains, e.g. workdirs/recipe/finetune/final.npz, need no name). The number of
classes is the checkpoint's head. Class names: --labels (one name a line), else the
checkpoint's own (every file this package writes keeps the names of the classes it was
trained on), else the ImageNet-1k ones for 1000 classes (vit_jax/data/imagenet_classes.txt),
else `class i`. Without --image_size the images are resized to the
resolution the checkpoint's position embeddings were made for, by the preprocessing the
checkpoint records (--preprocessing chooses another; vit_jax/data/pixels.py).

--json prints one JSON object a line, one per image, for scripts:
  {"image": PATH, "image_size": [H, W], "preprocessing": METHOD,
   "top_k": [{"index": 281, "label": "tabby", "probability": 0.8123...}, ...]}
with the probabilities at full (float32) precision.
"""

from __future__ import annotations

import json

from absl import flags

from vit_jax import cli
from vit_jax.data import images
from vit_jax.models import predict


def define_flags() -> None:
    cli.define_model_flags()
    flags.DEFINE_multi_string("image", None, "Image file; repeat for more.", required=True)
    flags.DEFINE_string(
        "labels", None, "Class names, one a line (default: the checkpoint's, else ImageNet's)."
    )
    flags.DEFINE_integer("top_k", 5, "Classes printed per image.", lower_bound=1)
    flags.DEFINE_integer("batch_size", 32, "Images per forward pass.", lower_bound=1)
    flags.DEFINE_bool("json", False, "One JSON object a line per image instead of the table.")


def main() -> None:
    f = flags.FLAGS
    images.check_images_exist(f.image)  # before the checkpoint is read
    loaded = cli.load_model(head=True)
    model, params, size = loaded.model, loaded.params, loaded.image_size
    if not model.num_classes:
        raise ValueError(f"{f.checkpoint} has no classification head: nothing to classify with")
    names = images.class_names(model.num_classes, f.labels, loaded.labels)
    x = images.load_images(f.image, size, loaded.preprocessing)
    probs = predict.predict(model, params, x, f.batch_size)
    indices, values = predict.top_k(probs, f.top_k)
    if not f.json:
        print(predict.format_predictions(f.image, indices, values, names))
        return
    for path, row_idx, row_val in zip(f.image, indices.tolist(), values.tolist(), strict=True):
        top = [
            {"index": i, "label": names[i], "probability": p}
            for i, p in zip(row_idx, row_val, strict=True)
        ]
        line = {"image": path, "image_size": list(size), "preprocessing": loaded.preprocessing}
        print(json.dumps({**line, "top_k": top}))


if __name__ == "__main__":
    cli.run(main, define_flags)
