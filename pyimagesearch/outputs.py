"""A run's outputs: the figure, the run record and the model, never half written.

The scripts draw the figure; `RunOutputs` stages it with the run record
(`run_record`) and the model in a local scratch folder (Matplotlib and Keras
write local files), then copies them next to their destination under
temporary names and renames them over the old ones (files.py),
all through `tf.io.gfile`, so the destination may be a local folder or a
bucket (`gs://...`, or `ram://` in tests). The folder holds the old set or the
new set at every moment, whatever stops the run: an error, a signal, a kill.
"""
import os
import platform
import shutil
import sys

import keras
import tensorflow as tf
from matplotlib.figure import Figure

# autoencoder, loss and strategies (its optimizer): registered for load_model
from pyimagesearch import autoencoder, config, loss, strategies  # noqa: F401
from pyimagesearch.files import StagedOutputs, join, scratch_folder, write_json
from pyimagesearch.plan import flags_apart, override
from pyimagesearch.runtime import detect, hardware, this_process


def load_model(path):
    """A model the scripts saved (`outputs/cpu.keras`), its classes registered by this import."""
    return keras.saving.load_model(path)


class RunOutputs:
    """The outputs of a run, staged: they replace the earlier ones together, or not at all.

    with RunOutputs(plan, run, record) as staged:
        fig.savefig(config.TPU_IMG_PATH)   # the device's figure path: staged in the block
        model.save(staged.path("keras"))

    Inside the block the device's figure path in config (CPU_IMG_PATH,
    GPU_IMG_PATH or TPU_IMG_PATH) is the staged figure's, so the article's
    `fig.savefig(config.TPU_IMG_PATH)` writes it. The run record is written
    as <name>.json. When the block ends without an
    error the three are swapped in and the backup, no longer needed, is
    deleted. A worker that is not the chief saves too, as TensorFlow's
    multi-worker guide asks (saving may run collectives), into a scratch
    folder that is then removed.
    """

    def __init__(self, plan, run, record):
        self.plan, self.run, self.record = plan, run, record

    def __enter__(self):
        plan = self.plan
        self._scratch = None if plan.is_chief else scratch_folder("worker")
        self.folder = self._scratch or plan.settings.output_dir
        self._staged = StagedOutputs(self.folder).__enter__()
        try:
            write_json(self.path("json"), self.record)
        except BaseException:
            self._staged.__exit__(*sys.exc_info())  # one line naming the scratch folder
            raise
        self._figure = hardware(plan.device).figure  # config's name: runtime.HARDWARE
        self._figure_was = getattr(config, self._figure)
        override({self._figure: self.path("png")})
        return self

    def path(self, suffix):
        """The local scratch path of the output <name>.<suffix>."""
        return self._staged.path(f"{self.plan.name}.{suffix}")

    def __exit__(self, kind, value, traceback):
        override({self._figure: self._figure_was})
        try:
            self._staged.__exit__(kind, value, traceback)
        finally:
            if self._scratch:  # a worker's copies: never outputs of the run
                shutil.rmtree(self._scratch, ignore_errors=True)
                if self._scratch in this_process.published:
                    this_process.published.remove(self._scratch)
        if kind is not None:
            return False
        cluster = self.plan.cluster
        if self.plan.is_chief:
            for suffix in ("png", "json", "keras"):
                print(f"[INFO] wrote {join(self.folder, self.plan.name)}.{suffix}")
            self.run.finish()  # only now: a failed save resumes from the backup
        else:
            print(f"[INFO] {cluster.task_type} {cluster.task_index} done; the chief "
                  "writes the outputs")
        if hasattr(cluster, "end_together"):  # a JAX slice's processes end as one
            cluster.end_together()
        return False


