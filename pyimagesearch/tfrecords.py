"""TFRecords, the article's storage format: write shards, verify them, read them fast.

A TFRecord folder (local or gs://...) holds `train-00000-of-00008.tfrecord` ...
(`.tfrecord.gz` with GZIP), the same for `test`, and `metadata.json`: counts
per split and shard, sizes, SHA-256s, the image shape and where the images came
from. One `tf.train.Example` per image: its raw uint8 pixels, shape and label.
A new write leaves the shards it lists alone (its own take a time stamp in their
names where an earlier write's hold the plain ones) and replaces the metadata
last, in one rename: the folder holds the old TFRecords or the new ones, whatever
stops the writer. Loaded for --data-source tfrecord and tools/write_tfrecords.py.
"""
import dataclasses
import datetime
import hashlib
import math
import os

import numpy as np
import tensorflow as tf

from pyimagesearch import config
from pyimagesearch.pipeline import finish, seeded_passes
from pyimagesearch.errors import UserError, first_line
from pyimagesearch.exits import watch
from pyimagesearch.files import join, read_json, replace_file, write_json

METADATA_NAME = "metadata.json"
FORMAT, FORMAT_VERSION = "pyimagesearch-tfrecords", 1
COMPRESSIONS = {"none": "", "gzip": "GZIP"}  # flag value -> TFRecord compression type
SUFFIXES = {"none": ".tfrecord", "gzip": ".tfrecord.gz"}
ORIGINS = ("tfds", "stand-in", "sample")  # what write_tfrecords.py read
DEFAULT_SHARDS = 8           # per split: up to 8 workers each read their own files
FEATURES = {"image": tf.io.FixedLenFeature([], tf.string),  # raw uint8 pixels (h, w, c)
            "shape": tf.io.FixedLenFeature([3], tf.int64),
            "label": tf.io.FixedLenFeature([], tf.int64)}
# shards read at once, one per core; 64 records from a shard before the next
INTERLEAVE_CYCLE = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 2
INTERLEAVE_BLOCK = 64
_AGAIN = "run tools/write_tfrecords.py again"


def shard_name(split, index, count, compression="none"):
    """`train-00003-of-00008.tfrecord`: the file name of shard `index` of `count`."""
    return f"{split}-{index:05d}-of-{count:05d}{SUFFIXES[compression]}"


def file_sha256(path):
    digest = hashlib.sha256()
    with tf.io.gfile.GFile(path, "rb") as handle:
        while block := handle.read(1 << 22):
            digest.update(block)
    return digest.hexdigest()


def read_metadata(folder):
    """The folder's metadata, checked for what the reader needs; one line naming what is wrong."""
    path = join(folder, METADATA_NAME)
    try:
        if not tf.io.gfile.isdir(folder):
            what = "is a file, not a folder" if tf.io.gfile.exists(folder) else "does not exist"
            raise UserError(f"TFRecord folder {folder} {what} "
                            "(write one with tools/write_tfrecords.py)")
        if not tf.io.gfile.exists(path):
            shards = tf.io.gfile.glob(join(folder, "*-of-*.tfrecord*"))
            raise UserError(f"{path} is missing: " + (
                f"{folder} has {len(shards)} shard files but no metadata, an unfinished "
                f"write; {_AGAIN}" if shards else
                f"{folder} holds no TFRecords; write them with tools/write_tfrecords.py"))
    except tf.errors.OpError as error:
        raise UserError(f"cannot read {path}: {first_line(error)}") from error
    metadata = read_json(path, advice=_AGAIN)

    def fail(problem):
        raise UserError(f"{path}: {problem}; {_AGAIN}")

    if not isinstance(metadata, dict) or metadata.get("format") != FORMAT:
        fail(f"not a {FORMAT} metadata file")
    if metadata.get("format_version") != FORMAT_VERSION:
        fail(f"format version {metadata.get('format_version')!r}, this reader knows "
             f"{FORMAT_VERSION}")
    shape = metadata.get("image_shape")
    if not (isinstance(shape, list) and len(shape) == 3
            and all(isinstance(side, int) and side > 0 for side in shape)):
        fail(f"image_shape {shape!r} is not [height, width, channels]")
    if metadata.get("dtype") != "uint8" or metadata.get("compression") not in COMPRESSIONS:
        fail(f"dtype must be uint8 and compression one of {', '.join(COMPRESSIONS)}")
    if metadata.get("source") not in ORIGINS:
        fail(f"source {metadata.get('source')!r} is not one of {', '.join(ORIGINS)}")
    splits = metadata.get("splits")
    if not isinstance(splits, dict) or not splits:
        fail("no splits listed")
    for split, entry in splits.items():
        shards = entry.get("shards") if isinstance(entry, dict) else None
        if not (isinstance(shards, list) and shards and all(
                isinstance(shard, dict) and isinstance(shard.get("file"), str)
                and "/" not in shard["file"] and type(shard.get("records")) is int
                and shard["records"] >= 0 for shard in shards)):
            fail(f"split {split!r} lists no shards, or shards without file and records")
        if entry.get("images") != sum(shard["records"] for shard in shards):
            fail(f"split {split!r} counts {entry.get('images')!r} images, its shards add up "
                 f"to {sum(shard['records'] for shard in shards)}")
    return metadata


