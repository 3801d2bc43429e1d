"""`get_data`, the batches every training script reads (the article names it; it never prints it).

Each split is decoded once, held in memory as uint8 and read through tf.data:
shuffle, batch, convert a whole batch to float, prefetch; no Python runs per
image. The digits come from MNIST through tensorflow_datasets, from the
5,000-digit sample when MNIST cannot be had (offline), or from TFRecords:
`sources` holds those sources, `pipeline` the batching and the per-replica
slicing, `tfrecords` the TFRecord format.
"""
import numpy as np
import tensorflow as tf

from pyimagesearch import config
from pyimagesearch.pipeline import Reading
from pyimagesearch.plan import under_way
from pyimagesearch.sources import resolve_source


def get_data(dataName, split, batchSize, shuffleSize=None, plan=None, skip=0,
             source="auto", data_dir=None, input_context=None, **reading):
    """Batches of (image, image) float pairs of one split: an autoencoder's input is its target.

    The article's function. Without `plan` it reads as the article does:
    MNIST through tfds (the 5,000-digit sample when offline), shuffled in a
    buffer of `shuffleSize` images when one is given, in batches of
    `batchSize`. `source` (a name or a resolved Source) and `data_dir` pick
    other digits; `reading` holds the other fields of `Reading` (seed,
    repeat, drop_remainder, images, batches); `input_context` makes it one
    input pipeline of several, which yields its replicas' slices.

    Inside a training script's run (cli.one_run, after cli.configure), or
    given `plan` (cli.plan: the run the flags describe, on its strategy), the
    split is read as that run needs it:

    - shuffled (training): from the plan's data source, in the order the
      run's seed gives, repeated, in full batches, after the first `skip`
      batches (a run resumed from a backup has trained on those);
    - not shuffled (validation): one pass in batches that every replica
      gets a share of, or on a TPU a fixed number of full batches
      (`plan.validation` says which images val_loss is the mean over);
    - under MultiWorkerMirroredStrategy each worker builds its own
      replicas' slices of the same global batches.
    """
    run = under_way() if plan is None else None
    if run:  # the script's run: its plan, and a backup's steps for the training split
        plan, skip = run[0], (run[1] if shuffleSize else skip)
    if plan is None:
        if isinstance(source, str):
            source = resolve_source(source, dataName, data_dir)
        return source.dataset(split, Reading(batchSize, shuffleSize, skip=skip, **reading),
                              input_context)
    if dataName != plan.source.data_name or batchSize != plan.global_batch_size:
        raise ValueError(f"the plan reads {plan.source.data_name} in batches of "
                         f"{plan.global_batch_size}, not {dataName} in batches of {batchSize}")
    if shuffleSize:
        reading = Reading(batchSize, shuffleSize, seed=plan.settings.seed, repeat=True,
                          drop_remainder=True, skip=skip)
    elif plan.validation.steps is not None:
        # a TPU step needs a full batch: the split repeated, cut to the steps counted
        reading = Reading(batchSize, repeat=True, drop_remainder=True,
                          batches=plan.validation.steps)
    else:
        reading = Reading(batchSize, images=plan.validation.images)
    if isinstance(plan.strategy, tf.distribute.MultiWorkerMirroredStrategy):
        # every worker builds its replicas' slices of the same global batches
        return plan.strategy.distribute_datasets_from_function(
            lambda context: plan.source.dataset(split, reading, context))
    dataset = plan.source.dataset(split, reading)
    if plan.backend == "jax":
        return dataset  # Keras on JAX: DataParallel splits each batch between the devices
    if getattr(plan.strategy.extended, "num_hosts", 1) > 1:
        return dataset  # a TPU slice of several hosts: the strategy splits it between them
    # one host: nothing to split, and the rewrite that would try only warns
    # that it drops the TFRecord pipeline's batch count
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    return dataset.with_options(options)


def figure_digits(examples, replicas=1, count=config.NUM_FIGURE_DIGITS):
    """`count` digits of different classes from a split, as floats in [0, 1].

    `examples` is a split's (images, labels), or the split's name, read from
    the data source of the run under way (cli.configure). The first image of
    each of the split's first `count` classes (0 to 7 on MNIST and the
    sample), so every figure of every run shows the same 8 different digits;
    a split with fewer classes fills up with images spaced evenly through
    it. They are repeated up to a multiple of `replicas` (at least `count`):
    Keras' predict splits a batch between the replicas, and one left with no
    image fails.
    """
    if isinstance(examples, str):
        run = under_way()
        if not run:
            raise ValueError(f"figure_digits({examples!r}) reads the split of the run under "
                             "way: configure one first, or pass (images, labels)")
        examples = run[0].source.examples(examples)
    images, labels = examples
    labels = np.asarray(labels)
    picks = [int(np.flatnonzero(labels == digit)[0]) for digit in np.unique(labels)[:count]]
    for spread in np.linspace(0, len(images) - 1, count).astype(int):
        if len(picks) < count and int(spread) not in picks:
            picks.append(int(spread))
    return images[np.resize(picks, figure_batch(len(picks), replicas))].astype(np.float32) / 255.0


def figure_batch(digits, replicas):
    """How many images `digits` digits make, repeated up to a multiple of `replicas`."""
    return -(-digits // replicas) * replicas
