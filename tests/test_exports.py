"""The ONNX export: run by onnxruntime, the logits are this package's."""

import jax
import numpy as np
import pytest
from format_helpers import HYBRID, TI16, TINY, make, reference_logits
from helpers import FIDELITY_ATOL, images, logits

from vit_jax import weights
from vit_jax.base import files
from vit_jax.weights import convert, hf, onnx_export
from vit_jax.weights.meta import Meta

GAP = dict(
    name="testing", overrides=dict(patch_size=8, classifier="gap", representation_size=24), size=32
)
# Three stages (strided units, projections): the stem's every kind of unit.
R50 = dict(
    name="R50+B/16",
    overrides=dict(width=64, depth=1, num_heads=2, mlp_dim=32, resnet_stages=(1, 2, 1)),
    size=32,
)
EXACT = dict(
    name="testing", overrides=dict(patch_size=8, gelu="exact", layer_norm_eps=1e-12), size=32
)
CASES = [
    pytest.param(TINY, 48, id="tiny"),
    pytest.param(EXACT, 48, id="exact_gelu_eps_1e-12"),
    pytest.param(GAP, 40, id="gap_prelogits"),
    pytest.param(TI16, 192, id="Ti16", marks=pytest.mark.slow),
]


def _exported(case, res, tmp_path, fmt, suffix):
    """(output, resolution, expected logits of images) at the native resolution and `res`:
    the expected ones are the float64 NumPy reference's, position embeddings resized by
    its own zoom, with the model's numerics (recorded in the .npz converted)."""
    model, params, size = make(case, quiet=True)
    src = tmp_path / "src.npz"
    weights.save_npz(src, params, Meta.of_model(model))
    for r in (size, res):  # native, then a resolution change
        out = tmp_path / f"m{r}{suffix}"
        convert.convert(src, fmt, out, image_size=r)
        yield out, r, lambda x: reference_logits(model, params, x)


@pytest.mark.parametrize(
    "case, res", [*CASES, pytest.param(HYBRID, 48, id="hybrid"), pytest.param(R50, 64, id="r50")]
)
def test_onnx_export_runs_in_onnxruntime(case, res, tmp_path):
    ort = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnx")
    for out, r, ours in _exported(case, res, tmp_path, "onnx", ".onnx"):
        session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
        for n in (1, 3):  # the batch dimension is dynamic
            x = images(r, n=n, seed=n)
            (got,) = session.run(["logits"], {"images": x})
            np.testing.assert_allclose(got, ours(x), atol=FIDELITY_ATOL, rtol=0)


def test_onnx_weights_over_the_limit_go_to_a_data_file(tmp_path):
    """ViT-H/14's 2.5 GB do not fit one protobuf: the same path, with the limit at 0."""
    ort = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnx")
    model, params, size = make(TINY)
    out = tmp_path / "m.onnx"
    onnx_export.export_onnx(params, model, (size, size), str(out), external_above=0)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx", "m.onnx.data"]
    weights = sum(np.asarray(v).nbytes for v in jax.tree.leaves(params))
    # Tensors under 1 KB (biases, norms, shapes) stay in the graph; the data file has the rest.
    data = (tmp_path / "m.onnx.data").stat().st_size
    assert out.stat().st_size < weights / 4 and 0.9 * weights < data <= weights
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    x = images(size, n=2)
    (got,) = session.run(["logits"], {"images": x})
    np.testing.assert_allclose(got, logits(model, params, x), atol=FIDELITY_ATOL, rtol=0)


def test_a_directory_output_is_built_whole_or_not_at_all(tmp_path):
    out = tmp_path / "out"
    with files.atomic_dir(out) as tmp:
        assert tmp.parent == tmp_path and not out.exists()  # built beside, renamed at the end
        (tmp / "a.txt").write_text("a")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    assert (out / "a.txt").read_text() == "a"
    with pytest.raises(FileExistsError, match="exists and is not an empty directory"):
        with files.atomic_dir(out):
            pass
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(RuntimeError), files.atomic_dir(empty) as tmp:
        (tmp / "half").write_text("x")
        raise RuntimeError("killed")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty", "out"]  # nothing left
    assert list(empty.iterdir()) == []
    with files.atomic_dir(empty) as tmp:  # an empty directory is replaced
        (tmp / "b.txt").write_text("b")
    assert [p.name for p in empty.iterdir()] == ["b.txt"]


@pytest.mark.parametrize("fmt", ["hf", "onnx"])
def test_every_directory_export_keeps_an_existing_output(tmp_path, fmt):
    model, params, size = make(TINY)
    out = tmp_path / "taken"
    out.mkdir()
    (out / "mine.txt").write_text("keep")
    with pytest.raises(FileExistsError, match=f"{out} exists and is not an empty directory"):
        if fmt == "hf":
            hf.write_dir(out, {}, {})
        else:
            pytest.importorskip("onnx")
            onnx_export.export_onnx(params, model, (size, size), str(out))
    assert [p.name for p in out.iterdir()] == ["mine.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["taken"]


def test_an_output_in_a_missing_directory_names_that_directory(tmp_path):
    missing = tmp_path / "no" / "such"
    want = f"cannot write {missing}/m.npz: its directory {missing} does not exist"
    with pytest.raises(FileNotFoundError) as error:
        with files.atomic_write(missing / "m.npz") as f:
            f.write(b"x")
    assert str(error.value) == want  # not the hidden m.npz.tmp
    with pytest.raises(FileNotFoundError, match=f"its directory {missing} does not exist"):
        with files.atomic_dir(missing / "hf"):
            pass
    assert list(tmp_path.iterdir()) == []
