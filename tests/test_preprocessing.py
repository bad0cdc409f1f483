"""The preprocessing string (vit_jax/data/preprocessing.py): parsing and printing back,
its errors, and its pixels against the sources themselves: timm's eval transform built
from a pretrained_cfg, transformers' image processors (PIL backend), and the paths that
read it (the evaluation pipeline, `infer`, Meta, an HF folder, the dataset config)."""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest
from helpers import random_params, run_command
from PIL import Image
from test_data import eval_all, folder_cfg, make_folder

from vit_jax import infer, weights
from vit_jax.data import config as data_config
from vit_jax.data import images, pixels
from vit_jax.data.preprocessing import GRAMMAR, Preprocessing, from_hf_processor, from_timm_cfg
from vit_jax.models import get_model
from vit_jax.weights import hf
from vit_jax.weights.errors import CheckpointError
from vit_jax.weights.meta import Meta

CLIP = "pil_bicubic:mean=0.48145466,0.4578275,0.40821073:std=0.26862954,0.26130258,0.27577711"
IMAGENET = dict(image_mean=[0.485, 0.456, 0.406], image_std=[0.229, 0.224, 0.225])
# (h, w): shrinking and growing, both orientations; 200 x 203 leaves odd margins (256 x
# 259 cut to 224: 35), where torchvision's offset (18) and transformers' (17) differ.
SHAPES = [(200, 300), (300, 200), (200, 203), (97, 131)]


def _image(tmp_path, shape, seed=0) -> str:
    """A random PNG (lossless: every reader decodes the same pixels), smooth plus noise."""
    rng = np.random.default_rng(seed)
    h, w = shape
    ramp = np.linspace(0, 255, h * w * 3).reshape(h, w, 3)
    pixels_ = np.clip(ramp + rng.normal(0, 40, (h, w, 3)), 0, 255).astype(np.uint8)
    path = str(tmp_path / f"x{h}x{w}_{seed}.png")
    Image.fromarray(pixels_).save(path)
    return path


# ---------------------------------------------------------------- the string


@pytest.mark.parametrize("text", ["tf_bilinear", "pil_antialias"])
def test_todays_strings_are_todays_preprocessing_bit_for_bit(tmp_path, text):
    """The two strings every record holds: the defaults (whole image, [-1, 1]), printed
    back as themselves, and load_image's pixels exactly today's: the resize, then
    (x - 127.5) / 127.5."""
    spec = Preprocessing.parse(text)
    assert spec == Preprocessing(resize=text) and str(spec) == text and spec.whole
    assert spec.mean == spec.std == (0.5, 0.5, 0.5)
    for shape in SHAPES:
        path = _image(tmp_path, shape)
        resized = pixels.resize(pixels.decode(path, text), (24, 32), text)
        want = (resized.astype(np.float32) - 127.5) / 127.5
        np.testing.assert_array_equal(images.load_image(path, (24, 32), text), want)


@pytest.mark.parametrize(
    "text, canonical",
    [
        (f"{CLIP}:crop=0.9:mode=center", None),
        ("pil_bicubic", None),
        ("tf_bilinear:crop=0.875:mode=border", None),
        ("pil_antialias:mean=0.5:std=0.5", "pil_antialias"),  # the defaults, left out
        ("pil_bicubic:mode=squash:mean=0.25", "pil_bicubic:mean=0.25,0.25,0.25"),
    ],
)
def test_strings_round_trip(text, canonical):
    spec = Preprocessing.parse(text)
    assert str(spec) == (canonical or text)
    assert Preprocessing.parse(str(spec)) == spec


@pytest.mark.parametrize(
    "text, part",
    [
        ("pil_bicubic:mean=0.1,0.2", "mean (0.1, 0.2)"),
        ("pil_bicubic:std=0", "std (0.0, 0.0, 0.0)"),
        ("pil_bicubic:crop=big", "crop=big is not numbers"),
        ("pil_bicubic:crop=0.9,0.8", "crop=0.9,0.8 is not one number"),
        ("pil_bicubic:mode=top", "mode 'top'"),
        ("pil_bicubic:size=224", "'size' is not one of mean|std|crop|mode"),
        ("pil_bicubic:crop=0.9:crop=0.8", "'crop' is not one of mean|std|crop|mode=VALUE, each"),
    ],
)
def test_a_wrong_string_is_one_line_naming_the_part_and_the_grammar(text, part):
    """Each wrong part, named after the whole string; then the grammar."""
    with pytest.raises(ValueError) as e:
        Preprocessing.parse(text)
    message = str(e.value)
    assert "\n" not in message
    assert message.startswith(f"preprocessing {text!r}: {part}")
    assert message.endswith(f"expected {GRAMMAR}")


