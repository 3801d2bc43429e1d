"""--backup-dir: survive a crash, in both training loops, on TensorFlow and on JAX.

The backup folder (local or gs://...) holds:

    checkpoints/   a tf.train.CheckpointManager of the model, its optimizer
                   and the global steps trained, saved at every epoch end,
                   every --backup-every steps and when SIGTERM comes
    history.json   the losses of the epochs done, for the run record
    run.json       what run the backup belongs to, so another run's is refused

`Backup` is one Keras callback that `fit` and the custom loop both drive.
On Keras' JAX backend (train_tpu.py's route on Colab's and Kaggle's TPUs)
`KerasBackup` keeps history.json and run.json alike, and in place of
checkpoints/ Keras' own weights file, since a tf.train.Checkpoint holds
TensorFlow variables only:

    checkpoint-N.weights.h5   model.save_weights: the model's and its
                              optimizer's variables after N global steps
    checkpoint.json           the steps trained and the file that holds them
Keras' own BackupAndRestore is not used because its .weights.h5 files carry
no checkpoint object that TensorFlow's multi-worker and TPU tooling can
share, and under MultiWorkerMirroredStrategy every process would write the
same files; a tf.train.Checkpoint works the same under every strategy.
"""
import math
import os
import shutil

import keras
import tensorflow as tf

from pyimagesearch import exits
from pyimagesearch.config import IMAGE_SHAPE
from pyimagesearch.errors import Preempted, UserError, first_line
from pyimagesearch.files import LOCK, join, read_json, scratch_folder, take_lock, write_json
from pyimagesearch.plan import default_settings, run_name
from pyimagesearch.workarounds import stop_preemption_handler

HISTORY = "history.json"   # losses of the epochs done, written before the checkpoint
RUN = "run.json"           # the configuration the backup belongs to
CHECKPOINTS = "checkpoints"
MODEL = "AutoEncoder"  # the one model the scripts train (pyimagesearch.autoencoder)
KERAS_BACKUP = "training_metadata.json"  # what the repo's fit backups held until 2026-12
CHECKPOINT = "checkpoint.json"  # on JAX: the steps trained and the weights file holding them
WEIGHTS = "checkpoint-{step}.weights.h5"  # on JAX: model.save_weights after `step` steps


def identity(plan):
    """What a backup must match to be resumed: the same model trained the same way.

    "run" is the script's run without its flags (cpu, tpu_rehearsal, with the
    runtime): the settings that matter follow it one by one, and --epochs is
    not among them, so a backup can be resumed to train on for more epochs.
    """
    settings, source = plan.settings, plan.source
    run = run_name(plan.device, default_settings(plan.device), plan.rehearsal, plan.runtime,
                   plan.backend)  # "..._jax" on JAX: the other backend's backup is refused
    return {"run": run, "model": MODEL,
            "global_batch_size": plan.global_batch_size, "replicas": plan.replicas,
            "steps_per_epoch": plan.steps_per_epoch, "loop": plan.loop,
            "precision": settings.precision, "optimizer": settings.optimizer,
            "learning_rate": plan.learning_rate, "data_source": source.label,
            "data_dir": getattr(source, "folder", None) or getattr(source, "data_dir", None),
            "seed": settings.seed, "jit_compile": settings.jit_compile}


def saved_checkpoint(folder):
    """(global steps, path) of the checkpoint the backup `folder` holds; (0, None) without one.

    Raises what TensorFlow raises for a checkpoint that cannot be read, and
    ValueError where its state names a checkpoint that is not there.
    """
    checkpoints = join(folder, CHECKPOINTS)
    if tf.io.gfile.exists(checkpoints) and not tf.io.gfile.isdir(checkpoints):
        raise ValueError(f"{checkpoints} is a file, not a folder")
    state = tf.train.get_checkpoint_state(checkpoints)
    if state is None or not state.model_checkpoint_path:
        return 0, None
    latest = state.model_checkpoint_path
    if not tf.io.gfile.exists(latest + ".index"):
        # (tf.train.latest_checkpoint would log an error and report none)
        raise ValueError(f"{latest}, which its state file names, is missing")
    return int(tf.train.load_variable(latest, "step/.ATTRIBUTES/VARIABLE_VALUE")), latest


