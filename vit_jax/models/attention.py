"""How each block's softmax(q kᵀ) v is computed: the choices of `VisionTransformer.attention`.

  xla     the explicit softmax (layers.explicit), whose [B, H, N, N] probabilities
          inspection reads: inspection always takes this path, whatever the model's choice.
  splash  Pallas' splash attention, the TPU kernel (v4 and newer), in Pallas' interpret
          mode when the compile target is a CPU (slowly: for tests and checks).
  cudnn   cuDNN's fused attention (jax.nn.dot_product_attention) on NVIDIA GPUs, in
          bfloat16 or float16.
  auto    cudnn on GPUs in bfloat16 or float16; splash on TPUs from FUSED_FROM tokens on;
          else xla (on CPUs, always).

Fused kernels never materialise the probabilities. The parameters are the same for every
choice. The compile target is the mesh in context (`parallel.sharding.on_mesh`: the
planner's is a TPU topology compiled for on a CPU host), else this host's first device.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import struct
from jax.sharding import PartitionSpec as P

CHOICES = ("auto", "xla", "splash", "cudnn")
# From here on `auto` takes splash on TPUs: below it the probabilities are small (197 tokens
# at 224 px with /16 stay xla; 577 at 384 px fuse). Set from the planner's bytes, not a time
# (no TPU lent). On GPUs cuDNN paid at every length timed (an H200, bfloat16, the train
# step: 1.19x at 197 tokens, 1.5x at 577; BENCHMARKS.md), so `auto` takes it at any length.
# Near the HBM limit without remat XLA fits more images with its own softmax (it recomputes it).
FUSED_FROM = 512
BLOCK = 128  # splash's sequence block: sequences are padded to a multiple of it
HALF = (jnp.bfloat16, jnp.float16)


def target() -> tuple[str, str]:
    """(platform, device kind) of the compile target: 'tpu', 'TPU v5 lite'; 'cpu', 'cpu'."""
    mesh = jax.sharding.get_abstract_mesh()
    d = jax.devices()[0] if mesh.empty else mesh.abstract_device
    return d.platform, d.device_kind


def choose(choice: str, tokens: int, dtype, dropout: float = 0.0) -> str:
    """What `choice` runs as on the target for a sequence of `tokens`, or ValueError naming
    what the target cannot run and what to use instead."""
    (platform, kind), dtype = target(), jnp.dtype(dtype)
    v3, gpu = kind.startswith("TPU v3"), platform in ("gpu", "cuda")
    if choice == "auto":
        if dropout:
            return "xla"
        if platform == "tpu" and not v3 and tokens >= FUSED_FROM:
            return "splash"
        return "cudnn" if gpu and dtype in HALF else "xla"
    if choice not in CHOICES:
        raise ValueError(f"attention={choice!r}: expected one of {', '.join(CHOICES)}")
    if choice != "xla" and dropout:
        raise ValueError(
            f"attention={choice} has no attention dropout: set "
            "attention_dropout=0, or attention=xla"
        )
    if choice == "cudnn" and not gpu:
        raise ValueError(
            f"attention=cudnn needs an NVIDIA GPU, and there is no GPU here "
            f"({kind}): use attention=xla (or splash on TPUs)"
        )
    if choice == "cudnn" and dtype not in HALF:
        raise ValueError(
            f"attention=cudnn runs in bfloat16 or float16, not {dtype}: set "
            "dtype=bfloat16, or attention=xla"
        )
    if choice == "splash" and (gpu or (v3 and dtype != jnp.float32)):
        instead = "attention=cudnn" if gpu else "attention=xla, or dtype=float32"
        raise ValueError(f"attention=splash does not compile for {kind} in {dtype}: use {instead}")
    return choice


@struct.dataclass
class Mask:
    """Which keys attention may read: one contract for every kernel (None: every token).

    valid         [B, N] True for a real token; padding holds anything and is read by none.
    padding_last  [] bool: whether every row's padding comes after its tokens (computed
                  from `valid` where the tokens are made, never assumed), which lets cuDNN
                  mask by lengths.
    """

    valid: jax.Array
    padding_last: jax.Array

    @classmethod
    def of(cls, valid: jax.Array) -> Mask:
        valid = jnp.asarray(valid, bool)
        return cls(valid, jnp.all(valid[:, :-1] >= valid[:, 1:]))


def attend(q: jax.Array, k: jax.Array, v: jax.Array, how: str, mask: Mask | None) -> jax.Array:
    """Fused softmax(q kᵀ) v, `how` one of 'splash', 'cudnn'. q (pre-scaled), k, v:
    [B, N, H, hd] -> [B, N, H, hd]; padding (`mask`) is attended to by no token."""
    if how == "cudnn":
        return cudnn(q, k, v, mask=mask)
    valid = jnp.ones(q.shape[:2], bool) if mask is None else mask.valid
    fn = functools.partial(splash, interpret=target()[0] != "tpu")
    mesh = jax.sharding.get_abstract_mesh()
    if not mesh.empty:  # XLA does not partition Mosaic kernels: each device runs its share
        batch = P(mesh.axis_names)  # the batch split over every axis, as the activations
        fn = jax.shard_map(fn, mesh=mesh, in_specs=batch, out_specs=batch, check_vma=False)
    return fn(q, k, v, valid)


def padded(m: int, fill: float, *ts: jax.Array):
    """Each [B, N, H, hd] of `ts` (one N) padded along N to `m` with `fill`."""
    widths = ((0, 0), (0, m - ts[0].shape[1]), (0, 0), (0, 0))
    return (jnp.pad(t, widths, constant_values=fill) for t in ts)


def splash(q, k, v, valid=None, *, interpret: bool, fill: float = 0.0):
    """Splash attention on one device, [B, N, H, hd] -> [B, N, H, hd]: the sequence padded
    with `fill` to a multiple of BLOCK (197 -> 256, 577 -> 640), the pad (and NaFlex's,
    valid [B, N] False, wherever it is) set apart by its segment id (no token attends to
    it), and sliced off again."""
    from jax.experimental.pallas.ops.tpu import splash_attention as sa  # noqa: PLC0415

    n, heads = q.shape[1], q.shape[2]
    m = n + -n % BLOCK
    q, k, v = (t.transpose(0, 2, 1, 3) for t in padded(m, fill, q, k, v))  # [B, H, M, hd]
    valid = jnp.ones(q.shape[:1] + (n,), bool) if valid is None else valid
    ids = jnp.pad(~valid, ((0, 0), (0, m - n)), constant_values=True).astype(jnp.int32)
    mask = sa.MultiHeadMask([sa.FullMask((m, m))] * heads)  # ids: 0 a token, 1 a pad
    kernel = sa.make_splash_mha(mask, head_shards=1, q_seq_shards=1, interpret=interpret)
    y = jax.vmap(kernel)(q, k, v, sa.SegmentIds(ids, ids))
    return y.transpose(0, 2, 1, 3)[:, :n]  # [B, N, H, hd]


def cudnn(q, k, v, impl: str = "cudnn", fill=0.0, mask: Mask | None = None):
    """cuDNN's fused attention, [B, N, H, hd] -> [B, N, H, hd]. Its training kernel takes
    even lengths only (JAX 0.11 refuses 197 tokens: "Unsupported sequence length"), so an
    odd sequence gets one pad token with `fill`, masked, and sliced off again.

    Masked by lengths where `mask` says padding comes last (the fast path), else by a
    boolean mask, which JAX turns into a bias: decided in Python on concrete arrays,
    by lax.cond on the device under jit."""
    n = q.shape[1]
    q, k, v = padded(n + n % 2, fill, q, k, v)
    run = functools.partial(jax.nn.dot_product_attention, scale=1.0, implementation=impl)
    if mask is None:
        lengths = jnp.full(q.shape[:1], n, jnp.int32)
        return run(q, k, v, query_seq_lengths=lengths, key_value_seq_lengths=lengths)[:, :n]
    lengths, dense = (functools.partial(f, run) for f in (by_lengths, by_mask))
    if isinstance(mask.padding_last, jax.core.Tracer):
        y = jax.lax.cond(mask.padding_last, lengths, dense, q, k, v, mask.valid)
    else:
        y = (lengths if mask.padding_last else dense)(q, k, v, mask.valid)
    return y[:, :n]


def by_lengths(run, q, k, v, valid):
    """The tokens are each row's first valid.sum(): attention over lengths."""
    n = jnp.maximum(valid.sum(-1, dtype=jnp.int32), 1)  # a row of padding: one key, not 0/0
    return run(q, k, v, query_seq_lengths=n, key_value_seq_lengths=n)


def by_mask(run, q, k, v, valid):
    """Padding anywhere: each key masked by its own flag, as [B, 1, N', N'] (cuDNN refuses
    a bias that is broadcast over the queries: "Bias must have same seq length as QKV")."""
    b, n = q.shape[:2]
    keys = jnp.pad(valid, ((0, 0), (0, n - valid.shape[1])))  # the odd pad: False
    keys = keys | ~keys.any(-1, keepdims=True)  # a row of padding alone: every key, finite
    return run(q, k, v, mask=jnp.broadcast_to(keys[:, None, None, :], (b, 1, n, n)))