def run_record(plan, run, trained):
    """The run record: what ran, on what, with which data, and how it went.

    `trained` is the history this process's training returned; `run` (the
    RunCallbacks) holds the timer, the backup's earlier epochs and the step
    the run resumed from. A loss that is not finite stops the run here.
    """
    history = run.history(trained)
    strategy, settings, source = plan.strategy, plan.settings, plan.source
    multi_worker = isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy)
    record = {
        "device": plan.device,
        "name": plan.name,
        "rehearsal": plan.rehearsal,
        "backend": plan.backend,  # Keras': tensorflow, or jax (DataParallel)
        # MultiWorkerMirroredStrategy's class is CollectiveAllReduceStrategy
        "strategy": "MultiWorkerMirroredStrategy" if multi_worker else type(
            strategy).__name__.lstrip("_"),  # the default strategy's is _Default...
        "workers": plan.workers,
        # how the workers' all-reduces travel (several machines only)
        "communication": (_communication(plan.rehearsal) if multi_worker else None),
        "replicas": plan.replicas,
        "global_batch_size": plan.global_batch_size,
        "per_replica_batch_size": plan.global_batch_size // plan.replicas,
        "steps_per_epoch": plan.steps_per_epoch,
        "steps_per_execution": plan.steps_per_execution,
        "epochs": settings.epochs,
        "resumed_from_epoch": run.start // plan.steps_per_epoch,
        "resumed_from_step": run.start,  # global steps trained before this run
        "loop": plan.loop,
        "precision": settings.precision,
        "jit_compile": plan.jit_compile,
        "optimizer": settings.optimizer,
        "learning_rate": plan.learning_rate,
        "learning_rate_scaling": settings.lr_scaling,
        "seed": settings.seed,
        "data_source": source.label,
        "data_source_reason": source.reason,
        "train_images": source.size(config.TRAIN_FLAG),
        "validation_steps": plan.validation.steps,
        "validation_images": plan.validation.images,
        "validation_split_images": plan.validation.split_images,
        "tensorflow_version": tf.__version__,
        "keras_version": keras.__version__,
        "epoch_seconds": run.timer.epoch_seconds,
        "train_seconds": run.timer.train_seconds,
        "images_per_second": [plan.steps_per_epoch * plan.global_batch_size / s
                              for s in run.timer.train_seconds],
        "loss": [float(v) for v in history["loss"]],
        "val_loss": [float(v) for v in history["val_loss"]],
        "command": [os.path.basename(sys.argv[0])] + sys.argv[1:],
        "flags": flags_apart(plan.device, settings),  # those in the name: off the defaults
        "runtime": runtime_info(plan),
        "machine": machine_info(),
        "started_at": run.started.isoformat(timespec="seconds"),
    }
    if plan.backend == "jax":
        from pyimagesearch.jax_route import versions
        record.update(versions(plan))
    return record


def figure(title, images, predicted):
    """The listing's figure: 8 rows of an input and its reconstruction, titled `title`.

    The scripts draw it in the article's own lines; this is the same drawing
    for tools/redraw_figure.py (tests/test_redraw_figure.py holds the two to
    the same pixels). Saved at 80 dpi.
    """
    fig = Figure(figsize=(4, 16), layout="constrained", dpi=80)
    rows = fig.subplots(nrows=8, ncols=2, subplot_kw={"xticks": [], "yticks": []})
    fig.suptitle(title, fontsize="medium")
    for row, pair in zip(rows, zip(images[:8], predicted[:8])):
        for ax, image, name in zip(row, pair, ("Input Image", "Predicted Image")):
            ax.imshow(image[..., 0], cmap="gray", vmin=0, vmax=1)
            ax.set_title(name)
    return fig


def figure_title(plan, record):
    """The figure's title: which run, how it ended, and whose digits it shows.

    "tpu_rehearsal: val_loss 0.0123", the batch, steps and learning rate,
    then the data: digits of the 5,000-digit sample are said to be the
    sample's, never MNIST's. With `plan` None the run's settings are read from
    its `record` (tools/redraw_figure.py redraws a saved run's figure).
    """
    run = record if plan is None else {
        "name": plan.name, "data_source": plan.source.label,
        "global_batch_size": plan.global_batch_size,
        "steps_per_epoch": plan.steps_per_epoch, "learning_rate": plan.learning_rate}
    label = run["data_source"]
    digits = ("digits 0-7 of the 5,000-digit sample, not MNIST" if "sample" in label
              else "images of a stand-in, not MNIST" if "stand-in" in label
              else f"digits 0-7 of MNIST ({label})")
    hosts = record.get("hosts")  # a JAX slice's (jax_route.versions)
    where = f"{hosts} hosts x {record['devices_per_host']} devices\n" if hosts else ""
    return (f"{run['name']}: val_loss {record['val_loss'][-1]:.4f}\n"
            f"{where}batch {run['global_batch_size']}, {run['steps_per_epoch']} steps/epoch, "
            f"lr {run['learning_rate']:g}\n{digits}")


def runtime_info(plan):
    """Where the run ran: the notebook service and its accelerator, and the devices trained on."""
    host = detect()
    devices = None
    if plan.device == "gpu" and not plan.rehearsal:
        names = [tf.config.experimental.get_device_details(gpu).get("device_name", "GPU")
                 for gpu in tf.config.list_physical_devices("GPU")]
        devices = " + ".join(sorted(set(names))) or None
    elif plan.device == "tpu" and not plan.rehearsal and host.tpu_generation:
        chips = "chip" if host.tpu_chips == 1 else "chips"
        devices = f"TPU {host.tpu_generation}, {host.tpu_chips} {chips}"
    return {"service": host.service, "accelerator": plan.runtime,
            "description": host.describe(), "devices": devices}


def machine_info():
    """A short description of the machine, for the run record."""
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


def _communication(rehearsal):
    """How a cluster's all-reduces travel (loaded with the cluster module, for clusters only)."""
    from pyimagesearch.cluster import collective_communication

    return collective_communication(rehearsal).name
