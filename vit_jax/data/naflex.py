"""NaFlex examples, each image at its own aspect ratio, in NumPy (no TensorFlow, no jax):
big_vision's `resize_to_sequence` + `patchify` (pp/proj/image_text/ops_naflex.py), and the
length schedule of a NaFlex training run.

  size_for_sequence  the largest scale of an h x w image whose grid, each side rounded up
                     to whole patches (at least one), has at most `seq_len` patches:
                     big_vision's binary search on the scale, in float32 as it runs
  resize             tf.image.resize(..., antialias=True)'s numerics (TensorFlow's
                     ScaleAndTranslate, triangle kernel widened by the scale when shrinking)
  put                an image into row j of a batch: resized, [-1, 1], flipped if asked,
                     cut into patches with their (row, column), padding last
                     (models/naflex.py's layout: patches, coords, valid)
  Lengths            step -> its length (drawn from `seq_lens`, the same on every process),
                     its global batch (tokens_per_batch // length, rounded down to a
                     multiple of devices x accum_steps) and the examples before it
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import numpy as np
import scipy.sparse

from vit_jax.data import augment, pixels
from vit_jax.data.preprocessing import PUBLISHED

LENGTH_SALT = 4  # after augment's salts: the length of each step
BLOCK = 1024  # steps whose lengths one generator draws


@functools.lru_cache(maxsize=4096)
def size_for_sequence(h: int, w: int, patch: int, seq_len: int) -> tuple[int, int]:
    """(H, W), multiples of `patch`, as big_vision's `_get_image_size_for_seq` finds them
    (eps 1e-5; the aspect ratio bends only by the rounding up to whole patches)."""
    f, p, eps = np.float32, np.float32(patch), np.float32(1e-5)

    def grid(ratio: np.float32) -> tuple[int, int]:  # patches a side at `ratio`
        return max(int(np.ceil(f(h) * ratio / p)), 1), max(int(np.ceil(f(w) * ratio / p)), 1)

    # big_vision's bounds: a scale from eps / 10 to 100, so an image too small to fill
    # seq_len even at 100x gets fewer patches (big_vision asserts instead).
    lo, hi = f(1e-6), f(100.0)
    while hi - lo >= eps:
        mid = (lo + hi) / f(2)
        gh, gw = grid(mid)
        lo, hi = (mid, hi) if gh * gw <= seq_len else (lo, mid)
    gh, gw = grid(lo)
    return gh * patch, gw * patch


@functools.lru_cache(maxsize=1024)
def _weights(n_in: int, n_out: int, channels: int) -> scipy.sparse.csc_matrix:
    """The sparse [n_out * c, n_in * c] resize of one axis with `channels` interleaved:
    TensorFlow's spans (scale_and_translate_op.cc), the kernel max(0, 1 - |x|) widened by
    the scale when shrinking, each output's weights summing to 1."""
    inv = np.float32(n_in) / np.float32(n_out)
    widen = max(inv, np.float32(1))
    span = min(2 * int(np.ceil(widen)) + 1, n_in)
    centre = (np.arange(n_out, dtype=np.float32) + np.float32(0.5)) * inv  # [n_out]
    first = np.clip(np.ceil(centre - widen - 0.5).astype(np.int64), 0, n_in - span)
    source = first[:, None] + np.arange(span)  # [n_out, span]
    w = np.maximum(0, 1 - np.abs((source + np.float32(0.5) - centre[:, None]) / widen))
    w = w.astype(np.float32)
    w *= np.float32(1) / w.sum(1, keepdims=True, dtype=np.float32)
    rows = np.repeat(np.arange(n_out), span)
    axis = scipy.sparse.csr_matrix((w.ravel(), (rows, source.ravel())), (n_out, n_in))
    return scipy.sparse.kron(axis, scipy.sparse.identity(channels, np.float32), "csc")


