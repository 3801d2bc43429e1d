"""TFRecords, the article's storage format: write shards, describe, verify and read them fast.

A TFRecord folder (a local path or a bucket, gs://...; everything goes
through `tf.io.gfile`, so tests use ram://) holds:

    train-00000-of-00008.tfrecord ... train-00007-of-00008.tfrecord
    test-00000-of-00008.tfrecord  ... test-00007-of-00008.tfrecord
    metadata.json

One `tf.train.Example` per image: its raw uint8 pixels (no PNG to decode
again), its shape (height, width, channels) and its label. With GZIP the
shards end in .tfrecord.gz. `metadata.json` gives the counts per split and
per shard, the image shape, where the images came from and how the folder
was made. Every file is written to a local scratch folder first, and the
whole set then replaces the folder's old one (files.py): the
folder holds the old TFRecords or the new ones, whatever stops the writer.

This module knows the format and reads it: arrays and batches of uint8
images out; `tfrecord_writer` writes it (tools/write_tfrecords.py).
`pyimagesearch.data` makes it the "tfrecord" source.
"""
import dataclasses
import hashlib
import json
import math
import os
import re

import numpy as np
import tensorflow as tf

from pyimagesearch.errors import UserError, first_line
from pyimagesearch.files import join
from pyimagesearch.pipeline import finish, seeded_passes
from pyimagesearch.terminal import native_stderr_quiet

METADATA_NAME = "metadata.json"  # published with the shards: its presence means "finished"
FORMAT = "pyimagesearch-tfrecords"
FORMAT_VERSION = 1           # bump when the record layout changes
COMPRESSIONS = {"none": "", "gzip": "GZIP"}  # flag value -> TFRecord compression type
SUFFIXES = {"none": ".tfrecord", "gzip": ".tfrecord.gz"}
# ORIGINS: what write_tfrecords.py read. "stand-in" is prepare_mnist.py
# --stand-in (the sample tiled to MNIST's size), never to pass for MNIST.
ORIGINS = ("tfds", "stand-in", "sample")
DEFAULT_SHARDS = 8           # per split: up to 8 workers can each read their own files
FEATURES = {
    "image": tf.io.FixedLenFeature([], tf.string),  # raw uint8 pixels, row-major (h, w, c)
    "shape": tf.io.FixedLenFeature([3], tf.int64),  # height, width, channels
    "label": tf.io.FixedLenFeature([], tf.int64),   # the digit
}
# Reading: as many shards at a time in parallel as this process has cores
# (2 on the machine the README's numbers come from, 96 or more on a TPU VM
# host reading a bucket). Taking 64 records from a shard before moving to
# the next costs the interleave far less than one record per turn, and the
# shuffle buffer behind it still mixes records of all the shards read.
INTERLEAVE_CYCLE = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (
    os.cpu_count() or 2)
INTERLEAVE_BLOCK = 64
PARSE_CALLS = tf.data.AUTOTUNE  # batches parsed at once: one per core, as autotuning is off
VERIFY_BATCH = 4096          # records parsed per step while verifying a shard


# --- names and checksums -----------------------------------------------------

def shard_name(split, index, count, compression="none"):
    """`train-00003-of-00008.tfrecord`: the file name of shard `index` of `count`."""
    return f"{split}-{index:05d}-of-{count:05d}{SUFFIXES[compression]}"


def file_sha256(path, chunk=1 << 22):
    """The SHA-256 of a file's bytes, read through tf.io.gfile, as hex."""
    digest = hashlib.sha256()
    with tf.io.gfile.GFile(path, "rb") as handle:
        while True:
            block = handle.read(chunk)
            if not block:
                return digest.hexdigest()
            digest.update(block)


# --- metadata ----------------------------------------------------------------

