"""What a run works out from its flags and its strategy: a `Plan`, passed down to every part.

`get_data(..., plan=plan)`, `model.fit(..., callbacks=plan.callbacks)` and the
outputs read it; the script binds `config = plan.config`, config's names with
this run's values. Nothing here changes `pyimagesearch.config`.
"""
import dataclasses
import datetime
import os
import re
import sys
import types

from pyimagesearch import config
from pyimagesearch.pipeline import Reading
from pyimagesearch.errors import UserError

# per device: config's names of its batch, steps per epoch and figure; `whole_epochs`:
# the TPU's way, a global batch, a whole epoch per call and validation in full batches
DEVICES = {
    "cpu": {"batch": "BATCH_SIZE", "steps": "STEPS_PER_EPOCH", "figure": "CPU_IMG_PATH",
            "whole_epochs": False},
    "gpu": {"batch": "BATCH_SIZE", "steps": "STEPS_PER_EPOCH", "figure": "GPU_IMG_PATH",
            "whole_epochs": False},
    "tpu": {"batch": "TPU_BATCH_SIZE", "steps": "TPU_STEPS_PER_EPOCH",
            "figure": "TPU_IMG_PATH", "whole_epochs": True},
}
# the flags that change what a run trains: its name carries those off the script's defaults
NAMED_FLAGS = ("epochs", "batch_size", "steps_per_epoch", "data_source", "seed", "optimizer",
               "learning_rate", "lr_scaling", "loop", "precision", "jit_compile")


@dataclasses.dataclass(frozen=True)
class Settings:
    """The training flags as parsed; every field is a flag of the same name."""

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
    backup_every: int | None = None
    logdir: str | None = None
    profile_steps: tuple[int, int] | None = None

    @classmethod
    def from_args(cls, args):
        return cls(**{field.name: getattr(args, field.name) for field in dataclasses.fields(cls)})

    @classmethod
    def defaults(cls, device):
        """train_<device>.py's defaults: the TPU's batch is the article's global 1024."""
        return cls(batch_size=getattr(config, DEVICES[device]["batch"]))


def flags_apart(device, settings):
    """(flag, value as typed; None for a switch) of each NAMED_FLAGS field off its default."""
    defaults = Settings.defaults(device)
    return [(field.replace("_", "-"), None if isinstance(value, bool) else str(value))
            for field in NAMED_FLAGS
            if (value := getattr(settings, field)) != getattr(defaults, field)]


def run_name(device, settings, rehearsal=False, runtime="cpu", backend="tensorflow"):
    """The stem of a run's outputs: what sets it apart from every other run.

    The device's figure name, `rehearsal`, each flag off the script's defaults,
    `jax` for Keras on JAX, and the runtime where a CPU run or a rehearsal ran
    on a GPU or TPU machine: `cpu`, `tpu_rehearsal`, `tpu_rehearsal_jax`,
    `cpu_epochs-1_gpu-runtime`. Letters, digits, `.`, `_` and `-` only.
    """
    stem = os.path.splitext(os.path.basename(getattr(config, DEVICES[device]["figure"])))[0]
    parts = [stem] + (["rehearsal"] if rehearsal else [])
    # an exponent's "+" is dropped, not made "-": 1e+300 and 1e-300 stay apart
    parts += [flag if value is None else f"{flag}-{value.replace('+', '')}"
              for flag, value in flags_apart(device, settings)]
    parts += ["jax"] if backend == "jax" else []
    on_cpu = device == "cpu" or rehearsal
    suffix = f"_{runtime}-runtime" if on_cpu and runtime != "cpu" else ""
    return re.sub(r"[^A-Za-z0-9._-]", "-", "_".join(parts)) + suffix


def steps_per_execution(steps, limit=config.STEPS_PER_EXECUTION):
    """Steps per call into fit's compiled function: a divisor of `steps` near `limit`.

    Keras runs whole executions, so one that does not divide the epoch would
    train extra steps. The largest divisor up to `limit`, unless that is under
    half of it: then the smallest from `limit` to 4 x `limit`, if there is one
    (58 steps: 29, not 2). The callbacks act between calls, so never more.
    """
    below = max(n for n in range(1, min(limit, steps) + 1) if steps % n == 0)
    if 2 * below >= limit or below == steps:
        return below
    above = [n for n in range(limit, min(4 * limit, steps) + 1) if steps % n == 0]
    return above[0] if above else below


