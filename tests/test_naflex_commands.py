"""The commands with --seq_len (NaFlex): each image at its own aspect ratio, its grid said
in the output, the numbers those of the model applied by hand to `naflex.put`'s patches."""

from __future__ import annotations

import gzip
import json
import os

import jax
import numpy as np
import pytest
from helpers import random_params, run_command, tiny_config, write_three_class_idx
from PIL import Image

from vit_jax import evaluate, fewshot, figures, infer, weights
from vit_jax.data import naflex
from vit_jax.evaluation import linear
from vit_jax.evaluation.fewshot import evaluator_of
from vit_jax.models import apply_with_intermediates, get_model

PATCH = 4  # the checkpoint's: 8x8 position embeddings at 32 px


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A random 3-class `testing` model with 4 px patches: (path, model, params)."""
    model = get_model("testing", 3, patch_size=PATCH)
    params = random_params(model, 32, seed=3, scale=0.1)
    path = str(tmp_path_factory.mktemp("naflex") / "testing.npz")
    weights.save_npz(path, params)
    return path, model, params


@pytest.fixture(scope="module")
def idx_dir(tmp_path_factory):
    return write_three_class_idx(str(tmp_path_factory.mktemp("naflex_idx")))


def noise(path, h: int, w: int, seed: int) -> str:
    Image.fromarray(np.random.default_rng(seed).integers(0, 256, (h, w, 3), np.uint8)).save(path)
    return str(path)


def by_hand(model, params, pixels: list[np.ndarray], seq_len: int, what: str = "logits"):
    """The model applied to `naflex.put`'s batch of uint8 images: logits or pre-logits."""
    x = naflex.empty(len(pixels), seq_len, PATCH)
    for j, image in enumerate(pixels):
        naflex.put(x, j, image, PATCH)
    out, inter = jax.jit(lambda p, x: apply_with_intermediates(model, p, x))(params, x)
    return np.asarray(out if what == "logits" else inter["pre_logits"])


def read_idx(path: str) -> np.ndarray:
    with gzip.open(path, "rb") as f:
        raw = f.read()
    shape = [int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(raw[3])]
    return np.frombuffer(raw, np.uint8, offset=4 + 4 * raw[3]).reshape(shape)


def test_infer_classifies_each_image_on_its_own_grid(checkpoint, tmp_path, capsys):
    path, model, params = checkpoint
    wide = noise(tmp_path / "wide.png", 40, 120, seed=0)  # 1:3
    tall = noise(tmp_path / "tall.png", 60, 30, seed=1)  # 2:1
    square = noise(tmp_path / "square.png", 32, 32, seed=2)
    paths = [wide, tall, square]
    args = [f"--checkpoint={path}", *(f"--image={p}" for p in paths), "--seq_len=48"]
    assert run_command(infer, *args, "--json", "--top_k=3", "--batch_size=2") == 0  # 1 padded
    out, err = capsys.readouterr()
    lines = [json.loads(line) for line in out.splitlines()]
    assert lines[0]["grid"] == [4, 12] and lines[0]["image_size"] == [16, 48]  # 1:3 kept
    assert lines[1]["grid"] == [9, 5]  # 36x20 px: the sides rounded up to whole patches
    assert lines[2]["grid"] == [6, 6] and [line["seq_len"] for line in lines] == [48] * 3
    assert {line["resize"] for line in lines} == {"naflex"}  # preprocessing: only the decode
    assert err.strip() == (
        "NaFlex at 48 patches: the 8x8 position embeddings of testing.npz are resized to "
        "each image's own grid"
    )
    pixels = [np.asarray(Image.open(p)) for p in paths]
    want = np.asarray(jax.nn.softmax(by_hand(model, params, pixels, 48)))
    for line, probs in zip(lines, want, strict=True):
        order = np.argsort(-probs, kind="stable")
        assert [t["index"] for t in line["top_k"]] == order.tolist()
        np.testing.assert_allclose(
            [t["probability"] for t in line["top_k"]], probs[order], atol=1e-6
        )
    assert np.abs(want[0] - want[1]).max() > 1e-3  # the images differ
    assert run_command(infer, *args) == 0  # the text output names each image's grid
    blocks = capsys.readouterr().out.split("\n\n")
    titles = [f"{wide}  (grid 4x12)", f"{tall}  (grid 9x5)", f"{square}  (grid 6x6)"]
    assert [b.splitlines()[0] for b in blocks] == titles


