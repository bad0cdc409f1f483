"""The ONNX export: a ViT's graph built from its parameters (opset 17 operators), for
serving outside Python research code. Written out equation by equation, it is exact
(tested with onnxruntime within 1e-4) and needs only the `onnx` package (jax2onnx pins an
older orbax-checkpoint; tf2onnx cannot read jax2tf's output). For TensorFlow Serving or
TFLite, convert the file with onnx2tf (`onnx2tf -i model.onnx`).

The graph is the model's equations written in ONNX's standard operators:
  images [N, H, W, C] -> patches [N, T, P*P*C] (Reshape, Transpose) -> MatMul + bias
  -> [class token (Expand to the batch), +] + position embeddings
  -> blocks: LayerNormalization(the model's eps) -> q, k, v (MatMul) -> softmax(q k^T /
     sqrt(d)) v -> out (MatMul) -> residual; LayerNormalization -> MatMul -> GELU (the
     model's: tanh approximation or exact erf, written out) -> MatMul -> residual
  -> LayerNormalization -> class token or mean -> [tanh pre_logits] -> head: logits [N, K].
Hybrids first run their ResNet stem in NCHW: weight-standardised convs (the kernels
standardised at export) with 'SAME' padding (SAME_UPPER, as XLA pads), GroupNorm(32) as
InstanceNormalization over [N, 32, C/32*H*W], ReLU and a 3x3/2 max-pool; the feature map
then goes through the same patch embedding.
The batch dimension is dynamic (N); H and W are fixed at export (position embeddings
resized to them first). Output is written under a temporary name and renamed when whole.
"""

from __future__ import annotations

import json
import math
from typing import Any

import jax
import numpy as np

from vit_jax.base import files, store
from vit_jax.models import resnet
from vit_jax.models.vit import VisionTransformer

OPSET = 17
# The towers' fields (VisionTransformer's docstring) the graph does not write: each must be
# the paper's, its default.
TOWER_FIELDS = tuple(
    "registers layer_scale pre_norm fc_norm swiglu mlp_norm attention_norm qkv_bias rope "
    "rope_base rope_grid".split()
)
# A protobuf message holds at most 2 GiB: above this many bytes of weights (ViT-H/14 has
# 2.5 GB) they go to a file beside the graph, ONNX's external data.
EXTERNAL_ABOVE = 1_800_000_000


class _Graph:
    """Nodes and initialisers of one graph, with fresh names."""

    def __init__(self, eps: float = 1e-6):
        import onnx
        from onnx import helper, numpy_helper

        self.onnx, self.helper, self.numpy_helper = onnx, helper, numpy_helper
        self.nodes: list[Any] = []
        self.inits: list[Any] = []
        self.eps = float(eps)  # of every LayerNormalization

    def const(self, value: np.ndarray, name: str | None = None) -> str:
        name = name or f"const_{len(self.inits)}"
        self.inits.append(self.numpy_helper.from_array(np.asarray(value), name))
        return name

    def op(self, kind: str, *inputs: str, **attrs: Any) -> str:
        out = f"{kind.lower()}_{len(self.nodes) + 1}"
        self.nodes.append(self.helper.make_node(kind, list(inputs), [out], **attrs))
        return out

    def dense(self, x: str, kernel: np.ndarray, bias: np.ndarray, name: str) -> str:
        k = self.const(kernel.reshape(-1, kernel.shape[-1]) if kernel.ndim > 2 else kernel, name)
        return self.op("Add", self.op("MatMul", x, k), self.const(bias.reshape(-1), name + "_b"))

    def layer_norm(self, x: str, p: dict, name: str) -> str:
        return self.op(
            "LayerNormalization",
            x,
            self.const(p["scale"], name + "_scale"),
            self.const(p["bias"], name + "_bias"),
            axis=-1,
            epsilon=self.eps,
        )


