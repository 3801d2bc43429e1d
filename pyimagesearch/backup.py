"""--backup-dir: a run that crashes or gets SIGTERM resumes where it stopped, on both backends.

The folder (local or gs://...) holds:

    weights-N.weights.h5   model.save_weights after N global steps: the model's and
                           its optimizer's variables (Keras' own format, any backend)
    backup.json            which run it is, the steps trained, the weights file that
                           holds them, and the losses of the epochs done
    .lock                  the host and process that use it

Each save writes a new weights file and only then replaces backup.json, whole,
to name it: a run killed while it saves leaves the last good pair. Keras'
BackupAndRestore is not enough here (keras/src/callbacks/backup_and_restore.py,
3.15.1): it resumes at an epoch's start, so a resumed run would train that
epoch's first steps twice, keeps no losses for the run record, and cannot tell
another run's backup from this one's. Resuming from the step itself (the data
skips the batches trained) gives the uninterrupted run's weights.
"""
import math
import os
import socket
import tempfile

import keras
import tensorflow as tf

from pyimagesearch.config import IMAGE_SHAPE
from pyimagesearch.errors import Preempted, UserError, first_line
from pyimagesearch.files import join, read_json, replace_file, write_json
from pyimagesearch.plan import Settings, run_name

STATE, LOCK = "backup.json", ".lock"
FRESH = "delete the backup folder to start fresh"


def identity(plan):
    """What a backup must match to be resumed: the same model trained the same way.

    The run's name without its flags (cpu, tpu_rehearsal_jax), then the settings
    that matter one by one; not --epochs, so a backup can train on for more.
    """
    settings, source = plan.settings, plan.source
    return {"run": run_name(plan.device, Settings.defaults(plan.device), plan.rehearsal,
                            plan.runtime, plan.backend),
            "global_batch_size": plan.global_batch_size, "replicas": plan.replicas,
            "steps_per_epoch": plan.steps_per_epoch, "loop": plan.loop,
            "precision": settings.precision, "optimizer": settings.optimizer,
            "learning_rate": plan.learning_rate, "data_source": source.label,
            "data_dir": getattr(source, "folder", None) or getattr(source, "data_dir", None),
            "seed": settings.seed, "jit_compile": settings.jit_compile}


def _count(count, what):
    return f"{count:,} {what}" + ("" if count == 1 else "s")


