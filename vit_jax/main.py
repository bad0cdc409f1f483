"""Train a ViT: pretraining and fine-tuning differ only in the config.

    python -m vit_jax.main --config=finetune:b16,cifar10 --workdir=workdirs/run \
        [--config.optimizer.lr=0.01 ...]

--config names a preset of the installed package (finetune, pretrain, augreg, fashion_mnist;
see vit_jax/configs/) with its argument after ':', or the path of a config file
(configs/finetune.py:b16,cifar10, or your own). Restarting with the same --workdir
resumes from its latest checkpoint; a workdir that finished is left as it is (the
command prints its stored results). On several hosts, run the same command on each
with --config.distributed.* set (see vit_jax/parallel/distributed.py); JAX's distributed
runtime starts before anything else uses jax.
"""

from absl import flags
from ml_collections import config_flags

from vit_jax import cli, configs
from vit_jax.base import problems
from vit_jax.parallel import distributed
from vit_jax.training import check, train


def define_flags() -> None:
    config_flags.DEFINE_config_file(
        "config",
        None,
        "a preset NAME:ARG (fashion_mnist:pretrain|finetune|scratch|full|tiny, "
        "finetune:MODEL,DATASET, pretrain:MODEL,DATASET, augreg:MODEL,DATASET,SETTING; "
        "e.g. finetune:b16,cifar10) or a "
        "config file PATH.py:ARG; set any field with --config.FIELD=VALUE "
        "(all fields: vit_jax/configs/common.py)",
        lock_config=True,
    )
    flags.DEFINE_string("workdir", None, "checkpoints, TensorBoard events, summary.json go here")
    flags.mark_flags_as_required(["config", "workdir"])


def main() -> None:
    config = flags.FLAGS.config
    try:
        problems.raise_if_any(check.problems(config))  # before the processes join
        distributed.initialize(config.distributed)  # before any other use of jax
        train.run(config, flags.FLAGS.workdir)  # checks the rest before it writes
    except problems.ConfigError as e:
        raise e.with_prefix("--config.") from None


preset_argv = configs.preset_argv  # a preset name in --config -> its installed file


if __name__ == "__main__":
    cli.run(main, define_flags, prepare_argv=preset_argv)
