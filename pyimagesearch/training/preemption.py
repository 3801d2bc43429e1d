"""SIGTERM: GCE, GKE, Cloud TPU VMs and spot machines send it about 30 s before they stop.

`watch()` makes SIGTERM mean: with a backup being kept, save it at the next
step boundary and stop (the `Backup` callback asks `requested()` after
every call into the compiled step); without one, stop at once, like Ctrl-C.
Either way the run ends with `errors.Preempted`, exit status 143, and the
earlier outputs are untouched.

In a cluster one worker's SIGTERM must stop them all at the same step, or
the others only find a lost peer and the steps since the last backup are
lost. There `cluster_handler` brings in TensorFlow's
PreemptionCheckpointHandler: it sees `requested()`, agrees on the step with
every worker through the coordination service, and has each save the backup
there and stop.
"""
import signal
import sys
import threading

import tensorflow as tf

from pyimagesearch.base.errors import Preempted

_requested = threading.Event()
_terminated = threading.Event()  # SIGTERM arrived with no backup to save: the run stops
STOPPED = "stopped by SIGTERM"  # the message run_main completes with what is on disk
_saving = threading.Event()  # a Backup is there to save at the next step


_after_the_run = []  # set by run_main once a run has ended well: what SIGTERM does then


def watch(fresh=False):
    """Handle SIGTERM from here on (call it in the main thread).

    Called again once the strategy is built: a multi-worker strategy's
    runtime puts a handler of its own in place that only takes note of it.
    fresh=True, at the start of a run, forgets an earlier run's SIGTERM.
    """
    if fresh:
        _requested.clear()
        _terminated.clear()
    _after_the_run.clear()
    signal.signal(signal.SIGTERM, _on_sigterm)


def run_ended(then):
    """The run has ended well: SIGTERM from now on calls `then(signum)` (it says so, exits)."""
    _after_the_run[:] = [then]


def _on_sigterm(signum, frame):
    if _after_the_run:  # nothing left to stop: say what is on disk, and go
        _after_the_run[0](signum)
        return
    if _saving.is_set():
        _requested.set()
        print("[INFO] SIGTERM: saving the backup at the next step, then stopping",
              file=sys.stderr, flush=True)
        return
    # noted first: raised inside a finalizer (a weakref callback, say), the
    # exception is printed and dropped by Python; run_main still sees this
    _terminated.set()
    raise Preempted(STOPPED)


def terminated():
    """True once SIGTERM arrived while no backup was kept: the run must end with 143."""
    return _terminated.is_set()


def saving(active):
    """Whether a backup will be saved at the next step when SIGTERM comes."""
    if active:
        _saving.set()
    else:
        _saving.clear()


def requested():
    """True once SIGTERM arrived while a backup was kept."""
    return _requested.is_set()


def _no_total_run_calls_warning(record):
    """False for the warning the handler logs reading its own deprecated total_run_calls."""
    return "total_run_calls" not in record.getMessage()


def cluster_handler(strategy, folder, save, stop, acts=None):
    """TensorFlow's PreemptionCheckpointHandler for a worker of a cluster; None elsewhere.

    Every worker calls its save_checkpoint_if_preempted() after each call
    into the compiled step, the same number of times. When any worker's
    SIGTERM has arrived (the handler polls `requested()` each second) they
    agree on a step, and at that step each calls `save()` (the backup's
    checkpoint and global step) and then `stop()`, which raises.

    The handler also counts its calls in a checkpoint variable of its own.
    That count must be the same on every worker, and it is not written into
    the backup (a worker that is not the chief restores its checkpoints from
    a folder other than the one it saves to): its checkpoint lives in
    `folder`, a scratch folder of this process, and is never saved, so every
    worker counts from 0.

    `acts` is whether the handler acts here (workarounds.preemption_handler_acts,
    which asks Google Cloud's metadata server). The handler makes a variable,
    a collective under MultiWorkerMirroredStrategy, so every worker must take
    the same decision: cli.plan makes it once per worker, before training,
    and checks that all agree; None asks here.
    """
    resolver = getattr(strategy, "cluster_resolver", None)
    if (not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy)
            or resolver is None or not resolver.cluster_spec().jobs):
        return None
    if acts is None:
        from pyimagesearch.training.workarounds import preemption_handler_acts

        acts = preemption_handler_acts()
    if not acts:
        print("[INFO] TensorFlow's preemption handler does nothing on Google Cloud CPU VMs: "
              "a worker that gets SIGTERM saves and stops alone, and the restarted cluster "
              "resumes from the chief's last backup", flush=True)
        return None
    tf.get_logger().addFilter(_no_total_run_calls_warning)  # a no-op the second time
    counter = tf.train.CheckpointManager(tf.train.Checkpoint(), folder, max_to_keep=1)
    config = tf.distribute.experimental.TerminationConfig(
        termination_watcher_fn=requested, exit_fn=stop, grace_period=0, save_fn=save)
    return tf.distribute.experimental.PreemptionCheckpointHandler(
        resolver, counter, termination_config=config)
