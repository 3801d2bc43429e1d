"""A run's outputs: the figure, the run record and the model, never half written.

The outputs are written into a local scratch folder first (Matplotlib and
Keras write local files), then copied next to their destination under
temporary names and renamed over the old ones, all through `tf.io.gfile`, so
the destination may be a local folder or a bucket (`gs://...`, or `ram://` in
tests). Nothing is renamed until every file is written and copied: a failure
leaves the old outputs as they were: the old files are renamed aside first and
put back if any step fails.
"""
import os
import platform
import shutil
import sys

import keras
import matplotlib
import tensorflow as tf

from pyimagesearch import config
from pyimagesearch.errors import UserError, first_line
from pyimagesearch.files import join, scratch_folder, write_json
from pyimagesearch.strategy import collective_communication

matplotlib.use("Agg")  # no display needed; must precede any pyplot import
from matplotlib.figure import Figure  # noqa: E402


class StagedOutputs:
    """Collect files in a scratch folder, then move them all into place at once.

    with StagedOutputs(folder) as staged:
        figure.savefig(staged.path("cpu.png"), format="png")
    # only here, on success, does cpu.png replace the old one
    """

    def __init__(self, folder):
        self.folder = folder
        self._names = []

    def path(self, name):
        """A local scratch path for the output called `name` (keeps its suffix)."""
        self._names.append(name)
        return os.path.join(self._scratch, name)

    def __enter__(self):
        self._scratch = scratch_folder("outputs")
        return self

    def __exit__(self, kind, value, traceback):
        try:
            if kind is None:
                self._publish()
        finally:
            shutil.rmtree(self._scratch, ignore_errors=True)
        return False

    def _publish(self):
        """Copy every staged file beside its destination, then swap them all in.

        The old outputs are first renamed aside; if any step fails, what was
        moved is put back, so the folder holds the old set or the new set,
        never a mix of the two.
        """
        pid = os.getpid()
        moves = [(join(self.folder, f".{name}.{pid}.tmp"), join(self.folder, name),
                  join(self.folder, f".{name}.{pid}.old")) for name in self._names]
        for _, final, _ in moves:
            if tf.io.gfile.isdir(final):
                raise UserError(f"cannot write {final}: a folder has that name; move it "
                                "away (earlier outputs are untouched)")
        aside, placed = [], []
        try:
            for name, (temporary, _, _) in zip(self._names, moves):
                tf.io.gfile.copy(os.path.join(self._scratch, name), temporary,
                                 overwrite=True)
            for _, final, old in moves:
                if tf.io.gfile.exists(final):
                    tf.io.gfile.rename(final, old, overwrite=True)
                    aside.append((old, final))
            for temporary, final, _ in moves:
                tf.io.gfile.rename(temporary, final, overwrite=True)
                placed.append(final)
        except (OSError, tf.errors.OpError) as error:
            for final in placed:
                tf.io.gfile.remove(final)
            for old, final in aside:
                tf.io.gfile.rename(old, final, overwrite=True)
            aside = []
            raise UserError(f"cannot replace the outputs in {self.folder} "
                            f"({first_line(error)}); earlier outputs are untouched") from error
        finally:
            # nothing temporary stays behind, whether a copy or a rename failed
            for temporary, _, _ in moves:
                if tf.io.gfile.exists(temporary):
                    tf.io.gfile.remove(temporary)
            for old, _ in aside:
                tf.io.gfile.remove(old)


def reconstruction_figure(inputs, predictions, title=None):
    """The article's figure: one row per digit, input left, reconstruction right."""
    rows = len(inputs)
    figure = Figure(figsize=(4, 2 * rows), layout="constrained")
    axes = figure.subplots(nrows=rows, ncols=2, squeeze=False)
    for (left, right), real, pred in zip(axes, inputs, predictions):
        left.imshow(real.squeeze(-1), cmap="gray", vmin=0.0, vmax=1.0)
        left.set_title("Input Image")
        right.imshow(pred.squeeze(-1), cmap="gray", vmin=0.0, vmax=1.0)
        right.set_title("Predicted Image")
        for axis in (left, right):
            axis.set_axis_off()
    if title:
        figure.suptitle(title)
    return figure


def save_outputs(plan, record, model, testIm, predIm):
    """Write figure, record and model; the old ones are replaced only when all are written.

    A worker that is not the chief saves too, as TensorFlow's multi-worker
    guide asks (saving may run collectives), into a folder that is removed.
    """
    if not plan.is_chief:
        scratch = scratch_folder("worker")
        try:
            _write(scratch, plan.name, record, model, testIm, predIm)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        return
    print("[INFO] saving the predicted images, run record and model...")
    folder = plan.settings.output_dir
    _write(folder, plan.name, record, model, testIm, predIm)
    for suffix in ("png", "json", "keras"):
        print(f"[INFO] wrote {join(folder, plan.name)}.{suffix}")


def _write(folder, name, record, model, testIm, predIm):
    """The three outputs, staged and then published into `folder`."""
    title = f"{name}: val_loss {record['val_loss'][-1]:.4f}"
    with StagedOutputs(folder) as staged:
        figure = reconstruction_figure(testIm, predIm, title=title)
        figure.savefig(staged.path(f"{name}.png"), format="png", dpi=80)
        write_json(staged.path(f"{name}.json"), record)
        model.save(staged.path(f"{name}.keras"))


def run_record(plan, strategy, source, validation, *, history, timer, resumed_from_step,
               started):
    """The run record: what ran, on what, with which data, and how it went."""
    settings = plan.settings
    return {
        "device": plan.device,
        "name": plan.name,
        "rehearsal": plan.rehearsal,
        # MultiWorkerMirroredStrategy's class is CollectiveAllReduceStrategy
        "strategy": ("MultiWorkerMirroredStrategy"
                     if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy)
                     else type(strategy).__name__),
        "workers": plan.workers,
        # how the workers' all-reduces travel (several machines only)
        "communication": (collective_communication(plan.rehearsal).name
                           if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy)
                           else None),
        "replicas": plan.replicas,
        "global_batch_size": plan.global_batch_size,
        "per_replica_batch_size": plan.global_batch_size // plan.replicas,
        "steps_per_epoch": plan.steps_per_epoch,
        "steps_per_execution": plan.steps_per_execution,
        "epochs": settings.epochs,
        "resumed_from_epoch": resumed_from_step // plan.steps_per_epoch,
        "resumed_from_step": resumed_from_step,  # global steps trained before this run
        "loop": plan.loop,
        "precision": settings.precision,
        "jit_compile": settings.jit_compile,
        "optimizer": settings.optimizer,
        "learning_rate": plan.learning_rate,
        "learning_rate_scaling": settings.lr_scaling,
        "seed": settings.seed,
        "data_source": source.label,
        "data_source_reason": source.reason,
        "train_images": source.size(config.TRAIN_FLAG),
        "validation_steps": validation.steps,
        "validation_images": validation.images,
        "validation_split_images": validation.split_images,
        "tensorflow_version": tf.__version__,
        "keras_version": keras.__version__,
        "epoch_seconds": timer.epoch_seconds,
        "train_seconds": timer.train_seconds,
        "images_per_second": [plan.steps_per_epoch * plan.global_batch_size / s
                              for s in timer.train_seconds],
        "loss": [float(v) for v in history["loss"]],
        "val_loss": [float(v) for v in history["val_loss"]],
        "command": [os.path.basename(sys.argv[0])] + sys.argv[1:],
        "machine": machine_info(),
        "started_at": started.isoformat(timespec="seconds"),
    }


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
