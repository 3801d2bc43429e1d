"""Everything a run does besides training, assembled in one place: timing, backup, logs.

- `EpochTimer`: wall time of each epoch and of its training part.
- `Backup` (--backup-dir): resume after a crash. `fit` uses Keras'
  `BackupAndRestore`; the custom loop, which Keras callbacks do not drive,
  a `tf.train.CheckpointManager` in the same folder. Beside the checkpoint
  the backup keeps the losses of the epochs done (history.json) and what run
  it belongs to (run.json), so a different run is refused, not mixed in.
- `EpochSummaries` (--logdir): what Keras' TensorBoard callback does not
  write: images per second and, at each epoch end, the figure's digits with
  their reconstructions as an image summary; in the custom loop also the
  losses and learning rate, under the tags Keras uses.
- `ProfileSteps` (--profile-steps A,B): a profiler trace of steps A to B in
  the custom loop (`fit` gets it from Keras' TensorBoard callback).

`make_callbacks` builds the list a run needs from its flags.
"""
import json
import shutil
import tempfile
import time

import keras
import numpy as np
import tensorflow as tf

from pyimagesearch.errors import UserError, first_line
from pyimagesearch.files import join, write_json

HISTORY = "history.json"   # losses of the epochs done, written before the checkpoint
RUN = "run.json"           # the configuration the backup belongs to
KERAS_STATE = "training_metadata.json"  # BackupAndRestore's own record of the epoch
CHECKPOINTS = "checkpoints"  # the custom loop's tf.train.CheckpointManager folder


class EpochTimer(keras.callbacks.Callback):
    """Wall time of each epoch, and of its training part alone (before validation)."""

    def __init__(self):
        super().__init__()
        self.epoch_seconds, self.train_seconds = [], []

    def on_epoch_begin(self, epoch, logs=None):
        self._start = time.perf_counter()
        self._train_end = None

    def on_test_begin(self, logs=None):
        if self._train_end is None:
            self._train_end = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        end = time.perf_counter()
        self.epoch_seconds.append(end - self._start)
        self.train_seconds.append((self._train_end or end) - self._start)


def _read_json(path):
    """A JSON file through tf.io.gfile; None if it is not there; UserError if unreadable."""
    if not tf.io.gfile.exists(path):
        return None
    try:
        with tf.io.gfile.GFile(path) as handle:
            return json.load(handle)
    except (ValueError, tf.errors.OpError) as error:
        raise UserError(f"cannot read {path} ({first_line(error)}); delete the backup "
                        "folder to start fresh") from error


