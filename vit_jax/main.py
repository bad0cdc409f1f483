"""Train a ViT: pretraining and fine-tuning differ only in the config.

    python -m vit_jax.main --config=configs/vit.py:b16,cifar10 --workdir=workdirs/run \
        [--config.optimizer.lr=0.01 ...]

Restarting with the same --workdir resumes from its latest checkpoint. On several
hosts, run the same command on each with --config.distributed.* set (see
vit_jax/distributed.py); JAX's distributed runtime starts before anything else uses jax.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TensorFlow (tf.data) is chatty

from absl import app, flags, logging  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from vit_jax import distributed, train  # noqa: E402

config_flags.DEFINE_config_file(
    "config", None, "a config file, e.g. configs/vit.py:b16,cifar10", lock_config=True
)
flags.DEFINE_string("workdir", None, "where checkpoints, TensorBoard events and summary.json go")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    if not flags.FLAGS["verbosity"].present:
        logging.set_verbosity(logging.WARNING)  # libraries' INFO logs drown the progress lines
    distributed.initialize(flags.FLAGS.config.distributed)  # before any other use of jax
    train.run(flags.FLAGS.config, flags.FLAGS.workdir)


if __name__ == "__main__":
    app.run(main)
