"""The ResNet stem of the hybrids: weight-standardised convs, GroupNorm, bottlenecks.

Names are the published ones: conv_root, gn_root, block{s}/unit{u}/{conv1..3,conv_proj,
gn1..3,gn_proj} with stages and units counted from 1.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

Dtype = Any
NHWC = ("NHWC", "HWIO", "NHWC")  # the convolutions' dimension numbers


def standardize(w: jax.Array, eps: float = 1e-5) -> jax.Array:
    """(w - mean) / (std + eps) over the kernel's H, W and input axes."""
    w = w - jnp.mean(w, axis=(0, 1, 2), keepdims=True)
    return w / (jnp.std(w, axis=(0, 1, 2), keepdims=True) + eps)


class StdConv(nn.Module):
    """A bias-free 'SAME' convolution whose stored kernel is standardised at use."""

    features: int
    kernel_size: int
    stride: int = 1
    dtype: Dtype = jnp.float32
    param_dtype: Dtype = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:  # [B, H, W, C] -> [B, H/s, W/s, F]
        shape = (self.kernel_size, self.kernel_size, x.shape[-1], self.features)
        w = self.param("kernel", nn.initializers.lecun_normal(), shape, self.param_dtype)
        w = standardize(w.astype(jnp.float32)).astype(self.dtype)
        return jax.lax.conv_general_dilated(
            x.astype(self.dtype), w, (self.stride, self.stride), "SAME", dimension_numbers=NHWC
        )


def group_norm(name: str, zero: bool = False, **dtypes: Dtype) -> nn.GroupNorm:
    """GroupNorm of 32 groups; `zero`: its scale starts at zero. `dtypes`: dtype, param_dtype."""
    init = nn.initializers.zeros if zero else nn.initializers.ones
    return nn.GroupNorm(num_groups=32, epsilon=1e-6, scale_init=init, name=name, **dtypes)


class ResidualUnit(nn.Module):
    """Bottleneck unit; the stride sits on the 3x3 conv and the projection."""

    features: int  # bottleneck width; the output is 4x wider
    stride: int = 1
    dtype: Dtype = jnp.float32
    param_dtype: Dtype = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        dtypes = dict(dtype=self.dtype, param_dtype=self.param_dtype)
        conv = lambda f, k, s, name: StdConv(f, k, s, name=name, **dtypes)
        gn = lambda name, zero=False: group_norm(name, zero, **dtypes)
        out = self.features * 4
        residual = x
        if x.shape[-1] != out or self.stride != 1:
            residual = gn("gn_proj")(conv(out, 1, self.stride, "conv_proj")(x))
        y = nn.relu(gn("gn1")(conv(self.features, 1, 1, "conv1")(x)))
        y = nn.relu(gn("gn2")(conv(self.features, 3, self.stride, "conv2")(y)))
        y = gn("gn3", zero=True)(conv(out, 1, 1, "conv3")(y))  # the unit starts as identity
        return nn.relu(residual + y)


class ResNetStage(nn.Module):
    """`units` bottleneck units; the first one carries the stage's stride."""

    units: int
    features: int
    stride: int
    dtype: Dtype = jnp.float32
    param_dtype: Dtype = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        dtypes = (self.dtype, self.param_dtype)
        for u in range(self.units):
            stride = self.stride if u == 0 else 1  # the stage's first unit carries it
            x = ResidualUnit(self.features, stride, *dtypes, name=f"unit{u + 1}")(x)
        return x


def stem(
    x: jax.Array,
    stages: tuple[int, ...],
    width: int = 64,
    dtype: Dtype = jnp.float32,
    param_dtype: Dtype = jnp.float32,
) -> jax.Array:
    """Root (conv 7x7/2, GN, ReLU, max-pool 3x3/2) and bottleneck stages.

    Called inside the ViT's compact method, so its modules sit at the top level of
    the parameter tree, as in the published files.
    [B, H, W, C] -> [B, H/4, W/4, 64] (root only) or [B, H/2^(n+1), W/2^(n+1), 256*2^(n-1)].
    """
    x = StdConv(width, 7, 2, dtype, param_dtype, name="conv_root")(x)
    x = nn.relu(group_norm("gn_root", dtype=dtype, param_dtype=param_dtype)(x))
    x = nn.max_pool(x, (3, 3), strides=(2, 2), padding="SAME")
    for s, units in enumerate(stages):
        x = ResNetStage(
            units, width * 2**s, 1 if s == 0 else 2, dtype, param_dtype, name=f"block{s + 1}"
        )(x)
    return x