class Backup(keras.callbacks.Callback):
    """The run's backup folder: refuse another run's, resume this one's.

    As a callback it keeps history.json up to date at every epoch end; list
    it before the checkpointing callback, so that a crash between the two
    leaves one epoch too many in the history, which `resume` trims, and never
    one too few.
    """

    def __init__(self, folder, run, loop, writer=True):
        super().__init__()
        self.folder, self.run, self.loop = folder, run, loop
        self.writer = writer  # False on a worker whose copies are thrown away
        self.history = {"loss": [], "val_loss": []}
        self.initial_epoch = 0

    def resume(self):
        """Check the folder belongs to this run; return the epochs already done.

        Only the writer (the chief) checks: another worker could look while
        the chief is still writing run.json.
        """
        self.initial_epoch = self._checkpoint_epoch()
        if self.writer:
            self._check_run()
            tf.io.gfile.makedirs(self.folder)
            write_json(join(self.folder, RUN), self.run)
        history = _read_json(join(self.folder, HISTORY)) or self.history
        self.history = {key: list(history[key][:self.initial_epoch]) for key in self.history}
        return self.initial_epoch

    def _check_run(self):
        """UserError unless the folder is empty or this run's backup."""
        saved = _read_json(join(self.folder, RUN))
        has_state = tf.io.gfile.exists(self.folder) and bool(tf.io.gfile.listdir(self.folder))
        if saved is None and has_state:
            raise UserError(f"--backup-dir {self.folder} holds files of something else; "
                            "choose an empty or new folder")
        if saved is not None and saved != self.run:
            differs = ", ".join(f"{key} {saved.get(key)!r} -> {self.run.get(key)!r}"
                                for key in sorted(set(saved) | set(self.run))
                                if saved.get(key) != self.run.get(key))
            raise UserError(f"--backup-dir {self.folder} is the backup of another run "
                            f"({differs}); delete it, or give a new --backup-dir, to "
                            "start fresh")

    def _checkpoint_epoch(self):
        """The epoch the checkpoint resumes at (0 without one)."""
        if self.loop == "fit":
            state = _read_json(join(self.folder, KERAS_STATE)) or {}
            return int(state.get("epoch", 0))
        latest = tf.train.latest_checkpoint(join(self.folder, CHECKPOINTS))
        if latest is None:
            return 0
        return int(tf.train.load_variable(latest, "epoch/.ATTRIBUTES/VARIABLE_VALUE"))

    def on_epoch_end(self, epoch, logs=None):
        for key in self.history:
            self.history[key].append(float(logs[key]))
        if self.writer:
            write_json(join(self.folder, HISTORY), self.history)

    def keras_callback(self, every=None):
        """Keras' BackupAndRestore into this folder (deleted by `finish`, not by Keras)."""
        return _BackupAndRestore(self.folder, save_freq=every or "epoch",
                                 delete_checkpoint=False)

    def finish(self):
        """The run's outputs are written: the backup is no longer needed."""
        if self.writer and tf.io.gfile.exists(self.folder):
            tf.io.gfile.rmtree(self.folder)


class _BackupAndRestore(keras.callbacks.BackupAndRestore):
    """Keras' BackupAndRestore, told the epoch it is in.

    Keras 3.15 learns the epoch only at an epoch's end, so a mid-epoch backup
    (`save_freq` in steps) in the first epoch of a resumed run would record
    epoch 0 and send the next resume back to the start.
    """

    def on_epoch_begin(self, epoch, logs=None):
        self._current_epoch = epoch


class CheckpointBackup(keras.callbacks.Callback):
    """The custom loop's backup: model, optimizer and epoch in a CheckpointManager.

    Under MultiWorkerMirroredStrategy every worker saves (TensorFlow's
    multi-worker guide); the chief into the backup folder, the others into
    a temporary one that is removed. Every worker restores from the chief's.
    """

    def __init__(self, folder, every=None, writer=True):
        super().__init__()
        self.folder, self.every, self.writer = folder, every, writer
        self._steps_since = 0

    def on_train_begin(self, logs=None):
        """Load the latest checkpoint, if any, into the model and its optimizer."""
        self.epoch = tf.Variable(0, dtype=tf.int64, trainable=False, name="epoch")
        checkpoint = tf.train.Checkpoint(model=self.model, optimizer=self.model.optimizer,
                                         epoch=self.epoch)
        target = join(self.folder, CHECKPOINTS)
        self._scratch = None if self.writer else tempfile.mkdtemp(prefix="pyimagesearch-ckpt-")
        self.manager = tf.train.CheckpointManager(
            checkpoint, self._scratch or target, max_to_keep=1)
        latest = tf.train.latest_checkpoint(target)
        if latest is not None:
            checkpoint.restore(latest).expect_partial()

    def on_train_batch_end(self, batch, logs=None):
        if not self.every:
            return
        self._steps_since += (logs or {}).get("steps", 1)
        if self._steps_since >= self.every:
            self._steps_since = 0
            self.manager.save()

    def on_epoch_end(self, epoch, logs=None):
        self.epoch.assign(epoch + 1)
        self.manager.save()

    def on_train_end(self, logs=None):
        if self._scratch:
            shutil.rmtree(self._scratch, ignore_errors=True)


