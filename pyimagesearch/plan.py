"""What a run works out from what it is asked (`Settings`, below): a `RunPlan`.

`plan_run` turns the settings into the numbers a run trains with on a
number of replicas (global batch, steps, steps per execution, learning
rate, which loop) and this process's place in a cluster. `RunPlan.with_data`
adds what follows from the strategy and the data source: the validation cut
and the facts every worker must agree on. `get_data`, the callbacks and the
outputs all read the plan, never the argparse namespace.

Also here:
- What a run is asked to do (`Settings`, from the flags), and the name its outputs take.
"""
import contextlib
import dataclasses
import os
import re
import sys

import keras

from pyimagesearch import config
from pyimagesearch.errors import UserError
from pyimagesearch.runtime import hardware, runtime_suffix, this_runtime


# --- What a run is asked to do (`Settings`, from the flags), and the name its outputs take ----
# `run_name` names a run's figure, record, model, logs and backups from its
# device and the flags that set it apart from the script's defaults
# (`flags_apart`), so that a rerun replaces its own outputs and no other
# run's. Inside `one_run`, `set_run` sets config.py's names to a run's values
# in place, and the scope puts config.py's back when it ends.


@dataclasses.dataclass(frozen=True)
class Settings:
    """The training flags, as parsed: every field is a flag of the same name."""

    epochs: int = config.EPOCHS
    batch_size: int = config.BATCH_SIZE   # per replica on CPU and GPU, global on TPU
    steps_per_epoch: int | None = None    # None: an epoch of config.TRAIN_IMAGES
    data_source: str = "auto"
    data_dir: str | None = None
    output_dir: str = config.BASE_IMG_PATH
    seed: int = config.SEED
    optimizer: str = config.OPTIMIZER
    learning_rate: float = config.LEARNING_RATE
    lr_scaling: str = "none"
    loop: str = "fit"
    precision: str = "float32"
    jit_compile: bool = False
    backup_dir: str | None = None
    backup_every: int | None = None       # training steps between backups
    logdir: str | None = None
    profile_steps: tuple[int, int] | None = None

    @classmethod
    def from_args(cls, args):
        """The Settings held by an argparse namespace (other attributes are ignored)."""
        return cls(**{field.name: getattr(args, field.name)
                      for field in dataclasses.fields(cls)})


# The flags that change what a run trains, in the order of --help: a run's
# name carries those that differ from the script's defaults. Folders,
# backups, logs and profiles change where things go, not the run.
NAMED_FLAGS = ("epochs", "batch_size", "steps_per_epoch", "data_source", "seed", "optimizer",
               "learning_rate", "lr_scaling", "loop", "precision", "jit_compile")


# the runs under way in this process, innermost last (one_run): config.py's
# values before each, its plan, and the training steps its data skips
_under_way = []


@contextlib.contextmanager
def one_run():
    """A run's scope: inside it config's names take the run's values; after it, config.py's.

    The scripts' main() is decorated with it (`@cli.one_run()`), so the flags
    override the article's config values for the length of main() and no
    longer: a second run in the same process, or a test, starts from
    config.py again, whatever way the first one ended.
    """
    run = {"before": {name: value for name, value in vars(config).items() if name.isupper()},
           "plan": None, "skip": 0}
    _under_way.append(run)
    try:
        yield
    finally:
        _under_way.remove(run)
        for name, value in run["before"].items():
            setattr(config, name, value)


def override(values):
    """In a run's scope: config's names take `values` ({name: value}) until the scope ends."""
    if not _under_way:
        raise RuntimeError("config's values are set for a run: inside one_run() only, "
                           "or they would outlive the run")
    for name, value in values.items():
        setattr(config, name, value)


def set_run(values, plan):
    """In a run's scope: config's names take `values`, and `plan` is the run's."""
    override(values)
    _under_way[-1]["plan"] = plan


def start_data_at(skip):
    """The run's training data starts `skip` batches in (the steps a backup holds)."""
    if _under_way:
        _under_way[-1]["skip"] = skip


def under_way():
    """(plan, skip) of the run under way (get_data and figure_digits read it); None outside one."""
    if not _under_way or _under_way[-1]["plan"] is None:
        return None
    return _under_way[-1]["plan"], _under_way[-1]["skip"]