def split_files(folder, metadata, split):
    """(paths, record counts) of `split`'s shards, in order."""
    if split not in metadata["splits"]:
        raise UserError(f"{join(folder, METADATA_NAME)} has splits "
                        f"{sorted(metadata['splits'])}, not {split!r}")
    shards = metadata["splits"][split]["shards"]
    return [join(folder, shard["file"]) for shard in shards], [s["records"] for s in shards]


def _tf_message(error):
    """TensorFlow's own words for a failed read, without its op names."""
    return first_line(error).split(" [Op:")[0].strip() or type(error).__name__


def verify_shard(path, shard, shape, compression):
    """One shard against its metadata: size, SHA-256 (local), readable records, count, shapes."""
    try:
        if not tf.io.gfile.exists(path) or tf.io.gfile.isdir(path):
            what = "is a folder" if tf.io.gfile.exists(path) else "is missing"
            raise UserError(f"{path} {what} ({METADATA_NAME} lists it as a shard); {_AGAIN}")
        size = tf.io.gfile.stat(path).length
    except tf.errors.OpError as error:
        raise UserError(f"cannot read {path}: {first_line(error)}") from error
    if shard.get("bytes") is not None and size != shard["bytes"]:
        raise UserError(f"{path} is {size:,} bytes, {METADATA_NAME} says "
                        f"{shard['bytes']:,}: cut short or replaced; {_AGAIN}")
    records = 0
    try:
        for serialized in tf.data.TFRecordDataset(path, compression).batch(4096):
            features = tf.io.parse_example(serialized, FEATURES)
            shapes = features["shape"].numpy()
            pixels = tf.strings.length(features["image"]).numpy()
            wrong = np.flatnonzero((shapes != shape).any(axis=1) | (pixels != math.prod(shape)))
            if len(wrong):
                first = int(wrong[0])
                raise UserError(f"{path}: record {records + first:,} has shape "
                                f"{tuple(int(s) for s in shapes[first])} and "
                                f"{int(pixels[first]):,} bytes of pixels, expected "
                                f"{tuple(shape)}; {_AGAIN}")
            records += len(shapes)
    except tf.errors.OpError as error:  # a cut, a checksum, a record that is no Example
        raise UserError(f"{path} is truncated or corrupt at or after record {records:,} "
                        f"({_tf_message(error)}); {_AGAIN}") from error
    if records != shard["records"]:
        raise UserError(f"{path} holds {records:,} records, {METADATA_NAME} says "
                        f"{shard['records']:,}; {_AGAIN}")
    # on a bucket this would read every shard twice: there the checksums of TFRecord serve
    if shard.get("sha256") and "://" not in path and file_sha256(path) != shard["sha256"]:
        raise UserError(f"{path} is not the shard {METADATA_NAME} lists (its SHA-256 "
                        f"differs): replaced or edited; {_AGAIN}")


