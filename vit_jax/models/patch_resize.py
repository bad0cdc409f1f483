"""Any patch size: resample a patch-embedding kernel (FlexiViT, Beyer et al. 2023).

To use a kernel w trained on P x P patches with P' x P' patches, FlexiViT picks
    w' = argmin_w' E_x ||<x, w> - <B x, w'>||^2 = pinv(B^T) w,
where B [P'^2, P^2] is the bilinear resize of one P x P patch to P' x P' (half-pixel
centres, edges clamped, no antialiasing: `jax.image.resize(..., 'bilinear',
antialias=False)`), and x runs over patches with independent unit-variance pixels.
Upsampling (P' > P): B^T has full row rank, so <B x, w'> = <x, w> exactly: the token of
a patch resized from P to P' equals the token of the original patch. Downsampling:
w' is the least-squares optimum (B B^T w' = B w).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def resize_matrix_1d(old: int, new: int) -> np.ndarray:
    """[new, old]: bilinear (linear, half-pixel centres, clamped edges) resize of a line.

    Column j is basis vector e_j resized by `jax.image.resize` (as big_vision's
    resample_patchemb does), in float64 so the pseudo-inverse sees exact weights.
    """
    resize = lambda e: jax.image.resize(e, (new,), "linear", antialias=False)
    with jax.enable_x64(True):
        return np.asarray(jax.vmap(resize)(jnp.eye(old, dtype=jnp.float64))).T  # [new, old]


def resize_matrix(old: int, new: int) -> np.ndarray:
    """B [new*new, old*old]: bilinear resize of a row-major old x old patch."""
    r = resize_matrix_1d(old, new)
    return np.kron(r, r)


def resample_kernel(kernel: np.ndarray, new: int) -> np.ndarray:
    """Kernel [P, P, C, D] -> [new, new, C, D] by w' = pinv(B^T) w, per channel and
    feature (computed in float64, returned in the kernel's dtype)."""
    p, q, c, d = kernel.shape
    if p != q:
        raise ValueError(f"patch-embedding kernel {kernel.shape} is not square")
    if new < 1:
        raise ValueError(f"patch size {new}: expected a positive integer")
    if new == p:
        return kernel
    pinv = np.linalg.pinv(resize_matrix(p, new).T)  # [new^2, P^2]
    w = np.asarray(kernel, np.float64).reshape(p * p, c * d)
    return (pinv @ w).reshape(new, new, c, d).astype(kernel.dtype)
