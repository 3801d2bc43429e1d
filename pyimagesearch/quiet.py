"""Keep TensorFlow's native start-up log lines off the terminal, without losing them.

Importing TensorFlow and discovering devices print C++ log lines (oneDNN
notices, "could not find cuda drivers", a failed cuInit on a machine without
a GPU) straight to file descriptor 2, where no Python setting reaches them.
They bury the one line a user needs when something is wrong, so those
moments run inside `native_stderr_quiet()`, with fd 2 pointed at a temporary
file:

- the block yields a `CapturedStderr`, so the caller can read what TensorFlow
  said (the reason it found no GPU, say) and put it in its own message;
- if the block raises, what was captured is written back to the real stderr
  before the exception travels on (unless the caller expected that error);
- if the process dies inside the block (a C++ abort or CHECK failure, a
  signal), a watchdog process started before the redirection copies the
  captured lines to the real stderr, so a crash never loses its last words.

Set PYIMAGESEARCH_VERBOSE_TF=1 to capture nothing at all: every native line
then reaches the terminal the moment TensorFlow writes it.
"""
import contextlib
import os
import subprocess
import sys
import tempfile

VERBOSE_ENV = "PYIMAGESEARCH_VERBOSE_TF"  # set to anything non-empty: no capture
_ALL_WELL = b"ok"  # what the block tells its watchdog when it ends alive

# The watchdog: a bare Python (-I -S: no site packages, ~10 ms to start).
# stdin is a pipe from the parent, stdout the real stderr, argv[1] the
# captured file's descriptor and argv[2] the all-well token. The pipe closes
# when the parent finishes the block or dies; only in the second case has
# nobody else shown the captured lines, so only then are they copied out.
_WATCHDOG = """
import os, sys
capture, all_well = int(sys.argv[1]), sys.argv[2].encode()
heard = b""
while True:
    chunk = os.read(0, 64)
    if not chunk:
        break
    heard += chunk
if heard != all_well:
    offset = 0
    try:
        while True:
            data = os.pread(capture, 65536, offset)
            if not data:
                break
            offset += len(data)
            while data:
                data = data[os.write(1, data):]
    except OSError:
        pass  # the real stderr is gone too: nobody left to tell
"""


class CapturedStderr:
    """What reached fd 2 inside a `native_stderr_quiet()` block."""

    def __init__(self, fd=None):
        self._fd = fd  # the capture file while the block runs, else None
        self._data = b""

    def data(self):
        """The captured bytes so far; all of them once the block has ended."""
        if self._fd is None:
            return self._data
        # pread leaves the file offset alone: fd 2 shares it and keeps writing
        size = os.fstat(self._fd).st_size
        return os.pread(self._fd, size, 0) if size else b""

    def text(self):
        """The captured output as text (undecodable bytes replaced)."""
        return self.data().decode("utf-8", errors="replace")

    def _keep(self):
        """Hold on to the captured bytes: the file is about to be closed."""
        self._data = self.data()
        self._fd = None


def _write_all(fd, data):
    """os.write until every byte of `data` is out."""
    while data:
        data = data[os.write(fd, data):]


def _start_watchdog(capture_fd):
    """Start the watchdog for `capture_fd`; None if it cannot be started."""
    if not sys.executable:  # an embedded interpreter: no Python to start
        return None
    try:
        return subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", _WATCHDOG, str(capture_fd),
             _ALL_WELL.decode()],
            stdin=subprocess.PIPE, stdout=2, pass_fds=(capture_fd,),
            # its own session: Ctrl-C must reach only the training process,
            # which replays the capture itself as the KeyboardInterrupt passes
            start_new_session=True)
    except OSError:
        return None


@contextlib.contextmanager
def native_stderr_quiet(expected=()):
    """Send fd 2 to a temporary file for the duration; yield a CapturedStderr.

    An exception of a type in `expected` is one the caller turns into its own
    message, so the captured lines are dropped then, not replayed; any other
    exception replays them first.
    """
    if os.environ.get(VERBOSE_ENV):  # escape hatch for debugging
        yield CapturedStderr()
        return
    with tempfile.TemporaryFile(mode="w+b") as capture:
        watchdog = _start_watchdog(capture.fileno())
        if watchdog is None:  # unguarded, a crash would be silent: stay loud
            yield CapturedStderr()
            return
        sys.stderr.flush()
        saved = os.dup(2)
        os.dup2(capture.fileno(), 2)
        captured = CapturedStderr(capture.fileno())
        try:
            yield captured
        except BaseException as error:
            if not isinstance(error, expected):
                os.dup2(saved, 2)
                _write_all(2, captured.data())
            raise
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            captured._keep()
            # the lines were shown or deliberately dropped: stand it down,
            # and wait so that no process outlives the block
            watchdog.communicate(_ALL_WELL)