def read_metadata(folder):
    """The folder's metadata, checked for what the reader needs; UserError naming the file."""
    path = join(folder, METADATA_NAME)
    try:
        if not tf.io.gfile.isdir(folder):
            what = "is a file, not a folder" if tf.io.gfile.exists(folder) else "does not exist"
            raise UserError(f"TFRecord folder {folder} {what} "
                            "(write one with tools/write_tfrecords.py)")
        if not tf.io.gfile.exists(path):
            shards = tf.io.gfile.glob(join(folder, "*-of-*.tfrecord*"))
            raise UserError(
                f"{path} is missing: " + (
                    f"{folder} has {len(shards)} shard files but no metadata, an "
                    "unfinished write; run tools/write_tfrecords.py again" if shards else
                    f"{folder} holds no TFRecords; write them with tools/write_tfrecords.py"))
        with tf.io.gfile.GFile(path, "r") as handle:
            text = handle.read()
    except tf.errors.OpError as error:
        raise UserError(f"cannot read {path}: {first_line(error)}") from error
    try:
        metadata = json.loads(text)
    except ValueError as error:
        raise UserError(f"{path} is not valid JSON ({error}); run tools/write_tfrecords.py "
                        "again") from error
    _check_metadata(path, metadata)
    return metadata


def _check_metadata(path, metadata):
    """Raise a UserError naming `path` unless `metadata` has the layout this reader knows."""
    def fail(problem):
        raise UserError(f"{path}: {problem}; run tools/write_tfrecords.py again")

    if not isinstance(metadata, dict) or metadata.get("format") != FORMAT:
        fail(f"not a {FORMAT} metadata file")
    if metadata.get("format_version") != FORMAT_VERSION:
        fail(f"format version {metadata.get('format_version')!r}, this reader "
             f"knows {FORMAT_VERSION}")
    shape = metadata.get("image_shape")
    if (not isinstance(shape, list) or len(shape) != 3
            or not all(isinstance(side, int) and side > 0 for side in shape)):
        fail(f"image_shape {shape!r} is not [height, width, channels]")
    if metadata.get("dtype") != "uint8" or metadata.get("compression") not in COMPRESSIONS:
        fail("dtype must be uint8 and compression one of "
             f"{', '.join(COMPRESSIONS)}")
    if metadata.get("source") not in ORIGINS:
        fail(f"source {metadata.get('source')!r} is not one of {', '.join(ORIGINS)}")
    splits = metadata.get("splits")
    if not isinstance(splits, dict) or not splits:
        fail("no splits listed")
    for split, entry in splits.items():
        shards = entry.get("shards") if isinstance(entry, dict) else None
        if not shards or not isinstance(shards, list) or not all(isinstance(shard, dict)
                                 and isinstance(shard.get("file"), str)
                                 and "/" not in shard["file"]
                                 and isinstance(shard.get("records"), int)
                                 and not isinstance(shard["records"], bool)
                                 and shard["records"] >= 0
                                 for shard in shards):
            fail(f"split {split!r} lists no shards, or shards without file and records")
        if not all(re.fullmatch(r"[0-9a-f]{64}", shard.get("sha256", "0" * 64) or "")
                   for shard in shards):
            fail(f"split {split!r} lists a shard whose sha256 is not 64 hex digits")
        if entry.get("images") != sum(shard["records"] for shard in shards):
            fail(f"split {split!r} counts {entry.get('images')!r} images, its shards "
                 f"add up to {sum(shard['records'] for shard in shards)}")


def split_files(folder, metadata, split):
    """(paths, record counts) of `split`'s shards, in order."""
    if split not in metadata["splits"]:
        raise UserError(f"{join(folder, METADATA_NAME)} has splits "
                        f"{sorted(metadata['splits'])}, not {split!r}")
    shards = metadata["splits"][split]["shards"]
    return ([join(folder, shard["file"]) for shard in shards],
            [shard["records"] for shard in shards])


def describe(folder, metadata):
    """One sentence for the log and the run record: where, how many, from what, when."""
    origins = {"tfds": "MNIST read through tfds",
               "stand-in": "a stand-in made by tools/prepare_mnist.py --stand-in (the "
                           "5,000-digit sample tiled to MNIST's size): for timing, "
                           "not for quality",
               "sample": "the 5,000-digit MNIST sample"}
    counts = " and ".join(f"{entry['images']:,} {split} images in {len(entry['shards'])} "
                          "shards" for split, entry in metadata["splits"].items())
    made = metadata.get("made_by", {}).get("date", "an unknown date")
    packing = "gzip-compressed" if metadata["compression"] == "gzip" else "uncompressed"
    return (f"TFRecords in {folder} ({counts}, {packing}), "
            f"written on {made} from {origins[metadata['source']]}")


