"""Evaluation of frozen models: linear few-shot accuracy (the paper's section 4.1), DINO's
k-NN accuracy and the top-1 / top-5 accuracy of a classifier.

  linear.py   closed-form regularised least squares to {-1, 1}^K targets (NumPy)
  knn.py      DINO's weighted k-NN classifier of cosine similarities (NumPy)
  fewshot.py  pre-logits features of a dataset split; FewShotEvaluator for training loops
  classify.py top-1 / top-5 accuracy of a classifier checkpoint on a dataset split
  batched.py  one batched apply over an eval iterator: few-shot, classify, the training loop

The commands are `python -m vit_jax.fewshot` (vit_jax/fewshot.py: few-shot) and
`python -m vit_jax.evaluate` (vit_jax/evaluate.py: classification accuracy).
"""

from vit_jax.evaluation.fewshot import (
    DEFAULT_L2,
    DEFAULT_SHOTS,
    FewShotEvaluator,
    by_dataset,
    dataset_configs,
    extract_features,
    metric_name,
)
from vit_jax.evaluation.linear import (
    LinearFit,
    choose_shots,
    fewshot_accuracy,
    fit,
    fit_predict,
    targets,
)
