"""Independent plain-NumPy (float64) forward pass of the Vision Transformer.

Written from Dosovitskiy et al. 2020, "An Image is Worth 16x16 Words", for the
published ``.npz`` checkpoint layout (flat dict, keys joined with ``'/'``).
It covers the plain ViT and its ResNet (BiT-style) hybrids and is used by the
tests to cross-check the JAX/Flax package: everything here is computed in
float64 with no JAX, Flax or Torch.

Only two functions are public: :func:`vit_logits` and :func:`resize_posemb`.
The underscore helpers are building blocks (also exercised by the self-tests).

Numerics (they all matter at the 1e-6 level):
  * LayerNorm: eps 1e-6 (the original's; `layer_norm_eps` sets another), biased variance
    over the last axis.
  * GELU: tanh approximation (the original's), or exact (erf) with gelu='exact'.
  * Attention: logits scaled by 1/sqrt(head_dim), softmax over keys.
  * Hybrid stem: weight-standardised convs (w - mean) / (std + 1e-5), GroupNorm
    with 32 groups and eps 1e-6, TensorFlow 'SAME' padding, max-pool padded
    with -inf.
"""

from __future__ import annotations

import math

import numpy as np
import scipy.ndimage
import scipy.special

LN_EPS = 1e-6
GN_EPS = 1e-6
GN_GROUPS = 32
WS_EPS = 1e-5

Params = dict[str, np.ndarray]


def _get(params: Params, key: str) -> np.ndarray:
    """Fetch a parameter as float64, with a readable error if it is missing."""
    if key not in params:
        raise KeyError(f"missing parameter {key!r}")
    return np.asarray(params[key], dtype=np.float64)


# ----------------------------------------------------------------------------
# Primitives.
# ----------------------------------------------------------------------------


