"""Convert a checkpoint to another format: npz, timm, hf, or onnx (TensorFlow Serving and
TFLite: convert the ONNX file with onnx2tf).

    python -m vit_jax.convert --checkpoint=IN --format=FORMAT --out=OUT [--model=NAME] \\
        [--image_size=N] [--num_classes=K] [--patch_size=P] [--labels=FILE] \\
        [--numerics=file|original]

IN is a published .npz (any layout), a timm .safetensors file or a Hugging Face model
directory (config.json + model.safetensors); its format is recognised from the file.
Without --model the architecture is read from the file; without --image_size the output
keeps the file's resolution (position embeddings are resized to any other);
--num_classes replaces the head by a new zero one; --patch_size resamples the patch
embedding (FlexiViT). The output computes what the input does, GELU form and LayerNorm
epsilon included (the input's own: a timm file's exact GELU, a Hugging Face config's
hidden_act and layer_norm_eps); --numerics=original computes the original ViT's instead
(tanh, 1e-6), for files converted by others from the published weights, such as
google/vit-base-patch16-224, whose config.json says 'gelu' and 1e-12. The last lines say
how to load OUT, as Python to paste: for timm, lines that build timm's VisionTransformer
(its Eva for DINOv3 and EVA-02) with every argument and load OUT strictly, or, where OUT
ends in '/' or has no suffix, timm's hub folder for timm.create_model('local-dir:' + OUT,
pretrained=True); for hf, from_pretrained and
pipeline('image-classification'). Every format keeps the head's class
names: the input's own (the files this package writes carry them), or --labels=FILE
(one a line, as for vit_jax.infer); an hf directory without any names a 1000-class
head with ImageNet's. An hf directory also holds preprocessor_config.json (the resize
and [-1, 1] scaling of vit_jax.infer).
See vit_jax/weights/.
"""

from __future__ import annotations

from absl import flags

from vit_jax import cli


def define_flags() -> None:
    from vit_jax.weights.convert import FORMATS

    cli.define_model_flags()
    flags.DEFINE_enum("format", None, list(FORMATS), "Output format.", required=True)
    out = "Output file, or directory (hf; timm's hub folder: no suffix, or ending in '/')."
    flags.DEFINE_string("out", None, out, required=True)
    flags.DEFINE_integer("num_classes", None, "New zero head of K classes (0: none).")
    flags.DEFINE_string(
        "labels", None, "Class names, one a line (default: the input's own, if it names them)."
    )


def main() -> None:
    from vit_jax.data import images
    from vit_jax.models import lora
    from vit_jax.weights import convert
    from vit_jax.weights.meta import Meta

    f = flags.FLAGS
    overrides = cli.model_overrides()  # bad flags fail before anything is read
    size = images.parse_image_size(f.image_size)
    if cli.is_run(f.checkpoint):  # its newest checkpoint; LoRA's adapters merged
        run = cli.load_model()
        params, model = lora.merge(run.params, run.model.lora), run.model.clone(lora=None)
        meta = Meta(preprocessing=run.preprocessing)
        done = convert.write(params, model, run.image_size, f.format, f.out, meta)
    else:
        args = (f.model, size, f.num_classes, f.patch_size, f.labels, f.preprocessing)
        try:
            done = convert.convert(f.checkpoint, f.format, f.out, *args, **overrides)
        except TypeError as e:  # an override that is no model option
            raise ValueError(f"--override: {e}") from None
    print(f"wrote {done.fmt} {done.out}: {cli.model_title(f.model, f.checkpoint, done.image_size)}")
    c, (h, w) = done.model.channels, done.image_size
    nchw = done.fmt in ("timm", "hf")
    layout = f"NCHW [N, {c}, {h}, {w}]" if nchw else f"NHWC [N, {h}, {w}, {c}]"
    classes = done.model.num_classes or 0
    print(f"{classes} classes; its input: {layout} float32 images in [-1, 1]; load it with:")
    print(done.how_to_load)


if __name__ == "__main__":
    cli.run(main, define_flags)
