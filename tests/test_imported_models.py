"""Models imported from timm and Hugging Face files, used by the commands and training:
evaluate, few-shot and init_from take them with their numerics (exact GELU, eps 1e-12 as
a PyTorch ViT), and --patch_size resamples them on evaluate, few-shot and convert."""

import json

import numpy as np
import pytest
from format_helpers import reference_logits
from helpers import (
    FIDELITY_ATOL,
    assert_trees_equal,
    flat,
    initial_params,
    quiet_params,
    run_command,
    tiny_config,
    write_three_class_idx,
)

from vit_jax import weights
from vit_jax.models import get_model
from vit_jax.weights import convert
from vit_jax.weights.meta import Meta

PYTORCH = dict(gelu="exact", layer_norm_eps=1e-12)  # transformers' defaults


@pytest.fixture(scope="module")
def idx_dir(tmp_path_factory):
    return write_three_class_idx(str(tmp_path_factory.mktemp("imported_idx")))


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """A 3-class model of PyTorch numerics as .npz, timm .safetensors and an HF directory:
    ({format: path}, model, params)."""
    root = tmp_path_factory.mktemp("sources")
    model = get_model("testing", 3, patch_size=8, **PYTORCH)
    params = quiet_params(model, 32)
    paths = {"npz": root / "m.npz", "timm": root / "m.safetensors", "hf": root / "hf"}
    weights.save_npz(paths["npz"], params, Meta.of_model(model))
    for fmt in ("timm", "hf"):
        convert.convert(paths["npz"], fmt, paths[fmt])
    return {k: str(v) for k, v in paths.items()}, model, params


def _eval_batches(idx_dir, size):
    from vit_jax import data

    cfg = data.default_config()
    cfg.data_dir = idx_dir
    return list(
        data.eval_iterator(
            cfg, "test", global_batch=64, image_size=size, process_index=0, process_count=1
        )  # fmt: skip
    )


def test_evaluate_reads_timm_and_hf_files_with_their_numerics(idx_dir, sources, capsys):
    """`evaluate` on each format: the same accuracy, the NumPy reference's (float64, the
    file's numerics) on the same images; --patch_size=4 resamples the patch embedding and
    keeps the token grid (16x16 images), as the library's load_model does."""
    from vit_jax import evaluate
    from vit_jax.evaluation import classify

    paths, model, params = sources
    b = _eval_batches(idx_dir, 32)[0]
    keep = b["mask"] > 0
    ref = reference_logits(model, params, b["image"][keep])
    want = float(np.mean(np.argmax(ref, -1) == np.argmax(b["label"][keep], -1)))
    results = {}
    for fmt, path in paths.items():
        capsys.readouterr()
        args = [f"--checkpoint={path}", "--dataset=fashion_mnist", f"--data_dir={idx_dir}"]
        assert run_command(evaluate, *args, "--noprogress") == 0, capsys.readouterr().err
        results[fmt] = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert {fmt: (r["examples"], r["top1"]) for fmt, r in results.items()} == {
        fmt: (12, want) for fmt in paths
    }
    assert 1 / 12 < want < 11 / 12  # a model that tells the images apart, not a constant
    capsys.readouterr()
    args = [f"--checkpoint={paths['hf']}", "--dataset=fashion_mnist", f"--data_dir={idx_dir}"]
    assert run_command(evaluate, *args, "--noprogress", "--patch_size=4") == 0
    got = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    m, p, size = weights.load_model(paths["hf"], patch_size=4)
    assert got["image_size"] == [16, 16] == list(size) and m.gelu == "exact"
    dataset = {"source": "idx", "name": "fashion_mnist", "data_dir": idx_dir}
    lib = classify.evaluate(m, p, dataset, "test", size, 64, progress=False)
    assert got["top1"] == lib["top1"] and got["examples"] == 12


def test_fewshot_reads_timm_and_hf_files_with_their_numerics(idx_dir, sources, capsys):
    """`fewshot` on each format prints the table of the evaluator on the file's model
    (exact GELU, eps 1e-12); --patch_size=4 gives the resampled model's at 16x16."""
    from vit_jax import fewshot
    from vit_jax.evaluation import FewShotEvaluator

    paths, model, params = sources
    ev = lambda size: FewShotEvaluator(
        [{"source": "idx", "name": "fashion_mnist", "data_dir": idx_dir}],
        shots=(1, 10), l2=1.0, image_size=size, batch_size=64,
    )  # fmt: skip
    cells = lambda acc: [f"{100 * acc[f'fewshot/fashion_mnist_{k}shot']:.2f}%" for k in (1, 10)]
    want = cells(ev(32).run(model, params))
    for fmt, path in paths.items():
        capsys.readouterr()
        args = [f"--checkpoint={path}", "--dataset=fashion_mnist", f"--data_dir={idx_dir}"]
        assert run_command(fewshot, *args, "--shots=1,10", "--l2=1") == 0, fmt
        lines = capsys.readouterr().out.strip().splitlines()
        assert lines[2].split()[1:] == want, fmt
    capsys.readouterr()
    args = [f"--checkpoint={paths['timm']}", "--dataset=fashion_mnist", f"--data_dir={idx_dir}"]
    assert run_command(fewshot, *args, "--shots=1,10", "--l2=1", "--patch_size=4") == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert "at 16x16" in lines[0]
    m, p, size = weights.load_model(paths["timm"], head=False, patch_size=4)
    assert size == (16, 16) and m.patch_size == 4 and m.gelu == "exact"
    assert lines[2].split()[1:] == cells(ev(16).run(m, p))


