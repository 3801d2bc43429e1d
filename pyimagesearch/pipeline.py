"""How a split becomes batches: one `Reading`, the in-memory pipeline, seeded passes.

The in-memory pipeline decodes nothing per step: the split is held as uint8
(47 MB for all of MNIST); it shuffles, batches, converts a whole batch to
float at a time and prefetches, with no Python per image or per epoch. The
TFRecord pipeline (tfrecords.py, opt-in) reads shards in parallel, parses a
batch at a time and ends as this one does (`finish`). Under several input pipelines (one per worker) each keeps
its replicas' slices of every global batch (`_replica_slices`).

Also here:
- Seeded passes over a split: every iterator, and every worker, reads the same sequence.
"""
import dataclasses

import tensorflow as tf


# --- Seeded passes over a split: every iterator, and every worker, reads the same sequence ----
# A leaf module, shared by the in-memory pipeline (`data`) and the TFRecord
# reader (`tfrecords`).


def seeded_passes(one_pass, seed, repeat):
    """Pass k over a split is `one_pass(k)`: every iterator sees the same passes.

    A seeded `shuffle(reshuffle_each_iteration=True)` gives every new
    iterator a new order, and Keras opens one to build the model before
    training, so `fit` and the custom loop would start from different
    orders. Here each pass shuffles with its own seed, derived from `seed`
    and k: every process of a cluster reads the same global batches.

    TensorFlow combines an op's seed with the graph's, and cannot when the
    graph seed is 0 (or 2**31 - 1, the same after its truncation) and the
    op seed is a tensor, as k is: it compares the pair with (0, 0) as a
    Python bool. So each pass sets its graph's seed to `seed` itself (what
    keras.utils.set_random_seed gives it anyway), and to 2**31 where
    TensorFlow would truncate that to 0.

    Upstream: none filed (related: tensorflow/tensorflow#17284). Still
    needed in TensorFlow 2.19.1 and 2.21.0 (tests/test_workarounds.py).
    """
    graph_seed = seed if seed % (2**31 - 1) else 2**31

    def seeded(k):
        if not tf.executing_eagerly():  # tf.data's debug mode runs this eagerly
            tf.compat.v1.get_default_graph().seed = graph_seed  # this pass's graph only
        return one_pass(k)

    passes = tf.data.Dataset.counter() if repeat else tf.data.Dataset.range(1)
    return passes.flat_map(seeded)


PREFETCH_BATCHES = 2  # batches prepared while the model trains on the current one


@dataclasses.dataclass(frozen=True)
class Reading:
    """How a split is read into batches: one object instead of seven parameters.

    `batch_size` is the global batch. `shuffle_size` None keeps the split's
    order (validation). `images` cuts every pass to that many images (a
    validation split keeps a multiple of the replicas, see plan.usable_images);
    `batches` cuts the whole pipeline to that many batches. `skip` leaves out
    the first global batches, which a resumed run has trained on already.
    """

    batch_size: int
    shuffle_size: int | None = None
    seed: int | None = None
    repeat: bool = False
    drop_remainder: bool = False
    images: int | None = None
    batches: int | None = None
    skip: int = 0


def _to_pair(images):
    """uint8 batch -> (float32 in [0, 1], same): an autoencoder's input is its target."""
    images = tf.cast(images, tf.float32) / 255.0
    return images, images


def _replica_slices(dataset, input_context, local_batches=False):
    """Cut every global batch into per-replica slices; keep this pipeline's replicas.

    Replica r of R takes rows [r * b/R, (r + 1) * b/R) of each batch of b
    images. `distribute_datasets_from_function` hands a pipeline's elements to
    its local replicas in turn, so the pipeline with id p of P yields the
    slices of replicas p * R/P to (p + 1) * R/P - 1, in order. Every worker
    reads the same seeded stream, so together the replicas see each global
    batch once: no image twice in a step, none skipped. Every batch must hold a
    multiple of R images (training.plan.usable_images). With `local_batches` each batch is
    already this pipeline's own share (TFRecords split between the
    pipelines), cut into its R/P replicas' slices.
    """
    replicas = input_context.num_replicas_in_sync
    local = replicas // input_context.num_input_pipelines
    first = input_context.input_pipeline_id * local
    if local_batches:
        replicas, first = local, 0

    def slices(images):
        batch = images.shape[0]  # known when batches are full: keep shapes static (TPU)
        per_replica = batch // replicas if batch is not None else tf.shape(images)[0] // replicas
        shaped = tf.reshape(images, [replicas, per_replica, *images.shape[1:]])
        return shaped[first:first + local]

    return dataset.map(slices).unbatch()


def make_pipeline(images, reading, input_context=None):
    """tf.data pipeline of (image, image) float batches from in-memory uint8 images.

    With `input_context` (from `distribute_datasets_from_function`) it
    yields this input pipeline's per-replica slices of each global batch.
    """
    if reading.images is not None:
        images = images[:reading.images]
    dataset = tf.data.Dataset.from_tensor_slices(images)
    if reading.shuffle_size and reading.seed is not None:
        dataset = seeded_passes(lambda k: dataset.shuffle(
            reading.shuffle_size, seed=reading.seed * 1_000_003 + k,
            reshuffle_each_iteration=False), reading.seed, reading.repeat)
    else:
        if reading.shuffle_size:
            dataset = dataset.shuffle(reading.shuffle_size, reshuffle_each_iteration=True)
        if reading.repeat:
            dataset = dataset.repeat()
    # batch first, then convert: one vectorised op per batch, not per image
    dataset = dataset.batch(reading.batch_size, drop_remainder=reading.drop_remainder)
    if reading.skip:
        dataset = dataset.skip(reading.skip)  # before any slicing: whole global batches
    if reading.batches is not None:
        dataset = dataset.take(reading.batches)
    return finish(dataset, input_context)


def finish(dataset, input_context=None, local_batches=False, decode=None, decode_calls=None):
    """The common end of a pipeline of uint8 batches: slice, float pairs, prefetch.

    `decode` turns a batch of stored records into uint8 images first, on
    `decode_calls` batches at once (TFRecords); it runs in the same step as the
    float conversion where no slicing comes between them.
    """
    if input_context is not None:
        if decode is not None:
            dataset = dataset.map(decode, num_parallel_calls=decode_calls)
        dataset = _replica_slices(dataset, input_context, local_batches)
        dataset = dataset.map(_to_pair)
    elif decode is not None:
        dataset = dataset.map(lambda records: _to_pair(decode(records)),
                              num_parallel_calls=decode_calls)
    else:
        dataset = dataset.map(_to_pair)
    # two batches ready ahead of the model are plenty for in-memory data;
    # with nothing left to tune, autotuning (a background thread per
    # iterator, which delays the iterator's teardown) is switched off
    dataset = dataset.prefetch(PREFETCH_BATCHES)
    options = tf.data.Options()
    options.autotune.enabled = False
    return dataset.with_options(options)
