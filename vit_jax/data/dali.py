"""NVIDIA DALI behind ``dataset.decoder = 'dali'``: decode, crop, resize, flip and [-1, 1]
on the GPU (nvJPEG), for hosts whose CPU cores cannot feed their accelerators.

The host keeps what makes a batch a pure function of (seed, step): which examples
(order.py) and which crop windows and flips (augment.py: the same draws as the host
pipeline, so resume stays exact and both decoders crop the same windows), plus the
files' bytes, their headers (the Inception crop needs the upright size), the labels
and mixup's weight. DALI does, per example: decode only the window
(decoders.image_slice, EXIF orientation applied), resize it bilinearly at half-pixel
centres without antialiasing (tf.image.resize's formula, float), mirror, and
(x - 127.5) / 127.5.

Pixels: the tf_bilinear resize of a decode of the window. On the CPU, DALI decodes with
libjpeg-turbo's accurate DCT (pixels.decode's pil_antialias decode, then the
tf_bilinear resize: equal to 1e-5, tests/test_dali.py); on a GPU nvJPEG is a third
decoder. Both are a few grey levels from TensorFlow's fast-DCT decode that tf_bilinear
reproduces (mean under one level), so checkpoints record 'tf_bilinear'.

Batches: with a GPU, one pipeline per local device decodes that device's rows of the
batch, and 'image' is a jax.Array over the local devices (`sharding.global_batch` takes
it without a copy); on the CPU (tests, a run without a GPU) one pipeline fills a NumPy
batch. Not taken by this path: RandAugment (PIL/NumPy ops on the host), in-memory
sources (idx, cache=True): config validation says so.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from vit_jax.data import augment, pixels, tables

INSTALL = (
    "dataset.decoder='dali' needs NVIDIA DALI: pip install nvidia-dali-cuda120 (CUDA 12; "
    "nvidia-dali-cuda130 for CUDA 13), or set dataset.decoder='host'"
)


def available() -> bool:
    """Whether NVIDIA DALI imports here."""
    try:
        import nvidia.dali  # noqa: F401, PLC0415
    except ImportError:
        return False
    return True


@dataclasses.dataclass
class Plan:
    """The host's part of one batch of this process: what DALI decodes, and the rest."""

    data: list[np.ndarray]  # each example's file, uint8 [bytes]
    windows: np.ndarray  # int32 [b, 4]: (y0, x0, height, width) in the upright image
    flips: np.ndarray  # int32 [b]: 1 mirrors
    label: np.ndarray  # float32 [b, K]
    table: tables.Table | None = None  # where the examples come from
    index: np.ndarray | None = None  # int [b]: each example's table position, -1 padding
    mask: np.ndarray | None = None  # float32 [b] (eval): 0 for padding
    mix: np.float32 | None = None  # mixup weight (train, dataset.mixup > 0)


def _bytes(table: tables.Table, i: int) -> tuple[np.ndarray, tuple[int, int], int]:
    """Example i's file as uint8 [bytes], its upright (h, w) and its label."""
    data, label = table.example(i)
    if isinstance(data, np.ndarray):  # decoded already: validation keeps this out
        raise ValueError("example is in memory, not a file: use dataset.decoder='host'")
    try:
        return np.frombuffer(data, np.uint8), pixels.upright_size(data), label
    except ValueError as e:
        raise table.corrupt(i, str(e)) from None


def train_plan(make: Any, step: int) -> Plan:
    """Step `step` of a `pipeline.TrainBatch`, as a Plan."""
    cfg = make.cfg
    table, index, _, draws = make.share(step)
    data, windows, labels = [], [], []
    for i, u in zip(index, draws, strict=True):
        raw, (h, w), label = _bytes(table, int(i))
        data.append(raw)
        windows.append(augment.crop_window(h, w, u, cfg.crop_min_area))
        labels.append(label)
    flips = (draws[:, -1] < 0.5) & bool(cfg.flip)
    label = augment.one_hot(np.asarray(labels), table.num_classes, cfg.label_smoothing)
    mix = None
    if cfg.mixup > 0:  # the labels mix here, the images where they lie (DaliBatches)
        mix = augment.mixup_weight(make.seed, step, cfg.mixup)
        augment.mix(label, mix)
    windows = np.asarray(windows, np.int32)
    return Plan(data, windows, flips.astype(np.int32), label, table, index, mix=mix)


@functools.cache
def _blank() -> np.ndarray:
    """An 8 x 8 black JPEG: what DALI decodes in a padding slot (then zeroed)."""
    import simplejpeg  # noqa: PLC0415

    jpeg = simplejpeg.encode_jpeg(np.zeros([8, 8, 3], np.uint8), quality=90)
    return np.frombuffer(jpeg, np.uint8)