def test_seq_len_with_image_size_is_one_error_line(checkpoint, tmp_path, capsys):
    path, *_ = checkpoint
    image = noise(tmp_path / "a.png", 8, 8, seed=2)
    args = [f"--checkpoint={path}", f"--image={image}", "--seq_len=16", "--image_size=32"]
    assert run_command(infer, *args) == 1
    lines = capsys.readouterr().err.splitlines()  # the error, then where a traceback is
    assert len(lines) == 2 and lines[0].startswith("error: --seq_len=16 and --image_size=32 ")
    assert lines[0].endswith("pass one") and "VIT_JAX_DEBUG=1" in lines[1]
    hybrid = get_model("testing", 3, resnet_stages=(), patch_size=2)  # a ResNet root only
    hybrid_path = str(tmp_path / "hybrid.npz")
    weights.save_npz(hybrid_path, random_params(hybrid, 32))
    args = [f"--checkpoint={hybrid_path}", f"--image={image}", "--seq_len=16"]
    assert run_command(infer, *args) == 1  # the file says it is a hybrid
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2 and lines[0].startswith(
        f"error: --seq_len=16: {hybrid_path} is a hybrid"
    )


def test_evaluate_scores_what_the_model_says_of_each_image(checkpoint, tmp_path, capsys):
    """An image folder of three shapes per class: the accuracy of the model applied by hand."""
    path, model, params = checkpoint
    shapes, pixels, labels = [(24, 40), (40, 24), (32, 32)], [], []
    for i in range(12):
        label, shape = i % 3, shapes[i // 3 % 3]
        os.makedirs(tmp_path / "test" / f"c{label}", exist_ok=True)
        file = noise(tmp_path / "test" / f"c{label}" / f"{i:02d}.png", *shape, seed=10 + i)
        pixels.append(np.asarray(Image.open(file)))
        labels.append(label)
    hits = np.argmax(by_hand(model, params, pixels, 16), -1) == np.asarray(labels)
    args = [f"--checkpoint={path}", "--source=folder", f"--data_dir={tmp_path}"]
    assert run_command(evaluate, *args, "--seq_len=16", "--batch_size=5", "--progress=false") == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["examples"] == 12 and result["seq_len"] == 16 and result["image_size"] is None
    assert result["top1"] == hits.mean() and 0 < hits.mean() < 1


def test_figures_draw_each_image_on_its_own_grid(checkpoint, idx_dir, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    path, *_ = checkpoint
    wide = noise(tmp_path / "wide.png", 40, 120, seed=0)
    tall = noise(tmp_path / "tall.png", 60, 30, seed=1)
    out = tmp_path / "out"
    args = [f"--checkpoint={path}", f"--out={out}", "--seq_len=48", "--relevance"]
    assert run_command(figures, *args, f"--image={wide}", f"--image={tall}") == 0
    assert f"wrote {out / 'attention_rollout.png'}" in capsys.readouterr().out
    with np.load(out / "inspect.npz") as numbers:
        assert numbers["rollout/0"].shape == (4, 12) and numbers["rollout/1"].shape == (9, 5)
        assert numbers["relevance/0"].shape == (1, 4, 12)  # the predicted class's map
    summary = json.loads((out / "inspect.json").read_text())
    assert summary["grid"] == [[4, 12], [9, 5]]
    assert summary["title"] == "testing.npz at NaFlex 48 patches"
    with Image.open(out / "attention_rollout.png") as png:
        assert png.format == "PNG"
    # Without --image: the sample (8x8 idx images), each a 4x4 grid of 16 patches.
    args = [f"--checkpoint={path}", f"--out={out}", "--seq_len=16", f"--data_dir={idx_dir}"]
    assert run_command(figures, *args, "--num_images=3") == 0
    with np.load(out / "inspect.npz") as numbers:
        assert [numbers[f"rollout/{i}"].shape for i in range(3)] == [(4, 4)] * 3


def test_fewshot_probes_the_naflex_features(checkpoint, idx_dir, capsys):
    path, model, params = checkpoint
    args = [f"--checkpoint={path}", "--dataset=fashion_mnist", f"--data_dir={idx_dir}"]
    assert run_command(fewshot, *args, "--shots=1,10", "--l2=1", "--seq_len=16") == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert f"({path}) at NaFlex 16 patches, l2=1, seed 0; *_knn: 20-NN" in lines[0]
    split = {}
    for name, prefix in (("train", "train"), ("test", "t10k")):
        images = read_idx(f"{idx_dir}/{prefix}-images-idx3-ubyte.gz")[..., None]  # [n, 8, 8, 1]
        features = by_hand(model, params, list(images), 16, "pre_logits")
        split[name] = features, read_idx(f"{idx_dir}/{prefix}-labels-idx1-ubyte.gz")
    want = linear.fewshot_accuracy(*split["train"], *split["test"], (1, 10), 1.0, seed=0)
    assert lines[2].split()[1:] == [f"{100 * want[k]:.2f}%" for k in (1, 10)]


def test_a_naflex_run_probes_at_its_longest_length():
    config = tiny_config(**{"fewshot.datasets": "fashion_mnist"})
    assert evaluator_of(config).configs[0].naflex.seq_lens is None  # square images
    config.dataset.naflex.seq_lens = (16, 64, 32)
    assert evaluator_of(config).configs[0].naflex.seq_lens == (64,)
