"""TensorFlow for the tf.data modules, imported without its start-up notes on stderr
(vit_jax/base/quiet_tf.py): they say `from vit_jax.data._tf import tf`."""

from vit_jax.base.quiet_tf import tensorflow

tf = tensorflow()
