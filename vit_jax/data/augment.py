"""Training augmentation in NumPy: Inception crop, flip, mixup, label smoothing.

Every random choice is drawn from a generator seeded by (run seed, salt, counter), so a
batch is a pure function of (seed, step): resuming at step s yields the batches an
uninterrupted run yields from step s on, for any number of processes or workers.

Per example the chain is (as in the original ViT and big_vision input pipelines):
decode -> Inception crop -> resize -> flip -> [RandAugment] -> [-1, 1].
"""

from __future__ import annotations

import math

import numpy as np

# Salts that fold the uses of the run seed apart.
SHUFFLE_SALT, AUGMENT_SALT, MIXUP_SALT, RANDAUG_SALT = 0, 1, 2, 3

ATTEMPTS = 10  # Inception crop: windows tried before falling back to the whole image
DRAWS = 2 * ATTEMPTS + 3  # uniforms per example: (area, ratio) x attempts, y, x, flip
RATIO_RANGE = (3 / 4, 4 / 3)


def generator(seed: int, salt: int, *counters: int) -> np.random.Generator:
    """The generator of one use (salt) of the run seed at one counter (step, epoch, ...)."""
    return np.random.default_rng([seed % 2**63, salt, *counters])


def step_draws(seed: int, step: int, global_batch: int) -> np.ndarray:
    """Uniforms in [0, 1) for every example of a global batch.  -> float64 [G, DRAWS]

    Drawn for the whole global batch, so that slot i gets the same numbers whichever
    process holds it.
    """
    return generator(seed, AUGMENT_SALT, step).random((global_batch, DRAWS))


def crop_window(
    h: int, w: int, u: np.ndarray, min_area: float, own_aspect: bool = False
) -> tuple[int, int, int, int]:
    """Inception crop of an h x w image from uniforms u [DRAWS] -> (y0, x0, height, width).

    Up to ATTEMPTS windows of area U(min_area, 1) * h * w and aspect ratio (width /
    height) log-uniform in [3/4, 4/3] (with `own_aspect`, NaFlex's: that times w / h, so a
    crop keeps the image's shape up to the same jitter); the first that fits is placed
    uniformly at random. If none fits, the whole image.
    """
    lo, hi = math.log(RATIO_RANGE[0]), math.log(RATIO_RANGE[1])
    for a in range(ATTEMPTS):
        area = (min_area + (1.0 - min_area) * u[2 * a]) * h * w
        ratio = math.exp(lo + (hi - lo) * u[2 * a + 1]) * (w / h if own_aspect else 1.0)
        cw, ch = int(round(math.sqrt(area * ratio))), int(round(math.sqrt(area / ratio)))
        if 0 < ch <= h and 0 < cw <= w:
            return int(u[-3] * (h - ch + 1)), int(u[-2] * (w - cw + 1)), ch, cw
    return 0, 0, h, w


def one_hot(labels: np.ndarray, num_classes: int, smoothing: float = 0.0) -> np.ndarray:
    """int [b] -> float32 [b, K] targets: (1 - s) * onehot + s / K."""
    target = np.eye(num_classes, dtype=np.float32)[labels]
    return target * np.float32(1.0 - smoothing) + np.float32(smoothing / num_classes)


def mixup(batch: dict[str, np.ndarray], seed: int, step: int, alpha: float) -> None:
    """Mixes each example with its neighbour in the batch, in place; weight ~ Beta(alpha, alpha).

    One weight per batch, as in big_vision: x' = lam * x + (1 - lam) * roll(x, 1).
    big_vision also folds the weight to max(lam, 1 - lam); this does not, and the mixed
    batches are the same in distribution: with lam < 1/2 the batch x mixes into what the
    folded rule makes of the reversed batch with weight 1 - lam, reversed and rotated
    by one (a test checks it), and a shuffled batch is as likely in either order.
    """
    lam = np.float32(generator(seed, MIXUP_SALT, step).beta(alpha, alpha))
    for x in (batch["image"], batch["label"]):  # float32 [b, ...], each mixed in place
        rolled = np.roll(x, 1, axis=0)
        rolled *= np.float32(1.0) - lam
        x *= lam
        x += rolled
