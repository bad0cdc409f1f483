"""big_vision's NaFlex image towers (SigLIP 2's layout, written here with random arrays: no
real file is reachable from CI) load by path, compute the NaFlex equations as an
independent NumPy reading of them does, fine-tune with a fresh head, and export where the
format can hold a MAP head (npz, timm) or are refused in one line (Hugging Face, ONNX)."""

import numpy as np
import pytest
from format_helpers import run_in_timm
from helpers import FIDELITY_ATOL, images, run_command

from vit_jax import convert as convert_command
from vit_jax import weights
from vit_jax.models import apply_with_intermediates, get_model, naflex
from vit_jax.weights import convert, read

D, DEPTH, HEADS, MLP, P, TABLE = 32, 2, 4, 64, 4, 6  # width, blocks, heads, MLP, patch, n x n
SIZES = dict(width=D, depth=DEPTH, num_heads=HEADS, mlp_dim=MLP, patch_size=P)
UNREAD = "the image tower img/ (b, t, txt not read)"


# ------------------------------------------------------------------ a tower in big_vision's layout


def _array(rng, key: str, shape: tuple) -> np.ndarray:
    """Random float32: kernels scaled by 1/sqrt(fan-in), norm scales around 1, the rest N(0, .3)."""
    if key.endswith("kernel"):
        fan_in = np.prod(shape[:-1]) if key.endswith("out/kernel") else shape[0]
        return (rng.normal(0, 1, shape) / np.sqrt(fan_in)).astype(np.float32)
    if key.endswith("scale"):
        return (1 + 0.2 * rng.normal(0, 1, shape)).astype(np.float32)
    return (0.3 * rng.normal(0, 1, shape)).astype(np.float32)


def _block_shapes(prefix: str, norms: tuple[str, ...]) -> dict[str, tuple]:
    """An attention, its norms and an MLP under `prefix` (a block, or the MAP head)."""
    att, hd = prefix + "MultiHeadDotProductAttention_0/", D // HEADS
    shapes = {f"{att}{n}/kernel": (D, HEADS, hd) for n in ("query", "key", "value")}
    shapes |= {f"{att}{n}/bias": (HEADS, hd) for n in ("query", "key", "value")}
    shapes |= {att + "out/kernel": (HEADS, hd, D), att + "out/bias": (D,)}
    shapes |= {f"{prefix}{n}/{leaf}": (D,) for n in norms for leaf in ("scale", "bias")}
    mlp = prefix + "MlpBlock_0/"
    shapes |= {mlp + "Dense_0/kernel": (D, MLP), mlp + "Dense_0/bias": (MLP,)}
    return shapes | {mlp + "Dense_1/kernel": (MLP, D), mlp + "Dense_1/bias": (D,)}


def tower(seed: int = 0) -> dict[str, np.ndarray]:
    """A NaFlex image tower as big_vision's naflex_vit names it (per-block, its numbering)."""
    shapes = {
        "embedding/kernel": (P * P * 3, D),
        "embedding/bias": (D,),
        "pos_embedding": (TABLE, TABLE, D),
        "Transformer/encoder_norm/scale": (D,),
        "Transformer/encoder_norm/bias": (D,),
        "MAPHead_0/probe": (1, 1, D),
        **_block_shapes("MAPHead_0/", ("LayerNorm_0",)),
    }
    for i in range(DEPTH):
        shapes |= _block_shapes(f"Transformer/encoderblock_{i}/", ("LayerNorm_0", "LayerNorm_1"))
    rng = np.random.default_rng(seed)
    return {k: _array(rng, k, s) for k, s in sorted(shapes.items())}


def write_siglip(path, img: dict, prefix: str = "params/", scan: bool = True) -> None:
    """`img` as a released SigLIP 2 file holds it: under {prefix}img/ (blocks stacked under
    Transformer/encoderblock/ with `scan`), beside a text tower and the scalars t and b."""
    if scan:
        blocks = [{k: v for k, v in img.items() if f"encoderblock_{i}/" in k} for i in range(DEPTH)]
        img = {k: v for k, v in img.items() if "encoderblock_" not in k}
        for k in blocks[0]:
            rest = k.split("encoderblock_0/")[1]
            layers = [b[f"Transformer/encoderblock_{i}/{rest}"] for i, b in enumerate(blocks)]
            img[f"Transformer/encoderblock/{rest}"] = np.stack(layers)
    txt = {"Embed_0/embedding": np.ones((10, 8), np.float32), "head/kernel": np.ones((8, 4))}
    arrays = {f"{prefix}img/{k}": v for k, v in img.items()}
    arrays |= {f"{prefix}txt/{k}": v for k, v in txt.items()}
    arrays |= {f"{prefix}t": np.array([2.3]), f"{prefix}b": np.array([-10.0])}
    np.savez(path, **arrays)


# ------------------------------------------------------------------ the NaFlex equations in NumPy


def _ln(x, t, name):
    mean, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + 1e-6) * t[name + "/scale"] + t[name + "/bias"]