def _same_pads(size: int, k: int, stride: int) -> tuple[int, int]:
    """TensorFlow 'SAME' padding (before, after) for one spatial axis."""
    out = -(-size // stride)  # ceil(size / stride)
    total = max((out - 1) * stride + k - size, 0)
    return total // 2, total - total // 2


def _pad_hw(
    x: np.ndarray, k: tuple[int, int], stride: int, padding: str, value: float
) -> np.ndarray:
    """Pads x [N, H, W, C] on H and W for a k=(kh, kw) window."""
    if padding == "VALID":
        return x
    if padding != "SAME":
        raise ValueError(f"unknown padding {padding!r}")
    ph = _same_pads(x.shape[1], k[0], stride)
    pw = _same_pads(x.shape[2], k[1], stride)
    return np.pad(x, ((0, 0), ph, pw, (0, 0)), constant_values=value)


def _windows(x: np.ndarray, k: tuple[int, int], stride: int) -> np.ndarray:
    """Strided view of all kh x kw windows: [N, H, W, C] -> [N, Ho, Wo, C, kh, kw]."""
    win = np.lib.stride_tricks.sliding_window_view(x, k, axis=(1, 2))
    return win[:, ::stride, ::stride]


def _conv2d(x: np.ndarray, w: np.ndarray, stride: int = 1, padding: str = "SAME") -> np.ndarray:
    """2-D cross-correlation, no bias (as in TF / Flax conv).

    Args:
      x: input [N, H, W, Cin].
      w: kernel [kh, kw, Cin, Cout].
      stride: the same stride on both spatial axes.
      padding: 'SAME' (TensorFlow rule) or 'VALID'.

    Returns:
      [N, Ho, Wo, Cout].
    """
    kh, kw, cin, _ = w.shape
    if x.shape[-1] != cin:
        raise ValueError(f"conv input has {x.shape[-1]} channels, kernel expects {cin}")
    xp = _pad_hw(x, (kh, kw), stride, padding, 0.0)
    win = _windows(xp, (kh, kw), stride)  # [N, Ho, Wo, Cin, kh, kw]
    # Contract (Cin, kh, kw) of the windows with (kh, kw, Cin) of the kernel.
    return np.tensordot(win, w, axes=([4, 5, 3], [0, 1, 2]))  # [N, Ho, Wo, Cout]


def _max_pool(x: np.ndarray, k: int = 3, stride: int = 2) -> np.ndarray:
    """k x k max-pool with 'SAME' padding by -inf: [N, H, W, C] -> [N, Ho, Wo, C]."""
    xp = _pad_hw(x, (k, k), stride, "SAME", -np.inf)
    return _windows(xp, (k, k), stride).max(axis=(4, 5))


def _standardize_weight(w: np.ndarray) -> np.ndarray:
    """Weight standardisation of a [kh, kw, Cin, Cout] kernel, per output channel."""
    w = w - w.mean(axis=(0, 1, 2), keepdims=True)
    return w / (w.std(axis=(0, 1, 2), keepdims=True) + WS_EPS)


def _group_norm(
    x: np.ndarray, scale: np.ndarray, bias: np.ndarray, groups: int = GN_GROUPS, eps: float = GN_EPS
) -> np.ndarray:
    """GroupNorm over (H, W, channels of the group) per example.

    Args:
      x: [N, H, W, C] with C divisible by groups.
      scale: per-channel scale, shape (C,) or (1, 1, 1, C).
      bias: per-channel bias, same shapes as scale.
      groups: number of channel groups.
      eps: added to the biased variance inside the sqrt.

    Returns:
      [N, H, W, C].
    """
    n, h, w, c = x.shape
    g = x.reshape(n, h, w, groups, c // groups)
    mean = g.mean(axis=(1, 2, 4), keepdims=True)
    var = ((g - mean) ** 2).mean(axis=(1, 2, 4), keepdims=True)
    g = (g - mean) / np.sqrt(var + eps)
    return g.reshape(n, h, w, c) * scale.reshape(-1) + bias.reshape(-1)


def _layer_norm(
    x: np.ndarray, scale: np.ndarray, bias: np.ndarray, eps: float = LN_EPS
) -> np.ndarray:
    """LayerNorm over the last axis with biased variance."""
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * scale + bias


def _gelu(x: np.ndarray, form: str = "tanh") -> np.ndarray:
    """GELU: the tanh approximation, or 'exact' x * Phi(x) by erf."""
    if form == "exact":
        return 0.5 * x * (1.0 + scipy.special.erf(x / math.sqrt(2.0)))
    if form != "tanh":
        raise ValueError(f"unknown GELU form {form!r}")
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


def _softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """Numerically stable softmax."""
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def _relu(x: np.ndarray) -> np.ndarray:
    return np.maximum(x, 0.0)


# ----------------------------------------------------------------------------
# ResNet (BiT) stem of the hybrids.
# ----------------------------------------------------------------------------


def _std_conv(params: Params, name: str, x: np.ndarray, stride: int) -> np.ndarray:
    """Weight-standardised conv `name/kernel`, no bias, 'SAME' padding."""
    w = _standardize_weight(_get(params, f"{name}/kernel"))
    return _conv2d(x, w, stride, "SAME")


def _gn(params: Params, name: str, x: np.ndarray) -> np.ndarray:
    """GroupNorm with parameters `name/scale`, `name/bias`."""
    return _group_norm(x, _get(params, f"{name}/scale"), _get(params, f"{name}/bias"))


def _bottleneck_unit(params: Params, prefix: str, x: np.ndarray, stride: int) -> np.ndarray:
    """BiT bottleneck unit (post-activation): [N, H, W, Cin] -> [N, H/s, W/s, 4w]."""
    if f"{prefix}/conv_proj/kernel" in params:
        residual = _gn(
            params, f"{prefix}/gn_proj", _std_conv(params, f"{prefix}/conv_proj", x, stride)
        )
    else:
        residual = x
    y = _relu(_gn(params, f"{prefix}/gn1", _std_conv(params, f"{prefix}/conv1", x, 1)))
    y = _relu(_gn(params, f"{prefix}/gn2", _std_conv(params, f"{prefix}/conv2", y, stride)))
    y = _gn(params, f"{prefix}/gn3", _std_conv(params, f"{prefix}/conv3", y, 1))
    if residual.shape != y.shape:
        raise ValueError(
            f"{prefix}: residual {residual.shape} vs branch {y.shape}; missing conv_proj?"
        )
    return _relu(residual + y)


def _resnet_stem(params: Params, x: np.ndarray, stages: tuple[int, ...]) -> np.ndarray:
    """Root (conv 7x7/2, GN, ReLU, max-pool 3x3/2) then the bottleneck stages."""
    x = _std_conv(params, "conv_root", x, 2)  # [N, H/2, W/2, 64]
    x = _relu(_gn(params, "gn_root", x))
    x = _max_pool(x, 3, 2)  # [N, H/4, W/4, 64]
    for i, depth in enumerate(stages):
        for u in range(depth):
            stride = 2 if (u == 0 and i > 0) else 1
            x = _bottleneck_unit(params, f"block{i + 1}/unit{u + 1}", x, stride)
    return x


# ----------------------------------------------------------------------------
# Transformer.
# ----------------------------------------------------------------------------


def _attention(params: Params, prefix: str, x: np.ndarray, num_heads: int) -> np.ndarray:
    """Multi-head self-attention: [N, L, D] -> [N, L, D]."""
    p = f"{prefix}/MultiHeadDotProductAttention_1"
    wq = _get(params, f"{p}/query/kernel")  # [D, H, dh]
    if wq.shape[1] != num_heads:
        raise ValueError(f"num_heads={num_heads} but query kernel is {wq.shape}")
    q = np.einsum("nld,dhk->nlhk", x, wq) + _get(params, f"{p}/query/bias")  # [N, L, H, dh]
    k = np.einsum("nld,dhk->nlhk", x, _get(params, f"{p}/key/kernel")) + _get(
        params, f"{p}/key/bias"
    )
    v = np.einsum("nld,dhk->nlhk", x, _get(params, f"{p}/value/kernel")) + _get(
        params, f"{p}/value/bias"
    )
    logits = np.einsum("nqhk,nmhk->nhqm", q, k) / math.sqrt(wq.shape[2])  # [N, H, L, L]
    attn = _softmax(logits, axis=-1)
    o = np.einsum("nhqm,nmhk->nqhk", attn, v)  # [N, L, H, dh]
    return np.einsum("nqhk,hkd->nqd", o, _get(params, f"{p}/out/kernel")) + _get(
        params, f"{p}/out/bias"
    )


def _mlp(params: Params, prefix: str, x: np.ndarray, gelu: str = "tanh") -> np.ndarray:
    """Dense -> GELU -> Dense: [N, L, D] -> [N, L, D]."""
    p = f"{prefix}/MlpBlock_3"
    h = _gelu(x @ _get(params, f"{p}/Dense_0/kernel") + _get(params, f"{p}/Dense_0/bias"), gelu)
    return h @ _get(params, f"{p}/Dense_1/kernel") + _get(params, f"{p}/Dense_1/bias")


def _encoder_block(
    params: Params,
    prefix: str,
    x: np.ndarray,
    num_heads: int,
    gelu: str = "tanh",
    eps: float = LN_EPS,
) -> np.ndarray:
    """Pre-LN block: x + MSA(LN0(x)), then + MLP(LN2(.))."""
    ln = lambda name, x: _layer_norm(
        x, _get(params, f"{prefix}/{name}/scale"), _get(params, f"{prefix}/{name}/bias"), eps
    )
    x = x + _attention(params, prefix, ln("LayerNorm_0", x), num_heads)
    return x + _mlp(params, prefix, ln("LayerNorm_2", x), gelu)


def _num_blocks(params: Params) -> int:
    n = 0
    while f"Transformer/encoderblock_{n}/LayerNorm_0/scale" in params:
        n += 1
    return n


def _embed(params: Params, x: np.ndarray, patch_size: int) -> np.ndarray:
    """Patch embedding (conv, kernel = stride = P, VALID): [N, H, W, C] -> [N, gh*gw, D]."""
    w = _get(params, "embedding/kernel")  # [P, P, C, D]
    if w.shape[:2] != (patch_size, patch_size):
        raise ValueError(f"patch_size={patch_size} but embedding kernel is {w.shape}")
    x = _conv2d(x, w, patch_size, "VALID") + _get(params, "embedding/bias")  # [N, gh, gw, D]
    n, gh, gw, d = x.shape
    return x.reshape(n, gh * gw, d)  # row-major over the patch grid


# ----------------------------------------------------------------------------
# Public API.
# ----------------------------------------------------------------------------


def vit_logits(
    params: dict[str, np.ndarray],
    images: np.ndarray,
    *,
    num_heads: int,
    patch_size: int,
    classifier: str = "token",
    resnet_stages: tuple[int, ...] | None = None,
    gelu: str = "tanh",
    layer_norm_eps: float = LN_EPS,
) -> np.ndarray:
    """Float64 reference forward pass of a ViT / ResNet+ViT hybrid.

    Args:
      params: flat dict of the published checkpoint layout, keys joined with '/'.
      images: [N, H, W, C] floats in [-1, 1].
      num_heads: number of attention heads (checked against the kernels).
      patch_size: P of the `embedding` conv (on the stem's map for hybrids).
      classifier: 'token' (class token, needs `cls`) or 'gap' (mean over tokens).
      resnet_stages: None for a plain ViT; for hybrids the depth of each ResNet
        stage (() = root only).
      gelu: 'tanh' (the original ViT's) or 'exact' (erf; PyTorch's nn.GELU).
      layer_norm_eps: the transformer's LayerNorm epsilon (the stem's GroupNorm keeps 1e-6).

    Returns:
      logits [N, K], float64.

    Raises:
      ValueError: on an unknown classifier or inconsistent shapes (e.g. a
        position embedding for another resolution: use `resize_posemb` first).
    """
    x = np.asarray(images, dtype=np.float64)  # [N, H, W, C]
    if resnet_stages is not None:
        x = _resnet_stem(params, x, tuple(resnet_stages))  # [N, H', W', C']
    x = _embed(params, x, patch_size)  # [N, T, D]
    n, _, d = x.shape

    if classifier == "token":
        cls = np.broadcast_to(_get(params, "cls").reshape(1, 1, d), (n, 1, d))
        x = np.concatenate([cls, x], axis=1)  # [N, 1+T, D]
    elif classifier != "gap":
        raise ValueError(f"unknown classifier {classifier!r}")

    pos = _get(params, "Transformer/posembed_input/pos_embedding")  # [1, L, D]
    if pos.shape[1:] != x.shape[1:]:
        raise ValueError(
            f"pos_embedding {pos.shape} does not fit tokens {x.shape}; resize it with resize_posemb"
        )
    x = x + pos

    for i in range(_num_blocks(params)):
        x = _encoder_block(
            params, f"Transformer/encoderblock_{i}", x, num_heads, gelu, layer_norm_eps
        )
    x = _layer_norm(
        x,
        _get(params, "Transformer/encoder_norm/scale"),
        _get(params, "Transformer/encoder_norm/bias"),
        layer_norm_eps,
    )

    x = x[:, 0] if classifier == "token" else x.mean(axis=1)  # [N, D]
    if "pre_logits/kernel" in params:
        x = np.tanh(x @ _get(params, "pre_logits/kernel") + _get(params, "pre_logits/bias"))
    return x @ _get(params, "head/kernel") + _get(params, "head/bias")  # [N, K]


def resize_posemb(
    posemb: np.ndarray, grid: tuple[int, int], has_class_token: bool = True
) -> np.ndarray:
    """Bilinearly resizes a square grid of position embeddings.

    Args:
      posemb: [1, (1 +) gs*gs, D]; the first row is the class token's if
        has_class_token.
      grid: the new grid (gh, gw).
      has_class_token: whether posemb starts with a class-token row (kept as is).

    Returns:
      [1, (1 +) gh*gw, D], float64: the grid resized with
      scipy.ndimage.zoom(grid, (gh/gs, gw/gs, 1), order=1).
    """
    posemb = np.asarray(posemb, dtype=np.float64)
    if has_class_token:
        tok, rows = posemb[:, :1], posemb[0, 1:]  # [1, 1, D], [gs*gs, D]
    else:
        tok, rows = posemb[:, :0], posemb[0]
    gs = int(math.sqrt(len(rows)))
    if gs * gs != len(rows):
        raise ValueError(f"{len(rows)} grid rows do not form a square grid")
    gh, gw = grid
    grid_emb = rows.reshape(gs, gs, -1)  # [gs, gs, D]
    grid_emb = scipy.ndimage.zoom(grid_emb, (gh / gs, gw / gs, 1), order=1)  # [gh, gw, D]
    grid_emb = grid_emb.reshape(1, gh * gw, -1)
    return np.concatenate([tok, grid_emb], axis=1)