def verify_folder(folder, data_name=config.DATA_NAME):
    """(metadata, what the folder holds in words) of a TFRecord folder, every shard read once."""
    if folder is None:
        raise UserError("--data-source tfrecord needs --data-dir: the folder "
                        "tools/write_tfrecords.py wrote (local or gs://...)")
    metadata = read_metadata(folder)
    where = join(folder, METADATA_NAME)
    if metadata.get("dataset") != data_name:
        raise UserError(f"{where} describes {metadata.get('dataset')!r}, not {data_name!r}")
    if tuple(metadata["image_shape"]) != config.IMAGE_SHAPE:
        raise UserError(f"{where}: images of shape {tuple(metadata['image_shape'])}, the "
                        f"autoencoder takes {config.IMAGE_SHAPE}")
    for split in (config.TRAIN_FLAG, config.VALIDATION_FLAG):
        paths, _ = split_files(folder, metadata, split)
        for path, shard in zip(paths, metadata["splits"][split]["shards"]):
            verify_shard(path, shard, metadata["image_shape"],
                         COMPRESSIONS[metadata["compression"]])
    counts = " and ".join(f"{entry['images']:,} {split} images in {len(entry['shards'])} shards"
                          for split, entry in metadata["splits"].items())
    origin = {"tfds": "MNIST read through tfds", "sample": "the 5,000-digit MNIST sample",
              "stand-in": "a stand-in made by tools/prepare_mnist.py --stand-in (the sample "
                          "tiled to MNIST's size): for timing, not for quality"}
    reason = (f"TFRecords in {folder} ({counts}, "
              f"{'gzip-compressed' if metadata['compression'] == 'gzip' else 'uncompressed'}), "
              f"written on {metadata.get('made_by', {}).get('date', 'an unknown date')} from "
              f"{origin[metadata['source']]}")
    return metadata, reason


def read_split(folder, split, metadata):
    """A whole split in shard order: (uint8 images (N, h, w, c), int64 labels)."""
    paths, _ = split_files(folder, metadata, split)
    dataset = tf.data.TFRecordDataset(paths, COMPRESSIONS[metadata["compression"]])
    images, labels = [], []
    try:
        for serialized in dataset.batch(10_000):
            features = tf.io.parse_example(serialized, FEATURES)
            pixels = tf.io.decode_raw(features["image"], tf.uint8)
            images.append(tf.reshape(pixels, [-1, *metadata["image_shape"]]).numpy())
            labels.append(features["label"].numpy())
    except tf.errors.OpError as error:
        raise UserError(f"cannot read {split} from {folder}: {_tf_message(error)}; "
                        f"{_AGAIN}") from error
    return np.concatenate(images), np.concatenate(labels)