def eval_plan(make: Any, number: int) -> Plan:
    """Batch `number` of a `pipeline.EvalBatch`, as a Plan (padding: a blank, mask 0)."""
    table, start, stop = make.rows(number)
    b, real = make.batch_size, max(stop - start, 0)
    data, windows = [], np.zeros([b, 4], np.int32)
    label = np.zeros([b, table.num_classes], np.float32)
    for j in range(b):
        if j < real:
            raw, (h, w), k = _bytes(table, start + j)
            label[j, k] = 1.0
        else:
            raw, (h, w) = _blank(), (8, 8)
        data.append(raw)
        windows[j] = (0, 0, h, w)
    mask = (np.arange(b) < real).astype(np.float32)
    index = np.where(mask > 0, start + np.arange(b), -1)
    return Plan(data, windows, np.zeros(b, np.int32), label, table, index, mask=mask)


class _Plans:
    """Each batch's Plan, made once on the host's threads and shared by the pipelines
    that decode its rows (one per device), ahead of them; dropped when consumed."""

    def __init__(self, plan: Callable[[int], Plan], indices: range, threads: int):
        self._plan, self._indices = plan, indices
        self._pool = concurrent.futures.ThreadPoolExecutor(threads, "vit_jax-dali-plans")
        self._futures: dict[int, concurrent.futures.Future] = {}
        self._lock = threading.Lock()

    def get(self, k: int) -> Plan:
        """The plan of the k-th batch of `indices` (StopIteration past the end)."""
        if k >= len(self._indices):
            raise StopIteration
        with self._lock:
            for ahead in range(k, min(k + 2, len(self._indices))):  # this one and the next
                if ahead not in self._futures:
                    self._futures[ahead] = self._pool.submit(self._plan, self._indices[ahead])
            future = self._futures[k]
        return future.result()

    def drop(self, k: int) -> None:
        with self._lock:
            self._futures.pop(k, None)

    def close(self) -> None:
        with self._lock:
            for future in self._futures.values():
                future.cancel()
            self._futures.clear()
        self._pool.shutdown(wait=True, cancel_futures=True)


def _pipeline(
    source: Callable, size: tuple[int, int], batch: int, device_id: int | None, threads: int
):
    """A DALI pipeline: source's (bytes, anchors, shapes, flips) -> float32 [b, H, W, 3]
    (decoded on GPU `device_id`, or on `threads` CPU threads when None)."""
    from nvidia.dali import fn, pipeline_def, types  # noqa: PLC0415

    @pipeline_def(
        batch_size=batch,
        num_threads=threads,
        device_id=device_id,
        prefetch_queue_depth=2,
    )
    def build():
        data, anchor, shape, flip = fn.external_source(
            source=source,
            num_outputs=4,
            batch=True,
            batch_info=True,
            dtype=[types.UINT8, types.INT32, types.INT32, types.INT32],
        )
        images = fn.decoders.image_slice(
            data,
            anchor,
            shape,
            device="cpu" if device_id is None else "mixed",
            output_type=types.RGB,
            axis_names="HW",
            normalized_anchor=False,
            normalized_shape=False,
        )
        images = fn.resize(  # float out, as tf.image.resize: no rounding to uint8
            images,
            size=list(size),
            antialias=False,
            interp_type=types.INTERP_LINEAR,
            dtype=types.FLOAT,
        )
        return fn.crop_mirror_normalize(
            images,
            mirror=flip,
            mean=[127.5] * 3,
            std=[127.5] * 3,
            dtype=types.FLOAT,
            output_layout="HWC",
        )

    pipe = build()
    pipe.build()
    return pipe


def _mix(x, mix):
    """augment.mix on a jax.Array over the process's devices (under jit): lam * x +
    (1 - lam) * roll(x, 1) over the process's rows."""
    import jax.numpy as jnp  # noqa: PLC0415

    return mix * x + (1.0 - mix) * jnp.roll(x, 1, axis=0)


def _zero_padding(x, mask):
    return x * mask[:, None, None, None]


