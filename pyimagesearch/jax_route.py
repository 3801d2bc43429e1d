"""Keras on JAX: `keras.distribution.DataParallel` in place of TPUStrategy.

train_tpu.py on JAX (runtime.py says when) builds its strategy
here. Keras' DataParallel replicates the model's variables on every device
and splits each global batch between them; `scope()` is Keras' own, so the
listing's `with strategy.scope():` reads the same. One jitted step sees the
whole global batch (its sharding says which device holds which images), so
the gradient is already the mean over all of them: the article's
`MSELoss(scale=1)` is right here, where Keras 3 on tf.distribute needs
`scale=N` (loss.py).

What this route cannot do yet is refused in one line before any training
(`refuse_levers`), in a line that says what works where it is read
(tpu_runtime.instead_of_jax): on Colab's and Kaggle's TPUs, not TensorFlow's
TPU route. Backups (--backup-dir) are Keras' own weights files here
(backup.KerasBackup); the custom loop (`--loop custom`: jax_loop.py's step),
--profile-steps (a JAX trace, callbacks.ProfileSteps) and mixed_float16
(Keras' loss scaling, backend-agnostic in Keras 3) run here as on TensorFlow.
"""
import os

import jax
import keras

from pyimagesearch.runtime import detect, installed_version, tensorflow_builds
from pyimagesearch.tpu_runtime import instead_of_jax
from pyimagesearch.errors import UserError


class DataParallel(keras.distribution.DataParallel):
    """Keras' DataParallel, with TPUStrategy's `num_replicas_in_sync`, which the listing reads."""

    @property
    def num_replicas_in_sync(self):
        """The devices the batch is split between: the article's numAcc."""
        return int(self.device_mesh.devices.size)


def strategy(replicas=None):
    """DataParallel over every TPU device JAX sees, or over `replicas` JAX CPU devices.

    A rehearsal's devices come from JAX_NUM_CPU_DEVICES, set before JAX
    started (tpu_runtime.prepare). Without a TPU (and no rehearsal), one
    line says what JAX and TensorFlow see, and which versions are installed.
    """
    if replicas:
        devices = keras.distribution.list_devices("cpu")
        if jax.process_count() > 1:  # a slice's rehearsal (jax_slice.py): every process's
            return DataParallel(devices=devices)
        if len(devices) < replicas:
            raise UserError(f"cannot rehearse on {replicas} JAX CPU devices: JAX started "
                            f"with {len(devices)} (JAX_NUM_CPU_DEVICES is read when JAX "
                            "starts; train_tpu.py sets it)")
        return DataParallel(devices=devices[:replicas])
    devices = keras.distribution.list_devices()
    if not devices or not devices[0].lower().startswith("tpu"):
        raise UserError(f"no TPU for Keras on JAX: {found(devices)}; use --rehearse 8 to "
                        "rehearse on 8 JAX CPU devices")
    return DataParallel(devices=devices)


def found(jax_devices):
    """What a TPU run found: the runtime, the devices JAX and TensorFlow see, the versions."""
    # lazy: Keras on JAX runs without TensorFlow (tools/jax_loss_step.py); only this line,
    # for a run that found no TPU, asks what TensorFlow sees
    import tensorflow as tf

    kinds = sorted({device.split(":")[0] for device in jax_devices}) or ["none"]
    tf_devices = sorted({device.device_type for device in tf.config.list_physical_devices()})
    versions = ", ".join([f"{name} {_version(name)}" for name in ("jax", "jaxlib", "libtpu")]
                         + [tensorflow_builds(), f"keras {_version('keras')}"])
    return (f"{detect().describe()}; JAX sees {len(jax_devices)} {'/'.join(kinds)} device(s), "
            f"TensorFlow {'/'.join(tf_devices) or 'none'}; {versions}")


def _version(package):
    """The installed version of `package`, or 'not installed'."""
    return installed_version(package) or "not installed"


def refuse_levers(settings, host=None, processes=1, rehearsal=False):
    """What Keras on JAX cannot do here yet: one line, before any training, with what works
    on `host` (None: this machine) instead; on several processes (a TPU slice), what
    only one can do."""
    if processes > 1 and settings.loop == "custom":
        raise UserError(f"--loop custom: on one host only (this run spans {processes} JAX "
                        "processes: its step reads one process's batch); leave --loop out, "
                        "fit trains the same step across them")
    if processes > 1 and not rehearsal and "://" not in (settings.backup_dir or "://"):
        raise UserError(f"--backup-dir {settings.backup_dir}: every host of the slice reads "
                        "the backup that process 0 writes, and cannot read this host's disk; "
                        "give a bucket (gs://...)")
    refused = [flag for flag, asked in (
        ("--jit-compile", settings.jit_compile),) if asked]
    if refused:
        raise UserError(
            f"{', '.join(refused)}: not on Keras' JAX backend (JAX compiles every step "
            f"with XLA anyway); {instead_of_jax(host or detect())}")


def versions(plan=None):
    """The JAX versions a run record names; for a run of several processes, its slice: the
    hosts (one process each), the devices each holds, and the TPU type the platform names."""
    named = {"jax_version": _version("jax"), "jaxlib_version": _version("jaxlib"),
             "libtpu_version": _version("libtpu"),
             "tensorflow_build": tensorflow_builds()}  # 'tensorflow-cpu 2.20.0': which one
    if plan is not None and plan.workers > 1:
        named.update(hosts=plan.workers, devices_per_host=plan.replicas // plan.workers,
                     slice=os.environ.get("TPU_ACCELERATOR_TYPE") or (
                         "rehearsal" if plan.rehearsal else "not named"))
    return named