def resize(image: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """uint8 or float [h, w, c] -> a new float32 [H, W, c] in the input's range, as
    tf.image.resize(image, size, antialias=True) (bilinear): columns, then rows."""
    x = np.array(image, np.float32)  # a copy: the caller's image is never written
    (h, w, c), (out_h, out_w) = x.shape, size
    if w != out_w:
        x = (_weights(w, out_w, c) @ x.reshape(h, w * c).T).T  # [h, W*c]
    if h != out_h:
        x = _weights(h, out_h, 1) @ x.reshape(h, -1)  # [H, W*c]
    return np.ascontiguousarray(x, np.float32).reshape(out_h, out_w, c)


def empty(batch: int, seq_len: int, patch: int) -> dict[str, np.ndarray]:
    """A NaFlex batch of padding: patches zero, coords zero, valid False."""
    return {
        "patches": np.zeros([batch, seq_len, patch * patch * 3], np.float32),
        "coords": np.zeros([batch, seq_len, 2], np.int32),
        "valid": np.zeros([batch, seq_len], bool),
    }


def put(out: dict, j: int, image: np.ndarray, patch: int, flip=False, method=PUBLISHED) -> tuple:
    """Row j of `out` (`empty`) := uint8 [h, w, c] resized to its sequence, mirrored with
    `flip`, normalised as `method` says (preprocessing.py: [-1, 1], or a tower's mean and
    std), as patches; the image's (gh, gw)."""
    size = size_for_sequence(image.shape[0], image.shape[1], patch, out["valid"].shape[1])
    x = resize(image, size)  # [H, W, c] in [0, 255]
    x = pixels.normalize(x[:, ::-1] if flip else x, x.shape[-1] == 3, method)  # [H, W, 3]
    gh, gw = size[0] // patch, size[1] // patch
    rows = x.reshape(gh, patch, gw, patch, 3).transpose(0, 2, 1, 3, 4).reshape(gh * gw, -1)
    out["patches"][j, : gh * gw] = rows  # [gh*gw, P*P*3], row-major over the grid
    out["coords"][j, : gh * gw] = np.stack(np.divmod(np.arange(gh * gw), gw), axis=-1)
    out["valid"][j, : gh * gw] = True
    return gh, gw


@functools.lru_cache(maxsize=8)
def _block(seed: int, choices: int, block: int) -> np.ndarray:
    """The length indices of steps block*BLOCK ... (block+1)*BLOCK - 1."""
    return augment.generator(seed, LENGTH_SALT, block).integers(choices, size=BLOCK)


@dataclasses.dataclass(frozen=True)
class Lengths:
    """The length schedule of a NaFlex training run (a pure function of its fields)."""

    seq_lens: tuple[int, ...]  # patches a row, not counting a class token
    tokens_per_batch: int
    multiple: int  # devices x accum_steps: every batch splits over them
    seed: int

    @classmethod
    def of(cls, cfg: Any, batch_size: int, multiple: int, seed: int) -> Lengths:
        """The schedule of `cfg` (dataset.naflex; tokens_per_batch 0: batch_size x the longest)."""
        lens = tuple(cfg.seq_lens)
        return cls(lens, cfg.tokens_per_batch or batch_size * max(lens), multiple, seed)

    def length(self, step: int) -> int:
        """Patches a row at `step` (one of seq_lens, uniformly)."""
        if len(self.seq_lens) == 1:
            return self.seq_lens[0]
        return self.seq_lens[_block(self.seed, len(self.seq_lens), step // BLOCK)[step % BLOCK]]

    def batch(self, length: int) -> int:
        """The global batch of a step of `length` patches a row."""
        return self.tokens_per_batch // length // self.multiple * self.multiple

    def batch_at(self, step: int) -> int:
        return self.batch(self.length(step))

    @property
    def fewest_tokens(self) -> int:
        """The tokens_per_batch below which the longest length gets no batch."""
        return max(self.seq_lens) * self.multiple

    def too_few(self) -> str | None:
        """Why tokens_per_batch gives the longest length no batch, in a sentence that names
        the smallest budget that works; None where every length gets one."""
        if self.tokens_per_batch >= self.fewest_tokens:
            return None
        return (
            f"too small for a step of length {max(self.seq_lens)}, which takes {self.multiple} "
            f"images at least (devices x accum_steps): the smallest budget that works is "
            f"{self.fewest_tokens} patches"
        )

    @functools.cached_property
    def _block_sums(self) -> dict[int, int]:
        """A memo (block -> its examples), filled by `offset`: the frozen fields decide it."""
        return {}

    def offset(self, step: int) -> int:
        """Examples drawn before `step` (the position of its first example)."""
        whole, total = step // BLOCK, 0
        for b in range(whole):
            if b not in self._block_sums:
                self._block_sums[b] = sum(
                    self.batch_at(s) for s in range(b * BLOCK, b * BLOCK + BLOCK)
                )
            total += self._block_sums[b]
        return total + sum(self.batch_at(s) for s in range(whole * BLOCK, step))
