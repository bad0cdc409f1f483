"""Helpers of the format tests: small and published-size models with every parameter
random (helpers.random_params), and real timm in a subprocess."""

import numpy as np
from helpers import flat, quiet_params, random_params
from numpy_reference import resize_posemb, vit_logits

from vit_jax.models import get_model

TINY = dict(name="testing", overrides=dict(patch_size=8), size=32)  # width 32, 2 blocks
TI16 = dict(name="ViT-Ti_16", overrides={}, size=224)
HYBRID = dict(name="testing", overrides=dict(resnet_stages=(1, 1), patch_size=1, width=64), size=32)


def make(case, num_classes=7, seed=0, quiet=False):
    """(model, params, size) of a test case; `quiet`: helpers.quiet_params, whose logits
    show a wrong LayerNorm epsilon or GELU form (for fidelity comparisons)."""
    model = get_model(case["name"], num_classes, **case["overrides"])
    params = (quiet_params if quiet else random_params)(model, case["size"], seed)
    return model, params, case["size"]


def reference_logits(model, params, x):
    """The float64 NumPy reference's logits of `model` (its numerics) with `params` on
    images `x` [N, H, W, C]: stored learned position embeddings are resized to their grid
    by the reference's own bilinear zoom, independently of the package."""
    f = dict(flat(params))
    pe_key = "Transformer/posembed_input/pos_embedding"
    grid = model.grid(x.shape[1:3])
    if f[pe_key].shape[1] != grid[0] * grid[1] + int(model.has_class_token):
        f[pe_key] = resize_posemb(f[pe_key], grid, model.has_class_token)
    return vit_logits(f, x, num_heads=model.num_heads, patch_size=model.patch_size,
                      classifier=model.classifier, resnet_stages=model.resnet_stages,
                      gelu=model.gelu, layer_norm_eps=model.layer_norm_eps)  # fmt: skip


# A script run by a fresh Python with real timm (and the torchvision it imports, as
# setup.sh installs them): for each job, exec the printed recipe lines as they are, then
# save the model's outputs on the job's images.
TIMM_DRIVER = """
import json, sys
import numpy as np, torch
for job in json.load(open(sys.argv[1])):
    scope = {}
    exec(job["recipe"], scope)
    x = torch.from_numpy(np.load(job["images"])).permute(0, 3, 1, 2)
    with torch.no_grad():
        np.save(job["logits"], scope["model"](x).numpy())
"""


def run_in_timm(jobs, tmp_path):
    """Runs each job's `recipe` (Python text) in one subprocess with real timm; returns
    the outputs of its `model` on `images` (NHWC, one array per job)."""
    import json
    import subprocess
    import sys

    for i, job in enumerate(jobs):
        job["logits"] = str(tmp_path / f"timm_logits{i}.npy")
    (tmp_path / "jobs.json").write_text(json.dumps(jobs))
    run = subprocess.run(
        [sys.executable, "-c", TIMM_DRIVER, str(tmp_path / "jobs.json")],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return [np.load(job["logits"]) for job in jobs]
