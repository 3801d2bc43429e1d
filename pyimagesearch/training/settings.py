"""What a run is asked to do (`Settings`, from the flags), and the name its outputs take.

`run_name` names a run's figure, record, model, logs and backups from its
device and the flags that set it apart from the script's defaults
(`flags_apart`), so that a rerun replaces its own outputs and no other
run's. `set_config` sets config.py's names to a run's values in place,
keeping what they were for `written` and `put_config_back`. Nothing here
imports TensorFlow.
"""
import dataclasses
import os
import re

from pyimagesearch import config
from pyimagesearch.platforms.host import runtime_suffix


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


_written = {}  # config.py's values that a run's flags replaced (set_config)


def set_config(values):
    """Set config's names to `values` ({name: value}) for a run, keeping what they were."""
    put_config_back()
    _written.update((name, getattr(config, name)) for name in values)
    for name, value in values.items():
        setattr(config, name, value)


def put_config_back():
    """config.py's values as they were before a run's flags set them (`set_config`)."""
    for name, value in _written.items():
        setattr(config, name, value)
    _written.clear()


def written(name):
    """config.NAME as config.py (or a reader's edit of it) has it, not as a run's flags set it."""
    return _written.get(name, getattr(config, name))


def default_settings(device):
    """train_<device>.py's defaults: the TPU's batch is the article's global 1024."""
    return Settings(batch_size=written("TPU_BATCH_SIZE")) if device == "tpu" else Settings()


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
    parts += ["jax"] if backend == "jax" else []
    return re.sub(r"[^A-Za-z0-9._-]", "-", "_".join(parts)) + runtime_suffix(
        device == "cpu" or rehearsal, runtime)


def figure_path(device):
    """config.CPU_IMG_PATH, GPU_IMG_PATH or TPU_IMG_PATH: names the run's outputs.

    Read when called, so an edited config.py (or a test's) takes effect.
    """
    return getattr(config, f"{device.upper()}_IMG_PATH")