class DaliBatches(Iterator[dict[str, Any]]):
    """The batches of `plan(i)` for i in `indices`, decoded by DALI.

    Args:
        plan: Batch index -> Plan (train_plan / eval_plan of the pipeline's makers).
        indices: The batch indices, in order.
        size: (H, W) of the images.
        batch: Examples per batch of this process.
        devices: None: one CPU pipeline and NumPy batches. Else the local devices (JAX
            order) the batch is split over, one pipeline each; on GPUs DALI decodes on
            each, elsewhere on the CPU, and 'image' is a jax.Array over them.
        threads: DALI's CPU threads, shared out over the pipelines.
    """

    def __init__(
        self,
        plan: Callable[[int], Plan],
        indices: range,
        size: tuple[int, int],
        batch: int,
        devices: Sequence[Any] | None = None,
        threads: int = 2,
    ):
        if devices is not None and batch % len(devices):
            raise ValueError(
                f"a batch of {batch} examples per process does not split over its "
                f"{len(devices)} devices; use a multiple of {len(devices)}."
            )
        self._plans = _Plans(plan, indices, min(threads, 2))  # reads and headers: light
        self._k, self._n, self._devices = 0, len(indices), devices
        parts = 1 if devices is None else len(devices)
        rows, per_pipe = batch // parts, max(1, threads // parts)
        self._pipes = []
        for p in range(parts):
            gpu = devices is not None and devices[p].platform == "gpu"
            source = self._source(slice(p * rows, (p + 1) * rows))
            device_id = devices[p].local_hardware_id if gpu else None
            self._pipes.append(_pipeline(source, size, rows, device_id, per_pipe))
        for pipe in self._pipes:
            pipe.schedule_run()

    def _source(self, rows: slice) -> Callable:
        """The external source of the pipeline that decodes `rows` of each batch."""

        def source(info):  # DALI's BatchInfo: the iteration is the batch's position
            plan = self._plans.get(info.iteration)
            windows = plan.windows[rows]
            return (
                plan.data[rows],
                list(np.ascontiguousarray(windows[:, :2])),
                list(np.ascontiguousarray(windows[:, 2:])),
                list(plan.flips[rows]),
            )

        return source

    def _images(self, pipe, device):
        (out,) = pipe.outputs()
        if device is None:
            return np.array(out.as_array())  # a copy: DALI reuses its buffers
        import jax  # noqa: PLC0415

        if device.platform != "gpu":
            return jax.device_put(np.array(out.as_array()), device)
        return jax.numpy.array(jax.dlpack.from_dlpack(out.as_tensor()), copy=True)

    def __next__(self) -> dict[str, Any]:
        if self._k >= self._n or not self._pipes:
            self.close()
            raise StopIteration
        plan = self._plans.get(self._k)
        try:
            devices = self._devices or [None]
            parts = [self._images(p, d) for p, d in zip(self._pipes, devices, strict=True)]
        except RuntimeError as e:  # a file DALI could not decode: name it
            raise _undecodable(plan, e) from None
        for pipe in self._pipes:
            pipe.schedule_run()
        self._plans.drop(self._k)
        self._k += 1
        if self._devices is None:  # NumPy: the host pipeline's own mixup, in place
            images = parts[0]
            if plan.mix is not None:
                augment.mix(images, plan.mix)
            if plan.mask is not None:
                images *= plan.mask[:, None, None, None]
        else:
            images = _assemble(parts, self._devices)
            if plan.mix is not None:
                images = _jit(_mix)(images, plan.mix)
            if plan.mask is not None:
                images = _jit(_zero_padding)(images, plan.mask)
        batch = {"image": images, "label": plan.label}
        if plan.mask is not None:
            batch["mask"] = plan.mask
        return batch

    def close(self) -> None:
        """Stops the pipelines and the plan threads; idempotent."""
        for pipe in self._pipes:
            pipe._shutdown()  # noqa: SLF001 -- DALI's own way to stop its threads
        self._pipes = []
        self._plans.close()

    def __enter__(self) -> DaliBatches:
        return self

    def __del__(self) -> None:  # dropped unclosed: stop DALI's threads and the plans'
        if getattr(self, "_pipes", None):
            self.close()

    def __exit__(self, *exc: object) -> None:
        self.close()


@functools.cache
def _jit(f):
    import jax  # noqa: PLC0415

    return jax.jit(f)


def _assemble(parts: list, devices: Sequence[Any]):
    """Per-device row blocks -> one jax.Array [b, ...] split over `devices` by rows."""
    import jax  # noqa: PLC0415
    from jax.sharding import Mesh, NamedSharding, PartitionSpec  # noqa: PLC0415

    mesh = Mesh(np.asarray(devices), ("rows",))
    shape = (sum(p.shape[0] for p in parts), *parts[0].shape[1:])
    return jax.make_array_from_single_device_arrays(
        shape, NamedSharding(mesh, PartitionSpec("rows")), parts
    )


def _undecodable(plan: Plan, error: Exception) -> Exception:
    """The table's error naming the first file of a batch that does not decode (DALI's
    own message names no file), else DALI's."""
    for data, i in zip(plan.data, plan.index, strict=True):
        try:
            pixels.decode(data.tobytes(), "pil_antialias")
        except ValueError as e:
            return plan.table.corrupt(int(i), f"{e}; DALI: {str(error).splitlines()[0]}")
    return error
