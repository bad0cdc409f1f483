"""Exports for serving outside Python research code: ONNX and TensorFlow SavedModel.

Routes, chosen by what is maintained today and gives exact logits:
  saved_model  jax.experimental.jax2tf with native serialization: the jitted model
               becomes StableHLO inside one XlaCallModule op, run by TensorFlow's own
               XLA, so the logits are this package's (tested within 1e-4, in practice
               ~1e-7). jax2tf ships and is tested with JAX; its non-native (graph op by
               op) mode is gone, and `jax.export` alone writes StableHLO, not a
               SavedModel. The batch dimension is polymorphic; parameters are variables.
  onnx         the graph is built from the parameters here (onnx_graph.py) with opset-17
               standard operators. jax2onnx, the maintained JAX->ONNX converter, pins
               orbax-checkpoint below this package's version and pulls in equinox,
               netron and more; tf2onnx cannot read jax2tf's XlaCallModule op and lags
               TensorFlow releases. Written-out equations are exact (tested with
               onnxruntime within 1e-4) and need only the `onnx` package. Plain ViTs
               and hybrids (the ResNet stem in NCHW convs).
Both take images float32 [N, H, W, C] in [-1, 1] and return `logits`; H, W are fixed at
export (position embeddings resized to them first). Output is written under a
temporary name and renamed when complete.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any

from vit_jax.base import files, quiet_tf, store
from vit_jax.models import layers
from vit_jax.models.vit import VisionTransformer


def export(
    params: dict,
    model: VisionTransformer,
    size: tuple[int, int],
    fmt: str,
    out: str,
    labels: list[str] | None = None,
) -> str:
    """Write `fmt` ('onnx' or 'saved_model') at `out`; returns how to load it. An ONNX
    model keeps `labels` (the class names) as metadata property `labels` (a JSON list)."""
    if fmt == "onnx":
        export_onnx(params, model, size, out, labels=labels)
        return f"onnxruntime.InferenceSession({out!r}).run(['logits'], {{'images': x}})"
    if fmt == "saved_model":
        export_saved_model(params, model, size, out)
        return f"tf.saved_model.load({out!r}).signatures['serving_default'](images=x)['logits']"
    raise ValueError(f"unknown export format {fmt!r}: use onnx or saved_model")


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
    `external_above` bytes (default onnx_graph.EXTERNAL_ABOVE, under protobuf's 2 GiB)
    go to `out`.data beside it, which onnxruntime reads from the same directory.

    Raises:
      FileExistsError: `out` exists (`files.check_new`).
      ImportError: no `onnx` package (pip install 'vit_jax[convert]').
      ValueError: position embeddings the graph does not build (see onnx_graph.build).
    """
    try:
        import onnx
    except ImportError as e:
        raise ImportError("the onnx export needs the onnx package: pip install onnx") from e
    from vit_jax.weights import onnx_graph

    path = store.path(out)
    files.check_new(path)  # before the graph is built
    limit = onnx_graph.EXTERNAL_ABOVE if external_above is None else external_above
    proto = onnx_graph.build(params, model, size)
    if labels is not None:
        onnx.helper.set_model_props(proto, {"labels": json.dumps(list(labels))})
    with files.scratch_dir(path) as tmp:  # the graph and its data file, renamed when whole
        if onnx_graph.weight_bytes(proto) > limit:
            data = path.name + ".data"  # the graph names it: written under its final name
            onnx.save_model(proto, str(tmp / path.name), save_as_external_data=True,
                            all_tensors_to_one_file=True, location=data)  # fmt: skip
            onnx.checker.check_model(str(tmp / path.name))  # by path: with its data
            files.publish(tmp / data, path.with_name(data))
        else:
            onnx.save_model(proto, str(tmp / path.name))
        files.publish(tmp / path.name, path)


def export_saved_model(
    params: dict, model: VisionTransformer, size: tuple[int, int], out: str
) -> None:
    """A SavedModel at `out` whose serving_default maps `images` to `logits`.

    Raises:
      FileExistsError: `out` exists and is not an empty directory (`files.check_new`).
      ImportError: no TensorFlow (pip install 'vit_jax[tf]').
    """
    try:
        tf = quiet_tf.tensorflow()  # before jax2tf, which imports it too
        from jax.experimental import jax2tf
    except ImportError as e:
        raise ImportError(
            "the saved_model export needs TensorFlow: pip install 'vit_jax[tf]'"
        ) from e
    with quiet_tf.quiet_stderr(), _stablehlo_tensorflow_reads():  # saving loads more of TF
        _write_saved_model(tf, jax2tf, params, model, size, out)


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(v) for v in text.split("."))


@contextlib.contextmanager
def _stablehlo_tensorflow_reads() -> Iterator[None]:
    """While it is open, JAX serializes StableHLO at the older of its own target and the
    version the installed TensorFlow reads.

    JAX writes StableHLO for consumers up to ~4 weeks behind it; the TensorFlow that pip
    resolves beside it can be older (measured: JAX 0.12 on Python 3.12 targets 1.18.0,
    TensorFlow 2.21 reads up to 1.13.7, and a polymorphic batch's shape checks then fail
    to deserialize when served: 'unregistered operation vhlo.custom_call_v2'). StableHLO
    serializes to an older version or refuses, so the export either loads or fails here.
    JAX exposes no option for the target: the hook is its `hlo` module's function.
    """
    from jax._src.lib.mlir.dialects import hlo  # noqa: PLC0415

    try:
        from tensorflow.compiler.mlir.stablehlo import stablehlo  # noqa: PLC0415

        theirs = stablehlo.get_current_version()
    except (ImportError, AttributeError):  # another TensorFlow layout: JAX's own target
        yield
        return
    jax_target = hlo.get_version_from_compatibility_requirement
    hlo.get_version_from_compatibility_requirement = lambda requirement: min(
        jax_target(requirement), theirs, key=_version
    )
    try:
        yield
    finally:
        hlo.get_version_from_compatibility_requirement = jax_target


def _write_saved_model(
    tf: Any, jax2tf: Any, params: dict, model: VisionTransformer, size: tuple[int, int], out: str
) -> None:
    h, w = size
    c = model.channels
    if model.gelu == "exact":  # erf without the CHLO composite TF cannot load (layers.py)
        model = model.clone(gelu=layers.EXACT_ELEMENTARY)
    fn = jax2tf.convert(
        lambda p, x: model.apply({"params": p}, x, train=False),
        polymorphic_shapes=[None, f"(b, {h}, {w}, {c})"],
        with_gradient=False,
    )
    module = tf.Module()
    module.params = tf.nest.map_structure(lambda a: tf.Variable(a, trainable=False), _numpy(params))

    @tf.function(
        input_signature=[tf.TensorSpec([None, h, w, c], tf.float32, name="images")], autograph=False
    )
    def serve(images: Any) -> dict:
        return {"logits": fn(module.params, images)}

    module.serve = serve
    with files.atomic_dir(out) as tmp:
        tf.saved_model.save(module, str(tmp), signatures={"serving_default": serve})


def _numpy(tree: Any) -> Any:
    import jax
    import numpy as np

    return jax.tree.map(lambda a: np.asarray(a, np.float32), tree)
