"""DINO's weighted k-NN classifier (Caron et al., 2021, eval_knn.py's `knn_classifier`):
cosine similarity of L2-normalised features, the k most similar training examples vote
for their class with weight exp(similarity / T), the class with most weight wins."""

from __future__ import annotations

import numpy as np

DEFAULT_K = 20  # DINO reports 10, 20, 100 and 200
TEMPERATURE = 0.07


def knn_predict(
    train_feats: np.ndarray,
    train_labels: np.ndarray,
    test_feats: np.ndarray,
    k: int = DEFAULT_K,
    temperature: float = TEMPERATURE,
    chunk: int = 256,
) -> np.ndarray:
    """The class of each test example (int64 [M]); k is capped at the training examples,
    and `chunk` test examples at a time bound the memory (a [chunk, n] similarity)."""
    unit = lambda x: x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
    train, test = unit(np.asarray(train_feats, np.float32)), unit(test_feats.astype(np.float32))
    labels = np.asarray(train_labels, np.int64)
    k, classes = min(k, len(labels)), int(labels.max()) + 1
    out = []
    for start in range(0, len(test), chunk):
        sim = test[start : start + chunk] @ train.T  # [c, n]
        top = np.argpartition(-sim, k - 1, axis=1)[:, :k]  # [c, k], in any order
        votes = np.exp(np.take_along_axis(sim, top, 1) / temperature)  # [c, k]
        rows = np.arange(len(sim))[:, None] * classes + labels[top]  # [c, k]
        scores = np.bincount(rows.ravel(), votes.ravel(), len(sim) * classes)
        out.append(scores.reshape(len(sim), classes).argmax(1))  # [c]
    return np.concatenate(out) if out else np.zeros(0, np.int64)


def knn_accuracy(train_feats, train_labels, test_feats, test_labels, k: int = DEFAULT_K) -> float:
    """k-NN top-1 accuracy in [0, 1] of the test examples against the training ones."""
    pred = knn_predict(train_feats, train_labels, test_feats, k)
    return float(np.mean(pred == np.asarray(test_labels)))
