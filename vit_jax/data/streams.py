"""Example streams: which example sits at each position of a process's share.

Train streams are infinite and indexed by a local counter c = step * b + j (b = the
local batch, j = the slot in it), so the stream that starts at step s is exactly the
tail, from position s * b, of the stream that starts at 0.

* Tables (idx, folder): the global batch of step s holds stream positions
  p = s * G + i, i < G; process k takes slots i in [k * b, (k + 1) * b). Position p
  is example ``index_shuffle(p % N, seed(epoch = p // N))``: a fresh permutation of
  the whole split every epoch, computed per position without materialising it. The
  augmentation seed is a function of (seed, p), so the union of the shares of all
  processes is the same batch for any process_count.
* TFDS: process k reads its contiguous range of the split (n_k examples), one epoch
  after another, each shuffled with a buffer seeded from (seed, k, epoch). Starting at
  step s skips (s * b) mod n_k records of the first epoch, before decoding.

Eval streams give each process a contiguous share of the split, in order.
"""

from __future__ import annotations

from vit_jax.data import preprocess, splits, tfds_source
from vit_jax.data._tf import tf
from vit_jax.data.tables import Table

_FOREVER = 2**62


def table_positions(
    n: int, step: tf.Tensor, *, global_batch: int, process_index: int, process_count: int, seed: int
) -> tuple[tf.Tensor, tf.Tensor]:
    """Table positions and augmentation seeds of this process's share of one step.

    Returns:
        (index int64 [b], example seeds int64 [b, 2]).
    """
    b = global_batch // process_count
    pos = step * global_batch + process_index * b + tf.range(b, dtype=tf.int64)  # [b]
    shuffle_seeds = preprocess.seeds(preprocess.key(seed, preprocess.SHUFFLE_SALT), pos // n)
    index = preprocess.permuted_index(pos % n, shuffle_seeds, n)
    return index, preprocess.seeds(preprocess.key(seed, preprocess.AUGMENT_SALT), pos)


def table_train(
    table: Table,
    *,
    global_batch: int,
    process_index: int,
    process_count: int,
    start_step: int,
    seed: int,
) -> tf.data.Dataset:
    """Infinite stream of {'image' uint8 [h, w, c], 'label', 'step', 'seed' [2]}.

    Tables with all images in memory (table.images) yield whole shares of a step
    instead: {'image' uint8 [b, h, w, c], 'label' [b], 'step' [b], 'seed' [b, 2]}.
    """
    b = global_batch // process_count
    if not len(table):
        raise ValueError(
            "the train split has no examples after slicing and class subsetting; check "
            "dataset.train_split, dataset.classes and dataset.examples_per_class."
        )
    labels = tf.constant(table.labels)
    shares = dict(
        global_batch=global_batch,
        process_index=process_index,
        process_count=process_count,
        seed=seed,
    )

    def locate(step):  # the whole share of a step at once: cheaper than per example
        index, example_seeds = table_positions(len(table), step, **shares)
        return {"index": index, "step": tf.fill([b], step), "seed": example_seeds}

    def load(ex):
        index = ex.pop("index")
        if table.images is not None:
            return {
                **ex,
                "image": tf.gather(table.images, index),
                "label": tf.gather(labels, index),
            }
        return {**ex, "image": table.load(index), "label": labels[index]}

    ds = tf.data.Dataset.range(start_step, _FOREVER).map(locate)
    if table.images is None:
        ds = ds.unbatch()
    return ds.map(load, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)


def tfds_train(
    plan: tfds_source.Plan,
    *,
    global_batch: int,
    process_index: int,
    process_count: int,
    start_step: int,
    seed: int,
    shuffle_buffer: int,
    cache: bool,
) -> tf.data.Dataset:
    """Infinite stream of {'image' encoded or uint8, 'label', 'step', 'seed' [2]}."""
    b = global_batch // process_count
    raw_lo, raw_hi, n = plan.part(process_index, process_count)
    if n == 0:
        raise ValueError(
            f"TFDS split {plan.name}[{plan.start}:{plan.stop}] has {plan.size} examples, none "
            f"for process {process_index} of {process_count}; use a larger split."
        )
    base = plan.examples(raw_lo, raw_hi)
    if cache:
        base = base.map(lambda ex: {**ex, "image": preprocess.decode(ex["image"])}).cache()
    first_epoch, first_offset = divmod(start_step * b, n)
    shuffle_key = preprocess.key(seed, preprocess.SHUFFLE_SALT, process_index)
    augment_key = preprocess.key(seed, preprocess.AUGMENT_SALT, process_index)

    def epoch(e):
        epoch_seed = preprocess.seeds(shuffle_key, e)
        shuffle_seed = tf.random.stateless_uniform([], epoch_seed, None, None, tf.int64)
        ds = base.shuffle(min(shuffle_buffer, n), seed=shuffle_seed, reshuffle_each_iteration=False)
        return ds.skip(tf.where(e == first_epoch, tf.constant(first_offset, tf.int64), 0))

    examples = tf.data.Dataset.range(first_epoch, _FOREVER).flat_map(epoch)
    counters = tf.data.Dataset.range(start_step * b, _FOREVER)

    def annotate(c, ex):
        return {**ex, "step": c // b, "seed": preprocess.seeds(augment_key, c)}

    return tf.data.Dataset.zip(counters, examples).map(annotate)


def table_eval(table: Table, process_index: int, process_count: int) -> tf.data.Dataset:
    """This process's contiguous share of the split: {'image' uint8, 'label'}."""
    lo, hi = splits.process_range(len(table), process_index, process_count)
    labels = tf.constant(table.labels)
    ds = tf.data.Dataset.range(lo, hi)
    return ds.map(
        lambda i: {"image": table.load(i), "label": labels[i]},
        num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=True,
    )


def tfds_eval(plan: tfds_source.Plan, process_index: int, process_count: int) -> tf.data.Dataset:
    """This process's contiguous share of the split: {'image' encoded, 'label'}."""
    raw_lo, raw_hi, _ = plan.part(process_index, process_count)
    return plan.examples(raw_lo, raw_hi)