def _gelu(g: _Graph, x: str, tanh: bool) -> str:
    """0.5 x (1 + t), as jax.nn.gelu(approximate=tanh): t = tanh(sqrt(2/pi) (x + 0.044715
    x^3)), or the exact form's t = erf(x / sqrt(2))."""
    f32 = lambda v: g.const(np.array(v, np.float32))
    if tanh:
        cube = g.op("Mul", g.op("Mul", x, x), x)
        inner = g.op("Add", x, g.op("Mul", cube, f32(0.044715)))
        t = g.op("Tanh", g.op("Mul", inner, f32(math.sqrt(2 / math.pi))))
    else:
        t = g.op("Erf", g.op("Mul", x, f32(1 / math.sqrt(2))))
    return g.op("Mul", x, g.op("Mul", g.op("Add", t, f32(1.0)), f32(0.5)))


def _attention(g: _Graph, x: str, p: dict, tokens: int, heads: int, name: str) -> str:
    d = p["query"]["kernel"].shape[0]
    hd = d // heads
    split = g.const(np.array([-1, tokens, heads, hd], np.int64))
    project = lambda n: g.dense(x, p[n]["kernel"].reshape(d, -1), p[n]["bias"], f"{name}_{n}")
    # each [N, T, H, hd]
    q, k, v = (g.op("Reshape", project(n), split) for n in ("query", "key", "value"))
    q = g.op("Div", g.op("Transpose", q, perm=[0, 2, 1, 3]), g.const(np.float32(math.sqrt(hd))))
    logits = g.op("MatMul", q, g.op("Transpose", k, perm=[0, 2, 3, 1]))  # [N, H, T, T]
    y = g.op("MatMul", g.op("Softmax", logits, axis=-1), g.op("Transpose", v, perm=[0, 2, 1, 3]))
    y = g.op("Reshape", g.op("Transpose", y, perm=[0, 2, 1, 3]), g.const(np.array([-1, tokens, d])))
    return g.dense(y, p["out"]["kernel"], p["out"]["bias"], f"{name}_out")


def _std_conv(g: _Graph, x: str, kernel: np.ndarray, stride: int, name: str) -> str:
    """A StdConv: the HWIO kernel standardised by the model's own function, as OIHW."""
    k = kernel.shape[0]
    w = g.const(np.asarray(resnet.standardize(kernel)).transpose(3, 2, 0, 1), name)
    return g.op("Conv", x, w, kernel_shape=[k, k], strides=[stride, stride], auto_pad="SAME_UPPER")


def _group_norm(g: _Graph, x: str, p: dict, name: str, groups: int = 32) -> str:
    """GroupNorm (eps 1e-6) of x [N, C, H, W]: each group normalised as one instance."""
    c = p["scale"].size
    shape = g.op("Shape", x)
    y = g.op("Reshape", x, g.const(np.array([0, groups, -1], np.int64)))
    ones, zeros = np.ones(groups, np.float32), np.zeros(groups, np.float32)
    y = g.op("InstanceNormalization", y, g.const(ones), g.const(zeros), epsilon=1e-6)
    y = g.op("Reshape", y, shape)
    y = g.op("Mul", y, g.const(p["scale"].reshape(c, 1, 1), name + "_scale"))
    return g.op("Add", y, g.const(p["bias"].reshape(c, 1, 1), name + "_bias"))


def _stem(g: _Graph, x: str, tree: dict, stages: tuple[int, ...]) -> str:
    """The hybrids' ResNet stem (models/resnet.py): x [N, C, H, W] -> features NCHW."""
    x = _std_conv(g, x, tree["conv_root"]["kernel"], 2, "conv_root")
    x = g.op("Relu", _group_norm(g, x, tree["gn_root"], "gn_root"))
    x = g.op("MaxPool", x, kernel_shape=[3, 3], strides=[2, 2], auto_pad="SAME_UPPER")
    for s, units in enumerate(stages):
        for u in range(units):
            name = f"block{s + 1}/unit{u + 1}"
            p = tree[f"block{s + 1}"][f"unit{u + 1}"]
            stride = 2 if s > 0 and u == 0 else 1

            def conv_gn(y, conv, gn, stride=1, p=p, name=name):
                y = _std_conv(g, y, p[conv]["kernel"], stride, f"{name}/{conv}")
                return _group_norm(g, y, p[gn], f"{name}/{gn}")

            residual = conv_gn(x, "conv_proj", "gn_proj", stride) if "conv_proj" in p else x
            y = g.op("Relu", conv_gn(x, "conv1", "gn1"))
            y = g.op("Relu", conv_gn(y, "conv2", "gn2", stride))
            x = g.op("Relu", g.op("Add", residual, conv_gn(y, "conv3", "gn3")))
    return x


