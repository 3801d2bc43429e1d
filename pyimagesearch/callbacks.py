"""Everything a run does besides training, as Keras callbacks that both loops drive.

`fit` calls them itself; the custom loop (`loop.py`) calls the same hooks
through Keras' CallbackList: train begin and end, epoch begin and end, test
begin, and a batch begin and end per execution of several steps, with the
step indices `fit` passes. One implementation each:

- `EpochTimer`: wall time of each epoch and of its training part.
- Keras' `TerminateOnNaN`: a diverged run stops at the step it diverged.
- `backup.Backup` (--backup-dir): resume after a crash; `backup.KerasBackup`
  on Keras' JAX backend.
- Keras' `TensorBoard` (--logdir): losses and learning rate per epoch,
  numbered from 1 as the log prints epochs (Keras numbers them from 0), in
  DIR/<run name>/<start time> (`attempt_logdir`).
- `EpochSummaries` (--logdir): what Keras' TensorBoard does not write:
  images per second and, at each epoch end, the figure's digits with their
  reconstructions as an image summary.
- `ProfileSteps` (--profile-steps A,B): a profiler trace of steps A to B
  (TensorFlow's, or on Keras' JAX backend JAX's).

`make_callbacks` builds the set a run needs from its plan.
"""
import dataclasses
import datetime
import functools
import math
import sys
import time

import keras
import numpy as np
import tensorflow as tf

from pyimagesearch import config, exits
from pyimagesearch.data import figure_batch
from pyimagesearch.errors import UserError
from pyimagesearch.files import join


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


class EpochSummaries(keras.callbacks.Callback):
    """Images per second and the reconstructed digits, once per epoch, for TensorBoard.

    List it after the EpochTimer whose times it reports.
    """

    def __init__(self, logdir, digits, images_per_step, timer):
        super().__init__()
        self.digits, self.images_per_step, self.timer = digits, images_per_step, timer
        self.train = tf.summary.create_file_writer(join(logdir, "train"))
        self.validation = tf.summary.create_file_writer(join(logdir, "validation"))

    def on_epoch_end(self, epoch, logs=None):
        with self.train.as_default(step=epoch + 1):  # epochs from 1, as the log prints them
            tf.summary.scalar("epoch_images_per_second", self.params["steps"]
                              * self.images_per_step / self.timer.train_seconds[-1])
        with self.validation.as_default(step=epoch + 1):
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


class EpochTensorBoard(keras.callbacks.TensorBoard):
    """Keras' TensorBoard callback, with epochs counted from 1, as the log prints them."""

    def on_epoch_end(self, epoch, logs=None):
        super().on_epoch_end(epoch + 1, logs)


class ProfileSteps(keras.callbacks.Callback):
    """A profiler trace of training steps `first` to `last` (counted from 1).

    Both loops call a batch hook once per execution of up to
    `steps_per_execution` steps, so every execution that holds one of the
    steps is traced. On TensorFlow it is TensorFlow's profiler; on Keras'
    JAX backend JAX's (`jax.profiler.start_trace`, what Keras' own
    TensorBoard callback calls there: keras/src/backend/jax/tensorboard.py,
    Keras 3.15.1, which switches it off below Python 3.12 after segfaults in
    one set-up, keras-team/keras#20450; jax 0.7.2 traced here on 3.11). Both
    write DIR/plugins/profile/<time>/<host>.xplane.pb, which TensorBoard's
    profile plugin opens.
    """

    def __init__(self, logdir, first, last, steps_per_execution):
        super().__init__()
        self.logdir, self.first, self.last = logdir, first, last
        self.steps_per_execution = steps_per_execution
        self._running = False

    def on_train_begin(self, logs=None):
        self._done = 0  # steps this process has trained, as Keras' TensorBoard counts

    def on_epoch_begin(self, epoch, logs=None):
        self._before = self._done  # steps of the epochs before

    def on_train_batch_begin(self, batch, logs=None):
        done = self._before + batch  # steps finished before this execution
        size = min(self.steps_per_execution, self.params["steps"] - batch)
        if not self._running and done < self.last and done + size >= self.first:
            if keras.backend.backend() == "jax":
                # lazy: jax is installed on train_tpu.py's JAX route only
                import jax.profiler

                self._profiler = jax.profiler
                _keeping_tensorflows_switch(jax.profiler.start_trace, self.logdir)
            else:
                self._profiler = None
                tf.profiler.experimental.start(self.logdir)
            self._running = True

    def on_train_batch_end(self, batch, logs=None):
        self._done = self._before + batch + 1
        if self._running and self._done >= self.last:
            self._stop()

    def on_train_end(self, logs=None):
        self._stop()

    def _stop(self):
        if self._running:
            if self._profiler:
                _keeping_tensorflows_switch(self._profiler.stop_trace)
            else:
                tf.profiler.experimental.stop()
            self._running = False


