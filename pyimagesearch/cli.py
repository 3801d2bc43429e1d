"""The command line of the three training scripts: flags, what they add to a run, one-line exits.

- `one_run`: the scripts' main() is decorated with it: the flags' values
  hold in config for the length of the run, and config.py's after it;
- `parse_args`: the flags (each defaults to config.py), TF_CONFIG and the
  output folders, all checked before any device is set up;
- `configure`: sets config.py's names to the values the flags give them on
  a strategy (batch, steps, epochs, seed, the optimizer with its learning
  rate), which the listing's lines then read; returns the run's `plan`,
  which get_data and figure_digits then read;
- `plan`: what the flags ask of a run on its strategy (a RunPlan, which
  `get_data` reads): global batch, steps, data source, precision;
- `callbacks`: the callbacks the flags ask for (timer, backup, TensorBoard,
  profiler), with a backup's resume point;
- `run_main` (exits.py): a wrong value, a lost peer or a signal
  ends the run with one line on stderr and an exit status a scheduler
  understands (errors.py).
- the flag types: a number is written the usual way or refused (`_parse`).
"""
import argparse
import dataclasses
import functools
import os
import re

import keras
import tensorflow as tf

from pyimagesearch import config
from pyimagesearch.callbacks import make_callbacks
from pyimagesearch.data import figure_digits
from pyimagesearch.errors import EXIT_USER_ERROR, NothingToDo, OneLineParser, UserError  # noqa: F401
from pyimagesearch.exits import note_run, run_main  # noqa: F401  (the scripts')
from pyimagesearch.files import check_output_dir, recover
from pyimagesearch.runtime import DEVICES, hardware
from pyimagesearch.plan import (Settings, check_levers, figure_path, one_run,  # noqa: F401
                                plan_run, set_run, start_data_at, written)
from pyimagesearch.strategies import PRECISIONS, set_precision
from pyimagesearch.sources import SOURCES, probe_network, resolve_data_dir, resolve_source


# what a person types: ASCII digits, a sign, a point, an exponent (int() and
# float() also take "1_0" and other scripts' digits, such as "٣")
_INTEGER = re.compile(r"[+-]?[0-9]+")
_DECIMAL = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?|[+-]?(inf|nan)",
                      re.IGNORECASE)


def _parse(kind, text):
    """int(text) or float(text), for text written the usual way only; ValueError else."""
    if not (_INTEGER if kind is int else _DECIMAL).fullmatch(text.strip()):
        raise ValueError(text)
    return kind(text)