def written(name):
    """config.NAME as config.py (or a reader's edit of it) has it, not as a run's flags set it."""
    before = _under_way[0]["before"] if _under_way else {}
    return before.get(name, getattr(config, name))


def default_settings(device):
    """train_<device>.py's defaults: the TPU's batch is the article's global 1024."""
    return Settings(batch_size=written(hardware(device).batch))


def flags_apart(device, settings):
    """The flags of `settings` that differ from train_<device>.py's defaults, as typed.

    ["--lr-scaling", "sqrt", "--jit-compile"]: what sets the run apart from
    the default run of its script (NAMED_FLAGS).
    """
    return [word for flag, value in _differences(device, settings)
            for word in (f"--{flag}",) + ((value,) if value is not None else ())]


def _differences(device, settings):
    """(flag, value as typed) for each NAMED_FLAGS field off its default; value None: a switch."""
    defaults = default_settings(device)
    for field in NAMED_FLAGS:
        value = getattr(settings, field)
        if value != getattr(defaults, field):
            # a float as Python prints it: every digit that counts, so 0.001 and 0.0011 differ
            yield field.replace("_", "-"), None if isinstance(value, bool) else str(value)


def run_name(device, settings, rehearsal=False, runtime=None, backend="tensorflow"):
    """The stem of a run's outputs: what sets the run apart from every other run.

    The device's figure name (cpu, gpu, tpu: config.*_IMG_PATH), then
    `rehearsal`, then each flag that differs from the script's defaults
    (flags_apart), then `jax` for Keras on JAX, then the runtime where a CPU
    run or a rehearsal ran on a machine with a GPU or TPU. The default runs
    on TensorFlow keep the article's names:

        train_cpu.py                                cpu
        train_tpu.py --rehearse 8                   tpu_rehearsal
        KERAS_BACKEND=jax train_tpu.py --rehearse 8 tpu_rehearsal_jax
        train_tpu.py --lr-scaling sqrt              tpu_lr-scaling-sqrt
        train_cpu.py --epochs 1, on a GPU runtime   cpu_epochs-1_gpu-runtime

    The same flags on the same runtime give the same name, so a rerun
    replaces its own outputs and no other run's. Letters, digits, `.`, `_`
    and `-` only: a file name anywhere, and in a bucket.
    """
    stem = os.path.splitext(os.path.basename(figure_path(device)))[0]
    parts = [stem] + (["rehearsal"] if rehearsal else [])
    # an exponent's "+" is dropped, not made "-": 1e+300 and 1e-300 stay apart
    parts += [flag if value is None else f"{flag}-{str(value).replace('+', '')}"
              for flag, value in _differences(device, settings)]
    tag = hardware(device, backend).tag  # "jax": Keras on JAX (runtime.HARDWARE)
    parts += [tag] if tag else []
    return re.sub(r"[^A-Za-z0-9._-]", "-", "_".join(parts)) + runtime_suffix(
        device == "cpu" or rehearsal, runtime)


def figure_path(device):
    """config.CPU_IMG_PATH, GPU_IMG_PATH or TPU_IMG_PATH (the device's `figure` in
    runtime.HARDWARE): names the run's outputs.

    Read when called, so an edited config.py (or a test's) takes effect.
    """
    return getattr(config, hardware(device).figure)


@dataclasses.dataclass(frozen=True)
class Validation:
    """What val_loss is the mean over."""

    steps: int | None     # batches per evaluation; None: one pass over the split
    images: int           # images val_loss averages
    split_images: int     # images in the validation split


