"""How a training script's process ends: one line, an exit status, and what is on disk.

`run_main(main)` is the scripts' last line. A UserError (bad input, no
device) becomes one line on stderr and status 2; a lost peer 138 and a
preemption 143, which schedulers restart (Kubeflow's `restartPolicy:
ExitCode`; errors.py); Ctrl-C 130; a full disk one line. Every line says
what the run leaves on disk. Around that: a signal that comes after the run
has ended still says so and exits 128 + N (an exit hook); a stdout whose
reader has gone (`| head -c 1`) takes the rest to /dev/null; the errors
Python can only print while it exits are kept for the line. `note_run`
records what parse_args learnt (the cluster, a resumable script).

Also here:
- SIGTERM: GCE, GKE, Cloud TPU VMs and spot machines send it about 30 s before they stop.
"""
import atexit
import errno
import logging
import os
import re
import signal
import stat
import sys
import threading

import tensorflow as tf

from pyimagesearch.errors import NothingToDo, PeerLost, Preempted, UserError
from pyimagesearch.runtime import this_process
from pyimagesearch.terminal import end_collective_noise_filter


class _Process:
    """What the end of this process must know of its run: the module's one state.

    SIGTERM's flags are Events, which the preemption handler's thread polls
    (`requested()`). The folders the run has put its outputs in are in
    runtime.this_process, which files.publish and outputs.py keep.
    """

    def __init__(self):
        self.requested = threading.Event()   # SIGTERM arrived while a backup was kept
        self.terminated = threading.Event()  # SIGTERM arrived with no backup to save: it stops
        self.saving = threading.Event()      # a Backup is there to save at the next step
        self.after_the_run = None  # set by run_main once a run has ended well: SIGTERM's then
        self.cluster = None        # parse_args' cluster (None: a run alone)
        self.resumable = False     # a training script's run, which --backup-dir resumes
        self.dropped = None        # a signal's exception Python dropped
        self.over = False          # the run ended well
        self.main = None           # the script's main()
        self.hooked = False        # the exit hook is in place


_process = _Process()


# --- SIGTERM: GCE, GKE, Cloud TPU VMs and spot machines send it about 30 s before they stop ---
# `watch()` makes SIGTERM mean: with a backup being kept, save it at the next
# step boundary and stop (the `Backup` callback asks `requested()` after
# every call into the compiled step); without one, stop at once, like Ctrl-C.
# Either way the run ends with `errors.Preempted`, exit status 143, and the
# earlier outputs are untouched.
#
# In a cluster one worker's SIGTERM must stop them all at the same step, or
# the others only find a lost peer and the steps since the last backup are
# lost. There `cluster_handler` brings in TensorFlow's
# PreemptionCheckpointHandler: it sees `requested()`, agrees on the step with
# every worker through the coordination service, and has each save the backup
# there and stop.
STOPPED = "stopped by SIGTERM"  # the message run_main completes with what is on disk


def watch(fresh=False):
    """Handle SIGTERM from here on (call it in the main thread).

    Called again once the strategy is built: a multi-worker strategy's
    runtime puts a handler of its own in place that only takes note of it.
    fresh=True, at the start of a run, forgets an earlier run's SIGTERM.
    """
    if fresh:
        _process.requested.clear()
        _process.terminated.clear()
    _process.after_the_run = None
    signal.signal(signal.SIGTERM, _on_sigterm)


def run_ended(then):
    """The run has ended well: SIGTERM from now on calls `then(signum)` (it says so, exits)."""
    _process.after_the_run = then


def _on_sigterm(signum, frame):
    if _process.after_the_run is not None:  # nothing left to stop: say what is on disk, go
        _process.after_the_run(signum)
        return
    if _process.saving.is_set():
        _process.requested.set()
        print("[INFO] SIGTERM: saving the backup at the next step, then stopping",
              file=sys.stderr, flush=True)
        return
    # noted first: raised inside a finalizer (a weakref callback, say), the
    # exception is printed and dropped by Python; run_main still sees this
    _process.terminated.set()
    raise Preempted(STOPPED)


def terminated():
    """True once SIGTERM arrived while no backup was kept: the run must end with 143."""
    return _process.terminated.is_set()


def saving(active):
    """Whether a backup will be saved at the next step when SIGTERM comes."""
    if active:
        _process.saving.set()
    else:
        _process.saving.clear()