def scaled_learning_rate(learning_rate, scaling, global_batch, base=config.BATCH_SIZE):
    """The rate tuned for `base` images scaled to `global_batch`: "linear", "sqrt" or "none"."""
    factor = {"linear": global_batch / base, "sqrt": (global_batch / base) ** 0.5,
              "none": 1.0}[scaling]
    return learning_rate * factor


@dataclasses.dataclass(frozen=True)
class Validation:
    """What val_loss is the mean over."""

    steps: int | None     # batches per evaluation; None: one pass over the split
    images: int           # images val_loss averages
    split_images: int     # images in the validation split


@dataclasses.dataclass(frozen=True)
class Plan:
    """One run: its settings, the numbers worked out from them, and what it runs with."""

    device: str               # "cpu", "gpu" or "tpu"
    settings: Settings
    name: str                 # stem of the output files
    rehearsal: bool           # logical CPU devices stand in for the device
    replicas: int             # strategy.num_replicas_in_sync
    global_batch_size: int
    steps_per_epoch: int
    steps_per_execution: int
    learning_rate: float      # after --lr-scaling
    loop: str                 # "fit" or "custom"
    backend: str = "tensorflow"   # Keras': "tensorflow" or "jax"
    runtime: str = "cpu"      # what this machine trains on
    cluster: object = None    # cluster.Cluster (TF_CONFIG) or jax_slice.Slice; None alone
    strategy: object = None
    source: object = None     # sources.Source
    validation: Validation | None = None
    # from the callbacks: the list fit gets, the timer, the backup and where it resumes
    callbacks: tuple = ()
    timer: object = None
    backup: object = None
    resume_step: int = 0
    interrupts: object = None  # exits.Interrupts: SIGTERM and Ctrl-C for this process
    started: datetime.datetime = dataclasses.field(
        default_factory=lambda: datetime.datetime.now(datetime.timezone.utc))

    @property
    def workers(self):
        return self.cluster.workers if self.cluster else 1

    @property
    def is_chief(self):
        """This process writes the outputs, logs and backups (nanoGPT's master_process)."""
        return self.cluster is None or self.cluster.is_chief

    @property
    def whole_epochs(self):
        return DEVICES[self.device]["whole_epochs"]

    @property
    def jit_compile(self):
        """compile()'s jit_compile: --jit-compile on TensorFlow; JAX jits every step anyway."""
        return True if self.backend == "jax" else self.settings.jit_compile

    @property
    def verbose(self):
        """fit's verbosity: a progress bar on a terminal, a line per epoch in a log, none
        where standard output was closed."""
        return 0 if sys.stdout is None else 1 if sys.stdout.isatty() else 2

    @property
    def initial_epoch(self):
        """The epoch fit starts from: the first one a backup has not finished."""
        return -(-self.resume_step // self.steps_per_epoch)

    @property
    def figure_path(self):
        from pyimagesearch.files import join
        return join(self.settings.output_dir, f"{self.name}.png")

    @property
    def config(self):
        """config's names with this run's values: what the script reads as `config.NAME`."""
        device = DEVICES[self.device]
        values = {name: getattr(config, name) for name in dir(config) if name.isupper()}
        values.update({"SEED": self.settings.seed, "EPOCHS": self.settings.epochs,
                       "OPTIMIZER": self.optimizer_config(),
                       device["batch"]: self.settings.batch_size,
                       device["steps"]: self.steps_per_epoch,
                       "BASE_IMG_PATH": self.settings.output_dir,
                       device["figure"]: self.figure_path})
        if self.whole_epochs and self.validation:
            values["TPU_VALIDATION_STEPS"] = self.validation.steps
        return types.SimpleNamespace(**values)

    def finish_epoch(self, model, trainDs, valDs):
        """After a resume in mid-epoch, fit the rest of that epoch (fit cannot start inside
        one); the training batches after it, which fit then trains from `initial_epoch`."""
        epoch, step = divmod(self.resume_step, self.steps_per_epoch)
        if not step:
            return trainDs
        rest = self.steps_per_epoch - step
        print(f"[INFO] finishing epoch {epoch + 1}: {rest} of its {self.steps_per_epoch} steps "
              "are left")
        part = model.fit(trainDs, epochs=epoch + 1, initial_epoch=epoch, steps_per_epoch=rest,
                         validation_data=valDs, callbacks=list(self.callbacks),
                         verbose=self.verbose, shuffle=False)
        from pyimagesearch.data import get_data
        self.history(part.history)  # a loss that is not finite stops the run here
        later = dataclasses.replace(self, resume_step=self.resume_step + rest)
        return get_data(self.source.data_name, config.TRAIN_FLAG, self.global_batch_size,
                        config.SHUFFLE_SIZE, plan=later)

    def history(self, trained):
        """Every epoch's losses (a resumed run's backup holds those before it); a diverged run
        stops here with one line, before anything is written."""
        losses, val_losses = trained.get("loss", []), trained.get("val_loss", [])
        if not all(value == value and abs(value) != float("inf")
                   for value in losses + val_losses):
            raise UserError(f"training diverged (loss {losses[-1]}, val_loss {val_losses[-1]}); "
                            "lower --learning-rate. Nothing was written: earlier outputs are "
                            "untouched")
        return self.backup.history if self.backup else trained

    def predict(self, model, images):
        """The article's model.predict, on the figure's digits, as NumPy.

        TPUStrategy's own predict; elsewhere a plain call of the model, which
        MirroredStrategy would otherwise split between replicas through a
        generator TensorFlow warns about (tensorflow/tensorflow#61816); on a JAX
        slice every process computes the whole batch (jax_slice.predict).
        """
        if self.backend == "jax" and self.workers > 1:
            from pyimagesearch.jax_slice import predict
            return predict(model, self.strategy, images)
        if self.device == "tpu" and self.backend == "tensorflow" and not self.rehearsal:
            return model.predict(images, batch_size=len(images), verbose=0)
        import keras
        return keras.ops.convert_to_numpy(model(images, training=False))

    def optimizer_config(self):
        """compile()'s optimizer: the flag's, with its learning rate; float16's loss scaling."""
        optimizer = {"class_name": self.settings.optimizer,
                     "config": {"learning_rate": self.learning_rate}}
        if self.settings.precision != "mixed_float16":
            return optimizer
        inner = {"module": "keras.optimizers", "registered_name": None,
                 "class_name": {"adam": "Adam", "sgd": "SGD"}[self.settings.optimizer],
                 "config": optimizer["config"]}
        return {"class_name": "pyimagesearch>ReplicasAgreeLossScaleOptimizer",
                "config": {"inner_optimizer": inner}}

    def reading(self, split, training):
        """How get_data reads `split` for this run (data.Reading)."""
        if training:  # the seed's order, repeated, full batches, from where a backup ends
            return Reading(self.global_batch_size, config.SHUFFLE_SIZE, seed=self.settings.seed,
                           repeat=True, drop_remainder=True, skip=self.resume_step,
                           by_pipeline=self.workers > 1)
        if self.validation.steps is not None:  # a TPU step needs full batches
            return Reading(self.global_batch_size, repeat=True, drop_remainder=True,
                           batches=self.validation.steps)
        return Reading(self.global_batch_size, images=self.validation.images)

    def describe(self):
        """The log lines that say how the run is laid out."""
        lines = [f"[INFO] global batch {self.global_batch_size} "
                 f"({self.global_batch_size // self.replicas} per replica), "
                 f"{self.steps_per_epoch} steps per epoch, {self.steps_per_execution} per "
                 f"execution; {self.settings.precision}"
                 + (", XLA" if self.settings.jit_compile else "") + f", {self.loop} loop"
                 + (", Keras on JAX" if self.backend == "jax" else "")]
        if self.device == "tpu" and not self.rehearsal and self.replicas == 1:
            lines.append("[INFO] 1 TPU device: nothing is distributed here; the article's "
                         "TPU split each batch over 8 cores")
        if self.settings.lr_scaling != "none":
            lines.append(f"[INFO] learning rate {self.settings.learning_rate:g} scaled "
                         f"({self.settings.lr_scaling}) for a global batch of "
                         f"{self.global_batch_size}: {self.learning_rate:g}")
        validation = self.validation
        if validation and validation.images != validation.split_images:
            why = ("repeated to full batches: a TPU step takes full batches only"
                   if validation.images > validation.split_images else
                   f"a multiple of the {self.replicas} replicas, so that each gets a share "
                   "of every batch")
            lines.append(f"[INFO] val_loss is the mean over {validation.images:,} images of "
                         f"the {validation.split_images:,} in the validation split ({why})")
        return "\n".join(lines)

    def agreed_facts(self):
        """What every process of a cluster must share: devices, data and settings."""
        settings, source = self.settings, self.source
        return {"replicas": self.replicas, "data source": source.label,
                "training images": source.size(config.TRAIN_FLAG),
                "validation images": source.size(config.VALIDATION_FLAG),
                "global batch": self.global_batch_size, "steps per epoch": self.steps_per_epoch,
                "epochs": settings.epochs, "seed": settings.seed,
                "optimizer": settings.optimizer, "learning rate": self.learning_rate,
                "precision": settings.precision, "XLA": settings.jit_compile,
                "loop": self.loop}


def make_plan(device, settings, replicas, rehearsal=False, cluster=None, runtime="cpu",
              backend="tensorflow"):
    """The numbers a run trains with on `replicas`: global batch, steps, learning rate, loop."""
    whole_epochs = DEVICES[device]["whole_epochs"]
    if whole_epochs:  # the article's TPU batch is global: 1024 over 8 cores is 128 per core
        global_batch = settings.batch_size
        if global_batch % replicas:
            raise UserError(f"--batch-size {global_batch} does not split evenly "
                            f"over {replicas} replicas")
    else:  # CPU and GPU: the batch is per replica, the global batch grows with them
        global_batch = settings.batch_size * replicas
    if settings.steps_per_epoch:
        steps = settings.steps_per_epoch
    elif whole_epochs and global_batch == config.TPU_BATCH_SIZE:
        steps = config.TPU_STEPS_PER_EPOCH  # the article's 58
    else:
        steps = config.TRAIN_IMAGES // global_batch
    if steps < 1:
        raise UserError(f"a global batch of {global_batch} is larger than an epoch of "
                        f"{config.TRAIN_IMAGES} images; lower --batch-size or set "
                        "--steps-per-epoch")
    if settings.profile_steps and settings.profile_steps[0] > settings.epochs * steps:
        raise UserError(f"--profile-steps {settings.profile_steps[0]},"
                        f"{settings.profile_steps[1]} starts after the last of the run's "
                        f"{settings.epochs * steps} steps")
    # Keras 3's fit does not run under MultiWorkerMirroredStrategy (keras-team/keras#20585);
    # a JAX slice's DataParallel it does
    loop = "custom" if cluster and backend != "jax" else settings.loop
    if whole_epochs:  # a whole epoch per call: every call is a round trip to the TPU host
        per_execution = steps
    elif loop == "custom":  # it runs a shorter last call where the epoch needs one
        per_execution = min(config.STEPS_PER_EXECUTION, steps)
    else:
        per_execution = steps_per_execution(steps)
    return Plan(device, settings, run_name(device, settings, rehearsal, runtime, backend),
                rehearsal, replicas, global_batch, steps, per_execution,
                scaled_learning_rate(settings.learning_rate, settings.lr_scaling, global_batch),
                loop, backend=backend, runtime=runtime, cluster=cluster)


def with_validation(plan, source):
    """`plan` reading `source`, with its validation cut.

    CPU and GPU validate on one pass over the split, a multiple of the replicas
    so each gets a share of every batch (498 of 500 on 3 replicas). The TPU's
    configuration needs full batches: the split repeated and cut to
    TPU_VALIDATION_STEPS (9 on MNIST), never more than one pass, never fewer
    than 1 batch (on the 500-digit sample one batch of 1024 repeats digits). The
    cut is made in the dataset, not by fit's validation_steps, which Keras rounds
    up to whole executions and carries on from epoch to epoch.
    """
    train_images = source.size(config.TRAIN_FLAG)
    if plan.global_batch_size > train_images:
        raise UserError(f"a global batch of {plan.global_batch_size:,} images is more than "
                        f"the {train_images:,} training images of {source.label}; "
                        "lower --batch-size")
    count = source.size(config.VALIDATION_FLAG)
    if plan.whole_epochs:
        batches = max(1, count // plan.global_batch_size)
        if plan.global_batch_size == config.TPU_BATCH_SIZE:
            batches = max(1, min(config.TPU_VALIDATION_STEPS, batches))
        validation = Validation(batches, batches * plan.global_batch_size, count)
    else:
        validation = Validation(None, count - count % plan.replicas, count)
    return dataclasses.replace(plan, source=source, validation=validation)
