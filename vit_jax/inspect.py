"""Figures of the paper's section 4.5 for a checkpoint, with the numbers behind them.

    python -m vit_jax.inspect --model=ViT-B_16 --checkpoint=ViT-B_16.npz --out=DIR \\
        [--image=cat.jpg --image=dog.png] [--image_size=224] [--num_images=8] \\
        [--data_dir=/usr/share/datasets/fashion-mnist]

writes to DIR:
  filters_pca.png          first 28 principal components of the patch-embedding filters
                           (plain ViTs only: a hybrid's filters act on ResNet features,
                           so this figure is skipped for hybrids, with a message)
  posemb_similarity.png    cosine similarity of each position embedding with all others
  attention_distance.png   mean attention distance (input pixels) of every head vs depth
  attention_rollout.png    attention rollout maps over the images (first 8)
  inspect.npz              the arrays behind every figure (see vit_jax/inspection/report.py)
  inspect.json             sizes, definitions, mean distances, skipped figures
Without --image, the first --num_images test images of the embedded Fashion-MNIST (idx
files, --data_dir) are used. Images are resized to --image_size, by default the
checkpoint's own resolution. Needs matplotlib: pip install -e .[plot].
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TextIO

import numpy as np
from absl import app, flags


def sample_images(num_images: int, image_size: tuple[int, int], data_dir: str | None) -> np.ndarray:
    """The first `num_images` test images of the idx dataset (Fashion-MNIST by default).

    Returns:
      images in [-1, 1].  # [num_images, H, W, 3]
    """
    from vit_jax import data  # tf.data: only needed without --image

    cfg = data.default_config()
    if data_dir:
        cfg.data_dir = data_dir
    cfg.test_split = f"test[:{num_images}]"
    batches = data.eval_iterator(
        cfg,
        cfg.test_split,
        global_batch=num_images,
        image_size=image_size,
        process_index=0,
        process_count=1,
    )
    batch = next(iter(batches))
    return batch["image"][batch["mask"] > 0]


def run(
    model_name: str,
    checkpoint_path: str,
    image_paths: Sequence[str],
    out_dir: str,
    image_size: int | str | Sequence[int] | None = None,
    num_images: int = 8,
    data_dir: str | None = None,
    batch_size: int = 8,
    out: TextIO | None = None,
):
    """Loads a checkpoint (without its head), computes every figure's numbers, writes all.

    Args:
      model_name: variant for `get_model`; pooling and representation layer come from
        the checkpoint.
      checkpoint_path: .npz in a published layout.
      image_paths: images to inspect; empty: a sample of the idx test split.
      out_dir: where the PNGs, inspect.npz and inspect.json go.
      image_size: N or (H, W); None: the checkpoint's own resolution.
      num_images: sample size when no images are given.
      data_dir: idx directory of the sample (default: the embedded Fashion-MNIST).
      batch_size: images per forward pass.
      out: where to print; None: stdout.

    Returns:
      The `vit_jax.inspection.Inspection`.
    """
    from vit_jax import checkpoint, infer, inspection
    from vit_jax.inspection import plots
    from vit_jax.models import get_model

    plots.pyplot()  # fail early, before any work, when matplotlib is missing
    if image_paths:
        infer.check_images_exist(image_paths)
    params = checkpoint.load_npz(checkpoint_path)
    model = get_model(model_name, None, **checkpoint.model_overrides(params))
    size = infer.parse_image_size(image_size) or checkpoint.native_image_size(params, model)
    params = checkpoint.adapt(params, model, size, source=str(checkpoint_path))
    if image_paths:
        images = infer.load_images(image_paths, size)
    else:
        images = sample_images(num_images, size, data_dir)
    result = inspection.compute(model, params, images, batch_size=batch_size)
    title = f"{model_name} at {size[0]}x{size[1]}"
    files = inspection.write(result, images, out_dir, title)
    stream = out or sys.stdout
    for message in result.skipped.values():
        print(message, file=stream)
    for path in files:
        print(f"wrote {path}", file=stream)
    return result


def define_flags() -> None:
    """The command's flags (defined only when run as a command)."""
    flags.DEFINE_string("model", "ViT-B_16", "Model variant, e.g. ViT-B_16, R50+ViT-B_16.")
    flags.DEFINE_string("checkpoint", None, "Checkpoint .npz (published layout).", required=True)
    flags.DEFINE_multi_string("image", [], "Image file; repeat for more. Default: a sample.")
    flags.DEFINE_string("out", None, "Directory for the figures and numbers.", required=True)
    flags.DEFINE_string("image_size", None, "Resolution N or H,W; default: the checkpoint's.")
    flags.DEFINE_integer("num_images", 8, "Sample size without --image.", lower_bound=1)
    flags.DEFINE_string("data_dir", None, "idx directory of the sample (Fashion-MNIST).")
    flags.DEFINE_integer("batch_size", 8, "Images per forward pass.", lower_bound=1)


def main(argv: Sequence[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    f = flags.FLAGS
    try:
        run(
            f.model,
            f.checkpoint,
            f.image,
            f.out,
            f.image_size,
            f.num_images,
            f.data_dir,
            f.batch_size,
        )
    except (OSError, ValueError, ImportError) as e:
        sys.exit(f"error: {e}")


if __name__ == "__main__":
    define_flags()
    app.run(main)