def requested():
    """True once SIGTERM arrived while a backup was kept."""
    return _process.requested.is_set()


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
        # lazy: workarounds (TensorFlow's private hooks) is opt-in, not a plain run's
        from pyimagesearch.workarounds import preemption_handler_acts

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


_STOPPING = (signal.SIGTERM, signal.SIGINT)


def _guard_the_exit(main):
    """Make the end of the process say a late signal too (once per process).

    After a run has ended well, SIGTERM can still arrive while the process
    ends: the handler then says so and exits 143 (run_ended), but
    late in Python's exit the signal gets its default action back, and the
    process would die of it (status -15), saying nothing. An exit hook,
    registered as the first run starts (so it runs after the hooks of what
    the run imported, such as autograph's), blocks SIGTERM and Ctrl-C, says
    one that came, flushes logging and ends the script's process itself: the
    hooks registered before it (matplotlib's figures, multiprocessing's,
    pybind11's) have nothing left to do in a run that has written its outputs.
    """
    _process.over, _process.main = False, main
    _process.resumable, _process.cluster = False, None
    if _process.hooked:
        return
    atexit.register(at_the_very_end)
    _process.hooked = True


def _late_signal(signum, frame=None):
    """One line that says what is on disk, then exit 128 + N at once."""
    prog = os.path.basename(sys.argv[0]) or "train"
    try:
        print(f"{prog}: error: stopped by {signal.Signals(signum).name} after the run had "
              f"ended; {_on_disk()}", file=sys.stderr, flush=True)
        sys.stdout.flush()
    except (OSError, ValueError):  # nobody left to read it: the status says it
        pass
    _stderr_whole()
    os._exit(128 + signum)


def at_the_very_end():
    """At exit, after a run ended well: a signal that came is said; none can cut the end."""
    if not _process.over:
        return
    signal.pthread_sigmask(signal.SIG_BLOCK, _STOPPING)
    pending = signal.sigpending() & set(_STOPPING)
    if pending:
        _late_signal(max(pending))  # SIGTERM before SIGINT
    script = sys.modules.get("__main__")
    if getattr(script, "main", None) is not _process.main:
        return  # a run inside another program (a test, a notebook): not ours to end
    logging.shutdown()
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
    # what is left of Python's exit and TensorFlow's would run with both signals
    # blocked, and a signal then would be lost: there is nothing left to do
    _stderr_whole()
    os._exit(0)


def _stderr_whole():
    """Before os._exit: every line given to stderr has reached it (the cluster's filter)."""
    end_collective_noise_filter(this_process)


def write_refused(error):
    """The one line for a write the system refused (a full disk, a size limit, ...); else None.

    The backup, the outputs and their scratch copies say so in lines of their
    own; this catches the rest, such as TensorBoard's event files, naming
    the file TensorFlow could not write. TensorFlow's own errors carry the
    system's words in their message, not an errno.
    """
    refusals = {errno.ENOSPC: "No space left on device", errno.EDQUOT: "Disk quota exceeded",
                errno.EFBIG: "File too large", errno.EROFS: "Read-only file system",
                errno.EIO: "Input/output error"}
    message = str(getattr(error, "message", error))
    code = getattr(error, "errno", None) if isinstance(error, OSError) else None
    if code not in refusals:  # by their words, but not EIO's: reads fail with it too
        code = next((known for known, words in refusals.items()
                     if known != errno.EIO and words in message), None)
    if code is None:
        return None
    where = re.search(r"(?:[a-z]+://|/)[^\s;:{}]+", re.sub(r"\{\{[^}]*\}\}", "", message))
    name = getattr(error, "filename", None) or (where[0] if where else "a folder it writes")
    if code in (errno.ENOSPC, errno.EDQUOT):
        return UserError(f"no space left on the device of {name}; free some space there, or "
                         f"give another folder; {_on_disk()}")
    return UserError(f"the system refused to write {name} ({refusals[code]}); lift the limit "
                     f"or give another folder; {_on_disk()}")


def _on_disk():
    """What a run that stops now leaves: its new outputs, if it got as far, or the old ones."""
    cluster = _process.cluster
    if cluster is not None and not cluster.is_chief:
        return f"{cluster.name} writes no outputs (the chief does)"
    if this_process.published:  # the folders whose new outputs this run has put in place
        return f"its new outputs were all written to {', '.join(this_process.published)}"
    return "earlier outputs are untouched"


