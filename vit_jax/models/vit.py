"""VisionTransformer: [hybrid stem] -> patches -> (+cls) -> encoder -> pool -> head.

Images come as an array [B, H, W, C], or as NaFlex patches, each image at its own shape
(models/naflex.py): the same parameters compute both."""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from vit_jax.models import naflex, resnet
from vit_jax.models.layers import GELUS, BlockOptions, Encoder, MAPHead
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
        bias = self.param("bias", nn.initializers.zeros, (self.features,), self.param_dtype)
        if x.ndim == 4:
            b, h, w, c = x.shape
            x = x.reshape(b, h // p, p, w // p, p, c).transpose(0, 1, 3, 2, 4, 5)
            x = x.reshape(b, h // p, w // p, p * p * c)  # [B, gh, gw, P*P*C]
        k = kernel.reshape(p * p * c, self.features).astype(self.dtype)
        return jnp.dot(x.astype(self.dtype), k) + bias.astype(self.dtype)  # [B, gh, gw, D]


class VisionTransformer(nn.Module):
    """The Vision Transformer of Dosovitskiy et al. (2020) and its ResNet hybrids.

    ``apply({'params': p}, images, train=False)`` maps NHWC images in [-1, 1] to logits
    [B, K] ([B, N, K] for classifier='unpooled'). Dropout and stochastic depth need a
    'dropout' rng only with ``train=True``. With ``mutable=['intermediates']`` the model
    also hands back 'representation' (the pre-logits features), each block's 'output'
    and 'attention' probabilities (see ``vit_jax.models.apply_with_intermediates``).

    Attributes:
      num_classes: head width; None or 0 for no head (returns the representation).
      patch_size: patch side on the input (or on the stem's feature map for hybrids).
      width, depth, num_heads, mlp_dim: the transformer's size.
      resnet_stages: None for a plain ViT; stage depths of the hybrid stem (() = root only).
      classifier: 'token' (class token), 'gap' (mean of tokens, no class token), 'map'
        (big_vision's attention pooling, no class token), 'unpooled' (no pooling, no class
        token: per-token outputs).
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
        with) or 'exact' (erf, PyTorch's default, so timm's and most of the hub's).
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

    @property
    def token_stride(self) -> int:
        """Input pixels per token side: the patch size times the stem's downsampling."""
        if self.resnet_stages is None:
            return self.patch_size
        return self.patch_size * 4 * 2 ** max(len(self.resnet_stages) - 1, 0)

    @property
    def block_options(self) -> BlockOptions:
        """The fields every encoder block computes with, handed down whole."""
        return BlockOptions(
            mlp_dim=self.mlp_dim,
            num_heads=self.num_heads,
            dropout=self.dropout,
            attention_dropout=self.attention_dropout,
            gelu=self.gelu,
            layer_norm_eps=float(self.layer_norm_eps),
            dtype=self.dtype,
            param_dtype=self.param_dtype,
            lora=self.lora,
            attention=self.attention,
        )

    @property
    def patch_dim(self) -> int:
        """Values in a NaFlex patch: P*P*C."""
        return self.patch_size * self.patch_size * self.channels

    @property
    def has_class_token(self) -> bool:
        return self.classifier == "token"

    def grid(self, image_size: tuple[int, int]) -> tuple[int, int]:
        """Patch grid (gh, gw) for an image of (H, W) pixels."""
        return image_size[0] // self.token_stride, image_size[1] // self.token_stride

    @nn.compact
    def __call__(self, images: jax.Array | dict, *, train: bool = False) -> jax.Array:
        self._check(images)
        dtypes = dict(dtype=self.dtype, param_dtype=self.param_dtype)
        embed = PatchEmbedding(self.width, self.patch_size, name="embedding", **dtypes)
        t = self._tokens(embed, images)  # t.x [B, N, D]: the one path from here on
        b, _, d = t.x.shape
        if self.has_class_token:
            cls = self.param("cls", nn.initializers.zeros, (1, 1, d), self.param_dtype)
            t = t.with_prefix(jnp.tile(cls, (b, 1, 1)))  # [B, 1+N, D]
        x = Encoder(
            self.block_options,
            self.depth,
            posemb=self.posemb,
            posemb_grid=self.posemb_grid,
            stochastic_depth=self.stochastic_depth,
            remat=self.remat,
            scan=self.scan,
            train=train,
            name="Transformer",
        )(t)
        if self.classifier == "token":
            x = x[:, 0]  # [B, D]
        elif self.classifier == "gap" and t.mask is None:
            x = jnp.mean(x, axis=1)  # [B, D]
        elif self.classifier == "gap":  # the mean of the patches, not of the padding
            valid = t.mask.valid
            x = (x * valid[..., None]).sum(1) / jnp.maximum(valid.sum(1), 1)[:, None]
        elif self.classifier == "map":
            x = MAPHead(self.block_options, name="MAPHead_0")(x, t.mask)  # [B, D]
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
        if self.classifier not in CLASSIFIERS:
            raise ValueError(f"unknown classifier {self.classifier!r}: use one of {CLASSIFIERS}")
        if self.posemb not in KINDS:
            raise ValueError(f"unknown posemb {self.posemb!r}: use one of {KINDS}")
        if self.gelu not in GELUS:
            raise ValueError(f"unknown gelu {self.gelu!r}: use one of {GELUS}")
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
