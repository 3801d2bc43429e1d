"""A run's outputs beside its figure: the run record (.json) and the model (.keras), each whole.

`save` writes the model, the figure and, last, the run record, each under a
temporary name renamed over the old one (files.py), into a folder or a bucket;
a failure on the way is one line that says which files are new. Then the
backup, no longer needed, goes.
"""
import json
import os
import platform
import sys

import keras
import tensorflow as tf

# the classes keras.saving.load_model needs, registered by their imports
from pyimagesearch import autoencoder, loss, strategies  # noqa: F401
from pyimagesearch.files import dump, replace_file
from pyimagesearch.host import detect, installed_version, tensorflow_builds
from pyimagesearch.plan import flags_apart


def load_model(path):
    """A model the scripts saved (`outputs/cpu.keras`)."""
    return keras.saving.load_model(path)


def run_record(plan, history):
    """What ran, on what, with which data, and how it went."""
    settings, source, timer = plan.settings, plan.source, plan.timer
    strategy = type(plan.strategy).__name__.lstrip("_")
    if strategy == "CollectiveAllReduceStrategy":
        strategy = "MultiWorkerMirroredStrategy"
    record = {
        "device": plan.device, "name": plan.name, "rehearsal": plan.rehearsal,
        "backend": plan.backend, "strategy": strategy, "workers": plan.workers,
        "replicas": plan.replicas, "global_batch_size": plan.global_batch_size,
        "per_replica_batch_size": plan.global_batch_size // plan.replicas,
        "steps_per_epoch": plan.steps_per_epoch,
        "steps_per_execution": plan.steps_per_execution, "epochs": settings.epochs,
        "resumed_from_epoch": plan.resume_step // plan.steps_per_epoch,
        "resumed_from_step": plan.resume_step, "loop": plan.loop,
        "precision": settings.precision, "jit_compile": plan.jit_compile,
        "optimizer": settings.optimizer, "learning_rate": plan.learning_rate,
        "learning_rate_scaling": settings.lr_scaling, "seed": settings.seed,
        "data_source": source.label, "data_source_reason": source.reason,
        "train_images": source.size("train"),
        "validation_steps": plan.validation.steps,
        "validation_images": plan.validation.images,
        "validation_split_images": plan.validation.split_images,
        "tensorflow_version": tf.__version__, "keras_version": keras.__version__,
        "epoch_seconds": timer.epoch_seconds, "train_seconds": timer.train_seconds,
        "images_per_second": [plan.steps_per_epoch * plan.global_batch_size / seconds
                              for seconds in timer.train_seconds],
        "loss": [float(value) for value in history["loss"]],
        "val_loss": [float(value) for value in history["val_loss"]],
        "command": [os.path.basename(sys.argv[0])] + sys.argv[1:],
        "flags": [word for flag, value in flags_apart(plan.device, settings)
                  for word in (f"--{flag}",) + ((value,) if value is not None else ())],
        "runtime": runtime_info(plan), "machine": machine_info(),
        "started_at": plan.started.isoformat(timespec="seconds"),
    }
    if plan.backend == "jax":
        record.update({f"{name}_version": installed_version(name) or "not installed"
                       for name in ("jax", "jaxlib", "libtpu")},
                      tensorflow_build=tensorflow_builds())
        if plan.workers > 1:  # a slice: its hosts, each one process, and their devices
            record.update(hosts=plan.workers, devices_per_host=plan.replicas // plan.workers,
                          slice=os.environ.get("TPU_ACCELERATOR_TYPE") or (
                              "rehearsal" if plan.rehearsal else "not named"))
    return record


def figure_title(record):
    """Which run, how it ended, and whose digits: the sample's are never called MNIST's."""
    label = record["data_source"]
    digits = ("digits 0-7 of the 5,000-digit sample, not MNIST" if "sample" in label
              else "images of a stand-in, not MNIST" if "stand-in" in label
              else f"digits 0-7 of MNIST ({label})")
    hosts = record.get("hosts")
    where = f"{hosts} hosts x {record['devices_per_host']} devices\n" if hosts else ""
    return (f"{record['name']}: val_loss {record['val_loss'][-1]:.4f}\n{where}"
            f"batch {record['global_batch_size']}, {record['steps_per_epoch']} steps/epoch, "
            f"lr {record['learning_rate']:g}\n{digits}")


def runtime_info(plan):
    """Where the run ran: the notebook service, its accelerator, the devices trained on."""
    host, devices = detect(), None
    if plan.device == "gpu" and not plan.rehearsal:
        names = [tf.config.experimental.get_device_details(gpu).get("device_name", "GPU")
                 for gpu in tf.config.list_physical_devices("GPU")]
        devices = " + ".join(sorted(set(names))) or None
    elif plan.device == "tpu" and not plan.rehearsal and host.tpu_generation:
        devices = f"TPU {host.tpu_generation}, {host.tpu_chips} chip" + (
            "s" if host.tpu_chips > 1 else "")
    return {"service": host.service, "accelerator": plan.runtime,
            "description": host.describe(), "devices": devices}


def machine_info():
    """A short description of the machine, for records."""
    model = platform.processor()
    try:
        with open("/proc/cpuinfo") as handle:
            model = next((line.split(":", 1)[1].strip() for line in handle
                          if line.startswith("model name")), model)
    except OSError:
        pass
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"platform": platform.platform(), "processor": platform.machine(),
            "cpu_model": model, "cpu_count": cpus, "python": platform.python_version()}


def save(figure_path, png, model, record, plan):
    """The model, the figure (`png`, its bytes) and the run record, each whole, the chief's.

    SIGTERM and Ctrl-C wait until the three are written; a failure says which
    are new. Then the backup goes. A slice's processes then leave together.
    """
    if not plan.is_chief:
        print(f"[INFO] {plan.cluster.name} done; the chief writes the outputs")
    else:
        stem = figure_path[:-len(".png")]
        paths = [f"{stem}.keras", figure_path, f"{stem}.json"]
        text = (json.dumps(record, indent=2) + "\n").encode()
        with plan.interrupts.held():
            for done, (path, write) in enumerate(zip(paths, (
                    model.save, lambda local: dump(local, png), lambda local: dump(local, text)))):
                what = (f"{', '.join(paths[:done])} new, the rest as before" if done
                        else "earlier outputs are untouched")
                replace_file(path, write, what)
            plan.interrupts.ended = f"its outputs were written to {plan.settings.output_dir}"
        for path in paths:
            print(f"[INFO] wrote {path}")
        if plan.backup:
            plan.backup.finish()  # only now: a failed save resumes from it
    if hasattr(plan.cluster, "end_together"):  # a JAX slice's processes leave as one
        plan.cluster.end_together()

