"""Everything a run does besides training, as Keras callbacks that `fit` and the custom loop drive.

- `EpochTimer`: wall time of each epoch and of its training part;
- Keras' `TerminateOnNaN`: a diverged run stops at the step it diverged;
- `backup.Backup` (--backup-dir): resume after a crash or SIGTERM;
- `EpochTensorBoard` (--logdir): Keras' TensorBoard, epochs numbered from 1 as
  the log prints them, in DIR/<run name>/<start time>;
- `EpochSummaries` (--logdir): images per second and the figure's digits with
  their reconstructions, each epoch;
- `ProfileSteps` (--profile-steps A,B): a profiler trace of steps A to B,
  TensorFlow's, or JAX's on Keras' JAX backend.
"""
import datetime
import time

import keras
import numpy as np
import tensorflow as tf

from pyimagesearch.files import join


class EpochTimer(keras.callbacks.Callback):
    """Wall time of each epoch, and of its training part alone (before validation)."""

    def __init__(self):
        super().__init__()
        self.epoch_seconds, self.train_seconds = [], []

    def on_epoch_begin(self, epoch, logs=None):
        self._start, self._train_end = time.perf_counter(), None

    def on_test_begin(self, logs=None):
        if self._train_end is None:
            self._train_end = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        end = time.perf_counter()
        self.epoch_seconds.append(end - self._start)
        self.train_seconds.append((self._train_end or end) - self._start)


class EpochTensorBoard(keras.callbacks.TensorBoard):
    """Keras' TensorBoard callback, with epochs counted from 1, as the log prints them."""

    def on_epoch_end(self, epoch, logs=None):
        super().on_epoch_end(epoch + 1, logs)


class EpochSummaries(keras.callbacks.Callback):
    """Images per second and the reconstructed digits, once per epoch, for TensorBoard.

    Every process of a slice computes the reconstructions (a computation over
    every host's devices); only the one given a `logdir` writes them.
    """

    def __init__(self, plan, digits, timer, logdir=None):
        super().__init__()
        self.plan, self.digits, self.timer = plan, digits, timer
        self.writers = logdir and {part: tf.summary.create_file_writer(join(logdir, part))
                                   for part in ("train", "validation")}

    def on_epoch_end(self, epoch, logs=None):
        predicted = self.plan.predict(self.model, self.digits)
        if not self.writers:
            return
        rows = [np.concatenate(list(images[:len(self.digits)][..., 0]), axis=1)
                for images in (self.digits, np.asarray(predicted, np.float32))]
        with self.writers["train"].as_default(step=epoch + 1):
            tf.summary.scalar("epoch_images_per_second", self.params["steps"]
                              * self.plan.global_batch_size / self.timer.train_seconds[-1])
        with self.writers["validation"].as_default(step=epoch + 1):
            tf.summary.image("reconstructions", np.concatenate(rows)[None, :, :, None],
                             description="input digits (top) and their reconstructions")
        for writer in self.writers.values():
            writer.flush()

    def on_train_end(self, logs=None):
        for writer in (self.writers or {}).values():
            writer.close()


class ProfileSteps(keras.callbacks.Callback):
    """A profiler trace of training steps `first` to `last` (counted from 1).

    Both loops call a batch hook once per execution of several steps, so every
    execution holding one of them is traced. On Keras' JAX backend it is JAX's
    trace (what Keras' own TensorBoard callback starts there); both write
    DIR/plugins/profile/<time>/<host>.xplane.pb for TensorBoard's profile tab.
    """

    def __init__(self, logdir, first, last, steps_per_execution):
        super().__init__()
        self.logdir, self.first, self.last = logdir, first, last
        self.steps_per_execution = steps_per_execution
        self._running, self._done = False, 0

    def on_epoch_begin(self, epoch, logs=None):
        self._before = self._done

    def on_train_batch_begin(self, batch, logs=None):
        done = self._before + batch
        size = min(self.steps_per_execution, self.params["steps"] - batch)
        if not self._running and done < self.last and done + size >= self.first:
            if keras.backend.backend() == "jax":
                import jax
                jax.profiler.start_trace(self.logdir)
            else:
                tf.profiler.experimental.start(self.logdir)
            self._running = True

    def on_train_batch_end(self, batch, logs=None):
        self._done = self._before + batch + 1
        if self._done >= self.last:
            self.on_train_end()

    def on_train_end(self, logs=None):
        if self._running:
            if keras.backend.backend() == "jax":
                import jax
                jax.profiler.stop_trace()
            else:
                tf.profiler.experimental.stop()
            self._running = False


def attempt_logdir(logdir, name, now=None):
    """`logdir`/NAME/TIME, created: one TensorBoard on `logdir` compares every run, and a
    rerun's curves start afresh beside the earlier ones."""
    stamp = (now or datetime.datetime.now(datetime.timezone.utc)).strftime("%Y%m%d-%H%M%S")
    attempt, count = join(join(logdir, name), stamp), 1
    while tf.io.gfile.exists(attempt):  # two starts within a second
        count += 1
        attempt = join(join(logdir, name), f"{stamp}-{count}")
    tf.io.gfile.makedirs(attempt)
    return attempt


def make_callbacks(plan, digits, interrupts):
    """(callbacks, timer, backup) for `plan`; `digits` are the figure's, for TensorBoard.

    Only the chief writes logs; every process computes what they show.
    """
    settings = plan.settings
    timer = EpochTimer()
    callbacks = [timer, keras.callbacks.TerminateOnNaN()]
    backup = None
    if settings.backup_dir:
        from pyimagesearch.backup import Backup  # loaded for --backup-dir only
        backup = Backup(plan, interrupts)
        callbacks.append(backup)
    if settings.logdir or settings.profile_steps:
        logdir = attempt_logdir(settings.logdir or "logs", plan.name) if plan.is_chief else None
        if logdir:
            callbacks.append(EpochTensorBoard(logdir, write_graph=False, profile_batch=0))
            if settings.profile_steps:
                callbacks.append(ProfileSteps(join(logdir, "train"), *settings.profile_steps,
                                              plan.steps_per_execution))
        callbacks.append(EpochSummaries(plan, digits, timer, logdir))
    return callbacks, timer, backup