class Backup(keras.callbacks.Callback):
    """The run's backup folder: refuse another run's, resume this one's, keep it current.

    Every process saves its model's state (on JAX saving syncs it), the chief
    alone writes the folder; every process reads it.
    """

    def __init__(self, plan, interrupts):
        super().__init__()
        self.folder, self.every = plan.settings.backup_dir, plan.settings.backup_every
        self.epochs, self.steps_per_epoch = plan.settings.epochs, plan.steps_per_epoch
        self.is_chief, self.cluster, self.backend = plan.is_chief, plan.cluster, plan.backend
        self.interrupts, self.run = interrupts, identity(plan)
        self.history = {"loss": [], "val_loss": []}
        self.step, self._weights, self._handler = 0, None, None

    def resume(self):
        """Check the folder is this run's; the global steps it has trained already."""
        state, refusal = None, None
        try:
            state, refusal = self._read()
        except UserError as error:
            refusal = str(error)
        if self.cluster:  # every process read the same, or none goes on
            self.cluster.agree({"error": refusal, "steps": state and state["step"]}, "backup")
        if refusal:
            raise UserError(refusal)
        if self.is_chief:
            tf.io.gfile.makedirs(self.folder)
            self._lock()
        if state:
            self.step, self._weights = state["step"], join(self.folder, state["weights"])
            done = self.step // self.steps_per_epoch
            self.history = {key: state["history"][key][:done] for key in self.history}
            print(f"[INFO] resuming from {self.folder}: {done} of {self.epochs} epochs and "
                  f"{self.step:,} steps done")
        return self.step

    def _read(self):
        """(the backup's state or None, why it cannot be this run's or None)."""
        state = read_json(join(self.folder, STATE), advice=FRESH)
        if state is None:
            others = [name for name in (tf.io.gfile.listdir(self.folder)
                                        if tf.io.gfile.isdir(self.folder) else [])
                      if name.rstrip("/") != LOCK]
            return None, others and (f"--backup-dir {self.folder} holds files of something "
                                     "else; choose an empty or new folder")
        history = state.get("history") if isinstance(state, dict) else None
        step = state.get("step") if isinstance(state, dict) else None
        if not (isinstance(step, int) and step >= 0 and isinstance(history, dict) and all(
                isinstance(history.get(key), list) for key in self.history)
                and state.get("weights") == f"weights-{step}.weights.h5"):
            return None, f"{join(self.folder, STATE)} does not describe a backup; {FRESH}"
        if state.get("run") != self.run:
            saved = state.get("run") if isinstance(state.get("run"), dict) else {}
            differs = ", ".join(f"{key} {saved.get(key)!r} -> {self.run.get(key)!r}"
                                for key in sorted(set(saved) | set(self.run))
                                if saved.get(key) != self.run.get(key))
            return None, (f"--backup-dir {self.folder} is the backup of another run "
                          f"({differs}); delete it, or give a new --backup-dir, to start fresh")
        done = step // self.steps_per_epoch
        if step > self.epochs * self.steps_per_epoch:
            rest = step - done * self.steps_per_epoch
            held = _count(done, "epoch") + (f" and {_count(rest, 'step')}" if rest else "")
            return None, (f"the backup in {self.folder} has {step:,} steps done ({held}), more "
                          f"than the {self.epochs * self.steps_per_epoch:,} of --epochs "
                          f"{self.epochs}; raise --epochs, or delete the backup to start fresh")
        if any(len(history[key]) < done for key in self.history):
            return None, (f"{join(self.folder, STATE)} holds the losses of fewer epochs than "
                          f"its {_count(done, 'epoch')} done; {FRESH}")
        if not tf.io.gfile.exists(join(self.folder, state["weights"])):
            return None, (f"{join(self.folder, state['weights'])}, which {STATE} names, is "
                          f"missing; {FRESH}")
        return state, None

    def _lock(self):
        """This process uses the folder; one line if another live one does."""
        path, mine = join(self.folder, LOCK), {"host": socket.gethostname(), "pid": os.getpid()}
        held = read_json(path, advice=f"delete {path} if no run uses {self.folder}")
        if isinstance(held, dict) and held != mine and (
                held.get("host") != mine["host"] or _running(held.get("pid"))):
            raise UserError(f"{self.folder} is in use by process {held.get('pid')} on "
                            f"{held.get('host')} ({path}); wait for that run to end, or give "
                            "another --backup-dir")
        write_json(path, mine)

    def on_train_begin(self, logs=None):
        """Load the weights `resume` found; from here SIGTERM saves and stops."""
        if self._weights:
            model = self.model  # on JAX, Callback.model puts fit's state back in the model
            if not model.built:
                model.build((None, *IMAGE_SHAPE))
            if not model.optimizer.built:  # its variables exist once it is built
                model.optimizer.build(model.trainable_variables)
            try:
                model.load_weights(self._weights)
            except (OSError, ValueError, KeyError) as error:  # h5py: a cut or foreign file
                raise UserError(f"cannot read the backup {self._weights} ({first_line(error)}); "
                                f"{FRESH}") from error
            self._weights = None  # once: a second fit (after a part epoch) goes on in memory
        self._saved, self._since = self.step, 0
        self.interrupts.saving = True
        if self.backend == "tensorflow" and self.cluster:
            self._handler = _preemption_handler(self)

    def on_epoch_begin(self, epoch, logs=None):
        self._done = 0  # steps of this epoch (or this call to fit) so far

    def on_train_batch_end(self, batch, logs=None):
        # `batch` is the last step of the execution just run, counted from 0 in the epoch
        ran, self._done = batch + 1 - self._done, batch + 1
        self.step += ran
        self._since += ran
        if self._done == self.params["steps"]:
            return  # the epoch's last step: on_epoch_end saves, after validation
        self._stop_if_preempted()
        if self.every and self._since >= self.every:
            self.save()

    def on_epoch_end(self, epoch, logs=None):
        if not all(math.isfinite(logs[key]) for key in self.history):
            return  # a diverged run stops; its last good backup stays
        for key in self.history:
            self.history[key].append(float(logs[key]))
        self._stop_if_preempted()
        self.save()

    def _stop_if_preempted(self):
        """If SIGTERM came: save and stop (status 143); in a cluster every process at once."""
        if self._handler is not None:  # TensorFlow's handler: every worker at one step
            try:
                self._handler.save_checkpoint_if_preempted()
            except tf.errors.AlreadyExistsError:
                pass  # SIGTERM after another worker ended training: none to stop
            return
        asked = self.interrupts.requested
        if self.cluster and self.backend == "jax":  # a slice: at each epoch's end all say
            asked = self.cluster.any_asked(f"sigterm/{self.step}", asked)
        if asked:
            self.save()
            self.stop()

    def stop(self):
        """The backup holds every step trained: end the run with status 143."""
        self.on_train_end()
        cause = "by SIGTERM" if self.interrupts.requested else "because a peer got SIGTERM,"
        if self.cluster and hasattr(self.cluster, "end_together"):
            self.cluster.end_together()
        raise Preempted(f"stopped {cause} after {self.step:,} steps; the backup in "
                        f"{self.folder} holds them: run the same command to resume")

    def save(self):
        """A new weights file, then backup.json naming it, then the earlier file removed."""
        if self.step == self._saved and self._since == 0:
            return
        name = f"weights-{self.step}.weights.h5"
        scratch = tempfile.mkdtemp(prefix="pyimagesearch-backup-")
        local = os.path.join(scratch, "backup.weights.h5")
        try:
            self.model.save_weights(local)  # every process: on JAX this syncs its state
            if self.is_chief:
                replace_file(join(self.folder, name), lambda path: tf.io.gfile.copy(
                    local, path, overwrite=True), what=self._kept())
                write_json(join(self.folder, STATE), {"run": self.run, "step": self.step,
                                                      "weights": name, "history": self.history},
                           what=self._kept())
        except (OSError, tf.errors.OpError) as error:
            raise UserError(f"cannot save the backup in {self.folder} ({first_line(error)}) "
                            f"after {self.step:,} steps; {self._kept()}") from error
        finally:
            tf.io.gfile.rmtree(scratch)
        if self.is_chief and self._saved != self.step:
            old = join(self.folder, f"weights-{self._saved}.weights.h5")
            if tf.io.gfile.exists(old):
                tf.io.gfile.remove(old)
        self._saved, self._since = self.step, 0

    def _kept(self):
        """What the backup folder holds now, in words, for a line about a failed save."""
        step = self._saved
        return (f"the backup of {step:,} steps stays, which the same command resumes from"
                if step else "no backup was kept yet") + "; earlier outputs are untouched"

    def on_train_end(self, logs=None):
        self.interrupts.saving = False
        if self._handler is not None:  # its watcher threads outlive training otherwise
            for name in ("_stop_cluster_wise_termination_watcher_thread",
                         "_stop_poll_termination_signal_thread"):
                getattr(self._handler, name, lambda: None)()
            self._handler = None

    def finish(self):
        """The run's outputs are written: the backup is no longer needed."""
        if self.is_chief and tf.io.gfile.exists(self.folder):
            tf.io.gfile.rmtree(self.folder)


