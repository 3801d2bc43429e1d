"""Writing a TFRecord folder: shards and metadata staged, then published all together.

The format is `tfrecords`' (its docstring describes the folder); this is
the writing side, which only tools/write_tfrecords.py and the tests need,
so a training run never loads it.
"""
import datetime
import os

import numpy as np
import tensorflow as tf

from pyimagesearch.errors import UserError, first_line
from pyimagesearch.files import join, write_json
from pyimagesearch.files import StagedOutputs, recover
from pyimagesearch.tfrecords import COMPRESSIONS, DEFAULT_SHARDS, FORMAT, FORMAT_VERSION, METADATA_NAME, ORIGINS, file_sha256, shard_name


def serialize(image, label):
    """One image (uint8, (h, w, c)) and its label as a serialized tf.train.Example."""
    feature = {
        "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[image.tobytes()])),
        "shape": tf.train.Feature(int64_list=tf.train.Int64List(value=list(image.shape))),
        "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[int(label)])),
    }
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def check_destination(folder, overwrite=False):
    """Refuse to write into a folder that holds finished TFRecords, unless `overwrite`.

    A folder with shards but no metadata is an interrupted write: it is
    written over without asking.
    """
    metadata_path = join(folder, METADATA_NAME)
    try:
        finished = tf.io.gfile.exists(metadata_path)
    except tf.errors.OpError as error:
        raise UserError(f"cannot look into {folder}: {first_line(error)}") from error
    if finished and not overwrite:
        raise UserError(f"{folder} already holds TFRecords ({metadata_path}); "
                        "pass --overwrite to replace them, or pick another --output-dir")
    return finished


def write_shard(path, records, compression):
    """Write `records` to the local scratch file `path`; its entry in the metadata."""
    options = tf.io.TFRecordOptions(compression_type=COMPRESSIONS[compression])
    with tf.io.TFRecordWriter(path, options) as writer:
        for record in records:
            writer.write(record)
    return {"file": os.path.basename(path), "records": len(records),
            "bytes": os.path.getsize(path), "sha256": file_sha256(path)}


def _remove_stale(folder, splits, keep):
    """Delete our shards and temporaries of an earlier write that the new metadata omits."""
    for split in splits:
        for pattern in (f"{split}-?????-of-?????.tfrecord*", f".{split}-?????-of-?????.*tmp"):
            for path in tf.io.gfile.glob(join(folder, pattern)):
                if path.rsplit("/", 1)[-1] not in keep:
                    tf.io.gfile.remove(path)


def write_folder(folder, splits, dataset, origin, origin_reason, command,
                 shards=DEFAULT_SHARDS, compression="none", overwrite=False):
    """Write `splits` ({split: (uint8 images (N, h, w, c), labels)}) as a TFRecord folder.

    Every split gets `shards` files (fewer if it has fewer images), each a
    contiguous run of the split in its order, so reading the shards in
    order gives the split back. Returns the metadata.
    """
    if origin not in ORIGINS:
        raise ValueError(f"origin must be one of {ORIGINS}, not {origin!r}")
    if compression not in COMPRESSIONS:
        raise UserError(f"unknown compression {compression!r}; "
                        f"choose one of {', '.join(COMPRESSIONS)}")
    shapes = {images.shape[1:] for images, _ in splits.values()}
    if len(shapes) != 1 or any(images.dtype != np.uint8 for images, _ in splits.values()):
        raise ValueError(f"every split must hold uint8 images of one shape, got {shapes}")
    for split, (images, _) in splits.items():
        if len(images) == 0:
            raise UserError(f"the {split} split is empty: nothing to write")
    recover(folder)  # a write killed mid-swap: its old or its new set made whole first
    check_destination(folder, overwrite)
    try:
        tf.io.gfile.makedirs(folder)
    except (OSError, tf.errors.OpError) as error:
        raise UserError(f"cannot write to {folder}: {first_line(error)}") from error
    # every file is written to a local scratch folder first, then the whole set
    # replaces the old one in `folder`: the folder holds the old TFRecords or
    # the new ones, whatever stops the process on the way (a full scratch
    # folder is one line naming it)
    with StagedOutputs(folder) as staged:
        metadata = _write_staged(staged, splits, dataset, origin, origin_reason, command,
                                 shards, compression, shapes.pop())
    _remove_stale(folder, metadata["splits"], {
        shard["file"] for entry in metadata["splits"].values() for shard in entry["shards"]})
    return metadata


def _write_staged(staged, splits, dataset, origin, origin_reason, command, shards,
                  compression, shape):
    """Write every shard and the metadata as `staged` files; the metadata."""
    listing = {}
    for split, (images, labels) in splits.items():
        count = min(shards, len(images))
        parts = np.array_split(np.arange(len(images)), count)
        listing[split] = {"images": int(len(images)), "shards": [
            write_shard(staged.path(shard_name(split, index, count, compression)),
                         [serialize(images[i], labels[i]) for i in part], compression)
            for index, part in enumerate(parts)]}
    metadata = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "dataset": dataset,
        "source": origin,
        "source_reason": origin_reason,
        "image_shape": [int(side) for side in shape],
        "dtype": "uint8",
        "compression": compression,
        "features": {"image": "bytes: raw uint8 pixels, row-major (height, width, channels)",
                     "shape": "int64 x 3: height, width, channels",
                     "label": "int64: the class"},
        "splits": listing,
        "made_by": {"command": command,
                    "date": datetime.datetime.now(datetime.timezone.utc)
                    .isoformat(timespec="seconds"),
                    "tensorflow_version": tf.__version__},
    }
    write_json(staged.path(METADATA_NAME), metadata)
    return metadata