class Backup(keras.callbacks.Callback):
    """The run's backup folder: refuse another run's, resume this one's, keep it current.

    Under MultiWorkerMirroredStrategy every worker saves (TensorFlow's
    multi-worker guide asks for it); the chief into the backup folder, the
    others into a temporary folder that is removed. Every worker restores
    from the chief's folder.
    """

    def __init__(self, plan):
        super().__init__()
        self.folder = plan.settings.backup_dir
        self.every = plan.settings.backup_every  # steps between mid-epoch saves
        self.epochs, self.steps_per_epoch = plan.settings.epochs, plan.steps_per_epoch
        self.is_chief, self.workers, self.cluster = plan.is_chief, plan.workers, plan.cluster
        self.handler_acts = plan.preemption_handler  # agreed by every worker
        self.run = identity(plan)
        self.history = {"loss": [], "val_loss": []}
        self.start_step = 0  # global steps trained before this run
        self._latest = None  # the checkpoint `resume` found, restored at train begin

    def resume(self, cluster=None):
        """Check the folder belongs to this run; return the global steps already trained.

        Every worker of a cluster reads the folder, and they check together
        that all found the same, so that all stop or none (a refused backup
        too); only then does the chief write run.json.
        """
        step, refusal = self._checkpoint_step(), self._refusal()
        if cluster:  # TensorFlow's workers, or a JAX slice's processes
            cluster.agree({"backup": refusal or f"{step:,} steps done"}, topic="backup")
        if refusal:
            raise UserError(refusal)
        epochs_done = step // self.steps_per_epoch
        history = self._read(HISTORY) or self.history
        if not (isinstance(history, dict) and all(
                isinstance(history.get(key), list) and all(
                    isinstance(value, (int, float)) for value in history[key])
                for key in self.history)):
            raise UserError(f"{join(self.folder, HISTORY)} does not hold a backup's losses; "
                            "delete the backup folder to start fresh")
        short = [key for key in self.history if len(history[key]) < epochs_done]
        if short:  # the run record would say N epochs and hold fewer losses
            raise UserError(f"{join(self.folder, HISTORY)} holds the {short[0]} of "
                            f"{_count(len(history[short[0]]), 'epoch')}, but the backup's "
                            f"checkpoint has {_count(epochs_done, 'epoch')} done; delete the "
                            "backup folder to start fresh")
        self.history = {key: list(history[key][:epochs_done]) for key in self.history}
        if step > self.epochs * self.steps_per_epoch:
            rest = step - epochs_done * self.steps_per_epoch
            held = _count(epochs_done, "epoch") + (f" and {_count(rest, 'step')}" if rest else "")
            raise UserError(f"the backup in {self.folder} has {step:,} steps done ({held}), "
                            f"more than the {self.epochs * self.steps_per_epoch:,} of --epochs "
                            f"{self.epochs}; raise --epochs, or delete the backup to start "
                            "fresh")
        if self.is_chief:
            tf.io.gfile.makedirs(self.folder)
            take_lock(self.folder)  # a second run on the same folder stops here
            write_json(join(self.folder, RUN), self.run)
        # global steps trained, saved with the weights: counted on across both
        # calls to fit of a run resumed mid-epoch
        self.start_step = self._trained = step
        if step:
            print(f"[INFO] resuming from {self.folder}: {epochs_done} of {self.epochs} "
                  f"epochs and {step:,} steps done")
        return step

    def _read(self, name):
        """A JSON file of the backup, None if absent; a broken one says what to do."""
        return read_json(join(self.folder, name),
                         advice="delete the backup folder to start fresh")

    def _refusal(self):
        """Why the folder cannot be this run's backup; None if it is empty or this run's."""
        saved = self._read(RUN)
        if saved is not None and not isinstance(saved, dict):
            return (f"{join(self.folder, RUN)} does not describe a run; delete the "
                    "backup folder to start fresh")
        has_state = tf.io.gfile.exists(self.folder) and any(
            name != LOCK for name in tf.io.gfile.listdir(self.folder))
        if saved is None and has_state:
            return (f"--backup-dir {self.folder} holds files of something else; "
                    "choose an empty or new folder")
        if saved is not None and saved != self.run:
            differs = ", ".join(f"{key} {saved.get(key)!r} -> {self.run.get(key)!r}"
                                for key in sorted(set(saved) | set(self.run))
                                if saved.get(key) != self.run.get(key))
            return (f"--backup-dir {self.folder} is the backup of another run "
                    f"({differs}); delete it, or give a new --backup-dir, to "
                    "start fresh")
        if tf.io.gfile.exists(join(self.folder, KERAS_BACKUP)):
            return (f"--backup-dir {self.folder} was written by an earlier version "
                    "of this repo (Keras' BackupAndRestore), which cannot be "
                    "resumed here; delete it to start fresh")
        return None

    def _checkpoint_step(self):
        """The global steps the checkpoint has trained (0 without one); keeps its path."""
        try:
            step, self._latest = saved_checkpoint(self.folder)
        except (ValueError, IndexError, tf.errors.OpError) as error:
            raise self._broken(error) from error
        return step

    def _broken(self, error):
        """The one-line error for a checkpoint that cannot be read."""
        return UserError(f"cannot read the checkpoint in {join(self.folder, CHECKPOINTS)} "
                         f"({first_line(error)}); delete the backup folder to start fresh")

    def on_train_begin(self, logs=None):
        """Load the checkpoint `resume` found, if any; from here SIGTERM saves and stops."""
        self._open()
        self._since = 0
        # in a cluster, SIGTERM on any worker stops every worker at one step
        self._handler_scratch = scratch_folder("preemption") if self.workers > 1 else None
        self._handler = self._handler_scratch and exits.cluster_handler(
            tf.distribute.get_strategy(), self._handler_scratch, self._save,
            self._stop_cluster_preempted, acts=self.handler_acts)
        exits.saving(True)

    def _open(self):
        """The checkpoint manager; the checkpoint `resume` found, loaded into the model."""
        self._step = tf.Variable(0, dtype=tf.int64, trainable=False, name="step")
        checkpoint = tf.train.Checkpoint(model=self.model, optimizer=self.model.optimizer,
                                         step=self._step)
        target = join(self.folder, CHECKPOINTS)
        self._scratch = None if self.is_chief else scratch_folder("ckpt")
        self.manager = tf.train.CheckpointManager(checkpoint, self._scratch or target,
                                                  max_to_keep=1)
        if self._latest is not None:
            try:
                checkpoint.restore(self._latest).expect_partial()
            except (ValueError, IndexError, tf.errors.OpError) as error:
                # IndexError: TensorFlow's "Read less bytes than requested", a cut file
                raise self._broken(error) from error
            # once: a second call to fit (after a part-trained epoch) goes on
            # from the weights in memory
            self._latest = None

    def on_epoch_begin(self, epoch, logs=None):
        self._done = 0  # steps of this call to fit (or this epoch) so far

    def on_train_batch_end(self, batch, logs=None):
        # `batch` is the last step the call into the compiled step ran,
        # counted from 0 in the epoch (fit and the custom loop call once per
        # execution of several steps)
        ran, self._done = batch + 1 - self._done, batch + 1
        self._trained += ran
        self._since += ran
        if self._done == self.params["steps"]:
            return  # the epoch's last step: on_epoch_end saves, after validation
        self._stop_if_preempted()
        if self.every and self._since >= self.every:
            self._save()

    def on_epoch_end(self, epoch, logs=None):
        if not all(math.isfinite(logs[key]) for key in self.history):
            return  # a diverged run stops; its last good backup stays
        # the history first: a crash between the two leaves one epoch too
        # many in it, which `resume` trims, never one too few
        for key in self.history:
            self.history[key].append(float(logs[key]))
        if self.is_chief:
            write_json(join(self.folder, HISTORY), self.history)
        self._stop_if_preempted()
        self._save()

    def _stop_if_preempted(self):
        """After a step: if SIGTERM came, save the backup and stop (exit status 143).

        Alone, this process saves at once. In a cluster TensorFlow's handler
        decides, and every worker saves at the step it agreed on.
        """
        if self._handler is not None:
            try:
                self._handler.save_checkpoint_if_preempted()
            except tf.errors.AlreadyExistsError:
                pass  # SIGTERM after another worker ended training: none to stop
        elif exits.requested():
            self._save()
            self._close()
            raise Preempted(f"stopped by SIGTERM after {self._trained:,} steps; the backup "
                            f"in {self.folder} holds them: run the same command to resume")

    def _stop_cluster_preempted(self):
        """TensorFlow's handler saved the backup on every worker: stop (exit status 143)."""
        cause = "by SIGTERM" if exits.requested() else "because a peer got SIGTERM,"
        self._close()
        raise Preempted(f"stopped {cause} after {self._trained:,} steps with the whole "
                        f"cluster; the backup in {self.folder} holds them: run the same "
                        "command to resume")

    def _save(self):
        """Save the checkpoint of the steps trained; a failure is one line, the last one kept.

        CheckpointManager writes the new checkpoint before its state file
        names it, so a save that fails (a full disk, a bucket gone) leaves the
        state naming the last good one; what was half written is removed.
        """
        self._step.assign(self._trained)
        try:
            self.manager.save()
        except (OSError, tf.errors.OpError) as error:
            written = self._scratch or join(self.folder, CHECKPOINTS)
            for path in (tf.io.gfile.glob(join(written, "*_temp*"))
                         + tf.io.gfile.glob(join(written, "checkpoint.tmp*"))):
                if tf.io.gfile.isdir(path):
                    tf.io.gfile.rmtree(path)
                else:
                    tf.io.gfile.remove(path)
            self._close()
            kept = self._kept()
            raise UserError(f"cannot save the backup in {self.folder} ({first_line(error)}) "
                            f"after {self._trained:,} steps; {kept}, and the earlier outputs "
                            "are untouched") from error
        self._since = 0

    def _kept(self):
        """What the backup folder holds now, read back from it: for a line that says so."""
        try:
            step, _ = saved_checkpoint(self.folder)
        except (ValueError, IndexError, tf.errors.OpError):
            return "the backup there cannot be read back"
        return _kept_line(step)

    def on_train_end(self, logs=None):
        self._close()

    def _close(self):
        """Training is over, or stops: no more saves on SIGTERM, no temporary folders."""
        exits.saving(False)
        if self._handler is not None:
            stop_preemption_handler(self._handler)
        for scratch in (self._scratch, self._handler_scratch):
            if scratch:
                shutil.rmtree(scratch, ignore_errors=True)

    def finish(self):
        """The run's outputs are written: the backup is no longer needed."""
        if self.is_chief and tf.io.gfile.exists(self.folder):
            tf.io.gfile.rmtree(self.folder)