def _running(pid):
    """Whether process `pid` of this machine exists."""
    try:
        os.kill(int(pid), 0)
    except (ProcessLookupError, TypeError, ValueError):
        return False
    except PermissionError:
        return True
    return True


def preemption_handler_acts():
    """Whether TensorFlow's PreemptionCheckpointHandler acts here: on Google Cloud's CPU and TPU
    VMs it does nothing at all (none filed; failure_handling.py: "We can make it work upon
    request"; still so in TensorFlow 2.19 to 2.21)."""
    from tensorflow.python.distribute.failure_handling import failure_handling_util as util
    devices = util.PlatformDevice
    return util.detect_platform() not in (devices.GCE_CPU, devices.GCE_TPU)


def _preemption_handler(backup):
    """TensorFlow's PreemptionCheckpointHandler, so that SIGTERM on any worker stops them all.

    Every worker calls save_checkpoint_if_preempted() after each execution; when
    any worker's SIGTERM has come, they agree on a step, and there each saves
    and stops. The handler counts its calls in a checkpoint of its own, kept in
    a scratch folder and never saved, so that every worker counts from 0. Whether
    it acts is the chief's decision for all: its variable is a collective.
    """
    if not backup.cluster.decide("preemption handler", preemption_handler_acts):
        print("[INFO] TensorFlow's preemption handler does nothing on Google Cloud CPU and "
              "TPU VMs: a worker that gets SIGTERM saves and stops alone, and the restarted "
              "cluster resumes from the chief's last backup", flush=True)
        return None
    strategy = tf.distribute.get_strategy()
    counter = tf.train.CheckpointManager(tf.train.Checkpoint(),
                                         tempfile.mkdtemp(prefix="pyimagesearch-preemption-"),
                                         max_to_keep=1)
    config = tf.distribute.experimental.TerminationConfig(
        termination_watcher_fn=lambda: backup.interrupts.requested, exit_fn=backup.stop,
        grace_period=0, save_fn=backup.save)
    return tf.distribute.experimental.PreemptionCheckpointHandler(
        strategy.cluster_resolver, counter, termination_config=config)

