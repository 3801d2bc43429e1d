"""`get_data`, the batches every training script reads (the article names it, never prints it).

A split is decoded once and held in memory as uint8 (sources.py); tf.data
shuffles it, batches it, converts a whole batch to float at a time and
prefetches: no Python runs per image. Given the run's `plan`, the training
split is read in the order the run's seed gives, repeated, in full batches,
from the step a backup resumes at, and split between the run's replicas.
"""
import numpy as np
import tensorflow as tf

from pyimagesearch import config
from pyimagesearch.pipeline import Reading
from pyimagesearch.sources import resolve_source


def get_data(dataName, split, batchSize, shuffleSize=None, plan=None):
    """Batches of (image, image) float pairs of one split: an autoencoder's input is its target.

    Without `plan`, as the article reads it: MNIST through tfds (the 5,000-digit
    sample offline), shuffled in a buffer of `shuffleSize` images when given.
    With the run's `plan`, as that run needs it (`plan.reading`).
    """
    if plan is None:
        source = resolve_source("auto", dataName)
        return source.dataset(split, Reading(batchSize, shuffleSize))
    if (dataName, batchSize) != (plan.source.data_name, plan.global_batch_size):
        raise ValueError(f"the plan reads {plan.source.data_name} in batches of "
                         f"{plan.global_batch_size}, not {dataName} in batches of {batchSize}")
    reading = plan.reading(split, training=bool(shuffleSize))
    return distribute(plan, lambda context=None: plan.source.dataset(split, reading, context))


def distribute(plan, make):
    """`make()`'s dataset as the plan's strategy reads it; `make(context)` builds one pipeline.

    - a TF_CONFIG cluster: every worker builds its replicas' slices of the same
      global batches;
    - a rehearsal on logical CPU devices: one pipeline per replica, read on the
      CPU. TensorFlow's per-device input buffers otherwise wait on their
      autotuning threads as Keras tears them down (with 8 devices, epochs of
      6 s took 20 s to minutes here; none filed, its warning is
      tensorflow/tensorflow#61816; still so in TensorFlow 2.19 to 2.21);
    - Keras on JAX: DataParallel splits each global batch between the devices,
      and across processes by data, never by file (Keras 3.12's auto-shard
      would give each process whole TFRecord files of its own);
    - a TPU slice of several hosts on TensorFlow: TPUStrategy splits it between them;
    - anything else: one pipeline of global batches, not sharded.
    """
    if plan.backend == "jax":
        policy = tf.data.experimental.AutoShardPolicy.DATA
    elif plan.workers > 1:
        return plan.strategy.distribute_datasets_from_function(make)
    elif plan.rehearsal and plan.replicas > 1:
        options = tf.distribute.InputOptions(
            experimental_replication_mode=tf.distribute.InputReplicationMode.PER_REPLICA,
            experimental_fetch_to_device=False)
        return plan.strategy.distribute_datasets_from_function(make, options)
    elif getattr(plan.strategy.extended, "num_hosts", 1) > 1:
        return make()
    else:
        policy = tf.data.experimental.AutoShardPolicy.OFF
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = policy
    return make().with_options(options)


def figure_digits(source, replicas=1, count=config.NUM_FIGURE_DIGITS):
    """`count` digits of different classes from the validation split, as floats in [0, 1].

    The first image of each of the split's first `count` classes (0 to 7), so
    every run's figure shows the same digits; a split with fewer classes fills
    up with images spread evenly through it. Repeated up to a multiple of
    `replicas`: Keras' predict splits its batch, and a replica left with none fails.
    """
    images, labels = source.examples(config.VALIDATION_FLAG)
    labels = np.asarray(labels)
    picks = [int(np.flatnonzero(labels == digit)[0]) for digit in np.unique(labels)[:count]]
    for spread in np.linspace(0, len(images) - 1, count).astype(int):
        if len(picks) < count and int(spread) not in picks:
            picks.append(int(spread))
    total = -(-len(picks) // replicas) * replicas
    return images[np.resize(picks, total)].astype(np.float32) / 255.0
