"""Regularised least squares on frozen features: the paper's linear few-shot classifier.

Few-shot accuracy (Dosovitskiy et al. 2020, section 4.1) maps the frozen representations
of k training images per class to {-1, 1}^K target vectors with L2-regularised least
squares, in closed form, and predicts the class of a test image as the argmax of its
K outputs.

How it is fitted here (pure NumPy, float64):
  1. Standardise: each feature dimension is centred on the training examples' mean and,
     with `standardize=True` (the default), divided by their standard deviation
     (dimensions constant over the training set are left unscaled; after centring they
     are zero). Standardising makes `l2` mean the same thing at any width and stage of
     training, whatever the scale of the features.
  2. Bias by centring: the targets are centred too, W solves
     (X^T X + l2 I) W = X^T Y on the centred X and Y, and the bias is
     b = mean(Y) - mean(X) W. This is exactly the solution with an appended ones column
     whose weight is *not* regularised (the bias is never shrunk).
  3. The smaller of the two equivalent systems is solved: the D x D one above when
     n >= D, else the n x n dual W = X^T (X X^T + l2 I)^{-1} Y. With l2 = 0 the
     minimum-norm solution is taken (plain least squares / interpolation).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np


@dataclasses.dataclass(frozen=True)
class LinearFit:
    """A fitted linear map on raw features: outputs = x @ w + b.

    Attributes:
      w: weights on the raw (unstandardised) features.  # [D, K]
      b: bias.  # [K]
    """

    w: np.ndarray
    b: np.ndarray

    def __call__(self, x: np.ndarray) -> np.ndarray:
        """Outputs for features x [M, D] -> [M, K]."""
        return np.asarray(x, np.float64) @ self.w + self.b


def targets(labels: np.ndarray, num_classes: int) -> np.ndarray:
    """Integer labels [n] -> {-1, 1}^K target vectors [n, K] (+1 at the label)."""
    labels = np.asarray(labels)
    if labels.size and (labels.min() < 0 or labels.max() >= num_classes):
        raise ValueError(
            f"labels range over [{labels.min()}, {labels.max()}] but num_classes is "
            f"{num_classes}: pass the number of classes of the dataset"
        )
    return 2.0 * np.eye(num_classes)[labels] - 1.0


def fit(x: np.ndarray, y: np.ndarray, l2: float, standardize: bool = True) -> LinearFit:
    """Closed-form ridge regression with an unregularised bias (see the module doc).

    Args:
      x: training features.  # [n, D]
      y: regression targets, e.g. `targets(labels, K)`.  # [n, K]
      l2: L2 strength on the weights (>= 0), in units of the standardised features.
      standardize: divide centred features by their standard deviation first.

    Returns:
      The fit, expressed on the raw features.
    """
    if l2 < 0:
        raise ValueError(f"l2={l2} is negative: use l2 >= 0 (0 = plain least squares)")
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    if x.ndim != 2 or y.ndim != 2 or len(x) != len(y) or len(x) == 0:
        raise ValueError(
            f"expected features [n, D] and targets [n, K] with n > 0, got {x.shape} and {y.shape}"
        )
    n, d = x.shape
    mean_x, mean_y = x.mean(0), y.mean(0)  # [D], [K]
    scale = x.std(0) if standardize else np.ones(d)
    scale = np.where(scale > 1e-8 * max(float(scale.max()), 1e-30), scale, 1.0)  # [D]
    xc, yc = (x - mean_x) / scale, y - mean_y  # [n, D], [n, K]
    # l2 > 0: positive definite; l2 = 0: the centred Gram matrix is singular (rank <= n - 1),
    # the minimum-norm solution a^+ b
    solve = np.linalg.solve if l2 > 0 else lambda a, b: np.linalg.lstsq(a, b, rcond=None)[0]
    if n >= d:
        w = solve(xc.T @ xc + l2 * np.eye(d), xc.T @ yc)  # [D, K]
    else:
        w = xc.T @ solve(xc @ xc.T + l2 * np.eye(n), yc)  # [D, n] @ [n, K]
    w = w / scale[:, None]  # back to raw features
    return LinearFit(w=w, b=mean_y - mean_x @ w)


def fit_predict(
    train_x: np.ndarray,
    train_y: np.ndarray,
    test_x: np.ndarray,
    l2: float,
    num_classes: int | None = None,
    standardize: bool = True,
) -> np.ndarray:
    """Fit on (train_x, integer labels train_y), predict test_x's classes (argmax).

    Args:
      train_x: training features.  # [n, D]
      train_y: integer labels in [0, K).  # [n]
      test_x: test features.  # [M, D]
      l2: L2 strength (see `fit`).
      num_classes: K; default max(train_y) + 1.
      standardize: see `fit`.

    Returns:
      predicted class of each test example.  # int [M]
    """
    train_y = np.asarray(train_y, np.int64)
    k = int(train_y.max()) + 1 if num_classes is None else num_classes
    return np.argmax(fit(train_x, targets(train_y, k), l2, standardize)(test_x), axis=-1)


def choose_shots(labels: np.ndarray, k: int, seed: int) -> np.ndarray:
    """Indices of k examples of every class present in `labels`, chosen per class.

    Class c's examples are permuted with a generator seeded by (seed, c) and the first
    k are taken, so the choice for one class does not depend on the others, and the
    k-shot set contains the k'-shot set for k' < k (same seed).

    Returns:
      indices into labels, grouped by class in ascending class order.  # int [K * k]
    """
    labels = np.asarray(labels, np.int64)
    chosen = []
    for c in np.unique(labels):
        members = np.flatnonzero(labels == c)
        if len(members) < k:
            raise ValueError(
                f"class {c} has {len(members)} training examples, fewer than {k} shots: "
                f"lower the shots or give a training split with at least {k} per class"
            )
        order = np.random.default_rng([seed, int(c)]).permutation(len(members))
        chosen.append(members[order[:k]])
    return np.concatenate(chosen)


def fewshot_accuracy(
    train_feats: np.ndarray,
    train_labels: np.ndarray,
    test_feats: np.ndarray,
    test_labels: np.ndarray,
    shots: Sequence[int] = (1, 5, 10, 25),
    l2: float = 1024.0,
    seed: int = 0,
    num_classes: int | None = None,
    standardize: bool = True,
) -> dict[int, float]:
    """Linear few-shot test accuracy for each number of shots.

    Args:
      train_feats: pool of training features to draw the shots from.  # [n, D]
      train_labels: their integer labels.  # [n]
      test_feats: test features.  # [M, D]
      test_labels: their integer labels.  # [M]
      shots: numbers of examples per class (each class needs at least max(shots)).
      l2: L2 strength of the least-squares fit (see `fit`).
      seed: which examples are chosen (see `choose_shots`).
      num_classes: K; default the largest label of train or test + 1.
      standardize: see `fit`.

    Returns:
      {k: accuracy in [0, 1]} in the order of `shots`.
    """
    train_labels = np.asarray(train_labels, np.int64)
    test_labels = np.asarray(test_labels, np.int64)
    if num_classes is None:
        num_classes = int(max(train_labels.max(), test_labels.max())) + 1
    out = {}
    for k in shots:
        if k < 1:
            raise ValueError(f"shots must be positive integers, got {k}")
        idx = choose_shots(train_labels, k, seed)
        pred = fit_predict(
            train_feats[idx], train_labels[idx], test_feats, l2, num_classes, standardize
        )
        out[int(k)] = float(np.mean(pred == test_labels))
    return out
