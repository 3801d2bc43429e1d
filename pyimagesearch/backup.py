"""--backup-dir: survive a crash, in both training loops, with one checkpoint format.

The backup folder (local or gs://...) holds:

    checkpoints/   a tf.train.CheckpointManager of the model, its optimizer
                   (its step count too) and the epoch being trained
    history.json   the losses of the epochs done, for the run record
    run.json       what run the backup belongs to, so another run's is refused

`Backup` is one Keras callback that `fit` and the custom loop both drive.
Keras' own BackupAndRestore is not used because its .weights.h5 files carry
no checkpoint object that TensorFlow's multi-worker and TPU tooling can
share, and under MultiWorkerMirroredStrategy every process would write the
same files; a tf.train.Checkpoint works the same under every strategy.
"""
import shutil
import tempfile

import keras
import tensorflow as tf

from pyimagesearch.autoencoder import AutoEncoder
from pyimagesearch.errors import UserError
from pyimagesearch.files import join, read_json, write_json

HISTORY = "history.json"   # losses of the epochs done, written before the checkpoint
RUN = "run.json"           # the configuration the backup belongs to
CHECKPOINTS = "checkpoints"


def identity(plan, source):
    """What a backup must match to be resumed: the same model trained the same way."""
    settings = plan.settings
    return {"run": plan.name, "model": AutoEncoder.__name__,
            "global_batch_size": plan.global_batch_size, "replicas": plan.replicas,
            "steps_per_epoch": plan.steps_per_epoch, "loop": plan.loop,
            "precision": settings.precision, "optimizer": settings.optimizer,
            "learning_rate": plan.learning_rate, "data_source": source.label}


class Backup(keras.callbacks.Callback):
    """The run's backup folder: refuse another run's, resume this one's, keep it current.

    Under MultiWorkerMirroredStrategy every worker saves (TensorFlow's
    multi-worker guide asks for it); the chief into the backup folder, the
    others into a temporary folder that is removed. Every worker restores
    from the chief's folder.
    """

    def __init__(self, plan, source):
        super().__init__()
        self.folder = plan.settings.backup_dir
        self.every = plan.settings.backup_every  # steps between mid-epoch saves
        self.epochs, self.steps_per_epoch = plan.settings.epochs, plan.steps_per_epoch
        self.is_chief = plan.is_chief
        self.run = identity(plan, source)
        self.history = {"loss": [], "val_loss": []}
        self.initial_epoch = 0

    def resume(self, strategy):
        """Check the folder belongs to this run; return the epochs already done.

        Only the chief checks and writes run.json: another worker could look
        while the chief is still writing it. Under several workers a
        collective then makes sure that every worker found the same backup.
        """
        self.initial_epoch = done = self._checkpoint_epoch()
        if self.is_chief:
            self._check_run()
            tf.io.gfile.makedirs(self.folder)
            write_json(join(self.folder, RUN), self.run)
        history = self._read(HISTORY) or self.history
        self.history = {key: list(history[key][:done]) for key in self.history}
        if done > self.epochs:
            raise UserError(f"the backup in {self.folder} has {done} epochs done, more "
                            f"than --epochs {self.epochs}; raise --epochs, or delete the "
                            "backup to start fresh")
        if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
            self._check_workers_agree(strategy, done)
        if done:
            print(f"[INFO] resuming from {self.folder}: {done} of {self.epochs} "
                  "epochs done")
        return done

    def _read(self, name):
        """A JSON file of the backup, None if absent; a broken one says what to do."""
        return read_json(join(self.folder, name),
                         advice="delete the backup folder to start fresh")

    def _check_run(self):
        """UserError unless the folder is empty or this run's backup."""
        saved = self._read(RUN)
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

    def _check_workers_agree(self, strategy, done):
        """Stop every worker unless all found the same number of epochs done.

        All are equal exactly when n x (sum of squares) == (sum)^2; every
        worker gets the same answer, so all stop or none.
        """
        mine = strategy.run(lambda: tf.constant([1.0, done, done * done], tf.float64))
        count, total, squares = strategy.reduce(tf.distribute.ReduceOp.SUM, mine,
                                                axis=None).numpy()
        if count * squares != total * total:
            raise UserError(f"the workers found different backups in {self.folder} "
                            f"(this one: {done} epochs done): every worker must see the "
                            "chief's folder; use a bucket (gs://...) or a shared disk")

    def _checkpoint_epoch(self):
        """The epoch the checkpoint resumes at (0 without one)."""
        latest = tf.train.latest_checkpoint(join(self.folder, CHECKPOINTS))
        if latest is None:
            return 0
        return int(tf.train.load_variable(latest, "epoch/.ATTRIBUTES/VARIABLE_VALUE"))

    def on_train_begin(self, logs=None):
        """Load the latest checkpoint, if any, into the model and its optimizer."""
        self._epoch = tf.Variable(0, dtype=tf.int64, trainable=False, name="epoch")
        checkpoint = tf.train.Checkpoint(model=self.model, optimizer=self.model.optimizer,
                                         epoch=self._epoch)
        target = join(self.folder, CHECKPOINTS)
        self._scratch = None if self.is_chief else tempfile.mkdtemp(
            prefix="pyimagesearch-ckpt-")
        self.manager = tf.train.CheckpointManager(checkpoint, self._scratch or target,
                                                  max_to_keep=1)
        latest = tf.train.latest_checkpoint(target)
        if latest is not None:
            checkpoint.restore(latest).expect_partial()

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch.assign(epoch)  # a mid-epoch save resumes this epoch
        self._done, self._since = 0, 0

    def on_train_batch_end(self, batch, logs=None):
        # `batch` is the last step the call ran, counted from 0 in the epoch
        # (fit and the custom loop call once per execution of several steps)
        self._since += batch + 1 - self._done
        self._done = batch + 1
        if self.every and self._since >= self.every:
            self._since = 0
            self.manager.save()

    def on_epoch_end(self, epoch, logs=None):
        # the history first: a crash between the two leaves one epoch too
        # many in it, which `resume` trims, never one too few
        for key in self.history:
            self.history[key].append(float(logs[key]))
        if self.is_chief:
            write_json(join(self.folder, HISTORY), self.history)
        self._epoch.assign(epoch + 1)
        self.manager.save()

    def on_train_end(self, logs=None):
        if self._scratch:
            shutil.rmtree(self._scratch, ignore_errors=True)

    def finish(self):
        """The run's outputs are written: the backup is no longer needed."""
        if self.is_chief and tf.io.gfile.exists(self.folder):
            tf.io.gfile.rmtree(self.folder)
