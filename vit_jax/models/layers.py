"""Transformer encoder: attention, MLP, pre-LN block, and the stack of blocks.

Module names are the published checkpoint's (older Flax numbered all submodules of a
module with one counter: LayerNorm_0, MultiHeadDotProductAttention_1, LayerNorm_2,
MlpBlock_3), so parameters load without renaming. ``remat`` and ``scan`` change how
the stack is computed, not what it computes; ``scan`` stacks the blocks' parameters
under ``encoderblock`` with a leading depth axis, which ``vit_jax.weights``
converts to and from the published per-block names.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from vit_jax.models import attention, rope
from vit_jax.models.lora import Lora, adapted
from vit_jax.models.posemb import PositionEmbedding
from vit_jax.models.tokens import Tokens

Dtype = Any
xavier = nn.initializers.xavier_uniform()
tiny_normal = nn.initializers.normal(stddev=1e-6)


# the tanh approximation (the original ViT's), erf, or OpenAI CLIP's x·σ(1.702x)
GELUS = ("tanh", "exact", "quick")
QKV_BIASES = ("qkv", "qv", "")  # which of the query, key and value projections have a bias


def gelu(x: jax.Array, form: str) -> jax.Array:
    """GELU in one of GELUS."""
    if form == "quick":
        return x * jax.nn.sigmoid(1.702 * x)
    return nn.gelu(x, approximate=form == "tanh")


@dataclasses.dataclass(frozen=True)
class BlockOptions:
    """What every encoder block computes with: the VisionTransformer's fields, handed down
    whole (`VisionTransformer.block_options`) rather than re-declared by each module."""

    mlp_dim: int
    num_heads: int
    gelu: str  # one of GELUS
    layer_norm_eps: float
    dropout: float = 0.0
    attention_dropout: float = 0.0
    dtype: Dtype = jnp.float32
    param_dtype: Dtype = jnp.float32
    lora: Lora | None = None  # low-rank adapters on some of the Dense modules (lora.py)
    attention: str = "auto"  # how softmax(q kᵀ) v is computed: one of attention.CHOICES
    # The towers' deltas (VisionTransformer's docstring names their sources):
    swiglu: bool = False  # silu(gate(x)) * Dense_0(x) instead of gelu(Dense_0(x))
    mlp_norm: bool = False  # a LayerNorm on the MLP's hidden layer (EVA-02)
    attention_norm: bool = False  # a LayerNorm on the heads' output (EVA-02 CLIP)
    qkv_bias: str = "qkv"  # one of QKV_BIASES
    layer_scale: float | None = None  # LayerScale's initial value; None: none
    rope: str | None = None  # rotary embeddings, one of rope.KINDS

    @property
    def dtypes(self) -> dict[str, Dtype]:
        """The compute and storage dtypes, as every Flax layer takes them."""
        return dict(dtype=self.dtype, param_dtype=self.param_dtype)


class MlpBlock(nn.Module):
    """Dense -> GELU -> Dense, with dropout after each. `opts.gelu`: 'tanh' (the original
    ViT's approximation, jax.nn.gelu(approximate=True)) or 'exact' (erf: PyTorch's
    nn.GELU(), timm's and transformers' 'gelu')."""

    opts: BlockOptions
    train: bool = False

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:  # [B, N, D]
        o = self.opts
        dense = lambda n, name: nn.Dense(
            n, kernel_init=xavier, bias_init=tiny_normal, name=name, **o.dtypes
        )
        d = x.shape[-1]
        h = adapted(self, "Dense_0", dense(o.mlp_dim, "Dense_0"), x)  # [B, N, F]
        if o.swiglu:  # SwiGLU: the gate's SiLU times Dense_0
            h = nn.silu(adapted(self, "gate", dense(o.mlp_dim, "gate"), x)) * h
        else:
            h = gelu(h, o.gelu)
        h = nn.Dropout(o.dropout)(h, deterministic=not self.train)
        if o.mlp_norm:
            h = nn.LayerNorm(epsilon=o.layer_norm_eps, name="norm", **o.dtypes)(h)
        x = adapted(self, "Dense_1", dense(d, "Dense_1"), h)  # [B, N, D]
        return nn.Dropout(o.dropout)(x, deterministic=not self.train)


class SelfAttention(nn.Module):
    """Multi-head self-attention with the parameter layout of Flax's
    MultiHeadDotProductAttention (query/key/value kernels [D, H, D/H], out [H, D/H, D]).

    Written out so that the attention probabilities can be sown as an intermediate
    (collection 'intermediates', name 'attention', [B, H, N, N]) and the softmax runs
    in float32 whatever the compute dtype; `opts.attention` may run a fused kernel
    instead (attention.py), except where the probabilities are read (intermediates or
    perturbations asked for).
    """

    opts: BlockOptions
    train: bool = False

    @nn.compact
    def __call__(
        self, x: jax.Array, mask: attention.Mask | None = None, theta: jax.Array | None = None
    ) -> jax.Array:
        """x [B, N, D] attends to itself; `mask`: the tokens that count (not padding);
        `theta`: the patches' rotary angles (rope.py), the prefix tokens unrotated."""
        o = self.opts
        q, k, v = project(self, x, x)  # [B, N, H, hd] each
        if theta is not None:
            prefix = x.shape[1] - theta.shape[1]
            q, k = (rope.rotate(a, theta, o.rope, prefix) for a in (q, k))
        how = attention.choose(o.attention, x.shape[1], o.dtype, o.attention_dropout * self.train)
        read = (
            self.is_mutable_collection("intermediates")
            or self.is_mutable_collection("perturbations")
            or self.has_variable("perturbations", "probabilities")
        )
        if how != "xla" and not read:
            return output(self, attention.attend(q, k, v, how, mask), x.shape[-1])
        return output(self, explicit(self, q, k, v, mask), x.shape[-1])


