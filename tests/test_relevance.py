"""Class-specific relevance maps (inspection/relevance.py): the method written again in
PyTorch from the paper, on a timm export of the same model, gives the same maps; maps
differ between classes; plain and scanned blocks, token and mean-pooled classifiers."""

import json
import subprocess
import sys

import jax
import numpy as np
import pytest
from flax import traverse_util
from format_helpers import TINY, make
from helpers import images, random_params

from vit_jax.inspection.relevance import relevance, rollout_relevance
from vit_jax.models import get_model
from vit_jax.weights import convert
from vit_jax.weights.npz import stack_blocks

# Chefer, Gur and Wolf (ICCV 2021), from their equations, on timm's explicit attention:
# the probabilities are the input of each block's attn_drop (identity in eval mode).
CHEFER_IN_TORCH = """
import json, sys
import numpy as np, torch
job = json.load(open(sys.argv[1]))
scope = {}
exec(job["recipe"], scope)
model = scope["model"].eval()
probs = []
def keep(module, inputs, output):
    inputs[0].retain_grad()
    probs.append(inputs[0])
for block in model.blocks:
    block.attn.fused_attn = False
    block.attn.attn_drop.register_forward_hook(keep)
x = torch.from_numpy(np.load(job["images"])).permute(0, 3, 1, 2)
maps = []
for i in range(len(x)):
    row = []
    for c in job["classes"]:
        probs.clear()
        model.zero_grad()
        model(x[i : i + 1])[0, c].backward()
        n = probs[0].shape[-1]
        r = torch.eye(n)
        for a in probs:
            cam = (a.grad[0] * a[0]).clamp(min=0).mean(0)  # mean over heads of (grad * A)+
            r = r + cam @ r
        row.append(r[0, 1:].detach().numpy() if job["token"] else r[:, :].mean(0).numpy())
    maps.append(row)
np.save(job["out"], np.array(maps))
"""


def test_relevance_equals_the_method_in_pytorch_on_a_timm_export(tmp_path):
    """A small random ViT exported to timm: the maps computed there with PyTorch's
    autograd agree with `relevance` within 1e-4 (relative to the largest value), for two
    classes of each of three images, and the two classes' maps differ."""
    pytest.importorskip("timm", exc_type=ImportError)
    from vit_jax.weights.meta import Meta

    model, params, size = make(TINY, num_classes=5, quiet=True)
    src = tmp_path / "m.npz"
    from vit_jax import weights

    weights.save_npz(src, params, Meta.of_model(model))
    made = convert.convert(src, "timm", tmp_path / "m.safetensors")
    x = images(size, n=3, seed=4)
    np.save(tmp_path / "x.npy", x)
    job = dict(recipe=made.how_to_load, images=str(tmp_path / "x.npy"), classes=[1, 3],
               out=str(tmp_path / "theirs.npy"), token=True)  # fmt: skip
    (tmp_path / "job.json").write_text(json.dumps(job))
    run = subprocess.run([sys.executable, "-c", CHEFER_IN_TORCH, str(tmp_path / "job.json")],
                         capture_output=True, text=True, timeout=600)  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    theirs = np.load(tmp_path / "theirs.npy")  # [3, 2, gh * gw]
    ours = relevance(model, params, x, [1, 3])  # [3, 2, gh, gw]
    assert ours.shape == (3, 2, *model.grid((size, size)))
    ours = ours.reshape(theirs.shape)
    scale = np.abs(theirs).max()
    assert scale > 1e-3
    np.testing.assert_allclose(ours, theirs, atol=1e-4 * scale, rtol=0)
    assert np.abs(ours[:, 0] - ours[:, 1]).max() > 0.05 * scale  # class-specific