@pytest.mark.parametrize("text", ["bicubic", "bicubic:crop=0.9"])
def test_a_wrong_resize_is_named_with_the_choices(text):
    """As the package named it when there were two methods (tests/test_pixels.py)."""
    where = " (in 'bicubic:crop=0.9')" if ":" in text else ""
    choices = "tf_bilinear or pil_antialias or pil_bicubic"
    with pytest.raises(ValueError) as e:
        Preprocessing.parse(text)
    assert (
        str(e.value)
        == f"preprocessing 'bicubic' is not one of {choices}{where}; expected {GRAMMAR}"
    )


# ---------------------------------------------------------------- timm's eval transform


def _timm_cfgs() -> dict[str, dict]:
    """Pretrained cfgs: timm's own (CLIP, DINOv2, an AugReg ViT) and variants of one
    that reach every crop mode, a non-square size and a crop fraction above 1 (padded)."""
    timm = pytest.importorskip("timm")
    names = (
        "vit_base_patch16_clip_224.openai",
        "vit_small_patch14_dinov2.lvd142m",
        "vit_base_patch16_224.augreg_in21k",
    )
    cfgs = {n: timm.models.get_pretrained_cfg(n).to_dict() for n in names}
    clip = cfgs[names[0]]
    cfgs["squash"] = {**clip, "crop_mode": "squash", "crop_pct": 0.875}
    cfgs["border"] = {**clip, "crop_mode": "border", "interpolation": "bilinear"}
    cfgs["non-square"] = {**clip, "input_size": (3, 160, 224)}
    cfgs["padded"] = {**clip, "crop_pct": 1.15}
    cfgs["no crop_pct"] = {k: v for k, v in clip.items() if k not in ("crop_pct", "crop_mode")}
    return cfgs


TIMM_CASES = [
    "vit_base_patch16_clip_224.openai",
    "vit_small_patch14_dinov2.lvd142m",
    "vit_base_patch16_224.augreg_in21k",
    "squash",
    "border",
    "non-square",
    "padded",
    "no crop_pct",
]


@pytest.mark.parametrize("name", TIMM_CASES)
def test_pixels_of_a_timm_cfg_are_timms_eval_transform(tmp_path, name):
    """`from_timm_cfg`'s string through load_image (as infer, the figures and the eval
    pipeline read it) against timm.data.create_transform(**resolve_data_config(cfg)) on
    the same PIL image: within 1e-5 (the same PIL resize, the same float32 arithmetic)."""
    timm_data = pytest.importorskip("timm.data")
    cfg = _timm_cfgs()[name]
    transform = timm_data.create_transform(**timm_data.resolve_data_config(pretrained_cfg=cfg))
    text = from_timm_cfg(cfg)
    size = tuple(cfg["input_size"][1:])
    for seed, shape in enumerate(SHAPES):
        path = _image(tmp_path, shape, seed)
        with Image.open(path) as f:
            theirs = transform(f.convert("RGB")).numpy().transpose(1, 2, 0)
        ours = images.load_image(path, size, text)
        assert ours.shape == theirs.shape
        np.testing.assert_allclose(ours, theirs, atol=1e-5, rtol=0, err_msg=f"{shape} {text}")


def test_timm_cfg_strings():
    """What from_timm_cfg writes for CLIP's and DINOv2's cfgs, spelled out."""
    cfgs = _timm_cfgs()
    assert from_timm_cfg(cfgs["vit_base_patch16_clip_224.openai"]) == f"{CLIP}:crop=0.9:mode=center"
    dinov2 = from_timm_cfg(cfgs["vit_small_patch14_dinov2.lvd142m"])
    assert dinov2 == "pil_bicubic:mean=0.485,0.456,0.406:std=0.229,0.224,0.225:mode=center"
    assert from_timm_cfg(cfgs["no crop_pct"]) == f"{CLIP}:crop=0.875:mode=center"  # timm's
    with pytest.raises(ValueError, match="'nearest' on 3 channels: expected bilinear or bicubic"):
        from_timm_cfg({"interpolation": "nearest"})


# ---------------------------------------------------------------- transformers' processors


def _processors() -> dict[str, object]:
    transformers = pytest.importorskip("transformers")
    dinov2 = dict(size={"shortest_edge": 256}, crop_size={"height": 224, "width": 224})
    return {
        "clip": transformers.CLIPImageProcessorPil(),
        "dinov2": transformers.BitImageProcessorPil(**dinov2, **IMAGENET),
        "siglip": transformers.SiglipImageProcessorPil(),
        "vit": transformers.ViTImageProcessorPil(),
        "deit": transformers.DeiTImageProcessorPil(),
    }


