"""The training scripts' command line: their flags, checked, and the run they ask for.

- `parse_args`: the flags (each defaults to config.py), every output folder
  proven writable and TF_CONFIG read, before any device is set up;
- `plan`: the run on its strategy (plan.Plan): batch, steps, data source,
  precision, callbacks and a backup's resume point, agreed by every process
  of a cluster. The script reads it; nothing is changed behind it.
"""
import argparse
import dataclasses
import os

from pyimagesearch import config
from pyimagesearch.errors import OneLineParser, UserError
from pyimagesearch.plan import DEVICES, Settings

MAX_SEED = 2**32 - 1           # NumPy's seed range, which keras.utils.set_random_seed uses
MAX_REHEARSAL_DEVICES = 64     # logical CPU devices; each costs threads and memory
MAX_EPOCHS, MAX_STEPS = 100_000, 1_000_000  # their product still fits an int64
MAX_STARTUP_TIMEOUT_S = 86_400.0            # a day; TensorFlow takes milliseconds


def integer(low, high=None):
    """A flag type: an integer from `low` to `high`."""
    def integer(text):  # its name is argparse's word: "invalid integer value"
        value = int(text)
        if value < low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"must be from {low} to {high}, got {text}"
                                             if high is not None else
                                             f"must be at least {low}, got {text}")
        return value

    return integer


def number(high=float("inf")):
    """A flag type: a finite number above 0 and at most `high`."""
    def number(text):
        value = float(text)
        if not 0 < value <= high or value == float("inf"):  # nan fails both
            raise argparse.ArgumentTypeError("must be a finite number above 0"
                                             + (f" and at most {high:g}" if high < float("inf")
                                                else "") + f", got {text}")
        return value

    return number


def step_range(text):
    """--profile-steps A,B: the first and last training step (from 1) to trace."""
    first, comma, last = text.partition(",")
    try:
        first, last = int(first), int(last)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected two steps A,B, got {text!r}") from None
    if not comma or not 1 <= first <= last:
        raise argparse.ArgumentTypeError(f"expected steps 1 <= A <= B, got {text!r}")
    return first, last