def pipeline(folder, metadata, split, reading, input_context=None):
    """data.make_pipeline's batches, read from the shards.

    Every pass (an epoch's worth of records) reads the shards in a new seeded
    order, `INTERLEAVE_CYCLE` at once, and shuffles the records in the
    reading's buffer. Under a cluster's input pipelines (`reading.by_pipeline`)
    each worker reads its share of the training data, whole files where they
    divide evenly between the workers, else every N-th record, and batches its
    part of the global batch; validation is the same stream on every worker.
    """
    paths, counts = split_files(folder, metadata, split)
    compression = COMPRESSIONS[metadata["compression"]]
    files, keep = tf.data.Dataset.from_tensor_slices(paths), sum(counts)
    by_data, shared = None, input_context is not None and reading.by_pipeline
    if shared:
        pipelines, index = input_context.num_input_pipelines, input_context.input_pipeline_id
        if len(paths) % pipelines == 0:  # 8 files over 3 workers would be 3, 3 and 2
            files, keep = files.shard(pipelines, index), sum(counts[index::pipelines])
        else:
            by_data, keep = (pipelines, index), len(range(index, keep, pipelines))
        reading = dataclasses.replace(reading, batch_size=reading.batch_size // pipelines)
    if reading.images is not None:
        keep = min(keep, reading.images)
    # workers splitting by record must read one order: a seed, fixed if none is given
    seed = reading.seed if reading.seed is not None else (
        0 if by_data else int(np.random.randint(2**31 - 1)))
    cycle = min(INTERLEAVE_CYCLE, len(paths))

    def one_pass(k):
        pass_seed = seed * 1_000_003 + k * 2  # two seeds a pass: shard order, records
        if reading.shuffle_size:
            records = files.shuffle(len(paths), seed=pass_seed, reshuffle_each_iteration=False)
            records = records.interleave(
                lambda path: tf.data.TFRecordDataset(path, compression), cycle_length=cycle,
                block_length=INTERLEAVE_BLOCK, num_parallel_calls=cycle,
                deterministic=reading.seed is not None or by_data is not None)
        else:
            records = files.flat_map(lambda path: tf.data.TFRecordDataset(path, compression))
        if by_data:
            records = records.shard(*by_data)
        records = records.take(keep)
        if reading.shuffle_size:
            records = records.shuffle(reading.shuffle_size, seed=pass_seed + 1,
                                      reshuffle_each_iteration=False)
        return records

    dataset = seeded_passes(one_pass, seed, reading.repeat).batch(
        reading.batch_size, drop_remainder=reading.drop_remainder)
    if reading.skip:
        dataset = dataset.skip(reading.skip)
    # the batch count, which the reading hides: Keras needs it to stop at the data's end
    count = None
    if not reading.repeat:
        full, rest = divmod(keep, reading.batch_size)
        count = full + (1 if rest and not reading.drop_remainder else 0)
    if reading.batches is not None:
        dataset = dataset.take(reading.batches)
        count = reading.batches if count is None else min(reading.batches, count)
    if count is not None:
        dataset = dataset.apply(tf.data.experimental.assert_cardinality(count))
    shape = metadata["image_shape"]

    def decode(serialized):
        pixels = tf.io.decode_raw(tf.io.parse_example(serialized, {"image": FEATURES["image"]})
                                  ["image"], tf.uint8)
        batch = serialized.shape[0]  # full batches keep a static size (a TPU needs one)
        return tf.reshape(pixels, [batch if batch is not None else -1, *shape])

    return finish(dataset, input_context, local_batches=shared, decode=decode,
                  decode_calls=tf.data.AUTOTUNE)


def serialize(image, label):
    """One uint8 image (h, w, c) and its label as a serialized tf.train.Example."""
    feature = {"image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[image.tobytes()])),
               "shape": tf.train.Feature(int64_list=tf.train.Int64List(value=list(image.shape))),
               "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[int(label)]))}
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def write_folder(folder, splits, origin, origin_reason, command, shards=DEFAULT_SHARDS,
                 compression="none", overwrite=False):
    """Write `splits` ({split: (uint8 images, labels)}) as a TFRecord folder; its metadata.

    Each split gets `shards` files (fewer for fewer images), contiguous runs of
    the split in order. The metadata that names them replaces the earlier one
    last; the earlier write's shards go after it.
    """
    metadata_path = join(folder, METADATA_NAME)
    if tf.io.gfile.exists(metadata_path) and not overwrite:
        raise UserError(f"{folder} already holds TFRecords ({metadata_path}); pass "
                        "--overwrite to replace them, or pick another --output-dir")
    if any(len(images) == 0 for images, _ in splits.values()):
        raise UserError("a split is empty: nothing to write")
    tf.io.gfile.makedirs(folder)
    taken = {path.rsplit("/", 1)[-1] for path in tf.io.gfile.glob(join(folder, "*"))}
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%S")
    listing = {}
    for split, (images, labels) in splits.items():
        parts = np.array_split(np.arange(len(images)), min(shards, len(images)))
        names = [shard_name(split, index, len(parts), compression)
                 for index in range(len(parts))]
        if taken & set(names):  # an earlier write's, which stay until the metadata is new
            names = [name.replace(".tfrecord", f".{stamp}.tfrecord") for name in names]
        listing[split] = {"images": int(len(images)), "shards": [
            _write_shard(join(folder, name), [serialize(images[i], labels[i]) for i in part],
                         compression) for name, part in zip(names, parts)]}
    metadata = {"format": FORMAT, "format_version": FORMAT_VERSION, "dataset": config.DATA_NAME,
                "source": origin, "source_reason": origin_reason,
                "image_shape": [int(side) for side in next(iter(splits.values()))[0].shape[1:]],
                "dtype": "uint8", "compression": compression, "splits": listing,
                "made_by": {"command": command, "tensorflow_version": tf.__version__,
                            "date": datetime.datetime.now(datetime.timezone.utc)
                            .isoformat(timespec="seconds")}}
    interrupts = watch()
    with interrupts.held():  # the new metadata, then the earlier shards gone: not cut in two
        write_json(metadata_path, metadata, what=f"{folder} holds its earlier TFRecords")
        kept = {shard["file"] for entry in listing.values() for shard in entry["shards"]}
        for path in tf.io.gfile.glob(join(folder, "*-?????-of-?????*.tfrecord*")):
            if path.rsplit("/", 1)[-1] not in kept:
                tf.io.gfile.remove(path)
        interrupts.ended = f"the new TFRecords in {folder} are whole"
    return metadata


def _write_shard(path, records, compression):
    """Write one shard whole; its entry in the metadata."""
    def write(local):
        options = tf.io.TFRecordOptions(compression_type=COMPRESSIONS[compression])
        with tf.io.TFRecordWriter(local, options) as writer:
            for record in records:
                writer.write(record)
        entry.update(bytes=os.path.getsize(local), sha256=file_sha256(local))

    entry = {"file": path.rsplit("/", 1)[-1], "records": len(records)}
    replace_file(path, write, what=f"{path.rsplit('/', 1)[0]} holds its earlier TFRecords")
    return entry

