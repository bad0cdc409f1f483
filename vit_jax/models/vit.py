"""VisionTransformer: [hybrid stem] -> patches -> (+cls) -> encoder -> pool -> head.

Images come as an array [B, H, W, C], or as NaFlex patches, each image at its own shape
(models/naflex.py): the same parameters compute both."""

from __future__ import annotations

import dataclasses
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from vit_jax.models import naflex, resnet, rope
from vit_jax.models.attention import Mask
from vit_jax.models.layers import GELUS, QKV_BIASES, BlockOptions, Encoder, MAPHead
from vit_jax.models.lora import Lora
from vit_jax.models.posemb import KINDS
from vit_jax.models.tokens import Tokens

CLASSIFIERS = ("token", "gap", "map", "unpooled")
# The original ViT's numerics (the published .npz files were trained with them): the tanh
# GELU and LayerNorm epsilon 1e-6. PyTorch-trained ViTs (timm, transformers) use the exact
# GELU; transformers' ViT defaults to epsilon 1e-12.
ORIGINAL_NUMERICS = {"gelu": "tanh", "layer_norm_eps": 1e-6}


class PatchEmbedding(nn.Module):
    """Linear projection of non-overlapping P x P patches: a conv with kernel = stride = P.

    Computed as one matrix product over flattened patches (the same kernel [P, P, C, D]
    and the same function as the conv, but faster on CPUs, where XLA's strided conv is
    several times slower than its matrix product).
    """

    features: int
    patch_size: int
    use_bias: bool = True
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        """Images [B, H, W, C] -> [B, H/P, W/P, D]; NaFlex's [B, N, P*P*C] -> [B, N, D]."""
        p = self.patch_size
        c = x.shape[-1] // (p * p) if x.ndim == 3 else x.shape[-1]
        kernel = self.param(
            "kernel", nn.initializers.lecun_normal(), (p, p, c, self.features), self.param_dtype
        )
        if x.ndim == 4:
            b, h, w, c = x.shape
            x = x.reshape(b, h // p, p, w // p, p, c).transpose(0, 1, 3, 2, 4, 5)
            x = x.reshape(b, h // p, w // p, p * p * c)  # [B, gh, gw, P*P*C]
        k = kernel.reshape(p * p * c, self.features).astype(self.dtype)
        x = jnp.dot(x.astype(self.dtype), k)  # [B, gh, gw, D]
        if not self.use_bias:  # a LayerNorm follows (pre_norm)
            return x
        bias = self.param("bias", nn.initializers.zeros, (self.features,), self.param_dtype)
        return x + bias.astype(self.dtype)


class VisionTransformer(nn.Module):
    """The Vision Transformer of Dosovitskiy et al. (2020) and its ResNet hybrids.

    ``apply({'params': p}, images, train=False)`` maps NHWC images (in [-1, 1], or
    normalised as a tower's weights expect: `weights.Loaded.preprocessing`) to logits
    [B, K] ([B, N, K] for classifier='unpooled'). Dropout and stochastic depth need a
    'dropout' rng only with ``train=True``. With ``mutable=['intermediates']`` the model
    also hands back 'representation' (the pre-logits features), each block's 'output'
    and 'attention' probabilities (see ``vit_jax.models.apply_with_intermediates``).

    Attributes:
      num_classes: head width; None or 0 for no head (returns the representation).
      patch_size: patch side on the input (or on the stem's feature map for hybrids).
      width, depth, num_heads, mlp_dim: the transformer's size.
      resnet_stages: None for a plain ViT; stage depths of the hybrid stem (() = root only).
      classifier: 'token' (class token), 'gap' (mean of the patches), 'map' (big_vision's
        attention pooling over the patches), 'unpooled' (no pooling: per-patch outputs);
        only 'token' has a class token unless `class_token` says otherwise.
      representation_size: width of the tanh 'pre_logits' layer (None: no such layer).
      posemb: 'learned' | 'none' | 'learned_2d' | 'sincos_2d' (see models/posemb.py).
      dropout, attention_dropout, stochastic_depth: rates (stochastic depth grows
        linearly from 0 at the first block to this rate at the last).
      dtype: compute dtype (e.g. jnp.bfloat16); param_dtype: storage dtype.
      remat: rematerialise each block in the backward pass (less memory, more compute).
      scan: run the blocks with nn.scan (stacked parameters, faster compiles).
      channels: input channels the model is built for.
      head_bias_init: initial value of the head's bias.
      gelu: the MLP's GELU, 'tanh' (the approximation the original ViT was trained
        with), 'exact' (erf, PyTorch's default, so timm's and most of the hub's) or 'quick'
        (OpenAI CLIP's x·σ(1.702x)); unused beside SwiGLU's SiLU.
      layer_norm_eps: the transformer's LayerNorm epsilon (the original's 1e-6; the
        hybrid stem's GroupNorm keeps 1e-6). Imports take both from the source file
        (see vit_jax/weights/meta.py).
      lora: low-rank adapters on some of the blocks' Dense modules (models/lora.py).
      attention: how softmax(q kᵀ) v is computed (models/attention.py): 'xla', 'splash',
        'cudnn', or 'auto' (the platform's fused kernel where it pays, else 'xla').
      posemb_grid: (gh, gw) of the stored position tables, fixed by the model and never by
        a batch: images must make this grid (load_model resizes a table to another), NaFlex
        patches read it resized to each image's. None: the grid of the images applied (the
        paper's, a table per resolution); NaFlex patches then read a stored square table.

    The towers' deltas (docs/formats.md, "Towers"; each default is the paper's; the names
    in brackets are the timm / transformers parameters a field reads):
      class_token: whether a class token leads (None: the classifier's, 'token' only).
      registers: learned register tokens after the class token, dropped before pooling
        (Darcet et al. 2024; DINOv3's storage tokens) [reg_token /
        embeddings.register_tokens]; no position embedding with embed_prefix=False, as
        every tower has them.
      embed_prefix: the class (and register) tokens take rows of the `learned` table, as
        the paper's class row; False: timm's no_embed_class (DeiT III, DINOv2 with
        registers, DINOv3) [pos_embed].
      layer_scale: LayerScale's initial value (Touvron et al. 2021, CaiT; DINOv2/v3):
        a learned gain per feature on each residual branch [ls1.gamma, gamma_1 /
        layer_scale1.lambda1]; None: none.
      pre_norm: a LayerNorm before the blocks, and no patch bias (CLIP's ln_pre)
        [norm_pre / pre_layrnorm].
      fc_norm: the final LayerNorm on the pooled features instead of on the tokens
        (timm's avg pooling, BEiT, EVA-02) [fc_norm].
      swiglu: a SwiGLU MLP, silu(gate(x)) * Dense_0(x) (Shazeer 2020; DINOv2 g, DINOv3
        H+, EVA-02) [mlp.fc1 packed, or fc1_g/fc1_x / gate_proj/up_proj]; mlp_dim is the
        hidden width of each half.
      mlp_norm: a LayerNorm on the MLP's hidden layer (EVA-02's scale_mlp) [mlp.norm].
      attention_norm: a LayerNorm on the heads' output before `out` (EVA-02 CLIP's
        scale_attn_inner) [attn.norm].
      qkv_bias: the projections with a bias, 'qkv', 'qv' (DINOv3 with biases, EVA-02:
        no key bias) [q_bias, v_bias] or '' (DINOv3).
      rope: 2D rotary embeddings on queries and keys, 'dinov3' or 'eva' (models/rope.py;
        with posemb 'none', DINOv3's; with a learned table, EVA-02's); rope_base: its
        base (None: 100 for dinov3, 10000 for eva); rope_grid: EVA's reference grid
        (ref_feat_shape), None: each image's own.
    """

    num_classes: int | None
    patch_size: int
    width: int
    depth: int
    num_heads: int
    mlp_dim: int
    resnet_stages: tuple[int, ...] | None = None
    classifier: str = "token"
    representation_size: int | None = None
    posemb: str = "learned"
    dropout: float = 0.0
    attention_dropout: float = 0.0
    stochastic_depth: float = 0.0
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32
    remat: bool = False
    scan: bool = False
    channels: int = 3
    head_bias_init: float = 0.0
    gelu: str = ORIGINAL_NUMERICS["gelu"]
    layer_norm_eps: float = ORIGINAL_NUMERICS["layer_norm_eps"]
    lora: Lora | None = None
    attention: str = "auto"  # models/attention.py: xla, splash, cudnn, or auto
    posemb_grid: tuple[int, int] | None = None
    class_token: bool | None = None
    registers: int = 0
    embed_prefix: bool = True
    layer_scale: float | None = None
    pre_norm: bool = False
    fc_norm: bool = False
    swiglu: bool = False
    mlp_norm: bool = False
    attention_norm: bool = False
    qkv_bias: str = "qkv"
    rope: str | None = None
    rope_base: float | None = None
    rope_grid: tuple[int, int] | None = None

    @property
    def token_stride(self) -> int:
        """Input pixels per token side: the patch size times the stem's downsampling."""
        if self.resnet_stages is None:
            return self.patch_size
        return self.patch_size * 4 * 2 ** max(len(self.resnet_stages) - 1, 0)

    @property
    def block_options(self) -> BlockOptions:
        """The fields every encoder block computes with (BlockOptions' own, of the same
        names), handed down whole."""
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(BlockOptions)}
        return BlockOptions(**{**fields, "layer_norm_eps": float(self.layer_norm_eps)})

    @property
    def patch_dim(self) -> int:
        """Values in a NaFlex patch: P*P*C."""
        return self.patch_size * self.patch_size * self.channels

    @property
    def has_class_token(self) -> bool:
        return self.classifier == "token" if self.class_token is None else self.class_token

    @property
    def num_prefix(self) -> int:
        """Tokens before the patches: the class token, then the registers."""
        return int(self.has_class_token) + self.registers

    @property
    def posemb_prefix(self) -> int:
        """Rows of a `learned` table before the patches' (the prefix's, or none)."""
        return self.num_prefix if self.embed_prefix else 0

    def grid(self, image_size: tuple[int, int]) -> tuple[int, int]:
        """Patch grid (gh, gw) for an image of (H, W) pixels."""
        return image_size[0] // self.token_stride, image_size[1] // self.token_stride

    @nn.compact
    def __call__(self, images: jax.Array | dict, *, train: bool = False) -> jax.Array:
        self._check(images)
        dtypes = dict(dtype=self.dtype, param_dtype=self.param_dtype)
        embed = PatchEmbedding(
            self.width, self.patch_size, not self.pre_norm, name="embedding", **dtypes
        )
        t = self._tokens(embed, images)  # t.x [B, N, D]: the one path from here on
        b, _, d = t.x.shape
        prefix = []
        if self.has_class_token:
            prefix.append(self.param("cls", nn.initializers.zeros, (1, 1, d), self.param_dtype))
        if self.registers:
            init = nn.initializers.normal(0.02)
            prefix.append(self.param("reg", init, (1, self.registers, d), self.param_dtype))
        if prefix:  # [B, k + N, D]
            t = t.with_prefix(jnp.tile(jnp.concatenate(prefix, axis=1), (b, 1, 1)))
        x = Encoder(
            self.block_options,
            self.depth,
            posemb=self.posemb,
            posemb_grid=self.posemb_grid,
            embed_prefix=self.embed_prefix,
            pre_norm=self.pre_norm,
            final_norm=not self.fc_norm,
            rope_base=self.rope_base,
            rope_grid=self.rope_grid,
            stochastic_depth=self.stochastic_depth,
            remat=self.remat,
            scan=self.scan,
            train=train,
            name="Transformer",
        )(t)
        cls, k = x[:, 0], self.num_prefix
        x, mask = x[:, k:], None if t.mask is None else Mask.of(t.mask.valid[:, k:])  # patches
        if self.classifier == "token":
            x = cls  # [B, D]
        elif self.classifier == "gap" and mask is None:
            x = jnp.mean(x, axis=1)  # [B, D]
        elif self.classifier == "gap":  # the mean of the patches, not of the padding
            valid = mask.valid
            x = (x * valid[..., None]).sum(1) / jnp.maximum(valid.sum(1), 1)[:, None]
        elif self.classifier == "map":
            x = MAPHead(self.block_options, name="MAPHead_0")(x, mask)  # [B, D]
        if self.fc_norm:
            x = nn.LayerNorm(epsilon=self.layer_norm_eps, name="fc_norm", **dtypes)(x)
        if self.representation_size:
            x = nn.tanh(nn.Dense(self.representation_size, name="pre_logits", **dtypes)(x))
        self.sow("intermediates", "representation", x)  # the "pre_logits" features
        if self.num_classes:
            x = nn.Dense(
                self.num_classes,
                kernel_init=nn.initializers.zeros,
                bias_init=nn.initializers.constant(self.head_bias_init),
                name="head",
                **dtypes,
            )(x)
        return x.astype(jnp.float32)

    def _tokens(self, embed: nn.Module, x: jax.Array | dict) -> Tokens:
        """Images [B, H, W, C] (through the hybrid's stem) or NaFlex patches, embedded, with
        their coordinates. NaFlex padding is zeroed here, whatever it holds: finite, and no
        gradient reaches it."""
        if not naflex.is_naflex(x):
            x = x.astype(self.dtype)  # [B, H, W, C]
            if self.resnet_stages is not None:
                dtypes = dict(dtype=self.dtype, param_dtype=self.param_dtype)
                x = resnet.stem(x, tuple(self.resnet_stages), **dtypes)  # [B, H/4.., W/4.., C']
            return Tokens.of_image(embed(x))  # [B, gh, gw, D] in
        valid = jnp.asarray(x["valid"], bool)
        patches = jnp.where(valid[..., None], x["patches"], 0).astype(self.dtype)
        coords = jnp.where(valid[..., None], x["coords"], 0).astype(jnp.int32)
        return Tokens.of_patches(embed(patches), coords, valid)  # [B, N, P*P*C] in

    def _check(self, images: jax.Array | dict) -> None:
        """Errors that name the bad input, before it fails deep inside a reshape."""
        known = dict(classifier=CLASSIFIERS, posemb=KINDS, gelu=GELUS, qkv_bias=QKV_BIASES)
        for field, allowed in known.items():
            if (value := getattr(self, field)) not in allowed:
                raise ValueError(f"unknown {field} {value!r}: use one of {allowed}")
        if self.rope is not None and self.rope not in rope.KINDS:
            raise ValueError(f"unknown rope {self.rope!r}: use one of {rope.KINDS} or None")
        if self.classifier == "token" and not self.has_class_token:
            raise ValueError("classifier='token' pools the class token: leave class_token on")
        if not 0 < self.layer_norm_eps < 1:
            raise ValueError(
                f"layer_norm_eps={self.layer_norm_eps}: expected a small positive number "
                "(the original ViT's is 1e-6)"
            )
        if naflex.is_naflex(images):
            if self.resnet_stages is not None:
                raise ValueError(
                    "NaFlex input is for plain ViTs: a hybrid's tokens come from its ResNet's "
                    "feature map of a whole image; give it images [B, H, W, C]"
                )
            return naflex.check(images, self.patch_dim)
        if images.ndim != 4:
            raise ValueError(
                f"expected images [batch, height, width, channels], got shape "
                f"{images.shape}; add a batch axis for a single image"
            )
        _, h, w, c = images.shape
        if c != self.channels:
            raise ValueError(
                f"images have {c} channels, the model is built for {self.channels}: convert "
                f"them (e.g. grayscale to RGB by repeating the channel), or build the model "
                f"with channels={c} (get_model(..., channels={c}))"
            )
        s = self.token_stride
        if h % s or w % s or h < s or w < s:
            fix = lambda n: max(s, round(n / s) * s)
            raise ValueError(
                f"image size {h}x{w} is not a multiple of the patch size {s} px"
                f"{' (stem downsampling x patch)' if self.resnet_stages is not None else ''}: "
                f"resize or crop to e.g. {fix(h)}x{fix(w)}"
            )