class _OutputThatOutlivesItsReader:
    """sys.stdout, but once its reader has gone (`| head -c 1`) it writes to /dev/null.

    Python ignores SIGPIPE, so a closed pipe is a BrokenPipeError at the next
    print: a traceback, and a run lost after its training. Unix tools stop
    quietly there; a training run keeps training, saying nothing more, and
    still writes its outputs.
    """

    def __init__(self, stream):
        self._stream = stream

    def write(self, text):
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            self._to_devnull()
            return len(text)

    def flush(self):
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._to_devnull()

    def _to_devnull(self):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, self._stream.fileno())
        os.close(devnull)

    def __getattr__(self, name):  # fileno, isatty, encoding, ...
        return getattr(self._stream, name)


def _is_pipe(stream):
    """True if `stream` writes to a pipe (whose reader may close it early)."""
    try:
        return stat.S_ISFIFO(os.fstat(stream.fileno()).st_mode)
    except (AttributeError, OSError, ValueError):  # pytest's capture, a closed stream
        return False


def run_main(main, argv=None):
    """Call main(argv); a UserError becomes one stderr line and its exit status.

    Bad input exits 2; a lost peer 138 and a preemption 143, which schedulers
    restart (see errors.py); Ctrl-C 130. In a cluster, the error a
    collective raises when a peer dies becomes a PeerLost line too; a full
    disk is one line too. Every line says what the run leaves on disk.
    """
    watch(fresh=True)
    if not isinstance(sys.stdout, _OutputThatOutlivesItsReader) and _is_pipe(sys.stdout):
        sys.stdout = _OutputThatOutlivesItsReader(sys.stdout)
    default_hook = sys.unraisablehook
    sys.unraisablehook = _kept_for_later(default_hook)
    _guard_the_exit(main)
    try:
        _run(main, argv)
        _process.over = True  # from here to the process's end, SIGTERM is said and exits
        run_ended(_late_signal)
    except UserError as error:
        if str(error) == STOPPED:
            error = Preempted(f"{STOPPED}; {_on_disk()}" + (
                " (with --backup-dir the run saves its state first and resumes after)"
                if _process.resumable and not this_process.published else ""))
        prog = os.path.basename(sys.argv[0]) or "train"
        print(f"{prog}: error: {error}", file=sys.stderr)
        if isinstance(error, (PeerLost, Preempted)):
            sys.stdout.flush()
            sys.stderr.flush()
            _stderr_whole()
            # an orderly exit would wait on peers that are gone or going
            os._exit(error.exit_status)
        sys.exit(error.exit_status)
    except NothingToDo as reason:
        print(f"[INFO] {reason}")
    except KeyboardInterrupt:
        print(f"interrupted; {_on_disk()}", file=sys.stderr)
        sys.stdout.flush()
        sys.stderr.flush()
        _stderr_whole()
        os._exit(130)  # TensorFlow's shutdown could wait on workers still starting
    finally:
        sys.unraisablehook = default_hook


def _run(main, argv):
    """main(argv), with the errors that stop a run made UserErrors or raised again."""
    _process.dropped = None
    this_process.published.clear()  # this run's, not an earlier one's in this interpreter
    try:
        main(argv)
    except UserError:
        raise
    except Exception as error:
        if terminated():
            # the handler's exception, wrapped by whatever caught it (tf.function's
            # input binding makes it a TypeError)
            raise Preempted(STOPPED) from error
        stopped = _peer_lost(_process.cluster, error) or write_refused(error)
        if stopped is None:
            raise
        raise stopped from error
    if isinstance(_process.dropped, KeyboardInterrupt):
        raise KeyboardInterrupt  # a Ctrl-C whose exception Python dropped
    if terminated():  # a SIGTERM whose exception Python dropped
        raise Preempted(STOPPED)


def _peer_lost(cluster, error):
    """The cluster's PeerLost line for `error`, if a peer is lost; None for a run alone."""
    if cluster is None:
        return None
    return cluster.lost(error)  # cluster.Cluster's, or a JAX slice's


def _kept_for_later(default_hook):
    """An unraisable-exception hook that keeps a signal's exception for after main().

    A signal's exception raised inside a finalizer (a weakref callback, a
    __del__) is one Python prints and drops; the run must still stop for it.
    """
    def hook(info):
        if isinstance(info.exc_value, (KeyboardInterrupt, Preempted)):
            _process.dropped = info.exc_value
        else:
            default_hook(info)

    return hook


def note_run(cluster):
    """What the flags said of this run: its place in a cluster (None: alone), and that it
    is a training script, which --backup-dir resumes."""
    _process.cluster = cluster
    _process.resumable = True