def _mlp(x, t, name):
    h = x @ t[name + "/Dense_0/kernel"] + t[name + "/Dense_0/bias"]
    h = 0.5 * h * (1 + np.tanh(np.sqrt(2 / np.pi) * (h + 0.044715 * h**3)))  # tanh GELU
    return h @ t[name + "/Dense_1/kernel"] + t[name + "/Dense_1/bias"]


def _attend(q_in, kv_in, valid, t, name):
    """Multi-head attention of q_in [Q, D] over the valid rows of kv_in [N, D]."""
    q, k, v = (
        np.einsum("nd,dhk->nhk", x, t[f"{name}/{n}/kernel"]) + t[f"{name}/{n}/bias"]
        for x, n in ((q_in, "query"), (kv_in, "key"), (kv_in, "value"))
    )
    logits = np.einsum("qhk,nhk->hqn", q, k) / np.sqrt(q.shape[-1])
    logits = np.where(valid[None, None, :], logits, -np.inf)  # padding: weight exactly 0
    a = np.exp(logits - logits.max(-1, keepdims=True))
    a /= a.sum(-1, keepdims=True)
    y = np.einsum("hqn,nhk->qhk", a, v)
    return np.einsum("qhk,hkd->qd", y, t[name + "/out/kernel"]) + t[name + "/out/bias"]


def _resize(m: int, n: int) -> np.ndarray:
    """[m, n]: jax.image.scale_and_translate's bilinear antialiased weights from n to m."""
    scale = m / n
    at = (np.arange(m) + 0.5) / scale - 0.5  # each output's sample point on the input
    w = np.maximum(0, 1 - np.abs(at[:, None] - np.arange(n)[None]) / max(1 / scale, 1))
    w = w / w.sum(1, keepdims=True)
    return np.where(((at >= -0.5) & (at <= n - 0.5))[:, None], w, 0)


def reference_features(t: dict, batch: dict) -> np.ndarray:
    """The pooled features [B, D] of a NaFlex tower `t` (big_vision's names, float64)."""
    t = {k: np.asarray(v, np.float64) for k, v in t.items()}
    out = []
    for patches, coords, valid in zip(
        batch["patches"], batch["coords"], batch["valid"], strict=True
    ):
        gh, gw = coords[valid].max(0) + 1
        table = np.einsum(
            "ij,kl,jld->ikd", _resize(gh, TABLE), _resize(gw, TABLE), t["pos_embedding"]
        )
        x = patches @ t["embedding/kernel"] + t["embedding/bias"]
        x = x + np.where(valid[:, None], table[coords[:, 0], coords[:, 1]], 0)  # pads: none
        for i in range(DEPTH):
            b = f"Transformer/encoderblock_{i}/"
            y = _ln(x, t, b + "LayerNorm_0")
            x = x + _attend(y, y, valid, t, b + "MultiHeadDotProductAttention_0")
            x = x + _mlp(_ln(x, t, b + "LayerNorm_1"), t, b + "MlpBlock_0")
        x = _ln(x, t, "Transformer/encoder_norm")
        y = _attend(
            t["MAPHead_0/probe"][0], x, valid, t, "MAPHead_0/MultiHeadDotProductAttention_0"
        )
        out.append((y + _mlp(_ln(y, t, "MAPHead_0/LayerNorm_0"), t, "MAPHead_0/MlpBlock_0"))[0])
    return np.stack(out)


def naflex_batch(seed: int = 0) -> dict:
    """Two images at their own non-square grids (3 x 8: wider than the table; 5 x 2), padded
    to 28 patches; the padding holds large noise, which must change nothing."""
    rng = np.random.default_rng(seed)
    rows = [
        naflex.patchify(images(s, n=1, seed=i), P, 28) for i, s in enumerate([(12, 32), (20, 8)])
    ]
    batch = {k: np.concatenate([r[k] for r in rows]) for k in naflex.KEYS}
    pads = ~batch["valid"]
    batch["patches"][pads] = 100 * rng.normal(size=(pads.sum(), P * P * 3))
    return batch


# ------------------------------------------------------------------ tests


@pytest.mark.parametrize(
    "prefix, scan, plain",
    [("params/", True, False), ("", False, False), ("params/", True, True)],
    ids=["params_scan", "img", "plain_siglip"],
)
def test_a_siglip_file_loads_its_image_tower_as_a_map_model(prefix, scan, plain, tmp_path):
    """NaFlex towers scanned under params/img/ and per-block under img/; a plain SigLIP
    tower (big_vision's vit.py: a conv kernel [P, P, 3, D], a table [1, n*n, D]) alike."""
    t = tower()
    stored = dict(t)
    if plain:
        stored["embedding/kernel"] = t["embedding/kernel"].reshape(P, P, 3, D)
        stored["pos_embedding"] = t["pos_embedding"].reshape(1, TABLE * TABLE, D)
    write_siglip(tmp_path / "siglip2.npz", stored, prefix, scan)
    model, params, size = weights.load_model(tmp_path / "siglip2.npz")
    assert (model.classifier, model.num_classes, model.posemb, size) == (
        "map",
        None,
        "learned",
        (24, 24),
    )
    assert (model.width, model.depth, model.num_heads, model.mlp_dim, model.patch_size) == (
        D, DEPTH, HEADS, MLP, P)  # fmt: skip
    np.testing.assert_array_equal(
        params["embedding"]["kernel"], t["embedding/kernel"].reshape(P, P, 3, D)
    )
    pe = params["Transformer"]["posembed_input"]["pos_embedding"]
    np.testing.assert_array_equal(pe, t["pos_embedding"].reshape(1, TABLE * TABLE, D))
    att = params["Transformer"]["encoderblock_1"]["MultiHeadDotProductAttention_1"]
    want = t["Transformer/encoderblock_1/MultiHeadDotProductAttention_0/value/kernel"]
    np.testing.assert_array_equal(att["value"]["kernel"], want)
    np.testing.assert_array_equal(params["MAPHead_0"]["probe"], t["MAPHead_0/probe"])
    assert read.read_source(tmp_path / "siglip2.npz").unread == (UNREAD,)
    assert weights.read_checkpoint(tmp_path / "siglip2.npz").keys() == params.keys()  # no txt