def _keeping_tensorflows_switch(call, *args):
    """Start or stop JAX's trace, then give TensorFlow's tracing switch back its function.

    JAX's profiler (jaxlib 0.7.2's XLA Python hooks, in libjax_common.so)
    sets `tensorflow.python.profiler.trace.enabled` to True as a trace
    starts and False as it stops: a flag in the TensorFlow it was written
    for, a function (`traceme_enabled`) in TensorFlow 2.21, where every
    traced TensorFlow call then fails ("'bool' object is not callable"),
    tf.data and the summaries included. No upstream report was found; seen
    with jax 0.7.2 and TensorFlow 2.21.0 (tests/test_jax_loop.py).
    """
    switch = sys.modules.get("tensorflow.python.profiler.trace")
    enabled = getattr(switch, "enabled", None)
    call(*args)
    if callable(enabled):
        switch.enabled = enabled


@dataclasses.dataclass
class RunCallbacks:
    """The callbacks of a run, with the two a run reads back from."""

    callbacks: list
    timer: EpochTimer
    backup: object  # a backup.Backup with --backup-dir (loaded only then), else None
    steps_per_epoch: int
    plan: object = None    # the RunPlan they were made for (tune reads it)
    start: int = 0         # global steps trained before this run (a resumed backup's)
    started: datetime.datetime = dataclasses.field(  # for the run record
        default_factory=lambda: datetime.datetime.now(datetime.timezone.utc))

    def resume(self, cluster=None):
        """The global steps a backup has trained already (0 without one)."""
        self.start = self.backup.resume(cluster) if self.backup else 0
        return self.start

    @property
    def initial_epoch(self):
        """The epoch fit starts from: the first one not finished."""
        return -(-self.start // self.steps_per_epoch)

    def tune(self, model):
        """What the run adds to the article's compile, fit and predict, set on `model`.

        After `model.compile(loss=mseLoss, optimizer=config.OPTIMIZER)`: the
        steps per call into the compiled step (fewer calls from Python) and
        XLA (--jit-compile; JAX compiles every step anyway); `model.fit` then
        takes this run's callbacks, the epoch a backup resumes from, its
        verbosity and no shuffle (trainDs is shuffled already); and
        `model.predict` takes the figure's digits in one batch (Keras' 32
        would starve replicas past 32), without a progress bar.
        """
        plan = self.plan
        model.steps_per_execution = plan.steps_per_execution
        model.jit_compile = plan.jit_compile
        model.fit = functools.partial(model.fit, initial_epoch=self.initial_epoch,
                                      callbacks=self.callbacks, shuffle=False,
                                      verbose=plan.verbose)
        model.predict = functools.partial(
            model.predict, verbose=0,
            batch_size=figure_batch(config.NUM_FIGURE_DIGITS, plan.replicas))
        if plan.backend == "jax" and plan.workers > 1:  # a slice: every process, every image
            from pyimagesearch.jax_slice import predict
            model.predict = functools.partial(predict, model, plan.strategy)

    def finish_epoch(self, model, trainDs, valDs, verbose):
        """After a resume in mid-epoch, train the rest of that epoch; the batches after it.

        `fit` cannot start in the middle of an epoch, so the part left is a
        call of its own (Keras' BackupAndRestore resumes from the epoch's
        start instead, and would train its first steps twice). `trainDs`
        starts where the backup ended; the batches it returns start at the
        next epoch, which `fit` then trains from `initial_epoch`.
        """
        epoch, step = divmod(self.start, self.steps_per_epoch)
        if not step:
            return trainDs
        rest = self.steps_per_epoch - step
        print(f"[INFO] finishing epoch {epoch + 1}: {rest} of its "
              f"{self.steps_per_epoch} steps are left")
        part = model.fit(trainDs, epochs=epoch + 1, initial_epoch=epoch,
                         steps_per_epoch=rest, validation_data=valDs,
                         callbacks=self.callbacks, shuffle=False, verbose=verbose)
        self.history(part.history)  # a loss that is not finite stops the run here
        return trainDs.skip(rest)

    def history(self, trained):
        """The losses of every epoch: the backup's also holds those before a resume.

        `trained` is what this process's fit (or custom loop) returned: no
        epochs at all when a backup held them all. A loss in it that is not finite stops the run before anything is
        written, with one line.
        """
        losses, val_losses = trained.get("loss", []), trained.get("val_loss", [])
        if not all(math.isfinite(value) for value in losses + val_losses):
            raise UserError(f"training diverged (loss {losses[-1]}, val_loss "
                            f"{val_losses[-1]}); lower --learning-rate. Nothing "
                            "was written: earlier outputs are untouched")
        return self.backup.history if self.backup else trained

    def finish(self):
        """The outputs are written: delete the backup (only now, so a failed save resumes)."""
        if self.backup:
            self.backup.finish()


def attempt_logdir(logdir, name, now=None):
    """`logdir`/NAME/TIME: a folder per run, and in it one per attempt, created.

    One TensorBoard on `logdir` compares every run; a rerun of the same run
    gets a folder of its own (its start, UTC), so its curves start afresh
    beside the earlier ones instead of doubling back over them.
    """
    now = now or datetime.datetime.now(datetime.timezone.utc)
    stamp = now.strftime("%Y%m%d-%H%M%S")
    run, count = join(logdir, name), 1
    attempt = join(run, stamp)
    while tf.io.gfile.exists(attempt):  # two starts within a second
        count += 1
        attempt = join(run, f"{stamp}-{count}")
    tf.io.gfile.makedirs(attempt)
    return attempt


def make_callbacks(plan, digits):
    """The callbacks `plan` asks for; `digits` are the figure's, for TensorBoard.

    A worker that is not the chief writes no logs, and its checkpoints go to
    a temporary folder.
    """
    settings = plan.settings
    exits.watch()  # again: a multi-worker runtime may have taken SIGTERM over
    timer = EpochTimer()
    # a loss that is not a number stops training; the run record then refuses it
    callbacks = [timer, keras.callbacks.TerminateOnNaN()]
    backup = None
    if settings.backup_dir:
        from pyimagesearch.backup import Backup, KerasBackup

        # a tf.train.Checkpoint on TensorFlow; Keras' own weights file on JAX
        backup = (KerasBackup if plan.backend == "jax" else Backup)(plan)
    if backup:
        callbacks.append(backup)
    if plan.is_chief and (settings.logdir or settings.profile_steps):
        logdir = attempt_logdir(settings.logdir or "logs", plan.name)
        callbacks.append(EpochTensorBoard(logdir, write_graph=False, profile_batch=0))
        if settings.profile_steps:
            callbacks.append(ProfileSteps(join(logdir, "train"), *settings.profile_steps,
                                          plan.steps_per_execution))
        callbacks.append(EpochSummaries(logdir, digits, plan.global_batch_size, timer))
    return RunCallbacks(callbacks, timer, backup, plan.steps_per_epoch, plan)
