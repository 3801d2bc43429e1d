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
"""
import os
import re
import signal
import sys

from pyimagesearch.base.errors import NothingToDo, PeerLost, Preempted, UserError

# parse_args' cluster; a signal Python dropped; the run ended well; the script's main();
# a training script's run; the exit hook is in place
_process = {"cluster": None, "dropped": None, "over": False, "main": None,
            "resumable": False, "hooked": False}
_STOPPING = (signal.SIGTERM, signal.SIGINT)


def _guard_the_exit(main):
    """Make the end of the process say a late signal too (once per process).

    After a run has ended well, SIGTERM can still arrive while the process
    ends: the handler then says so and exits 143 (preemption.run_ended), but
    late in Python's exit the signal gets its default action back, and the
    process would die of it (status -15), saying nothing. An exit hook,
    registered as the first run starts (so it runs after the hooks of what
    the run imported, such as autograph's), blocks SIGTERM and Ctrl-C, says
    one that came, flushes logging and ends the script's process itself: the
    hooks registered before it (matplotlib's figures, multiprocessing's,
    pybind11's) have nothing left to do in a run that has written its outputs.
    """
    _process.update(over=False, main=main, resumable=False, cluster=None)
    if _process["hooked"]:
        return
    import atexit

    atexit.register(_at_the_very_end)
    _process["hooked"] = True


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


def _at_the_very_end():
    """At exit, after a run ended well: a signal that came is said; none can cut the end."""
    if not _process["over"]:
        return
    signal.pthread_sigmask(signal.SIG_BLOCK, _STOPPING)
    pending = signal.sigpending() & set(_STOPPING)
    if pending:
        _late_signal(max(pending))  # SIGTERM before SIGINT
    script = sys.modules.get("__main__")
    if getattr(script, "main", None) is not _process["main"]:
        return  # a run inside another program (a test, a notebook): not ours to end
    import logging

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
    from pyimagesearch.base.terminal import end_collective_noise_filter

    end_collective_noise_filter()


def _write_refused(error):
    """The one line for a write the system refused (a full disk, a size limit, ...); else None.

    The backup, the outputs and their scratch copies say so in lines of their
    own; this catches the rest, such as TensorBoard's event files, naming
    the file TensorFlow could not write. TensorFlow's own errors carry the
    system's words in their message, not an errno.
    """
    import errno

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


def _published():
    """The folders whose new outputs this run has put in place."""
    from pyimagesearch.base.publish import published

    return published


def _on_disk():
    """What a run that stops now leaves: its new outputs, if it got as far, or the old ones."""
    cluster = _process["cluster"]
    if cluster is not None and not cluster.is_chief:
        return f"{cluster.name} writes no outputs (the chief does)"
    if _published():
        return f"its new outputs were all written to {', '.join(_published())}"
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
    import stat

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
    from pyimagesearch.training import preemption

    preemption.watch(fresh=True)
    if not isinstance(sys.stdout, _OutputThatOutlivesItsReader) and _is_pipe(sys.stdout):
        sys.stdout = _OutputThatOutlivesItsReader(sys.stdout)
    default_hook = sys.unraisablehook
    sys.unraisablehook = _kept_for_later(default_hook)
    _guard_the_exit(main)
    try:
        _run(main, argv)
        _process["over"] = True  # from here to the process's end, SIGTERM is said and exits
        preemption.run_ended(_late_signal)
    except UserError as error:
        if str(error) == preemption.STOPPED:
            error = Preempted(f"{preemption.STOPPED}; {_on_disk()}" + (
                " (with --backup-dir the run saves its state first and resumes after)"
                if _process["resumable"] and not _published() else ""))
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
    from pyimagesearch.base.publish import published
    from pyimagesearch.training import preemption

    _process["dropped"] = None
    published.clear()  # this run's, not an earlier one's in this interpreter
    try:
        main(argv)
    except UserError:
        raise
    except Exception as error:
        if preemption.terminated():
            # the handler's exception, wrapped by whatever caught it (tf.function's
            # input binding makes it a TypeError)
            raise Preempted(preemption.STOPPED) from error
        stopped = _peer_lost(_process["cluster"], error) or _write_refused(error)
        if stopped is None:
            raise
        raise stopped from error
    if isinstance(_process["dropped"], KeyboardInterrupt):
        raise KeyboardInterrupt  # a Ctrl-C whose exception Python dropped
    if preemption.terminated():  # a SIGTERM whose exception Python dropped
        raise Preempted(preemption.STOPPED)


def _peer_lost(cluster, error):
    """cluster.peer_lost's line for a run of a cluster; None for a run alone (no module loaded)."""
    if cluster is None:
        return None
    from pyimagesearch.training.cluster import peer_lost

    return peer_lost(cluster, error)


def _kept_for_later(default_hook):
    """An unraisable-exception hook that keeps a signal's exception for after main().

    A signal's exception raised inside a finalizer (a weakref callback, a
    __del__) is one Python prints and drops; the run must still stop for it.
    """
    def hook(info):
        if isinstance(info.exc_value, (KeyboardInterrupt, Preempted)):
            _process["dropped"] = info.exc_value
        else:
            default_hook(info)

    return hook


def note_run(cluster):
    """What the flags said of this run: its place in a cluster (None: alone), and that it
    is a training script, which --backup-dir resumes."""
    _process["cluster"] = cluster
    _process["resumable"] = True