def saved_weights(folder):
    """(global steps, path) of the weights file a JAX backup `folder` holds; (0, None) without.

    Raises a UserError for a checkpoint.json that cannot be read, and
    ValueError where it names no file, or one that is not there.
    """
    saved = read_json(join(folder, CHECKPOINT), advice="delete the backup folder to start fresh")
    if saved is None:
        return 0, None
    step, name = (saved.get("step"), saved.get("weights")) if isinstance(saved, dict) else (0, 0)
    if not (isinstance(step, int) and step >= 0 and isinstance(name, str)
            and name == WEIGHTS.format(step=step)):
        raise ValueError(f"{join(folder, CHECKPOINT)} does not name a checkpoint")
    path = join(folder, name)
    if not tf.io.gfile.exists(path):
        raise ValueError(f"{path}, which {CHECKPOINT} names, is missing")
    return step, path


class KerasBackup(Backup):
    """The backup on Keras' JAX backend: Keras' own weights file, named by a small JSON file.

    A tf.train.Checkpoint tracks TensorFlow variables only; on JAX the
    model's are jax.Arrays. `model.save_weights` writes the variables of the
    model and of its optimizer (its step count, Adam's moments) into one
    .weights.h5 file, the same format on every backend (Keras 3.15,
    keras/src/saving/saving_lib.py: `save_weights_only` calls `_save_state`,
    which walks every KerasSaveable attribute of the model, `optimizer`
    among them). As tf.train.CheckpointManager does, each save is a new file
    and only then does checkpoint.json, replaced by one rename
    (files.write_json), name it: a run killed while it saves leaves the last
    good pair.

    Keras' BackupAndRestore is not used (keras/src/callbacks/
    backup_and_restore.py, 3.15.1): it writes latest.weights.h5 over the
    last one and training_metadata.json after it, so a kill in between
    leaves new weights with the old epoch; it resumes at the start of an
    epoch (the batch it records is never read); and it deletes its folder
    when fit returns, before the run's outputs are written.

    Keras on JAX runs a TPU's whole epoch per call (plan.py), so, as on a
    TensorFlow TPU, the backups and SIGTERM's stop come at epoch ends. On
    a slice of several processes (jax_slice.py) every process reads the
    backup and process 0 alone writes it; at each epoch's end they all say
    whether SIGTERM came to them, and if it came to any, all stop there,
    after process 0 has saved.
    """

    def _stop_if_preempted(self):
        if self.workers == 1:
            return super()._stop_if_preempted()
        from pyimagesearch.jax_slice import any_asked

        if not any_asked(self.cluster, f"sigterm/{self._trained}", exits.requested()):
            return
        self._save()
        self._close()
        self.cluster.end_together()  # process 0 has saved: all leave as one
        cause = "by SIGTERM" if exits.requested() else "because another process got SIGTERM,"
        raise Preempted(f"stopped {cause} after {self._trained:,} steps with every process; "
                        f"the backup in {self.folder} holds them: run the same command on "
                        "every host to resume")

    def _checkpoint_step(self):
        """The global steps the weights file has trained (0 without one); keeps its path."""
        try:
            step, self._latest = saved_weights(self.folder)
        except ValueError as error:
            raise self._broken(error) from error
        return step

    def _broken(self, error):
        """The one-line error for a weights file that cannot be read."""
        return UserError(f"cannot read the checkpoint in {self.folder} ({first_line(error)}); "
                         "delete the backup folder to start fresh")

    def _open(self):
        """Load the weights file `resume` found, if any, into the model and its optimizer."""
        self._scratch = scratch_folder("weights")  # Keras writes each file here first
        self._saved = self._latest
        for path in tf.io.gfile.glob(join(self.folder, WEIGHTS.format(step="*"))):
            if path != self._latest and self.is_chief:  # the new file of a save that was killed
                _remove(path)
        if self._latest is None:
            return
        model = self.model  # on JAX, Keras' Callback.model puts fit's state back in the model
        if not model.built:  # JAX's fit has built it (its _symbolic_build); TensorFlow's defers
            model.build((None, *IMAGE_SHAPE))
        if not model.optimizer.built:  # its variables exist only once built
            model.optimizer.build(model.trainable_variables)
        try:
            model.load_weights(self._latest)
        except (OSError, ValueError, KeyError) as error:  # h5py: a cut or foreign file
            raise self._broken(error) from error
        self._latest = None  # once, as in Backup._open

    def _save(self):
        """A new weights file, then checkpoint.json naming it; the earlier file removed.

        A failure (a full disk, a bucket gone) is one line, and leaves the last pair.
        """
        path = join(self.folder, WEIGHTS.format(step=self._trained))
        if path != self._saved:  # (the same steps are the same weights)
            local = os.path.join(self._scratch, "checkpoint.weights.h5")
            try:
                # written here, then copied: on a full disk h5py would also print
                # the errors it meets while it closes the file. Every process of a
                # slice writes its copy, as process 0 does, or their models' state
                # would differ from here on (Keras on JAX syncs it as it saves)
                self.model.save_weights(local)
                if not self.is_chief:
                    return
                tf.io.gfile.copy(local, path, overwrite=True)
                write_json(join(self.folder, CHECKPOINT),
                           {"step": self._trained, "weights": path.rsplit("/", 1)[-1]})
            except (OSError, tf.errors.OpError, UserError) as error:
                _remove(path)
                self._close()
                raise UserError(f"cannot save the backup in {self.folder} "
                                f"({first_line(error)}) after {self._trained:,} steps; "
                                f"{self._kept()}, and the earlier outputs are untouched"
                                ) from error
            if self._saved:
                _remove(self._saved)
            self._saved = path
        self._since = 0

    def _kept(self):
        """What the backup folder holds now, read back from it: for a line that says so."""
        try:
            step, _ = saved_weights(self.folder)
        except (ValueError, UserError):
            return "the backup there cannot be read back"
        return _kept_line(step)


def _remove(path):
    """Remove the file `path` if it is there."""
    if path and tf.io.gfile.exists(path):
        tf.io.gfile.remove(path)


def _kept_line(step):
    """What a backup of `step` global steps lets the same command do."""
    if not step:
        return "it holds no backup yet"
    return (f"it holds the backup of {step:,} steps, which the same command resumes "
            "from (once there is room)")


def _count(count, what):
    """'1 epoch', '2 epochs'."""
    return f"{count:,} {what}" + ("" if count == 1 else "s")