def _number(kind, minimum, text):
    """Parse `text` as `kind` and require it to be >= `minimum`."""
    try:
        value = _parse(kind, text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected {'an integer' if kind is int else 'a number'}, got {text!r}")
    if not value >= minimum:  # also rejects nan
        raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {text}")
    return value


def bounded_int(minimum, maximum):
    """A flag type: an integer from `minimum` to `maximum`."""
    def parse(text):
        value = _number(int, minimum, text)
        if value > maximum:
            raise argparse.ArgumentTypeError(f"must be at most {maximum}, got {text}")
        return value

    parse.__name__ = "integer"
    return parse


MAX_SEED = 2**32 - 1  # NumPy's seed range, which keras.utils.set_random_seed uses
seed = bounded_int(0, MAX_SEED)  # an integer seed NumPy accepts


positive_int = functools.partial(_number, int, 1)
non_negative_int = functools.partial(_number, int, 0)
positive_int.__name__ = "positive integer"
non_negative_int.__name__ = "non-negative integer"


def step_range(text):
    """'A,B': the first and last training step (counted from 1) to profile."""
    first, comma, last = text.partition(",")
    try:
        first, last = _parse(int, first), _parse(int, last)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected two steps A,B, got {text!r}")
    if not comma or not 1 <= first <= last:
        raise argparse.ArgumentTypeError(f"expected steps 1 <= A <= B, got {text!r}")
    return first, last


def positive_float(text):
    """A finite float > 0."""
    try:
        value = _parse(float, text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}")
    if not 0.0 < value < float("inf"):  # also rejects nan
        raise argparse.ArgumentTypeError(f"must be a finite number above 0, got {text}")
    return value


OPTIMIZERS = ("adam", "sgd")
LOOPS = ("fit", "custom")
LR_SCALINGS = ("none", "sqrt", "linear")


MAX_REHEARSAL_DEVICES = 64   # logical CPU devices; each costs threads and memory
MAX_EPOCHS = 100_000          # with MAX_STEPS_PER_EPOCH, the steps still fit an int64
MAX_STEPS_PER_EPOCH = 1_000_000
STARTUP_TIMEOUT_S = 300.0     # s; a scheduler may start a cluster's pods minutes apart
MAX_STARTUP_TIMEOUT_S = 86_400.0  # s; TensorFlow takes the limit in milliseconds, as int64


def startup_seconds(text):
    """--startup-timeout: seconds above 0, a day at most."""
    value = positive_float(text)
    if value > MAX_STARTUP_TIMEOUT_S:
        raise argparse.ArgumentTypeError(
            f"must be at most {MAX_STARTUP_TIMEOUT_S:g} (a day), got {text}")
    return value


EVERY_DEVICE = DEVICES  # runtime.HARDWARE's: cpu, gpu, tpu
REHEARSED = tuple(device for device in DEVICES if hardware(device).rehearse)  # gpu, tpu

# The flags of train_<device>.py in --help's order, a row each: flag, type (a
# flag type, a tuple of choices, bool for a switch, None for text), default,
# help, the devices whose script has it, metavar. A default or help that is a
# function of the device is called as the parser is built: written() must read
# config.py as it is then, and train_tpu.py's help says what differs on a TPU.
FLAGS = (
    ("--epochs", bounded_int(1, MAX_EPOCHS), lambda device: written("EPOCHS"),
     "training epochs (default %(default)s)", EVERY_DEVICE, None),
    ("--batch-size", positive_int,
     lambda device: written(hardware(device).batch),
     lambda device: ("global batch, split evenly across the TPU cores"
                     if hardware(device).whole_epochs else
                     "batch per replica; the global batch is this times the replica count")
     + " (default %(default)s)", EVERY_DEVICE, None),
    ("--steps-per-epoch", bounded_int(1, MAX_STEPS_PER_EPOCH), None,
     lambda device: f"training steps per epoch (default: {config.TRAIN_IMAGES:,} images "
                    "divided by the global batch; more steps fight the large-batch blur)",
     EVERY_DEVICE, None),
    ("--data-source", SOURCES, "auto",
     "where MNIST comes from (default %(default)s: tfds if prepared or downloadable, else "
     "the 5,000-digit sample; tfrecord: a folder tools/write_tfrecords.py wrote)",
     EVERY_DEVICE, None),
    ("--data-dir", None, None,
     "tensorflow_datasets data dir (default: $TFDS_DATA_DIR, else tfds' own default); with "
     "--data-source tfrecord, the TFRecord folder, local or gs://...", EVERY_DEVICE, None),
    ("--output-dir", None, lambda device: os.path.dirname(figure_path(device)) or ".",
     lambda device: "where the figure, run record and model go: a folder or a bucket, "
                    "gs://... (default %(default)s, the folder "
                    f"of config.{hardware(device).figure})", EVERY_DEVICE, None),
    ("--seed", seed, lambda device: written("SEED"),
     "random seed (default %(default)s)", EVERY_DEVICE, None),
    ("--optimizer", OPTIMIZERS, lambda device: written("OPTIMIZER"),
     "optimizer (default %(default)s)", EVERY_DEVICE, None),
    ("--learning-rate", positive_float, lambda device: written("LEARNING_RATE"),
     "learning rate (default %(default)s)", EVERY_DEVICE, None),
    ("--lr-scaling", LR_SCALINGS, "none",
     lambda device: "scale the learning rate with the global batch over "
                    f"{written('BATCH_SIZE')} (default %(default)s)", EVERY_DEVICE, None),
    ("--loop", LOOPS, "fit",
     "model.fit, or the explicit custom loop, its loss the mean over the global batch "
     "(tf.nn.compute_average_loss; on JAX a jax.value_and_grad step) (default "
     "%(default)s)", EVERY_DEVICE, None),
    ("--precision", PRECISIONS, "float32",
     lambda device: "compute precision (default %(default)s, the article's): mixed_float16 "
                    "for NVIDIA GPUs with tensor cores (with loss scaling), mixed_bfloat16 "
                    "for TPUs" + (", their native format" if device == "tpu" else "")
                    + ", and recent CPUs", EVERY_DEVICE, None),
    ("--jit-compile", bool, False, "compile the train step with XLA", EVERY_DEVICE, None),
    ("--backup-dir", None, None,
     "back up model and optimizer state here (a folder or gs://...) at every epoch end; "
     "the same command after a crash resumes from it; a finished run deletes it",
     EVERY_DEVICE, "DIR"),
    ("--backup-every", positive_int, None,
     lambda device: "also back up every N training steps (a resumed run restarts the "
                    "epoch it was in)" + ("; a TPU runs a whole epoch per call, so it "
                                          "backs up at epoch ends only"
                                          if device == "tpu" else ""), EVERY_DEVICE, "N"),
    ("--logdir", None, None,
     "write TensorBoard logs into DIR/<run name>/<start time>, e.g. "
     "logs/cpu/20261203-120000: `tensorboard --logdir DIR` compares the runs",
     EVERY_DEVICE, "DIR"),
    ("--profile-steps", step_range, None,
     lambda device: "capture a profiler trace of training steps A to B into the log dir "
                    "(--logdir, else logs)" + ("; on a TPU, of the whole epochs that hold "
                                               "them" if device == "tpu" else ""),
     EVERY_DEVICE, "A,B"),
    ("--rehearse", bounded_int(1, MAX_REHEARSAL_DEVICES), None,
     f"split the CPU into N logical devices (at most {MAX_REHEARSAL_DEVICES}) and run this "
     "very configuration on them, no accelerator needed", REHEARSED, "N"),
    ("--startup-timeout", startup_seconds, STARTUP_TIMEOUT_S,
     "under TF_CONFIG (train_gpu.py), or across the JAX processes of a TPU slice "
     "(train_tpu.py), how long to wait for the others to start before giving up "
     "(default %(default)s)", ("gpu", "tpu"), "SECONDS"),
    ("--tpu", None, None,
     "TPU name or grpc:// address (default: found from the environment: Colab, Kaggle or "
     "a TPU VM)", ("tpu",), None),
)


def _for_device(value, device):
    """A row's default or help on `device`: a function of the device is called, else as is."""
    return value(device) if callable(value) else value


def _kind_arguments(kind, metavar):
    """add_argument's keywords for a row's type and metavar (a switch takes neither)."""
    if kind is bool:
        return {"action": "store_true"}
    arguments = {"choices": kind} if isinstance(kind, tuple) else {"type": kind}
    if metavar:
        arguments["metavar"] = metavar
    return arguments


def build_parser(device, description):
    """The flags of train_<device>.py; `device` is cpu, gpu or tpu."""
    parser = OneLineParser(
        description=description,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    for flag, kind, default, text, devices, metavar in FLAGS:
        if device in devices:
            parser.add_argument(flag, default=_for_device(default, device),
                                help=_for_device(text, device), **_kind_arguments(kind, metavar))
    return parser


def parse_args(device, description, argv=None):
    """The flags of train_<device>.py, checked before any device is set up.

    `args.cluster` is this process's place in the cluster TF_CONFIG names
    (train_gpu.py only), else None; every folder this process will write
    is created and proven writable.
    """
    args = build_parser(device, description).parse_args(argv)
    args.cluster = read_cluster(device, getattr(args, "startup_timeout", STARTUP_TIMEOUT_S))
    note_run(args.cluster)  # run_main reports a lost peer of it; --backup-dir resumes it
    check_run_flags(Settings.from_args(args),
                    is_chief=args.cluster is None or args.cluster.is_chief)
    return args


def configure(device, args, strategy):
    """Set config.py's values as the flags give them for a run on `strategy`; the run's plan.

    In place, so the listing's `config.BATCH_SIZE` and the rest are
    config.py's own names, with this run's values. Changed: SEED and EPOCHS;
    the batch (TPU_BATCH_SIZE, global; on CPU and GPU BATCH_SIZE, per
    replica) and the steps per epoch (TPU_STEPS_PER_EPOCH, or STEPS_PER_EPOCH
    on CPU and GPU) derived from it; on a TPU, TPU_VALIDATION_STEPS as the
    data source allows; and OPTIMIZER, a Keras optimizer config that carries
    the learning rate (scaled by --lr-scaling), which compile() builds inside
    the strategy's scope. Inside `one_run` only: its end puts config.py's
    values back. The plan is the run's: get_data and figure_digits read it.
    """
    run = plan(device, args, strategy)
    row = hardware(device)
    values = {"SEED": args.seed, "EPOCHS": args.epochs, "OPTIMIZER": run.optimizer_config(),
              row.batch: args.batch_size, row.steps: run.steps_per_epoch}
    if row.whole_epochs:
        values["TPU_VALIDATION_STEPS"] = run.validation.steps
    set_run(values, run)
    return run


def plan(device, args, strategy):
    """The run the flags ask for on `strategy`: a RunPlan, which get_data and the outputs read.

    Works out the global batch, steps and learning rate; refuses levers that
    cannot work; resolves the data source once (and says which, and why);
    sets the compute precision, before the model is built; in a cluster,
    checks that every worker runs the same settings on the same data.
    """
    settings = Settings.from_args(args)
    backend = keras.backend.backend()  # Keras' own, fixed when Keras was first imported
    if backend == "jax":
        from pyimagesearch.jax_route import refuse_levers
        refuse_levers(settings, processes=args.cluster.workers if args.cluster else 1,
                      rehearsal=bool(getattr(args, "rehearse", None)))
    run = plan_run(device, settings, strategy.num_replicas_in_sync,
                   rehearsal=bool(getattr(args, "rehearse", None)), cluster=args.cluster,
                   backend=backend)
    check_levers(run, strategy)
    node = tpu_node(strategy)
    if node:
        check_tpu_node_paths(settings, node)
    print(run.describe())
    network = None
    if args.cluster and settings.data_source in ("auto", "tfds"):
        # one probe, the chief's, for every worker: a slow worker's own would
        # pick the sample while the others download MNIST
        answer = args.cluster.decide("network", probe_network)
        network = lambda: answer  # noqa: E731
    source = resolve_source(settings.data_source, config.DATA_NAME,
                            resolve_data_dir(settings.data_dir), network)
    if node and getattr(source, "on_local_disk", False):
        # refused before tfds downloads anything: the download would land here
        what = "prepared on" if source.prepared else "downloaded to"
        raise UserError(f"a TPU Node ({node}) reads its data itself, and cannot read "
                        f"{source.data_name} {what} this machine's disk ({source.reason}); "
                        "give --data-dir gs://... (tfds or TFRecords), or use "
                        "--data-source sample")
    print(f"[INFO] data source: {source.label} ({source.reason})")
    run = run.with_data(source, strategy)
    if run.validation_note():
        print(run.validation_note())
    if args.cluster and backend != "jax":
        from pyimagesearch.workarounds import preemption_handler_acts
        # a decision that makes a collective (the handler's variable): taken
        # once here, where each worker asks Google Cloud's metadata server
        # (TensorFlow gives it 5 s), and agreed by all, or one slow answer hangs them
        run = dataclasses.replace(run, preemption_handler=preemption_handler_acts())
    if args.cluster:
        args.cluster.agree(run.agreed_facts())  # TensorFlow's workers, or a JAX slice's
    set_precision(settings.precision)
    return run


def tpu_node(strategy):
    """The grpc:// address of a TPU Node that `strategy` trains on; None for anything else.

    On a TPU VM (Colab's and Kaggle's TPUs, a Cloud TPU VM) the TPU is this
    machine's, and its resolver has no address. A TPU Node (`--tpu NAME` or
    a grpc:// address) is another machine: once connected, TensorFlow runs
    every op there by default (connect_to_cluster's make_master_device_default),
    so its file reads and writes (datasets, checkpoints, summaries) happen on
    the TPU's host, which cannot see this machine's disk.
    """
    resolver = getattr(strategy, "cluster_resolver", None)
    if not isinstance(resolver, tf.distribute.cluster_resolver.TPUClusterResolver):
        return None
    master = resolver.master()
    return master if master.startswith("grpc://") else None


def check_tpu_node_paths(settings, node):
    """Refuse, in one line, the local folders that a TPU Node's own ops would read or write."""
    def local(path):
        return "://" not in path

    folders = []
    if settings.backup_dir and local(settings.backup_dir):
        folders.append(f"--backup-dir {settings.backup_dir}")
    if (settings.logdir or settings.profile_steps) and local(settings.logdir or "logs"):
        folders.append(f"--logdir {settings.logdir or 'logs'}")
    if settings.data_source == "tfrecord" and settings.data_dir and local(settings.data_dir):
        folders.append(f"--data-dir {settings.data_dir}")
    if folders:
        raise UserError(f"a TPU Node ({node}) reads and writes through its own host, which "
                        f"cannot see this machine's disk: {', '.join(folders)} must be in a "
                        "bucket (gs://...); a TPU VM has no such limit")


def callbacks(plan):
    """The callbacks the flags ask for, as RunCallbacks, after reading the backup.

    Its `start` is the global steps a backup (--backup-dir) has trained
    already: training resumes there, and the run's get_data starts its
    training batches there.
    """
    run_callbacks = make_callbacks(plan, figure_digits(
        plan.source.examples(config.VALIDATION_FLAG)))
    start_data_at(run_callbacks.resume(plan.cluster))
    return run_callbacks


def read_cluster(device, startup_timeout_s=STARTUP_TIMEOUT_S):
    """This process's place in the cluster TF_CONFIG describes; None when it trains alone.

    Only train_gpu.py trains across machines; an evaluator task has nothing
    to do, since validation runs inside training. With neither TF_CONFIG
    nor a JobSet's name in the environment, the cluster module is not even
    loaded; anything else, an empty TF_CONFIG included, is read_tf_config's.
    train_tpu.py on JAX spans the processes of a TPU slice instead (jax_slice.py).
    """
    if device == "tpu" and keras.backend.backend() == "jax":
        return read_slice(startup_timeout_s)
    if "TF_CONFIG" not in os.environ and "JOBSET_NAME" not in os.environ:
        return None
    from pyimagesearch.cluster import EVALUATOR, read_tf_config

    cluster = read_tf_config()
    if cluster is None:
        return None
    if cluster.task_type == EVALUATOR:
        raise NothingToDo(f"TF_CONFIG makes this process {cluster.name}: no evaluator "
                          "is needed, validation runs inside training")
    if device != "gpu":
        raise UserError(f"TF_CONFIG names a cluster of {cluster.workers} workers, but "
                        f"train_{device}.py trains on one machine; run train_gpu.py on "
                        "every machine (--rehearse 1 trains on their CPUs), or unset "
                        "TF_CONFIG")
    return cluster


def read_slice(startup_timeout_s):
    """Keras on JAX: this process's Slice when the run spans several (a TPU slice's hosts,
    the launcher's rehearsal), joined within `startup_timeout_s`; None for one host
    (jax_slice.py is then not loaded)."""
    if not {"KERAS_DISTRIBUTION_NUM_PROCESSES", "TPU_WORKER_HOSTNAMES"} & set(os.environ):
        return None
    from pyimagesearch.jax_slice import join, processes

    count = processes()
    return join(count, startup_timeout_s) if count > 1 else None


def check_run_flags(settings, is_chief=True):
    """Before any training: flags that go together do, and every output folder is writable.

    A worker that is not the chief (`is_chief` False) writes nothing of its own.
    """
    if settings.backup_every and not settings.backup_dir:
        raise UserError("--backup-every needs --backup-dir")
    for flag in ("output_dir", "backup_dir", "logdir", "data_dir"):
        if getattr(settings, flag) == "":
            raise UserError(f"--{flag.replace('_', '-')} is empty; give a folder, "
                            "or leave the flag out")
    check_folders(settings)
    if is_chief:
        for folder, kind in ((settings.output_dir, "output folder"),
                             (settings.backup_dir, "--backup-dir folder"),
                             (settings.logdir, "--logdir folder")):
            if folder:
                check_output_dir(folder, kind)
        recover(settings.output_dir)  # what a run killed while it wrote its outputs left


def check_folders(settings):
    """Refuse folder flags whose files the run would delete, compared as the file system sees them.

    The backup folder is deleted when the run ends: outputs, logs or data
    inside it would go with it. Local folders are compared by their real
    paths, so a symbolic link (an --output-dir that is a link into the
    backup, a --backup-dir that is a link to the output folder) is seen.
    """
    backup = settings.backup_dir
    if not backup:
        return
    logdir = settings.logdir or ("logs" if settings.profile_steps else None)
    for flag, folder in (("--output-dir", settings.output_dir), ("--logdir", logdir),
                         ("--data-dir", settings.data_dir)):
        if folder and _within(folder, backup):
            linked = "" if _within(folder, backup, real=False) else " (through a symbolic link)"
            raise UserError(f"{flag} {folder} is inside --backup-dir {backup}{linked}, which "
                            "is deleted when the run ends; give them separate folders")


def _within(path, folder, real=True):
    """Whether `path` is `folder` or inside it: real paths for local ones, URLs as written."""
    if "://" not in path and "://" not in folder:
        resolve = os.path.realpath if real else os.path.abspath
        path, folder = resolve(path), resolve(folder)
    path, folder = path.rstrip("/"), folder.rstrip("/")
    return path == folder or path.startswith(folder + "/")
