"""What a run is asked to do (`Settings`, from the flags) and what it works out (`RunPlan`).

The scripts turn their flags into `Settings` once; `plan_run` adds what
follows from the strategy (replicas, global batch, steps, learning rate) and
from this process's place in a cluster. Everything below the scripts takes
the plan, never the argparse namespace.
"""
import dataclasses
import os

from pyimagesearch import config
from pyimagesearch.errors import UserError


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

    def describe(self):
        """The log lines that say how the run is laid out."""
        lines = [f"[INFO] global batch {self.global_batch_size} "
                 f"({self.global_batch_size // self.replicas} per replica), "
                 f"{self.steps_per_epoch} steps per epoch, "
                 f"{self.steps_per_execution} per execution"]
        if self.settings.lr_scaling != "none":
            lines.append(f"[INFO] learning rate {self.settings.learning_rate:g} scaled "
                         f"({self.settings.lr_scaling}) for a global batch of "
                         f"{self.global_batch_size}: {self.learning_rate:g}")
        return "\n".join(lines)


def plan_run(device, settings, replicas, rehearsal=False, cluster=None):
    """Work out the global batch, steps and learning rate for `device` on `replicas`.

    `cluster` (from TF_CONFIG) makes this one worker of several: it trains
    with the custom loop, and only its chief writes.
    """
    if device == "tpu":
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
    elif device == "tpu" and global_batch == config.TPU_BATCH_SIZE:
        steps = config.TPU_STEPS_PER_EPOCH  # the article's 58, or the reader's value
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
    stem = os.path.splitext(os.path.basename(figure_path(device)))[0]
    return RunPlan(
        settings, device, name=f"{stem}_rehearsal" if rehearsal else stem,
        rehearsal=rehearsal, replicas=replicas, global_batch_size=global_batch,
        steps_per_epoch=steps,
        # a TPU runs the whole epoch per call: every call is a blocking round trip
        steps_per_execution=steps if device == "tpu" else steps_per_execution(steps),
        fixed_validation=device == "tpu",
        learning_rate=scaled_learning_rate(settings.learning_rate, settings.lr_scaling,
                                           global_batch),
        # Keras 3's fit does not run under MultiWorkerMirroredStrategy
        loop="custom" if cluster else settings.loop,
        workers=cluster.workers if cluster else 1,
        is_chief=cluster.is_chief if cluster else True)


def figure_path(device):
    """config.CPU_IMG_PATH, GPU_IMG_PATH or TPU_IMG_PATH: names the run's outputs.

    Read when called, so an edited config.py (or a test's) takes effect.
    """
    return getattr(config, f"{device.upper()}_IMG_PATH")


def steps_per_execution(steps, limit=config.STEPS_PER_EXECUTION):
    """The largest divisor of `steps` up to `limit`.

    Keras runs whole executions, so one that does not divide the epoch would
    train extra steps (58 steps at 8 per execution train 64).
    """
    return max(n for n in range(1, min(limit, steps) + 1) if steps % n == 0)


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