def test_pooled_features_are_the_naflex_equations(tmp_path):
    t = tower(seed=1)
    write_siglip(tmp_path / "siglip2.npz", t)
    model, params, _ = weights.load_model(tmp_path / "siglip2.npz", head=False)
    batch = naflex_batch()
    np.testing.assert_array_equal(naflex.grids(batch), [[3, 8], [5, 2]])
    got = np.asarray(apply_with_intermediates(model, params, batch)[1]["pre_logits"])
    want = reference_features(t, batch)
    assert (
        got.shape == (2, D) and np.abs(want).max() > 0.5 and np.abs(want[0] - want[1]).max() > 0.1
    )
    np.testing.assert_allclose(got, want, atol=FIDELITY_ATOL, rtol=0)


def test_fine_tuning_gets_a_zero_head_and_says_what_was_not_read(tmp_path):
    t = tower()
    write_siglip(tmp_path / "siglip2.npz", t)
    model = get_model(None, 10, classifier="map", **SIZES)
    said = []
    params = weights.load_pretrained(tmp_path / "siglip2.npz", model, 32, said=said)
    assert said == [UNREAD, "position embeddings (1, 36, 32) -> (1, 64, 32)",
                    "a new zero-initialised head for 10 classes"]  # fmt: skip
    np.testing.assert_array_equal(params["head"]["kernel"], np.zeros((D, 10)))
    np.testing.assert_array_equal(params["head"]["bias"], np.zeros(10))
    mlp = params["MAPHead_0"]["MlpBlock_0"]["Dense_1"]["kernel"]
    np.testing.assert_array_equal(mlp, t["MAPHead_0/MlpBlock_0/Dense_1/kernel"])
    logits = model.apply({"params": params}, images(32, n=2))
    np.testing.assert_array_equal(logits, np.zeros((2, 10)))  # a zero head, not a random one


@pytest.mark.parametrize(
    "fmt, why", [("hf", "transformers' ViT has none"), ("onnx", "no MAP head")]
)
def test_exports_that_cannot_hold_a_map_head_are_refused_in_one_line(fmt, why, capsys, tmp_path):
    write_siglip(tmp_path / "siglip2.npz", tower())
    capsys.readouterr()
    out = tmp_path / "out"
    code = run_command(
        convert_command,
        f"--checkpoint={tmp_path / 'siglip2.npz'}",
        f"--format={fmt}",
        f"--out={out}",
    )
    err = capsys.readouterr().err
    line = err.splitlines()[0]  # then the commands' hint: VIT_JAX_DEBUG=1 for a traceback
    assert code == 1 and line.startswith("error: ") and "VIT_JAX_DEBUG" in err[len(line) :], err
    assert "MAP head" in line and why in line and "--format=timm" in line, err
    assert not list(tmp_path.glob("out*"))


def test_npz_and_timm_exports_keep_the_map_head(tmp_path):
    """Written as npz and as timm's VisionTransformer(global_pool='map'), the tower reads back
    bit for bit, and real timm computes its pooled features (square images at the table's
    grid, where the NaFlex and square paths are one function)."""
    write_siglip(tmp_path / "siglip2.npz", tower(seed=2))
    model, params, size = weights.load_model(tmp_path / "siglip2.npz")
    for fmt, out in (("npz", "m.npz"), ("timm", "m.safetensors")):
        done = convert.convert(tmp_path / "siglip2.npz", fmt, tmp_path / out)
        m, p, s = weights.load_model(tmp_path / out)
        assert (m.classifier, s) == ("map", size)
        np.testing.assert_equal(p, params)
    assert "global_pool='map'" in done.how_to_load and "class_token=False" in done.how_to_load
    pytest.importorskip("timm")
    x = images(24, n=3)
    np.save(tmp_path / "x.npy", x)
    (theirs,) = run_in_timm(
        [dict(recipe=done.how_to_load, images=str(tmp_path / "x.npy"))], tmp_path
    )
    ours = np.asarray(apply_with_intermediates(model, params, x)[1]["pre_logits"])
    np.testing.assert_allclose(theirs, ours, atol=FIDELITY_ATOL, rtol=0)
    assert np.abs(ours).max() > 0.5