# --- verifying ---------------------------------------------------------------

def _tf_message(error):
    """TensorFlow's own words for a failed read, without its graph and op names."""
    text = re.sub(r"\{\{[^}]*\}\}\s*", "", first_line(error))
    return re.sub(r"\s*\[Op:.*$", "", text).strip() or type(error).__name__


def _parse_all(serialized):
    """Every feature of a batch of serialized examples, plus each image's byte count."""
    features = tf.io.parse_example(serialized, FEATURES)
    features["bytes"] = tf.strings.length(features.pop("image"))
    return features


def verify(folder):
    """Read every record of every shard once and check it against the metadata.

    Catches a missing, truncated or corrupt shard (TFRecord's checksums), a
    record with missing features or the wrong shape, counts that differ from
    the metadata and, for a local shard, bytes that are not the ones written
    (a shard swapped for another of the same size: its SHA-256): a UserError
    naming the file, before any training starts. Returns the metadata. Cheap
    at MNIST's size (47 MB).
    """
    metadata = read_metadata(folder)
    shape = metadata["image_shape"]
    compression = COMPRESSIONS[metadata["compression"]]
    # TensorFlow logs a failed read on stderr too; our one line says it all
    with native_stderr_quiet((UserError,)):
        for split in metadata["splits"]:
            paths, counts = split_files(folder, metadata, split)
            for path, count, shard in zip(paths, counts, metadata["splits"][split]["shards"]):
                verify_shard(path, count, shard.get("bytes"), shape, compression)
                if shard.get("sha256") and "://" not in path:
                    _check_sha256(path, shard["sha256"])
    return metadata


def _check_sha256(path, expected):
    """A local shard's bytes are the ones written: another shard of the same size is not.

    On a bucket this is left out (it would read every shard a second time
    over the network); there the size, the record count and shape, and
    TFRecord's own checksum of every record are checked.
    """
    if file_sha256(path) != expected:
        raise UserError(f"{path} is not the shard {METADATA_NAME} lists (its SHA-256 "
                        "differs): replaced or edited; run tools/write_tfrecords.py again")


def verify_shard(path, count, size, shape, compression):
    """Check one shard: its size, readable records, their count and their shapes."""
    try:
        if not tf.io.gfile.exists(path) or tf.io.gfile.isdir(path):
            what = "is a folder" if tf.io.gfile.exists(path) else "is missing"
            raise UserError(f"{path} {what} ({METADATA_NAME} lists it as a shard); "
                            "run tools/write_tfrecords.py again")
        actual = tf.io.gfile.stat(path).length
    except tf.errors.OpError as error:
        raise UserError(f"cannot read {path}: {first_line(error)}") from error
    if size is not None and actual != size:
        raise UserError(f"{path} is {actual:,} bytes, {METADATA_NAME} says {size:,}: cut "
                        "short or replaced; run tools/write_tfrecords.py again")
    dataset = tf.data.TFRecordDataset(path, compression_type=compression)
    records = 0
    try:
        for features in dataset.batch(VERIFY_BATCH).map(_parse_all):
            shapes = features["shape"].numpy()
            wrong = np.flatnonzero((shapes != shape).any(axis=1)
                                   | (features["bytes"].numpy() != math.prod(shape)))
            if len(wrong):
                first = int(wrong[0])
                raise UserError(
                    f"{path}: record {records + first:,} has shape "
                    f"{tuple(int(s) for s in shapes[first])} and "
                    f"{int(features['bytes'][first]):,} bytes of pixels, expected "
                    f"{tuple(shape)} ({math.prod(shape):,} bytes); run "
                    "tools/write_tfrecords.py again")
            records += len(shapes)
    except tf.errors.OpError as error:
        # DataLossError (a cut or a checksum mismatch) or a record that is
        # not an Example with our features
        raise UserError(f"{path} is truncated or corrupt at or after record {records:,} "
                        f"({_tf_message(error)}); run tools/write_tfrecords.py again") from error
    if records != count:
        raise UserError(f"{path} holds {records:,} records, {METADATA_NAME} says "
                        f"{count:,}; run tools/write_tfrecords.py again")