@dataclasses.dataclass(frozen=True)
class RunPlan:
    """The numbers one run trains with, derived from the settings and the strategy."""

    settings: Settings
    device: str               # cpu, gpu or tpu: the configuration being run
    name: str                 # stem of the output files
    rehearsal: bool           # True when logical CPU devices stand in for the device
    replicas: int             # strategy.num_replicas_in_sync
    global_batch_size: int    # images per step, over all replicas
    steps_per_epoch: int
    steps_per_execution: int  # train steps per call into the compiled function
    fixed_validation: bool    # TPU style: repeated data, full batches, fixed steps
    learning_rate: float      # after --lr-scaling
    loop: str                 # "fit" or "custom"
    workers: int = 1          # processes of a multi-worker cluster
    is_chief: bool = True     # this process writes the outputs, logs and backups
    cluster: object = None    # this process's place in a TF_CONFIG cluster, if any
    # from `with_data`: the strategy, the data source and the validation cut
    strategy: object = None
    source: object = None
    validation: Validation | None = None
    # in a cluster: whether TensorFlow's PreemptionCheckpointHandler acts here
    preemption_handler: bool | None = None
    runtime: str = "cpu"      # what this machine trains on: cpu, gpu or tpu (in the name)
    backend: str = "tensorflow"  # Keras' backend: "tensorflow", or "jax" (train_tpu.py)

    @property
    def jit_compile(self):
        """compile()'s jit_compile: --jit-compile on TensorFlow; JAX jits every step."""
        return True if self.backend == "jax" else self.settings.jit_compile

    @property
    def verbose(self):
        """fit's verbosity: a progress bar on a terminal, one line per epoch in a log file."""
        return 1 if sys.stdout.isatty() else 2

    def with_data(self, source, strategy):
        """This plan on `strategy`, reading `source`: the validation cut worked out.

        On CPU and GPU validation is one pass over the split, every batch
        split evenly between the replicas: a split that is not a multiple of
        the replica count leaves out its last few images (498 of 500 on 3
        replicas) rather than give a replica an empty batch. The TPU
        configuration needs full batches: the split is repeated and cut to
        config.TPU_VALIDATION_STEPS batches when the batch is
        config.TPU_BATCH_SIZE, else to `len // global batch`; never more than
        one pass, never fewer than 1 batch (on the 500-digit sample one batch
        of 1024 repeats digits). The cut is made in the dataset, not with
        Keras' validation_steps, because Keras rounds those up to whole
        multiples of steps_per_execution.
        """
        train_images = source.size(config.TRAIN_FLAG)
        if self.global_batch_size > train_images:
            raise UserError(f"a global batch of {self.global_batch_size:,} images is more "
                            f"than the {train_images:,} training images of {source.label}; "
                            "lower --batch-size")
        count = source.size(config.VALIDATION_FLAG)
        if self.fixed_validation:
            batches = max(1, count // self.global_batch_size)
            if self.global_batch_size == config.TPU_BATCH_SIZE:
                batches = max(1, min(config.TPU_VALIDATION_STEPS, batches))
            validation = Validation(batches, batches * self.global_batch_size, count)
        else:
            validation = Validation(None, usable_images(count, self.replicas), count)
        return dataclasses.replace(self, strategy=strategy, source=source,
                                   validation=validation)

    def describe(self):
        """The log lines that say how the run is laid out."""
        lines = [f"[INFO] global batch {self.global_batch_size} "
                 f"({self.global_batch_size // self.replicas} per replica), "
                 f"{self.steps_per_epoch} steps per epoch, "
                 f"{self.steps_per_execution} per execution; {self.settings.precision}"
                 + (", XLA" if self.settings.jit_compile else "") + f", {self.loop} loop"
                 + (", Keras on JAX" if self.backend == "jax" else "")]
        if self.device == "tpu" and not self.rehearsal and self.replicas == 1:
            lines.append("[INFO] 1 TPU device: nothing is distributed here; the article's "
                         "TPU split each batch over 8 cores")
        if self.settings.lr_scaling != "none":
            lines.append(f"[INFO] learning rate {self.settings.learning_rate:g} scaled "
                         f"({self.settings.lr_scaling}) for a global batch of "
                         f"{self.global_batch_size}: {self.learning_rate:g}")
        return "\n".join(lines)

    def validation_note(self):
        """A log line when val_loss is not the mean over the whole validation split; else None."""
        validation = self.validation
        if validation is None or validation.images == validation.split_images:
            return None
        why = ("repeated to full batches: a TPU step takes full batches only"
               if validation.images > validation.split_images else
               f"a multiple of the {self.replicas} replicas, so that each gets a share "
               "of every batch")
        return (f"[INFO] val_loss is the mean over {validation.images:,} images of the "
                f"{validation.split_images:,} in the validation split ({why})")

    def agreed_facts(self):
        """What every worker of a cluster must share: devices, data and training settings."""
        settings, source = self.settings, self.source
        extended = getattr(self.strategy, "extended", None)  # tf.distribute's; JAX: the slice's
        return {"devices per worker": (len(extended.worker_devices) if extended
                                       else self.cluster.devices_per_host),
                "data source": source.label,
                "training images": source.size(config.TRAIN_FLAG),
                "validation images": source.size(config.VALIDATION_FLAG),
                "global batch": self.global_batch_size,
                "steps per epoch": self.steps_per_epoch,
                "epochs": settings.epochs, "seed": settings.seed,
                "optimizer": settings.optimizer, "learning rate": self.learning_rate,
                "precision": settings.precision, "XLA": settings.jit_compile,
                "loop": self.loop,
                "TensorFlow's preemption handler": (
                    None if self.preemption_handler is None else
                    "acts" if self.preemption_handler else
                    "does nothing (Google Cloud CPU or TPU VM)")}

    def optimizer_config(self):
        """The optimizer of the flags as a Keras config, which compile(optimizer=...) takes.

        {"class_name": "adam", "config": {"learning_rate": 0.001}}: the name
        and the learning rate after --lr-scaling; under mixed_float16 wrapped
        in the LossScaleOptimizer of strategies.py.
        """
        if self.settings.optimizer not in ("adam", "sgd"):
            raise UserError(f"unknown optimizer {self.settings.optimizer!r}; choose adam or sgd")
        optimizer = {"class_name": self.settings.optimizer,
                     "config": {"learning_rate": self.learning_rate}}
        if self.settings.precision == "mixed_float16":
            inner = {"module": "keras.optimizers", "registered_name": None,
                     "class_name": {"adam": "Adam", "sgd": "SGD"}[self.settings.optimizer],
                     "config": optimizer["config"]}
            return {"class_name": "pyimagesearch>ReplicasAgreeLossScaleOptimizer",
                    "config": {"inner_optimizer": inner}}
        return optimizer


def make_optimizer(name, learning_rate):
    """A fresh Keras optimizer called `name` ("adam" or "sgd")."""
    if name == "adam":
        return keras.optimizers.Adam(learning_rate=learning_rate)
    if name == "sgd":
        return keras.optimizers.SGD(learning_rate=learning_rate)
    raise UserError(f"unknown optimizer {name!r}; choose adam or sgd")


def plan_run(device, settings, replicas, rehearsal=False, cluster=None, runtime=None,
             backend="tensorflow"):
    """Work out the global batch, steps and learning rate for `device` on `replicas`.

    `cluster` (from TF_CONFIG) makes this one worker of several: it trains
    with the custom loop, and only its chief writes. `runtime` is what this
    machine trains on ("cpu", "gpu" or "tpu"; None: read from the machine),
    for the run's name; `backend` Keras' ("jax" runs are named apart).
    """
    row = hardware(device)
    if row.whole_epochs:
        # the article's TPU batch is global: 1024 over 8 cores is 128 per core
        global_batch = settings.batch_size
        if global_batch % replicas:
            raise UserError(f"--batch-size {global_batch} does not split evenly "
                            f"over {replicas} replicas")
    else:
        # CPU and GPU: the batch is per replica, the global batch grows with them
        global_batch = settings.batch_size * replicas
    if settings.steps_per_epoch:
        steps = settings.steps_per_epoch
    elif row.whole_epochs and global_batch == getattr(config, row.batch):
        steps = getattr(config, row.steps)  # the article's 58, or the reader's value
    else:
        steps = config.TRAIN_IMAGES // global_batch
    if steps < 1:
        raise UserError(f"a global batch of {global_batch} is larger than an epoch "
                        f"of {config.TRAIN_IMAGES} images; lower --batch-size or "
                        "set --steps-per-epoch")
    if settings.profile_steps and settings.profile_steps[0] > settings.epochs * steps:
        raise UserError(f"--profile-steps {settings.profile_steps[0]},"
                        f"{settings.profile_steps[1]} starts after the last of the run's "
                        f"{settings.epochs * steps} steps")
    # Keras 3's fit does not run under MultiWorkerMirroredStrategy (a JAX slice's DataParallel: it does)
    loop = "custom" if cluster and backend != "jax" else settings.loop
    if row.whole_epochs:  # the whole epoch per call: every call is a blocking round trip
        per_execution = steps
    elif loop == "custom":  # it runs a shorter last call where the epoch needs one
        per_execution = min(config.STEPS_PER_EXECUTION, steps)
    else:
        per_execution = steps_per_execution(steps)
    runtime = runtime or this_runtime()
    return RunPlan(
        settings, device, name=run_name(device, settings, rehearsal, runtime, backend),
        runtime=runtime, backend=backend,
        rehearsal=rehearsal, replicas=replicas, global_batch_size=global_batch,
        steps_per_epoch=steps, steps_per_execution=per_execution,
        fixed_validation=row.whole_epochs,
        learning_rate=scaled_learning_rate(settings.learning_rate, settings.lr_scaling,
                                           global_batch),
        loop=loop,
        workers=cluster.workers if cluster else 1,
        is_chief=cluster.is_chief if cluster else True, cluster=cluster)


def usable_images(count, replicas):
    """How many of `count` images split into equal, non-empty shares per replica.

    MirroredStrategy splits a short last batch unevenly unless it is a
    multiple of the replicas (4 images on 3 replicas: 2, 2 and none), and a
    replica with no images fails (a Conv2D on an empty batch on CPU) or
    averages to NaN (GPU); so a finite split keeps a multiple of the replicas.
    """
    return count - count % replicas


def check_levers(plan, strategy):
    """Refuse --jit-compile where it cannot work, with one line that says what does.

    Keras' fit compiles `strategy.run` itself with XLA (its `one_step_on_data`
    is a `tf.function(jit_compile=True)` around it), so on several replicas
    it asks for one XLA program across all their devices, which fails:
    "Trying to access resource ... located in device GPU:1 from device
    GPU:0" (keras-team/keras#19005, closed unfixed, still so in Keras 3.15.1:
    tests/test_workarounds.py; Keras' own "auto" turns XLA off under any
    tf.distribute strategy for that reason). The custom loop compiles each
    replica's step on its own device instead (TensorFlow's mirrored_run), so
    on real GPUs it can. Logical CPU devices are one XLA device: a rehearsal
    on several of them fails either way (seen here with both loops).
    """
    if not plan.settings.jit_compile:
        return
    if plan.device == "tpu" and not plan.rehearsal:
        raise UserError("--jit-compile is for CPUs and GPUs: a TPU compiles every step "
                        "with XLA anyway")
    try:
        local = len(strategy.extended.worker_devices)
    except RuntimeError:  # TensorFlow's default strategy (train_cpu.py): one device
        local = 1
    if plan.rehearsal and local > 1:
        raise UserError("--jit-compile cannot rehearse on several logical CPU devices "
                        "in one process; use --rehearse 1, or leave out --jit-compile")
    if plan.loop == "fit" and plan.replicas > 1:
        raise UserError(f"--jit-compile with fit cannot train on {plan.replicas} replicas: "
                        "Keras compiles the step of every GPU into one XLA program, which "
                        "fails; add --loop custom, which compiles each GPU's step on its own, "
                        "or leave out --jit-compile")


def steps_per_execution(steps, limit=config.STEPS_PER_EXECUTION):
    """Steps per call into fit's compiled function: a divisor of `steps`, near `limit`.

    Keras runs whole executions, so one that does not divide the epoch
    would train extra steps (58 steps at 8 per execution train 64). The
    largest divisor up to `limit`, unless that is under half of it: then the
    smallest divisor from `limit` to 4 x `limit`, if there is one (58 steps,
    8 GPUs: 29 rather than 2 round trips from Python per epoch). Never more:
    the callbacks (backups, SIGTERM, the progress line) act between calls.
    """
    below = max(n for n in range(1, min(limit, steps) + 1) if steps % n == 0)
    if 2 * below >= limit or below == steps:
        return below
    above = [n for n in range(limit, min(4 * limit, steps) + 1) if steps % n == 0]
    return above[0] if above else below


def scaled_learning_rate(learning_rate, scaling, global_batch_size,
                         base_batch_size=config.BATCH_SIZE):
    """Scale a learning rate tuned for `base_batch_size` to a larger global batch.

    A batch k times larger gives k times fewer updates per epoch; "linear"
    multiplies the rate by k, "sqrt" by the square root of k (gentler, often
    the better match for Adam), "none" leaves it.
    """
    factor = global_batch_size / base_batch_size
    if scaling == "linear":
        return learning_rate * factor
    if scaling == "sqrt":
        return learning_rate * factor ** 0.5
    if scaling == "none":
        return learning_rate
    raise UserError(f"unknown learning-rate scaling {scaling!r}")