class CrossAttention(nn.Module):
    """MAP's probe [B, 1, D] attending to the tokens [B, N, D] (not to padding), with
    SelfAttention's parameters and maps; always the explicit softmax (one query), and no
    attention dropout (the MAP head never drops out, as big_vision's)."""

    opts: BlockOptions

    @nn.compact
    def __call__(self, probe: jax.Array, x: jax.Array, mask: attention.Mask | None) -> jax.Array:
        q, k, v = project(self, probe, x)
        return output(self, explicit(self, q, k, v, mask), x.shape[-1])  # [B, 1, D]


def project(module: nn.Module, x: jax.Array, kv: jax.Array) -> tuple[jax.Array, ...]:
    """Queries of `x` (scaled by 1/sqrt(hd)), keys and values of `kv`: [B, N, H, hd]."""
    o, d = module.opts, x.shape[-1]
    if d % o.num_heads:
        raise ValueError(f"width {d} is not divisible by num_heads={o.num_heads}")
    hd = d // o.num_heads
    proj = lambda name: nn.DenseGeneral(
        (o.num_heads, hd), use_bias=name[0] in o.qkv_bias, kernel_init=xavier, name=name, **o.dtypes
    )
    q = adapted(module, "query", proj("query"), x) / jnp.sqrt(hd).astype(o.dtype)
    return q, adapted(module, "key", proj("key"), kv), adapted(module, "value", proj("value"), kv)


def explicit(module: nn.Module, q, k, v, mask: attention.Mask | None) -> jax.Array:
    """softmax(q kᵀ) v written out, its probabilities sown and perturbable:
    [B, N, H, hd] in and out."""
    o, train = module.opts, getattr(module, "train", False)
    # Heads first, so that both attention products are plain batched matrix
    # products: XLA:CPU runs the [B, N, H, hd] forms of these einsums ~4x slower.
    q, k, v = (t.transpose(0, 2, 1, 3) for t in (q, k, v))  # [B, H, N, hd]
    logits = jnp.einsum("bhqd,bhkd->bhqk", q, k).astype(jnp.float32)  # [B, H, N, M]
    if mask is not None:  # exp(min - max) is 0: a pad's weight, exactly
        logits = jnp.where(mask.valid[:, None, None, :], logits, jnp.finfo(jnp.float32).min)
    attn = jax.nn.softmax(logits, axis=-1)
    module.sow("intermediates", "attention", attn)
    # + zeros where 'perturbations' is given: the gradient there is the probabilities'
    # (inspection/relevance.py); a no-op otherwise.
    attn = module.perturb("probabilities", attn)
    attn = nn.Dropout(o.attention_dropout)(attn, deterministic=not train)
    attn = attn.astype(o.dtype)
    return jnp.einsum("bhqk,bhkd->bhqd", attn, v).transpose(0, 2, 1, 3)  # [B, N, H, hd]


def output(module: nn.Module, y: jax.Array, d: int) -> jax.Array:  # [B, N, H, hd] -> [B, N, D]
    o = module.opts
    if o.attention_norm:  # one LayerNorm over all heads' features
        axes = dict(reduction_axes=(-2, -1), feature_axes=(-2, -1))
        y = nn.LayerNorm(epsilon=o.layer_norm_eps, name="norm", **axes, **o.dtypes)(y)
    out = nn.DenseGeneral(d, axis=(-2, -1), kernel_init=xavier, name="out", **o.dtypes)
    return adapted(module, "out", out, y, in_axes=2)


def drop_path(module: nn.Module, y: jax.Array, rate: jax.Array | float) -> jax.Array:
    """Stochastic depth: drops a residual branch for whole examples with prob. `rate`."""
    keep = 1.0 - rate
    mask = jax.random.bernoulli(
        module.make_rng("dropout"), keep, (y.shape[0],) + (1,) * (y.ndim - 1)
    )
    return jnp.where(mask, y / keep, 0).astype(y.dtype)


