"""Ctrl-C and SIGTERM held back for a few steps that must not be cut in two."""
import contextlib
import signal
import threading


@contextlib.contextmanager
def deferred():
    """Ctrl-C and SIGTERM wait until the block ends: for a few steps that must not be cut.

    Their handlers are swapped for ones that only take note, so a signal
    arriving in any thread cannot raise inside the block; each one noted is
    raised again, to the usual handler, when the block ends. Main thread
    only (signal handlers can be set nowhere else); elsewhere it does nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    noted = []
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    for sig in previous:
        signal.signal(sig, lambda signum, frame: noted.append(signum))
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        for sig in dict.fromkeys(noted):
            signal.raise_signal(sig)