# --- reading -----------------------------------------------------------------

def read_split(folder, split, metadata=None):
    """A whole split in shard order: (uint8 images (N, h, w, c), int64 labels).

    `metadata` is the folder's, when the caller has read it already.
    """
    metadata = metadata or read_metadata(folder)
    paths, _ = split_files(folder, metadata, split)
    dataset = tf.data.TFRecordDataset(paths,
                                      compression_type=COMPRESSIONS[metadata["compression"]])
    images, labels = [], []
    try:
        with native_stderr_quiet((UserError,)):
            for features in dataset.batch(10_000).map(
                    lambda s: tf.io.parse_example(s, FEATURES)):
                pixels = tf.io.decode_raw(features["image"], tf.uint8)
                images.append(tf.reshape(pixels, [-1, *metadata["image_shape"]]).numpy())
                labels.append(features["label"].numpy())
    except tf.errors.OpError as error:
        raise UserError(f"cannot read {split} from {folder}: {_tf_message(error)} "
                        "(python tools/write_tfrecords.py can write it again)") from error
    return np.concatenate(images), np.concatenate(labels)


def image_decoder(shape):
    """A function: batch of serialized examples -> uint8 images (batch, *shape), parsed at once."""
    def decode(serialized):
        features = tf.io.parse_example(serialized, {"image": FEATURES["image"]})
        pixels = tf.io.decode_raw(features["image"], tf.uint8)
        # full batches keep a static batch size (a TPU needs one)
        batch = serialized.shape[0]
        return tf.reshape(pixels, [batch if batch is not None else -1, *shape])

    return decode


def pass_size(folder, metadata, split, shard=None):
    """How many records one pass over `split` reads; `shard` as in `record_batches`."""
    _, counts = split_files(folder, metadata, split)
    if shard is None:
        return sum(counts)
    pipelines, index = shard
    if splits_by_file(len(counts), pipelines):
        return sum(counts[index::pipelines])  # its own shard files
    return len(range(index, sum(counts), pipelines))  # every pipelines-th record


def splits_by_file(files, pipelines):
    """Whether `pipelines` readers can each take whole files and get equal shares.

    8 shards over 3 workers would give them 3, 3 and 2 files (22,500, 22,500
    and 15,000 of 60,000 images), so the third worker's images would be seen
    1.5 times as often: an uneven division splits by record instead.
    """
    return files % pipelines == 0


def _pipeline_files(paths, shard):
    """(the shard files this pipeline reads, the (pipelines, index) of records it keeps or None)."""
    files = tf.data.Dataset.from_tensor_slices(paths)
    if shard is not None and splits_by_file(len(paths), shard[0]):
        return files.shard(*shard), None  # by file: each pipeline reads its own shards
    # by data (a shard given): each pipeline reads every record and keeps its
    # share, which needs the same record order in every pipeline
    return files, shard


def _passes_seed(seed, by_data):
    """The seed the passes' own seeds derive from: `seed`, else a fixed or a drawn one."""
    if seed is not None:
        return seed
    # every pipeline splitting by data must read the same order: a fixed
    # seed. Otherwise one drawn here, since an unseeded shuffle inside
    # flat_map is traced once and could repeat one order every pass.
    return 0 if by_data is not None else int(np.random.randint(2**31 - 1))


