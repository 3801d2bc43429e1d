"""SIGTERM: GCE, GKE, Cloud TPU VMs and spot machines send it about 30 s before they stop.

`watch()` makes SIGTERM mean: with a backup being kept, save it at the next
step boundary and stop (the `Backup` callback asks `requested()` after
every call into the compiled step); without one, stop at once, like Ctrl-C.
Either way the run ends with `errors.Preempted`, exit status 143, and the
earlier outputs are untouched.
"""
import signal
import sys
import threading

from pyimagesearch.errors import Preempted

_requested = threading.Event()
_saving = threading.Event()  # a Backup is there to save at the next step


def watch():
    """Handle SIGTERM from here on (call it in the main thread).

    Called again once the strategy is built: a multi-worker strategy's
    runtime puts a handler of its own in place that only takes note of it.
    """
    signal.signal(signal.SIGTERM, _on_sigterm)


def _on_sigterm(signum, frame):
    if _saving.is_set():
        _requested.set()
        print("[INFO] SIGTERM: saving the backup at the next step, then stopping",
              file=sys.stderr, flush=True)
        return
    raise Preempted("stopped by SIGTERM; earlier outputs are untouched (with "
                    "--backup-dir the run saves its state first and resumes after)")


def saving(active):
    """Whether a backup will be saved at the next step when SIGTERM comes."""
    if active:
        _saving.set()
    else:
        _saving.clear()


def requested():
    """True once SIGTERM arrived while a backup was kept."""
    return _requested.is_set()