def test_convert_patch_size_resamples_into_every_format(sources, tmp_path, capsys):
    """convert --patch_size=4: the written file holds the pseudo-inverse-resampled kernel
    (FlexiViT) at 16x16 with the same numerics, in npz, timm and hf; the command says each
    format's input layout."""
    from vit_jax import convert as command
    from vit_jax.models.patch_resize import resample_kernel

    paths, model, params = sources
    kernel = resample_kernel(np.asarray(params["embedding"]["kernel"]), 4)  # [4, 4, 3, D]
    for fmt, out in (("npz", "p4.npz"), ("timm", "p4.safetensors"), ("hf", "p4")):
        flags = [f"--checkpoint={paths['hf']}", f"--format={fmt}", f"--out={tmp_path / out}"]
        capsys.readouterr()
        assert run_command(command, *flags, "--patch_size=4") == 0, fmt
        layout = "NHWC [N, 16, 16, 3]" if fmt == "npz" else "NCHW [N, 3, 16, 16]"
        want = f"its input: {layout} float32 images in [-1, 1]; load it with:"
        assert capsys.readouterr().out.splitlines()[1].endswith(want), fmt
        m, p, size = weights.load_model(tmp_path / out)
        assert (m.patch_size, size, m.gelu, m.layer_norm_eps) == (4, (16, 16), "exact", 1e-12)
        np.testing.assert_allclose(p["embedding"]["kernel"], kernel, atol=1e-6, rtol=0)
        same = {k: v for k, v in flat(p).items() if "embedding" not in k and "pos" not in k}
        assert_trees_equal(same, {k: flat(params)[k] for k in same})
    pytest.importorskip("onnx")
    flags = [f"--checkpoint={paths['hf']}", "--format=onnx", f"--out={tmp_path / 'p4.onnx'}"]
    assert run_command(command, *flags, "--patch_size=4") == 0  # the graph takes NHWC
    want = "its input: NHWC [N, 16, 16, 3] float32 images in [-1, 1]; load it with:"
    assert capsys.readouterr().out.splitlines()[1].endswith(want)


def test_init_from_timm_and_hf_takes_their_numerics(tmp_path):
    """Fine-tuning from a timm file or an HF directory of PyTorch numerics: the model is
    built with them (unless the config names its own), starts from the file's parameters,
    and the run's final.npz records them, so that it loads later computing the same."""
    from vit_jax.training import state as state_lib
    from vit_jax.training import train

    c = tiny_config(total_steps=2, eval_every=2, checkpoint_every=2, log_every=1)
    c.dataset.test_split = "test[:64]"
    source = get_model(None, 10, width=32, depth=2, num_heads=2, mlp_dim=64, patch_size=7,
                       **PYTORCH)  # fmt: skip
    params = quiet_params(source, 28)
    weights.save_npz(tmp_path / "src.npz", params, Meta.of_model(source))
    for fmt, out in (("timm", "src.safetensors"), ("hf", "hf")):
        convert.convert(tmp_path / "src.npz", fmt, tmp_path / out)
        model = state_lib.build_model(c.model, 10, str(tmp_path / out))
        assert (model.gelu, model.layer_norm_eps) == ("exact", 1e-12), fmt
        c.init_from = str(tmp_path / out)
        start = state_lib.Start.of(c)
        got = initial_params(start, model, 28)
        body = lambda tree: {k: v for k, v in flat(tree).items() if not k.startswith("head/")}
        assert_trees_equal(body(got), body(params))
    c.model.gelu = "tanh"  # the config's own choice wins over the file's
    assert state_lib.build_model(c.model, 10, c.init_from).gelu == "tanh"
    c.model.gelu = None
    summary = train.run(c, str(tmp_path / "run"))  # from the HF directory
    assert summary["steps"] == 2
    m, p, _ = weights.load_model(tmp_path / "run" / "final.npz")
    assert (m.gelu, m.layer_norm_eps) == ("exact", 1e-12)
    x = np.random.default_rng(0).uniform(-1, 1, (2, 28, 28, 3)).astype(np.float32)
    np.testing.assert_allclose(
        np.asarray(m.apply({"params": p}, x)), reference_logits(m, p, x), atol=FIDELITY_ATOL, rtol=0
    )