def record_batches(folder, metadata, split, reading, keep=None, shard=None):
    """Batches of serialized records of `split`, read the way a training run wants them.

    `reading` (a `data.Reading`) gives the batch size, shuffle buffer, seed,
    repeat and drop_remainder. With a shuffle buffer, every pass over the
    data (an epoch's worth of records) reads the shards in a new order,
    `INTERLEAVE_CYCLE` of them at once in parallel, and shuffles the records
    in the buffer; without one the split is read in order. Each pass has its
    own seed derived from the reading's, so every new iterator (Keras opens
    one to build the model, every worker of a cluster opens its own) reads
    the same sequence of passes. `keep` cuts each pass to that many records,
    before the shuffle. `shard` = (pipelines, index) makes this one of
    several input pipelines: it reads every pipelines-th shard file when
    there are at least as many files as pipelines, else every pipelines-th
    record (see `pass_size`).
    """
    paths, _ = split_files(folder, metadata, split)
    compression = COMPRESSIONS[metadata["compression"]]
    files, by_data = _pipeline_files(paths, shard)
    shuffle_size = reading.shuffle_size
    # parallel reads in a fixed order only where the order matters
    deterministic = reading.seed is not None or by_data is not None
    seed = _passes_seed(reading.seed, by_data)
    cut = keep is not None and keep < pass_size(folder, metadata, split, shard)
    cycle = min(INTERLEAVE_CYCLE, len(paths))

    def read(path):
        return tf.data.TFRecordDataset(path, compression_type=compression)

    def one_pass(k):
        """The records of pass `k` over the split."""
        # two seeds per pass (shard order, then records), none shared with another pass
        pass_seed = seed * 1_000_003 + k * 2
        if shuffle_size:
            # the metadata names the shards: a list of them rather than a
            # glob (list_files), so no stray file in the folder is ever read
            order = files.shuffle(len(paths), seed=pass_seed, reshuffle_each_iteration=False)
            records = order.interleave(read, cycle_length=cycle,
                                       block_length=INTERLEAVE_BLOCK,
                                       num_parallel_calls=cycle,
                                       deterministic=deterministic)
        else:
            records = files.flat_map(read)  # in order: the split as it was written
        if by_data is not None:
            records = records.shard(*by_data)
        if cut:
            records = records.take(keep)
        if shuffle_size:
            records = records.shuffle(shuffle_size, seed=pass_seed + 1,
                                      reshuffle_each_iteration=False)
        return records

    return seeded_passes(one_pass, seed, reading.repeat).batch(
        reading.batch_size, drop_remainder=reading.drop_remainder)


def tfrecord_pipeline(folder, metadata, split, reading, input_context=None):
    """`make_pipeline`'s batches, read from the TFRecord folder `folder`.

    Every input pipeline of a multi-worker run reads the same stream for
    evaluation (no shuffle) and keeps its replicas' slices, as
    `make_pipeline` does, so all workers run the same number of validation
    steps over exactly the images counted. Training data is split between
    the pipelines instead (by shard file, or by record when there are fewer
    files than pipelines): each reads only its share and batches its part of
    the global batch (batch / pipelines), cut into its local replicas' slices.
    """
    shard = None
    if input_context is not None and reading.shuffle_size:
        pipelines = input_context.num_input_pipelines
        shard = (pipelines, input_context.input_pipeline_id)
        reading = dataclasses.replace(reading, batch_size=reading.batch_size // pipelines)
    keep = pass_size(folder, metadata, split, shard)
    if reading.images is not None:
        keep = min(keep, reading.images)
    dataset = record_batches(folder, metadata, split, reading, keep, shard)
    if reading.skip:
        dataset = dataset.skip(reading.skip)  # this pipeline's share of each global batch
    # the batch count, which reading shards hides: Keras needs it to stop at
    # the end of the data, not in the middle of an execution of several steps
    count = None
    if not reading.repeat:
        full, rest = divmod(keep, reading.batch_size)
        count = full + (1 if rest and not reading.drop_remainder else 0)
    if reading.batches is not None:
        dataset = dataset.take(reading.batches)
        count = reading.batches if count is None else min(reading.batches, count)
    if count is not None:
        dataset = dataset.apply(tf.data.experimental.assert_cardinality(count))
    dataset = finish(dataset, input_context, local_batches=shard is not None,
                      decode=image_decoder(metadata["image_shape"]),
                      decode_calls=PARSE_CALLS)
    if input_context is None:
        # a strategy over several hosts (a TPU slice) splits it between them
        return dataset
    # this pipeline splits itself between the workers; a strategy's auto-shard
    # rewrite would only drop the batch count, with a warning
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = (
        tf.data.experimental.AutoShardPolicy.OFF)
    return dataset.with_options(options)