def test_scanned_blocks_and_mean_pooling():
    """The same parameters stacked for a scanned model give the same maps; a mean-pooled
    model's map is the mean of the rows; one class list per image; a class the head does
    not have is refused naming it."""
    model = get_model("testing", 5, patch_size=8)
    params = random_params(model, 32, seed=1)
    x = images(32, n=3)
    plain = relevance(model, params, x, [[0, 1], [2, 3], [4, 0]], batch_size=2)
    flat = stack_blocks(traverse_util.flatten_dict(params, sep="/"))
    stacked = traverse_util.unflatten_dict(flat, sep="/")
    scanned = relevance(model.clone(scan=True), stacked, x, [[0, 1], [2, 3], [4, 0]])
    np.testing.assert_allclose(scanned, plain, atol=1e-6 * np.abs(plain).max())
    one = relevance(model, params, x[1:2], [3])
    np.testing.assert_allclose(one[0, 0], plain[1, 1], rtol=1e-5, atol=1e-7)
    with pytest.raises(ValueError, match="class 5 is not one of the head's 5 classes"):
        relevance(model, params, x, [5])

    gap = get_model("testing", 5, patch_size=8, classifier="gap")
    gap_params = random_params(gap, 32, seed=2)
    maps = relevance(gap, gap_params, x[:1], [2])
    assert maps.shape == (1, 1, 4, 4) and (maps > 0).all()


def test_the_rollout_rule_on_a_hand_made_case():
    """Two layers, one head, two tokens: R = (I + Ā2)(I + Ā1), with Ā = (grad * A)+."""
    a = np.array([[[[[0.5, 0.5], [0.25, 0.75]]]]] * 2, np.float32)  # [L=2, B, H, N, N]
    g = np.array([[[[[1.0, -1.0], [2.0, 0.0]]]]] * 2, np.float32)
    bar = np.maximum(a * g, 0)[:, 0, 0]  # [[0.5, 0], [0.5, 0]]
    want = (np.eye(2) + bar[1]) @ (np.eye(2) + bar[0])
    np.testing.assert_allclose(np.asarray(rollout_relevance(a, g))[0], want, rtol=1e-6)


def test_figures_relevance_writes_maps_for_named_and_predicted_classes(tmp_path, capsys):
    """`figures --relevance` draws relevance.png and saves the maps of each image's
    predicted class; `--class` takes the head's class names and indices; the maps are
    `relevance`'s; --class without --relevance is one error line."""
    from helpers import run_command

    from vit_jax import figures, weights
    from vit_jax.weights.meta import Meta

    model, params, size = make(TINY, num_classes=3, quiet=True)
    src = tmp_path / "m.npz"
    weights.save_npz(src, params, Meta.of_model(model, ["cat", "dog", "emu"]))
    x = images(size, n=2, seed=5)
    from PIL import Image

    paths = []
    for i, im in enumerate(x):
        paths.append(str(tmp_path / f"{i}.png"))
        Image.fromarray(((im + 1) * 127.5).round().astype(np.uint8)).save(paths[-1])
    args = [f"--checkpoint={src}", *[f"--image={p}" for p in paths], "--preprocessing=tf_bilinear"]
    for out, extra in (("pred", []), ("named", ["--class=emu", "--class=0"])):
        code = run_command(figures, *args, f"--out={tmp_path / out}", "--relevance", *extra)
        assert code == 0, capsys.readouterr().err
        assert (tmp_path / out / "relevance.png").stat().st_size > 5000
    pred, named = (np.load(tmp_path / d / "inspect.npz") for d in ("pred", "named"))
    np.testing.assert_array_equal(named["relevance_classes"], [[2, 0], [2, 0]])
    assert pred["relevance"].shape == (2, 1, 4, 4) and named["relevance"].shape == (2, 2, 4, 4)
    loaded = weights.load(src)
    seen = images_as_loaded(paths, size)
    probs = np.asarray(jax.nn.softmax(loaded.model.apply({"params": loaded.params}, seen)))
    np.testing.assert_array_equal(pred["relevance_classes"][:, 0], probs.argmax(-1))
    np.testing.assert_allclose(pred["relevance_probabilities"][:, 0], probs.max(-1), rtol=1e-5)
    want = relevance(loaded.model, loaded.params, seen, [2, 0])
    np.testing.assert_allclose(named["relevance"], want, rtol=1e-5, atol=1e-7)
    assert run_command(figures, *args, f"--out={tmp_path / 'x'}", "--class=1") == 1
    assert capsys.readouterr().err.startswith("error: --class names the classes of --relevance")


def images_as_loaded(paths, size):
    from vit_jax.data import images as image_files

    return image_files.load_images(paths, (size, size), "tf_bilinear")