@pytest.mark.parametrize("name", ["clip", "dinov2", "siglip", "vit", "deit"])
def test_pixels_of_a_processor_config_are_the_processors(tmp_path, name):
    """`from_hf_processor` of a processor's preprocessor_config.json through load_image,
    at the processor's output size, against the processor's own pixel_values (PIL
    backend): within 1e-5 (its rescale and normalise in float64 then float32, ours in
    float32)."""
    processor = _processors()[name]
    text = from_hf_processor(json.loads(processor.to_json_string()))
    for seed, shape in enumerate(SHAPES):
        path = _image(tmp_path, shape, seed)
        with Image.open(path) as f:
            theirs = processor(images=f.convert("RGB"), return_tensors="np")["pixel_values"][0]
        theirs = theirs.transpose(1, 2, 0)
        ours = images.load_image(path, theirs.shape[:2], text)
        np.testing.assert_allclose(ours, theirs, atol=1e-5, rtol=0, err_msg=f"{shape} {text}")
    if name == "clip":  # transformers' offset is what its string says, not torchvision's
        assert text == f"{CLIP}:mode=hf_center"
        path = _image(tmp_path, (200, 300))
        with Image.open(path) as f:
            rgb = f.convert("RGB").resize((203, 200))  # 224 x 227: a margin of 3
        rgb.save(path)
        theirs = processor(images=rgb, return_tensors="np")["pixel_values"][0].transpose(1, 2, 0)
        torchvision_offset = images.load_image(path, (224, 224), f"{CLIP}:mode=center")
        assert np.abs(torchvision_offset - theirs).max() > 0.1
        np.testing.assert_allclose(images.load_image(path, (224, 224), text), theirs, atol=1e-5)


def test_processor_strings_and_their_rescale():
    assert from_hf_processor(_processors()["siglip"].to_dict()) == "pil_bicubic"
    dinov2 = from_hf_processor(_processors()["dinov2"].to_dict())
    assert (
        dinov2
        == "pil_bicubic:mean=0.485,0.456,0.406:std=0.229,0.224,0.225:crop=0.875:mode=hf_center"
    )
    # x * 1 (no rescale) with mean 127.5, std 127.5 is x / 255 with 0.5 and 0.5.
    raw = {"resample": 2, "do_rescale": False, "image_mean": 127.5, "image_std": 127.5}
    assert from_hf_processor(raw) == "pil_antialias"
    assert (
        from_hf_processor({"do_normalize": False})
        == "pil_antialias:mean=0.0,0.0,0.0:std=1.0,1.0,1.0"
    )
    with pytest.raises(ValueError, match="resample 0"):
        from_hf_processor({"resample": 0})


# ---------------------------------------------------------------- the paths that read it


def test_meta_and_an_hf_folder_record_the_string(tmp_path):
    """Meta keeps a spec in its one spelling and refuses a wrong one; an HF folder without
    vit_jax_preprocessing reads its preprocessor_config.json; config.json's own wins."""
    assert Meta(preprocessing="pil_bicubic:mean=0.5").preprocessing == "pil_bicubic"
    assert Meta(preprocessing=f"{CLIP}:crop=0.9:mode=center").preprocessing.endswith(
        "crop=0.9:mode=center"
    )
    with pytest.raises(CheckpointError, match="preprocessing 'bicubic' is not one of tf_bilinear"):
        Meta(preprocessing="bicubic")
    (tmp_path / hf.CONFIG).write_text(json.dumps({"model_type": "vit"}))
    (tmp_path / hf.PREPROCESSOR).write_text(_processors()["clip"].to_json_string())
    assert hf.read_config(tmp_path)["vit_jax_preprocessing"] == f"{CLIP}:mode=hf_center"
    (tmp_path / hf.CONFIG).write_text(json.dumps({"vit_jax_preprocessing": "tf_bilinear"}))
    assert hf.read_config(tmp_path)["vit_jax_preprocessing"] == "tf_bilinear"
    written = hf.preprocessor_config((224, 224), CLIP)
    assert (written["resample"], written["image_mean"]) == (3, [0.48145466, 0.4578275, 0.40821073])


def test_the_evaluation_pipeline_crops_and_normalises_as_load_image(tmp_path):
    """A folder's test split through eval_iterator (evaluation, few-shot, `evaluate`)
    with a timm string: each image is load_image's (crop and mean/std), padding 0; the
    dataset config accepts the string and names a wrong one with the grammar."""
    stored = make_folder(tmp_path)
    text = f"{CLIP}:crop=0.875:mode=center"
    cfg = folder_cfg(tmp_path, preprocessing=text)
    data_config.validate(cfg)
    out = eval_all(cfg, "test", image_size=12)
    paths = [str(tmp_path / name) for name in stored if name.startswith("test/")]
    np.testing.assert_allclose(out["image"][:2], images.load_images(paths, (12, 12), text), atol=0)
    assert out["image"].max() > 1.5  # CLIP's normalisation, not [-1, 1]'s
    np.testing.assert_array_equal(out["image"][2:], 0)  # the padding
    cfg.preprocessing = "pil_bicubic:crop=2,3"
    with pytest.raises(
        ValueError, match=r"dataset.preprocessing.*crop=2,3 is not one number.*RESIZE\["
    ):
        data_config.validate(cfg)