def _embed(g: _Graph, tree: dict, model: VisionTransformer, size: tuple[int, int]) -> str:
    """images [N, H, W, C] -> tokens [N, T, D] with class token and position embeddings."""
    p, c, dim = model.patch_size, model.channels, model.width
    gh, gw = model.grid(size)
    x = "images"
    if model.resnet_stages is not None:  # NHWC -> stem (NCHW) -> NHWC feature map
        x = _stem(g, g.op("Transpose", x, perm=[0, 3, 1, 2]), tree, tuple(model.resnet_stages))
        x = g.op("Transpose", x, perm=[0, 2, 3, 1])
        c = tree["embedding"]["kernel"].shape[2]
    x = g.op("Reshape", x, g.const(np.array([-1, gh, p, gw, p, c], np.int64)))
    x = g.op("Transpose", x, perm=[0, 1, 3, 2, 4, 5])  # [N, gh, gw, P, P, C]
    x = g.op("Reshape", x, g.const(np.array([-1, gh * gw, p * p * c], np.int64)))
    x = g.dense(x, tree["embedding"]["kernel"], tree["embedding"]["bias"], "embedding")
    if model.has_class_token:
        zero, one = g.const(np.array([0])), g.const(np.array([1]))
        batch = g.op("Slice", g.op("Shape", "images"), zero, one)
        shape = g.op("Concat", batch, g.const(np.array([1, dim], np.int64)), axis=0)
        x = g.op("Concat", g.op("Expand", g.const(tree["cls"], "cls"), shape), x, axis=1)
    pe = tree["Transformer"].get("posembed_input", {}).get("pos_embedding")
    return x if pe is None else g.op("Add", x, g.const(pe, "pos_embedding"))


def _block(g: _Graph, x: str, b: dict, tokens: int, heads: int, gelu: str, name: str) -> str:
    """One pre-LN encoder block: x + attention(LN(x)), then + MLP(LN(.))."""
    y = g.layer_norm(x, b["LayerNorm_0"], f"{name}_ln0")
    att = b["MultiHeadDotProductAttention_1"]
    x = g.op("Add", x, _attention(g, y, att, tokens, heads, name))
    fc1, fc2 = b["MlpBlock_3"]["Dense_0"], b["MlpBlock_3"]["Dense_1"]
    y = g.layer_norm(x, b["LayerNorm_2"], f"{name}_ln2")
    y = _gelu(g, g.dense(y, fc1["kernel"], fc1["bias"], f"{name}_fc1"), tanh=gelu == "tanh")
    return g.op("Add", x, g.dense(y, fc2["kernel"], fc2["bias"], f"{name}_fc2"))


def _pool_head(g: _Graph, x: str, tree: dict, model: VisionTransformer) -> str:
    """Final norm, pooling, representation layer and head: [N, T, D] -> logits."""
    x = g.layer_norm(x, tree["Transformer"]["encoder_norm"], "encoder_norm")
    if model.classifier == "token":
        x = g.op("Gather", x, g.const(np.array(0, np.int64)), axis=1)  # [N, D]
    elif model.classifier == "gap":
        x = g.op("ReduceMean", x, axes=[1], keepdims=0)
    if model.representation_size:
        pre = tree["pre_logits"]
        x = g.op("Tanh", g.dense(x, pre["kernel"], pre["bias"], "pre_logits"))
    if model.num_classes:
        x = g.dense(x, tree["head"]["kernel"], tree["head"]["bias"], "head")
    return x


