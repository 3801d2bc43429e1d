"""How a run ends: one line on stderr and an exit status a scheduler reads (errors.py).

`run_main(main)` is the scripts' and tools' last line. A user's error is one
line and status 2; a lost peer 138 and SIGTERM 143, which Kubeflow's
`restartPolicy: ExitCode` retries; Ctrl-C 130; a closed standard output 141
(128 + SIGPIPE, as Unix tools report it). Each line says what is on disk.

SIGTERM and Ctrl-C go to one `Interrupts` object, the process's handler: with
a backup kept, SIGTERM is saved at the next step (backup.py asks `requested`);
without one it stops the run at once, like Ctrl-C; inside `held()` both wait
until the block ends (outputs being written); after the run has ended they
are said in one line.
"""
import contextlib
import errno
import os
import re
import signal
import sys

from pyimagesearch.errors import NothingToDo, PeerLost, Preempted, UserError, first_line

UNTOUCHED = "earlier outputs are untouched"


def say(line):
    """One line on stderr, if there is a stderr to say it on."""
    try:
        print(f"{os.path.basename(sys.argv[0]) or 'python'}: error: {line}",
              file=sys.stderr or sys.__stderr__, flush=True)
    except (OSError, ValueError, AttributeError):  # nobody left to read it: the status says it
        pass


def leave(status):
    """End this process now with `status`, its output flushed.

    The package's one os._exit: after a lost peer, TensorFlow's and JAX's
    orderly shutdown would wait on processes that are gone; after Ctrl-C or
    SIGTERM, on workers still starting.
    """
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError, AttributeError):
            stream.flush()
    os._exit(status)


class Interrupts:
    """SIGTERM and Ctrl-C for this process: what each means at this moment of the run."""

    def __init__(self):
        self.saving = False      # a backup is kept: SIGTERM saves it at the next step
        self.requested = False   # SIGTERM came while saving
        self.terminated = False  # SIGTERM stopped the run (in case its exception was dropped)
        self.ended = None        # once the outputs are written: what is on disk, in words
        self._held = None        # the signals noted inside held()

    def __call__(self, signum, frame):
        name = signal.Signals(signum).name
        if self._held is not None:
            self._held.append(signum)
        elif self.ended is not None:  # nothing left to stop: say what is on disk, go
            say(f"stopped by {name} after the run had ended; {self.ended}")
            leave(128 + signum)
        elif signum == signal.SIGINT:
            raise KeyboardInterrupt
        elif self.saving:
            self.requested = True
            print("[INFO] SIGTERM: saving the backup at the next step, then stopping",
                  file=sys.stderr, flush=True)
        else:
            self.terminated = True
            raise Preempted(f"stopped by SIGTERM; {UNTOUCHED}")

    @contextlib.contextmanager
    def held(self):
        """SIGTERM and Ctrl-C wait until the block ends (main thread only)."""
        self._held = []
        try:
            yield
        finally:
            noted, self._held = self._held, None
            for signum in dict.fromkeys(noted):
                signal.raise_signal(signum)


def watch(fresh=False):
    """This process's Interrupts, (re)installed for SIGTERM and, unless ignored, SIGINT.

    `fresh` at the start of a run forgets an earlier run's. Called again once a
    strategy is built: TensorFlow's multi-worker runtime puts a C handler of its
    own in place of Python's.
    """
    handler = signal.getsignal(signal.SIGTERM)
    if fresh or not isinstance(handler, Interrupts):
        handler = Interrupts()
    signal.signal(signal.SIGTERM, handler)
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:  # a background job's stays so
        signal.signal(signal.SIGINT, handler)
    return handler


# what TensorFlow's collectives and JAX's coordination service say when a peer is gone
_PEER = re.compile(r"/job:|collective|coordination|heartbeat|peer|gloo|Connection reset",
                   re.IGNORECASE)
_REFUSED = {errno.ENOSPC: "No space left on device", errno.EDQUOT: "Disk quota exceeded",
            errno.EFBIG: "File too large", errno.EROFS: "Read-only file system"}


def explained(error):
    """The UserError that says `error` in one line, or None for a bug (its traceback stays).

    A collective that failed because a peer died (PeerLost, 138); a write the
    system refused (a full disk, a size limit), in TensorFlow's words or an
    OSError's, naming the file.
    """
    message = str(getattr(error, "message", error))
    kind = type(error).__name__
    if kind in ("UnavailableError", "DeadlineExceededError", "AbortedError",
                "CancelledError", "XlaRuntimeError", "JaxRuntimeError") and _PEER.search(message):
        cause = next((line.strip() for line in message.splitlines() if re.search(
            r"aborted|reset|unavailable|deadline|heartbeat|connect|failed|lost", line, re.I)),
            first_line(error))
        return PeerLost(f"lost a peer of its cluster and stopped ({kind}: {cause}); "
                        "restart every process together")
    code = getattr(error, "errno", None)
    code = code if code in _REFUSED else next(
        (known for known, words in _REFUSED.items() if words in message), None)
    if code is None:
        return None
    where = getattr(error, "filename", None) or next(
        iter(re.findall(r"(?:[a-z]+://|/)[^\s;:{}'\"]+", message)), "a folder it writes")
    return UserError(f"the system refused to write {where} ({_REFUSED[code]}); free some "
                     f"space or lift the limit, or give another folder; {UNTOUCHED}")


def run_main(main, argv=None):
    """Call main(argv); whatever stops the run ends it in one line and its exit status."""
    interrupts = watch(fresh=True)
    try:
        try:
            main(argv)
        except (UserError, NothingToDo, KeyboardInterrupt, BrokenPipeError):
            raise
        except Exception as error:
            if interrupts.terminated:  # the handler's Preempted, wrapped by what caught it
                raise Preempted(f"stopped by SIGTERM; {UNTOUCHED}") from error
            if (stopped := explained(error)) is None:
                raise
            raise stopped from error
        if interrupts.terminated:  # a SIGTERM whose exception Python dropped in a finalizer
            raise Preempted("stopped by SIGTERM at the end of the run")
        interrupts.ended = interrupts.ended or "nothing was left to do"
    except NothingToDo as reason:
        print(f"[INFO] {reason}")
    except UserError as error:
        say(error)
        if isinstance(error, (PeerLost, Preempted)):
            leave(error.exit_status)  # the others are gone, or going
        raise SystemExit(error.exit_status)
    except KeyboardInterrupt:
        say(f"interrupted; {UNTOUCHED}")
        leave(130)
    except BrokenPipeError:
        # the reader of standard output left (`| head -1`); Python's docs: point
        # stdout at /dev/null, so that the exit's flush says nothing more
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        say(f"stopped: standard output was closed by its reader; {UNTOUCHED}")
        raise SystemExit(141)