def build_parser(device, description=""):
    """The flags of train_<device>.py (cpu, gpu or tpu)."""
    tpu = device == "tpu"
    batch = getattr(config, DEVICES[device]["batch"])
    parser = OneLineParser(description=description,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    add = parser.add_argument
    add("--epochs", type=integer(1, MAX_EPOCHS), default=config.EPOCHS,
        help="training epochs (default %(default)s)")
    add("--batch-size", type=integer(1), default=batch,
        help=("global batch, split evenly across the TPU cores" if tpu else "batch per replica; "
              "the global batch is this times the replica count") + " (default %(default)s)")
    add("--steps-per-epoch", type=integer(1, MAX_STEPS), default=None,
        help=f"training steps per epoch (default: {config.TRAIN_IMAGES:,} images divided by "
             "the global batch; more steps fight the large-batch blur)")
    add("--data-source", choices=("auto", "tfds", "sample", "tfrecord"), default="auto",
        help="where MNIST comes from (default %(default)s: tfds if prepared or downloadable, "
             "else the 5,000-digit sample; tfrecord: a folder tools/write_tfrecords.py wrote)")
    add("--data-dir", default=None,
        help="tensorflow_datasets data dir (default: $TFDS_DATA_DIR, else tfds' own); with "
             "--data-source tfrecord, the TFRecord folder, local or gs://...")
    add("--output-dir", default=os.path.dirname(getattr(config, DEVICES[device]["figure"])),
        help="where the figure, run record and model go: a folder or a bucket, gs://... "
             "(default %(default)s)")
    add("--seed", type=integer(0, MAX_SEED), default=config.SEED,
        help="random seed (default %(default)s)")
    add("--optimizer", choices=("adam", "sgd"), default=config.OPTIMIZER,
        help="optimizer (default %(default)s)")
    add("--learning-rate", type=number(), default=config.LEARNING_RATE,
        help="learning rate (default %(default)s)")
    add("--lr-scaling", choices=("none", "sqrt", "linear"), default="none",
        help=f"scale the learning rate with the global batch over {config.BATCH_SIZE} "
             "(default %(default)s)")
    add("--loop", choices=("fit", "custom"), default="fit",
        help="model.fit, or the explicit custom loop, its loss the mean over the global batch "
             "(tf.nn.compute_average_loss; on JAX a jax.value_and_grad step) (default %(default)s)")
    add("--precision", choices=("float32", "mixed_float16", "mixed_bfloat16"), default="float32",
        help="compute precision (default %(default)s, the article's): mixed_float16 for NVIDIA "
             "GPUs with tensor cores (with loss scaling), mixed_bfloat16 for TPUs"
             + (", their native format" if tpu else "") + ", and recent CPUs")
    add("--jit-compile", action="store_true", help="compile the train step with XLA")
    add("--backup-dir", metavar="DIR",
        help="back up model and optimizer state here (a folder or gs://...) at every epoch end; "
             "the same command after a crash resumes from it; a finished run deletes it")
    add("--backup-every", metavar="N", type=integer(1),
        help="also back up every N training steps (a resumed run restarts the epoch it was in)"
             + ("; a TPU runs a whole epoch per call, so it backs up at epoch ends only"
                if tpu else ""))
    add("--logdir", metavar="DIR",
        help="write TensorBoard logs into DIR/<run name>/<start time>: `tensorboard --logdir "
             "DIR` compares the runs")
    add("--profile-steps", metavar="A,B", type=step_range,
        help="capture a profiler trace of training steps A to B into the log dir (--logdir, "
             "else logs)" + ("; on a TPU, of the whole epochs that hold them" if tpu else ""))
    if device != "cpu":
        add("--rehearse", metavar="N", type=integer(1, MAX_REHEARSAL_DEVICES),
            help=f"split the CPU into N logical devices (at most {MAX_REHEARSAL_DEVICES}) and "
                 "run this very configuration on them, no accelerator needed")
        add("--startup-timeout", metavar="SECONDS", type=number(MAX_STARTUP_TIMEOUT_S),
            default=300.0, help="under TF_CONFIG (train_gpu.py), or across the JAX processes "
                                "of a TPU slice (train_tpu.py), how long to wait for the others "
                                "to start before giving up (default %(default)s)")
    if tpu:
        add("--tpu", help="TPU name or grpc:// address (default: found from the environment: "
                          "Colab, Kaggle or a TPU VM)")
    parser.set_defaults(rehearse=None, startup_timeout=300.0)  # train_cpu.py has neither
    return parser


def parse_args(device, description, argv=None):
    """The flags of train_<device>.py, checked; `args.cluster`: this process's place in the
    cluster TF_CONFIG describes (train_gpu.py), else None."""
    args = build_parser(device, description).parse_args(argv)
    for flag in ("output_dir", "backup_dir", "logdir", "data_dir"):
        if getattr(args, flag) == "":
            raise UserError(f"--{flag.replace('_', '-')} is empty; give a folder, or leave "
                            "the flag out")
    if args.backup_every and not args.backup_dir:
        raise UserError("--backup-every needs --backup-dir")
    logdir = args.logdir or ("logs" if args.profile_steps else None)
    for flag, folder in (("--output-dir", args.output_dir), ("--logdir", logdir),
                         ("--data-dir", args.data_dir)):
        if folder and args.backup_dir and _within(folder, args.backup_dir):
            raise UserError(f"{flag} {folder} is inside --backup-dir {args.backup_dir}, which is "
                            "deleted when the run ends; give them separate folders")
    cluster = None
    if "TF_CONFIG" in os.environ or "JOBSET_NAME" in os.environ:
        import keras
        if keras.backend.backend() == "tensorflow":
            from pyimagesearch.cluster import read_tf_config
            cluster = read_tf_config()
        if cluster and device != "gpu":
            raise UserError(f"TF_CONFIG names a cluster of {cluster.workers} workers, but "
                            f"train_{device}.py trains on one machine; run train_gpu.py on every "
                            "machine (--rehearse 1 trains on their CPUs), or unset TF_CONFIG")
    from pyimagesearch.files import check_output_dir
    for folder, kind in ((args.output_dir, "output folder"), (args.backup_dir, "--backup-dir "
                         "folder"), (args.logdir, "--logdir folder")):
        if folder and (cluster is None or cluster.is_chief):  # it alone writes
            check_output_dir(folder, kind)
    return argparse.Namespace(**vars(args), cluster=cluster)


def _within(path, folder):
    """Whether `path` is `folder` or inside it: real paths for local ones (links seen)."""
    if "://" not in path and "://" not in folder:
        path, folder = os.path.realpath(path), os.path.realpath(folder)
    path, folder = path.rstrip("/"), folder.rstrip("/")
    return path == folder or path.startswith(folder + "/")


def plan(device, args, strategy):
    """The run the flags ask for on `strategy` (plan.Plan), said in a few log lines.

    Refuses what cannot work here; resolves the data source once; sets the
    precision before the model is built; makes the callbacks and reads the
    backup's resume point; in a cluster, every process checks that all run alike.
    """
    import keras

    from pyimagesearch import exits, plan as plans, strategies
    from pyimagesearch.callbacks import make_callbacks
    from pyimagesearch.data import figure_digits
    from pyimagesearch.host import detect
    from pyimagesearch.sources import resolve_source

    settings, backend = Settings.from_args(args), keras.backend.backend()
    cluster = args.cluster or getattr(strategy, "cluster", None)  # TF_CONFIG, or a JAX slice
    run = plans.make_plan(device, settings, strategy.num_replicas_in_sync,
                          bool(args.rehearse), cluster, detect().accelerator, backend)
    refuse(run, strategy)
    print(run.describe())
    network = None
    if cluster and settings.data_source in ("auto", "tfds"):
        # the chief's probe for every process: a slow one's own might pick the sample
        from pyimagesearch.host import probe
        from pyimagesearch.sources import PROBE_TIMEOUT_S, PROBE_URL
        answer = cluster.decide("network", lambda: probe(PROBE_URL, PROBE_TIMEOUT_S))
        network = lambda: answer  # noqa: E731
    try:  # in a cluster, one process's refusal is every process's
        source = resolve_source(settings.data_source, config.DATA_NAME, settings.data_dir,
                                network)
        run = plans.with_validation(dataclasses.replace(run, strategy=strategy), source)
        refusal = None
    except UserError as error:
        if not cluster:
            raise
        refusal = str(error)
    if cluster:
        cluster.agree({"error": refusal}, "data")
        cluster.agree(run.agreed_facts())
    print(f"[INFO] data source: {source.label} ({source.reason})")
    strategies.set_precision(settings.precision)
    interrupts = exits.watch()  # again: a multi-worker runtime may have taken SIGTERM over
    run = dataclasses.replace(run, interrupts=interrupts)
    callbacks, timer, backup = make_callbacks(run, figure_digits(source, run.replicas),
                                              interrupts)
    return dataclasses.replace(run, callbacks=tuple(callbacks), timer=timer, backup=backup,
                               resume_step=backup.resume() if backup else 0)


def refuse(run, strategy):
    """What cannot work on this run's strategy and backend: one line, with what does."""
    settings = run.settings
    if run.backend == "jax":
        from pyimagesearch.host import detect
        from pyimagesearch.tpu import instead_of_jax
        if settings.jit_compile:
            raise UserError("--jit-compile: not on Keras' JAX backend (JAX compiles every "
                            f"step with XLA anyway); {instead_of_jax(detect())}")
        if run.workers > 1 and settings.loop == "custom":
            raise UserError(f"--loop custom: on one host only (this run spans {run.workers} JAX "
                            "processes); leave --loop out, fit trains the same step across them")
        if run.workers > 1 and not run.rehearsal and "://" not in (settings.backup_dir or "://"):
            raise UserError(f"--backup-dir {settings.backup_dir}: every host of the slice reads "
                            "the backup process 0 writes, and cannot read this host's disk; "
                            "give a bucket (gs://...)")
        from tensorflow.python.profiler import trace
        if settings.profile_steps and callable(getattr(trace, "enabled", None)):
            # jaxlib's profiler sets TensorFlow's tracing switch to a bool as a trace starts,
            # where TensorFlow 2.21 has a function: every tf.data call then fails. No upstream
            # report; seen with jax 0.7.2 (tests/test_jax.py notices when it changes)
            raise UserError("--profile-steps on Keras' JAX backend needs TensorFlow 2.20 or "
                            "earlier (TensorFlow 2.21's tracing switch is one JAX's "
                            "profiler breaks); requirements-jax-tpu.txt installs "
                            "tensorflow-cpu 2.20.0")
        return
    import tensorflow as tf
    resolver = getattr(strategy, "cluster_resolver", None)
    node = resolver.master() if isinstance(
        resolver, tf.distribute.cluster_resolver.TPUClusterResolver) else ""
    local = [f"{flag} {folder}" for flag, folder in (
        ("--backup-dir", settings.backup_dir),
        ("--logdir", settings.logdir or ("logs" if settings.profile_steps else None)),
        ("--data-dir", settings.data_dir if settings.data_source == "tfrecord" else None))
        if folder and "://" not in folder]
    if node.startswith("grpc://") and local:  # a TPU Node runs every op on its own host
        raise UserError(f"a TPU Node ({node}) reads and writes through its own host, which "
                        f"cannot see this machine's disk: {', '.join(local)} must be in a "
                        "bucket (gs://...); a TPU VM has no such limit")
    if not settings.jit_compile:
        return
    # Keras' fit compiles strategy.run with XLA, one program over every replica's device,
    # which fails (keras-team/keras#19005, closed unfixed, so in Keras 3.15.1); the custom
    # loop compiles each replica's step on its own device. Logical CPUs are one XLA device.
    if run.device == "tpu" and not run.rehearsal:
        raise UserError("--jit-compile is for CPUs and GPUs: a TPU compiles every step with "
                        "XLA anyway")
    local = 1 if run.device == "cpu" else len(strategy.extended.worker_devices)
    if run.rehearsal and local > 1:
        raise UserError("--jit-compile cannot rehearse on several logical CPU devices in one "
                        "process; use --rehearse 1, or leave out --jit-compile")
    if run.loop == "fit" and run.replicas > 1:
        raise UserError(f"--jit-compile with fit cannot train on {run.replicas} replicas: Keras "
                        "compiles every GPU's step into one XLA program, which fails; add "
                        "--loop custom, or leave out --jit-compile")