def build(params: dict, model: VisionTransformer, size: tuple[int, int]) -> Any:
    """The onnx.ModelProto of `model` (plain or hybrid, scan=False layout) at `size`.

    Raises:
      ValueError: position embeddings other than 'learned' / 'none', a MAP head, or a
        tower's field other than the paper's (`unwritten`).
    """
    if other := unwritten(model):
        raise ValueError(
            f"the ONNX export writes the paper's ViT, not {', '.join(other)}: use format='npz'"
        )
    if model.posemb not in ("learned", "none"):
        raise ValueError(
            f"the ONNX export supports posemb 'learned' and 'none', not {model.posemb!r}"
        )
    if model.classifier == "map":
        raise ValueError(
            "the ONNX export has no MAP head (classifier 'map'): use format='timm' or format='npz'"
        )
    tree = jax.tree.map(lambda v: np.asarray(v, np.float32), params)
    g = _Graph(model.layer_norm_eps)
    x = _embed(g, tree, model, size)
    tokens = model.grid(size)[0] * model.grid(size)[1] + model.num_prefix
    for i in range(model.depth):
        b = tree["Transformer"][f"encoderblock_{i}"]
        x = _block(g, x, b, tokens, model.num_heads, model.gelu, f"block{i}")
    x = _pool_head(g, x, tree, model)
    g.nodes.append(g.helper.make_node("Identity", [x], ["logits"]))
    k = model.num_classes or model.representation_size or model.width
    out_dims = ["N", tokens, k] if model.classifier == "unpooled" else ["N", k]
    f = g.onnx.TensorProto.FLOAT
    images = g.helper.make_tensor_value_info("images", f, ["N", size[0], size[1], model.channels])
    logits = g.helper.make_tensor_value_info("logits", f, out_dims)
    graph = g.helper.make_graph(g.nodes, "vit_jax", [images], [logits], g.inits)
    opset = [g.helper.make_opsetid("", OPSET)]
    proto = g.helper.make_model(graph, opset_imports=opset, producer_name="vit_jax")
    proto.ir_version = min(proto.ir_version, 8)  # readable by older runtimes too
    if weight_bytes(proto) <= EXTERNAL_ABOVE:  # a larger one is checked once written
        g.onnx.checker.check_model(proto)
    return proto


def unwritten(model: VisionTransformer) -> list[str]:
    """The fields of `model` the graph does not write, as 'name=value'."""
    default = lambda k: VisionTransformer.__dataclass_fields__[k].default
    other = [k for k in TOWER_FIELDS if getattr(model, k) != default(k)]
    other += ["class_token"] if model.has_class_token != (model.classifier == "token") else []
    other += ["embed_prefix"] if model.num_prefix and not model.embed_prefix else []
    other += ["gelu"] if model.gelu == "quick" else []
    return [f"{k}={getattr(model, k)!r}" for k in other]


def weight_bytes(proto: Any) -> int:
    """Bytes of the graph's initialisers."""
    return sum(len(t.raw_data) for t in proto.graph.initializer)


def export_onnx(
    params: dict,
    model: VisionTransformer,
    size: tuple[int, int],
    out: str,
    external_above: int | None = None,
    labels: list[str] | None = None,
) -> None:
    """An ONNX model with a dynamic batch dimension at `out`, `labels` as its metadata
    property 'labels' (a JSON list of the class names). Weights over
    `external_above` bytes (default EXTERNAL_ABOVE, under protobuf's 2 GiB)
    go to `out`.data beside it, which onnxruntime reads from the same directory.

    Raises:
      FileExistsError: `out` exists (`files.check_new`).
      ImportError: no `onnx` package (pip install 'vit_jax[convert]').
      ValueError: position embeddings the graph does not build (see `build`).
    """
    try:
        import onnx
    except ImportError as e:
        raise ImportError("the onnx export needs the onnx package: pip install onnx") from e
    path = store.path(out)
    files.check_new(path)  # before the graph is built
    limit = EXTERNAL_ABOVE if external_above is None else external_above
    proto = build(params, model, size)
    if labels is not None:
        onnx.helper.set_model_props(proto, {"labels": json.dumps(list(labels))})
    with files.scratch_dir(path) as tmp:  # the graph and its data file, renamed when whole
        if weight_bytes(proto) > limit:
            data = path.name + ".data"  # the graph names it: written under its final name
            onnx.save_model(
                proto,
                str(tmp / path.name),
                save_as_external_data=True,
                all_tensors_to_one_file=True,
                location=data,
            )
            onnx.checker.check_model(str(tmp / path.name))  # by path: with its data
            files.publish(tmp / data, path.with_name(data))
        else:
            onnx.save_model(proto, str(tmp / path.name))
        files.publish(tmp / path.name, path)