def test_infer_takes_a_spec_and_names_a_wrong_one(tmp_path, capsys):
    """`infer --preprocessing=<CLIP's string>` prints the probabilities of a direct apply
    on load_image's pixels for that string; a wrong string is one error line."""
    model = get_model("testing", 10)
    params = random_params(model, 32, seed=3, scale=0.1)
    path = str(tmp_path / "testing.npz")
    weights.save_npz(path, params)
    image = _image(tmp_path, (40, 56))
    text = f"{CLIP}:crop=0.875:mode=center"
    assert (
        run_command(
            infer, f"--checkpoint={path}", f"--image={image}", f"--preprocessing={text}", "--json"
        )
        == 0
    )
    got = json.loads(capsys.readouterr().out.strip().splitlines()[0])
    x = images.load_images([image], (32, 32), text)
    probs = np.asarray(jax.nn.softmax(model.apply({"params": params}, x, train=False)))[0]
    top = np.argsort(-probs)[: len(got["top_k"])]
    assert [t["index"] for t in got["top_k"]] == top.tolist()
    np.testing.assert_allclose([t["probability"] for t in got["top_k"]], probs[top], rtol=1e-5)
    plain = images.load_images([image], (32, 32), "tf_bilinear")
    assert np.abs(plain - x).max() > 0.1  # the string changed the pixels
    bad = "pil_bicubic:mode=top"
    assert (
        run_command(infer, f"--checkpoint={path}", f"--image={image}", f"--preprocessing={bad}")
        == 1
    )
    err = capsys.readouterr().err
    assert f"preprocessing {bad!r}: mode 'top'; expected {GRAMMAR}" in err
    assert len([line for line in err.splitlines() if line.startswith("error:")]) == 1


def test_a_run_fine_tuning_a_tower_takes_its_pixels_unless_told(tmp_path):
    """dataset.preprocessing '' (the default) resolves to init_from's recorded pixels (a
    CLIP tower's mean and std), to the published resize without init_from; a value the
    config names is kept."""
    from vit_jax.configs import fashion_mnist  # noqa: PLC0415
    from vit_jax.training import train  # noqa: PLC0415

    clip = "pil_bicubic:mean=0.4815,0.4578,0.4082:std=0.2686,0.2613,0.2758:crop=0.875:mode=center"
    model = get_model("testing", 10)
    path = tmp_path / "tower.npz"
    weights.save_npz(path, random_params(model, 32), Meta(preprocessing=clip))
    resolved = {}
    for init_from, said in (("", ""), (str(path), ""), (str(path), "pil_antialias")):
        config = fashion_mnist.get_config("finetune")
        config.init_from, config.dataset.preprocessing = init_from, said
        train._resolve_pixels(config)
        resolved[(init_from, said)] = config.dataset.preprocessing
    assert data_config.default_config().preprocessing == ""
    assert resolved[("", "")] == "tf_bilinear"
    assert resolved[(str(path), "")] == str(Preprocessing.parse(clip))
    assert resolved[(str(path), "pil_antialias")] == "pil_antialias"


def test_naflex_patches_take_the_strings_mean_and_std():
    """A tower's mean and std reach NaFlex patches too: the same resize, normalised as the
    string says ((x/255 - mean) / std), not to [-1, 1]."""
    from vit_jax.data import naflex  # noqa: PLC0415

    clip = "pil_bicubic:mean=0.4815,0.4578,0.4082:std=0.2686,0.2613,0.2758"
    image = np.random.default_rng(0).integers(0, 256, (40, 56, 3), np.uint8)
    rows = {}
    for method in ("tf_bilinear", clip):
        out = naflex.empty(1, 16, 8)
        gh, gw = naflex.put(out, 0, image, 8, method=method)
        rows[method] = out["patches"][0, : gh * gw]
    mean, std = np.array([0.4815, 0.4578, 0.4082]), np.array([0.2686, 0.2613, 0.2758])
    unit = (rows["tf_bilinear"].reshape(-1, 3) + 1) / 2  # [-1, 1] back to [0, 1]
    np.testing.assert_allclose(rows[clip].reshape(-1, 3), (unit - mean) / std, atol=1e-5)