class EpochSummaries(keras.callbacks.Callback):
    """TensorBoard summaries that Keras does not write, and the losses for the custom loop.

    List it after the EpochTimer whose times it reports.
    """

    def __init__(self, logdir, digits, images_per_step, timer, losses_too=False):
        super().__init__()
        self.digits, self.images_per_step, self.timer = digits, images_per_step, timer
        self.losses_too = losses_too
        self.train = tf.summary.create_file_writer(join(logdir, "train"))
        self.validation = tf.summary.create_file_writer(join(logdir, "validation"))

    def on_epoch_end(self, epoch, logs=None):
        logs = logs or {}
        steps = logs.get("steps") or self.params.get("steps") or 0
        with self.train.as_default(step=epoch):
            tf.summary.scalar("epoch_images_per_second",
                              steps * self.images_per_step / self.timer.train_seconds[-1])
            if self.losses_too:
                tf.summary.scalar("epoch_loss", logs["loss"])
                tf.summary.scalar("epoch_learning_rate",
                                  float(keras.ops.convert_to_numpy(
                                      self.model.optimizer.learning_rate)))
        with self.validation.as_default(step=epoch):
            if self.losses_too:
                tf.summary.scalar("epoch_loss", logs["val_loss"])
            tf.summary.image("reconstructions", self._side_by_side(),
                             description="input digits (top) and their reconstructions")
        self.train.flush()
        self.validation.flush()

    def _side_by_side(self):
        """One image: the figure's digits in a row above their reconstructions."""
        predicted = np.asarray(self.model(self.digits, training=False), dtype=np.float32)
        rows = [np.concatenate(list(images[..., 0]), axis=1)
                for images in (self.digits, predicted)]
        return np.concatenate(rows, axis=0)[None, :, :, None]

    def on_train_end(self, logs=None):
        self.train.close()
        self.validation.close()


class ProfileSteps(keras.callbacks.Callback):
    """A TensorFlow profiler trace of training steps `first` to `last` (custom loop)."""

    def __init__(self, logdir, first, last):
        super().__init__()
        self.logdir, self.first, self.last = logdir, first, last
        self._step, self._running = 0, False

    def on_train_batch_begin(self, batch, logs=None):
        # one call per execution of `steps` steps: trace every execution that
        # holds one of the steps first..last
        steps = (logs or {}).get("steps", 1)
        if not self._running and self._step < self.last and self._step + steps >= self.first:
            tf.profiler.experimental.start(self.logdir)
            self._running = True

    def on_train_batch_end(self, batch, logs=None):
        self._step += (logs or {}).get("steps", 1)
        if self._running and self._step >= self.last:
            tf.profiler.experimental.stop()
            self._running = False

    def on_train_end(self, logs=None):
        if self._running:
            tf.profiler.experimental.stop()
            self._running = False


def make_callbacks(args, plan, loop, run, digits, writer=True):
    """The callbacks of a run, its EpochTimer, and its Backup (None without --backup-dir).

    `run` identifies the run for the backup check. `writer` False is a worker
    that is not the chief: it writes no logs, and its checkpoints go to a
    temporary folder.
    """
    timer = EpochTimer()
    callbacks = [timer]
    backup = None
    if args.backup_dir:
        backup = Backup(args.backup_dir, run, loop, writer)
        callbacks.append(backup)  # history first, then the checkpoint (see Backup)
        callbacks.append(backup.keras_callback(args.backup_every) if loop == "fit" else
                         CheckpointBackup(args.backup_dir, args.backup_every, writer))
    if writer and (args.logdir or args.profile_steps):
        # one subfolder per configuration: one TensorBoard compares them all
        logdir = join(args.logdir or "logs", plan.name)
        first, last = args.profile_steps or (0, 0)
        if loop == "fit":
            # Keras counts batches in executions of steps_per_execution steps
            per_call = plan.steps_per_execution
            executions = ((first - 1) // per_call + 1, (last - 1) // per_call + 1)
            callbacks.append(keras.callbacks.TensorBoard(
                logdir, write_graph=False, profile_batch=executions if last else 0))
        elif last:
            callbacks.append(ProfileSteps(join(logdir, "train"), first, last))
        callbacks.append(EpochSummaries(logdir, digits, plan.global_batch_size, timer,
                                        losses_too=loop == "custom"))
    return callbacks, timer, backup