class Encoder1DBlock(nn.Module):
    """Pre-LN block: x + MSA(LN(x)), then x + MLP(LN(x))."""

    opts: BlockOptions
    stochastic_depth: bool = False  # whether `droppath` rates apply (in training)
    train: bool = False

    @nn.compact
    def __call__(
        self,
        x: jax.Array,
        droppath: jax.Array | float = 0.0,
        mask: attention.Mask | None = None,
        theta: jax.Array | None = None,
    ) -> jax.Array:
        o = self.opts  # x [B, N, D]; mask: the tokens others attend to (None: all)
        ln = lambda name: nn.LayerNorm(epsilon=o.layer_norm_eps, name=name, **o.dtypes)
        drop = self.train and self.stochastic_depth

        def residual(x: jax.Array, y: jax.Array, scale: str) -> jax.Array:
            if o.layer_scale is not None:  # LayerScale: a learned gain per feature
                init = nn.initializers.constant(o.layer_scale)
                y = y * self.param(scale, init, (x.shape[-1],), o.param_dtype).astype(y.dtype)
            return x + (drop_path(self, y, droppath) if drop else y)

        y = ln("LayerNorm_0")(x)
        y = SelfAttention(o, self.train, name="MultiHeadDotProductAttention_1")(y, mask, theta)
        x = residual(x, nn.Dropout(o.dropout)(y, deterministic=not self.train), "layer_scale_1")
        y = MlpBlock(o, self.train, name="MlpBlock_3")(ln("LayerNorm_2")(x))
        x = residual(x, y, "layer_scale_2")
        self.sow("intermediates", "output", x)
        return x


class _ScanBlock(Encoder1DBlock):
    """The block as a scan body: (carry, per-layer input) -> (carry, output)."""

    def __call__(self, x, droppath, mask, theta):  # type: ignore[override]
        return super().__call__(x, droppath, mask, theta), None


class Encoder(nn.Module):
    """Position embeddings, [a LayerNorm ('pre_norm')], `depth` blocks, final LayerNorm
    ('encoder_norm'; none where the model normalises the pooled features instead)."""

    opts: BlockOptions
    depth: int
    posemb: str = "learned"
    posemb_grid: tuple[int, int] | None = None  # the stored tables' grid (posemb.py)
    embed_prefix: bool = True  # the prefix tokens have rows in a `learned` table
    pre_norm: bool = False
    final_norm: bool = True
    rope_base: float | None = None  # None: the rope kind's own (rope.BASES)
    rope_grid: tuple[int, int] | None = None  # EVA's reference grid; None: the image's
    stochastic_depth: float = 0.0
    remat: bool = False
    scan: bool = False
    train: bool = False

    @nn.compact
    def __call__(self, t: Tokens) -> jax.Array:  # t.x [B, S, D] -> [B, S, D]
        o = self.opts
        pe = PositionEmbedding(
            self.posemb, self.posemb_grid, o.param_dtype, self.embed_prefix, name="posembed_input"
        )
        x = pe(t).astype(o.dtype)
        x = nn.Dropout(o.dropout)(x, deterministic=not self.train)
        ln = lambda name: nn.LayerNorm(epsilon=o.layer_norm_eps, name=name, **o.dtypes)
        x = ln("pre_norm")(x) if self.pre_norm else x
        theta = None  # the patches' rotary angles, the same in every block
        if o.rope is not None:
            hd = x.shape[-1] // o.num_heads
            theta = rope.angles(t, o.rope, hd, self.rope_base, self.rope_grid)
        # Stochastic depth grows linearly with depth, from 0 at the first block.
        rates = np.linspace(0.0, self.stochastic_depth, self.depth, dtype=np.float32)
        kw = dict(opts=o, stochastic_depth=self.stochastic_depth > 0, train=self.train)
        if self.scan:
            body = nn.remat(_ScanBlock) if self.remat else _ScanBlock
            axes = {"params": 0, "intermediates": 0, "perturbations": 0}  # stacked per block
            stack = nn.scan(
                body,
                variable_axes=axes,
                length=self.depth,
                split_rngs={"params": True, "dropout": True},
                in_axes=(0, nn.broadcast, nn.broadcast),
            )
            x, _ = stack(name="encoderblock", **kw)(x, jnp.asarray(rates), t.mask, theta)
        else:
            block = nn.remat(Encoder1DBlock) if self.remat else Encoder1DBlock
            for i in range(self.depth):
                x = block(name=f"encoderblock_{i}", **kw)(x, float(rates[i]), t.mask, theta)
        return ln("encoder_norm")(x) if self.final_norm else x


class MAPHead(nn.Module):
    """Multihead attention pooling (big_vision's MAPHead, its parameter names): a learned
    probe attends to the tokens (not to padding), then x + MLP(LN(x)).  [B, N, D] -> [B, D]"""

    opts: BlockOptions

    @nn.compact
    def __call__(self, x: jax.Array, mask: attention.Mask | None = None) -> jax.Array:
        o = self.opts
        probe = self.param("probe", xavier, (1, 1, x.shape[-1]), o.param_dtype)
        probe = jnp.tile(probe.astype(x.dtype), (x.shape[0], 1, 1))  # [B, 1, D]
        y = CrossAttention(o, name="MultiHeadDotProductAttention_0")(probe, x, mask)
        z = nn.LayerNorm(epsilon=o.layer_norm_eps, name="LayerNorm_0", **o.dtypes)(y)
        return (y + MlpBlock(o, name="MlpBlock_0")(z))[:, 0]
