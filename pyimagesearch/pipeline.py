"""How a split becomes batches: a `Reading`, the in-memory pipeline, seeded passes, slices.

The split is held in memory as uint8; tf.data shuffles, batches, converts a
whole batch to float at a time and prefetches, with no Python per image. Under
several input pipelines each keeps its replicas' slices of every global batch.
"""
import dataclasses

import tensorflow as tf

PREFETCH_BATCHES = 2  # batches ready while the model trains on the current one


@dataclasses.dataclass(frozen=True)
class Reading:
    """How a split is read into batches.

    `batch_size` is the global batch; `shuffle_size` None keeps the split's
    order; `images` cuts every pass to that many images, `batches` the whole
    stream to that many batches; `skip` leaves out the first global batches
    (a resumed run has trained on them). `by_pipeline`: the workers of a cluster
    each read a share of the training data (TFRecord files) rather than slices of
    the same stream.
    """

    batch_size: int
    shuffle_size: int | None = None
    seed: int | None = None
    repeat: bool = False
    drop_remainder: bool = False
    images: int | None = None
    batches: int | None = None
    skip: int = 0
    by_pipeline: bool = False


def seeded_passes(one_pass, seed, repeat):
    """Pass k over a split is `one_pass(k)`, so every iterator and every worker reads the same.

    A seeded shuffle that reshuffles each iteration gives each new iterator a
    new order, and Keras opens one to build the model before training. Each
    pass here sets its graph's seed to `seed` (2**31 where TensorFlow would
    truncate it to 0: it then cannot combine a graph seed of 0 with the pass's
    tensor op seed, tensorflow/tensorflow#17284, still so in 2.21).
    """
    graph_seed = seed if seed % (2**31 - 1) else 2**31

    def seeded(k):
        if not tf.executing_eagerly():  # tf.data's debug mode runs this eagerly
            tf.random.set_seed(graph_seed)  # in a graph: this pass's graph seed only
        return one_pass(k)

    passes = tf.data.Dataset.counter() if repeat else tf.data.Dataset.range(1)
    return passes.flat_map(seeded)


def make_pipeline(images, reading, input_context=None):
    """A tf.data pipeline of (image, image) float batches from in-memory uint8 images."""
    if reading.images is not None:
        images = images[:reading.images]
    dataset = tf.data.Dataset.from_tensor_slices(images)
    if reading.shuffle_size and reading.seed is not None:
        dataset = seeded_passes(lambda k: dataset.shuffle(
            reading.shuffle_size, seed=reading.seed * 1_000_003 + k,
            reshuffle_each_iteration=False), reading.seed, reading.repeat)
    else:
        if reading.shuffle_size:
            dataset = dataset.shuffle(reading.shuffle_size)
        if reading.repeat:
            dataset = dataset.repeat()
    # batch first, then convert: one vectorised op per batch, not one per image
    dataset = dataset.batch(reading.batch_size, drop_remainder=reading.drop_remainder)
    if reading.skip:
        dataset = dataset.skip(reading.skip)  # whole global batches, before any slicing
    if reading.batches is not None:
        dataset = dataset.take(reading.batches)
    return finish(dataset, input_context)


def _to_pair(images):
    """uint8 batch -> (float32 in [0, 1], the same): an autoencoder's input is its target."""
    images = tf.cast(images, tf.float32) / 255.0
    return images, images


def _replica_slices(dataset, input_context, local_batches=False):
    """Cut every global batch into per-replica slices; keep this pipeline's replicas.

    Replica r of R takes rows [r * b/R, (r + 1) * b/R) of each batch of b; the
    pipeline p of P yields the slices of replicas p * R/P to (p + 1) * R/P - 1,
    which the strategy hands to its local replicas in turn. Every pipeline reads
    the same seeded stream, so together the replicas see each global batch once.
    With `local_batches` each batch is already this pipeline's share (TFRecord
    files split between the workers).
    """
    replicas = input_context.num_replicas_in_sync
    local = replicas // input_context.num_input_pipelines
    first = input_context.input_pipeline_id * local
    if local_batches:
        replicas, first = local, 0

    def slices(images):
        batch = images.shape[0]  # known for full batches: shapes stay static (TPU)
        per_replica = batch // replicas if batch is not None else tf.shape(images)[0] // replicas
        return tf.reshape(images, [replicas, per_replica, *images.shape[1:]])[first:first + local]

    return dataset.map(slices).unbatch()


def finish(dataset, input_context=None, local_batches=False, decode=None, decode_calls=None):
    """The end of every pipeline of uint8 batches: decode (TFRecords), slice, float, prefetch."""
    if decode is not None:
        dataset = dataset.map(decode, num_parallel_calls=decode_calls)
    if input_context is not None:
        dataset = _replica_slices(dataset, input_context, local_batches)
    # with nothing left to tune, autotuning (a thread per iterator) is switched off
    options = tf.data.Options()
    options.autotune.enabled = False
    return dataset.map(_to_pair).prefetch(PREFETCH_BATCHES).with_options(options)
