"""Write MNIST as sharded TFRecords, the storage the article's "Data" section advises.

    python tools/write_tfrecords.py --data-source tfds --data-dir ~/tensorflow_datasets \
        --output-dir mnist-tfrecords --shards 8
    python tools/write_tfrecords.py --data-source sample --output-dir gs://BUCKET/mnist-sample
    python train_cpu.py --data-source tfrecord --data-dir mnist-tfrecords

The training split (train) and the validation split (test) each become
--shards files, train-00000-of-00008.tfrecord and so on: one tf.train.Example
per image with its raw uint8 pixels (no PNG to decode again), its shape and
its label. metadata.json gives the counts per split and per shard, the image
shape, the source (tfds MNIST, a prepare_mnist.py --stand-in, or the
5,000-digit sample) and how the folder was made. The output may be a local
folder or a bucket (gs://...); a TPU reads it straight from a bucket.

Each shard is written whole and metadata.json last (tfrecords.write_folder):
a write stopped on the way never leaves a folder that passes for a finished
one. A folder that already holds TFRecords (a metadata.json) is left alone
unless --overwrite is given.
"""
import argparse
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # the repository's root
from pyimagesearch import host  # noqa: E402
host.prepare_tensorflow()  # Keras on TensorFlow (KERAS_BACKEND set aside in one line)

from pyimagesearch import cli, config, exits, sources, tfrecords  # noqa: E402
from pyimagesearch.errors import OneLineParser  # noqa: E402
from pyimagesearch.files import check_output_dir  # noqa: E402

SPLITS = (config.TRAIN_FLAG, config.VALIDATION_FLAG)  # training, validation


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = OneLineParser(description=__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-source", choices=("tfds", "sample"), required=True,
                        help="where the images come from: MNIST through tfds (prepared "
                             "in --data-dir or downloaded), or the 5,000-digit sample")
    parser.add_argument("--data-dir", default=None,
                        help="tfds data dir for --data-source tfds (default: "
                             "$TFDS_DATA_DIR, else tfds' own default)")
    parser.add_argument("--output-dir", required=True,
                        help="the TFRecord folder to write: a local path or gs://...")
    parser.add_argument("--shards", type=cli.integer(1), default=tfrecords.DEFAULT_SHARDS,
                        help="files per split (default %(default)s; fewer if a split "
                             "has fewer images)")
    parser.add_argument("--compression", choices=tuple(tfrecords.COMPRESSIONS),
                        default="none",
                        help="gzip makes MNIST's shards about 5x smaller (51 to 11 MB "
                             "for train), read about a third slower on 2 cores "
                             "(default %(default)s)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace the TFRecords already in --output-dir; without "
                             "it a folder holding a metadata.json is left untouched")
    args = parser.parse_args(argv)

    source = sources.resolve_source(args.data_source, config.DATA_NAME, args.data_dir)
    check_output_dir(args.output_dir)
    print(f"[INFO] reading {source.label} ({source.reason})")
    started = time.perf_counter()
    splits = {split: source.examples(split) for split in SPLITS}
    metadata = tfrecords.write_folder(
        args.output_dir, splits, origin=source.label, origin_reason=source.reason,
        command=["tools/write_tfrecords.py", *argv], shards=args.shards,
        compression=args.compression, overwrite=args.overwrite)
    for split, entry in metadata["splits"].items():
        size = sum(shard["bytes"] for shard in entry["shards"])
        print(f"[INFO] {split}: {entry['images']:,} images in {len(entry['shards'])} "
              f"shards, {size / 1e6:.1f} MB")
    print(f"[INFO] wrote {args.output_dir} in {time.perf_counter() - started:.1f} s; "
          f"train with --data-source tfrecord --data-dir {args.output_dir}")


if __name__ == "__main__":
    exits.run_main(main)
