"""What reaches the terminal: TensorFlow's native log lines, closed standard streams.

TensorFlow's C++ writes some lines straight to file descriptor 2, where no
Python setting reaches them and TF_CPP_MIN_LOG_LEVEL does not stop all of
them. Three moments get help here, each for a line that would bury the one
line a user needs:

1. `quiet_tensorflow_import` and `native_stderr_quiet`: the start-up lines
   of importing TensorFlow and finding its devices ("Unable to register
   cuDNN factory", "could not find cuda drivers", "failed call to cuInit"
   on a machine without a GPU) go to a temporary file, not the terminal
   (the import's only on releases whose import ignores TF_CPP_MIN_LOG_LEVEL).
   The block yields a `CapturedStderr`, so a caller can put what TensorFlow
   said (why it found no GPU, say) in its own line; if the block raises,
   what was captured is written back before the exception travels on
   (unless the caller expected that error); if the process dies inside the
   block (a C++ abort, a signal), a watchdog process started before the
   redirection copies the captured lines out, so a crash keeps its last words.
2. `filter_collective_noise`: in a cluster, the C++ records of a collective
   aborted by a lost peer ("Aborting RingReduce", "Collective ops is aborted
   by", gRPC's details) are dropped by a filter process on fd 2; the run
   says the same in its one line (cluster.peer_lost).
3. `open_closed_standard_streams`: a standard stream the caller closed
   (`python train_cpu.py >&-`) gets /dev/null, before TensorFlow opens a
   file that would take its number and receive its C++ lines.

Set PYIMAGESEARCH_VERBOSE_TF=1 to capture and filter nothing: every native
line then reaches the terminal the moment TensorFlow writes it. Nothing here
imports TensorFlow or the package.
"""
import contextlib
import importlib.abc
import importlib.metadata
import importlib.util
import os
import subprocess
import sys
import tempfile

VERBOSE_ENV = "PYIMAGESEARCH_VERBOSE_TF"  # set to anything non-empty: no capture
# How TensorFlow's C++ starts a log record (the level letter, then the message):
# "E0000 00:00:1796065747.16    7071 cuda_platform.cc:52] failed call to ..." (TF 2.21, absl)
# "2026-11-30 19:11:58.56: E external/.../cuda_platform.cc:51] failed call ..." (TF 2.20's own)
TF_LOG_LINE = (r"^(?:(?P<absl>[IWEF])\d{4} [\d:.]+ +\d+"
               r"|[\d-]+ [\d:.]+: (?P<tsl>[IWEF]))"
               r" \S+:\d+\] (?P<message>.*)")
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


class _QuietLoader(importlib.abc.Loader):
    """Runs another loader's module inside `native_stderr_quiet()`."""

    def __init__(self, loader):
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        with native_stderr_quiet():
            self._loader.exec_module(module)

    def __getattr__(self, name):  # get_resource_reader and the like
        return getattr(self._loader, name)


class _QuietTensorFlowFinder(importlib.abc.MetaPathFinder):
    """Finds `tensorflow` once, with a loader that keeps its start-up lines quiet."""

    def find_spec(self, name, path=None, target=None):
        if name != "tensorflow":
            return None
        sys.meta_path.remove(self)  # once: later imports find it in sys.modules
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.loader is not None:
            spec.loader = _QuietLoader(spec.loader)
        return spec


def open_closed_standard_streams():
    """Give /dev/null to fds 0, 1 and 2 where the caller closed them.

    A closed fd 1 or 2 is the lowest free number: the next file opened (a
    checkpoint, a record, the temporary file of `native_stderr_quiet`) would
    take it, and whatever is printed or logged would be written into that
    file. Python has set the stream to None, where `sys.stdout.flush()`
    fails: it gets a stream on /dev/null too. What is printed is then lost,
    as the caller asked, and the run goes on.
    """
    for fd, name in ((0, "stdin"), (1, "stdout"), (2, "stderr")):
        try:
            os.fstat(fd)
            continue
        except OSError:
            pass
        null = os.open(os.devnull, os.O_RDWR)  # the lowest free number: fd itself
        if null != fd:
            os.dup2(null, fd)
            os.close(null)
        if getattr(sys, name) is None:
            setattr(sys, name, open(fd, "r" if fd == 0 else "w", closefd=False))


# TensorFlow releases whose `import tensorflow` keeps to TF_CPP_MIN_LOG_LEVEL: nothing
# at 1 (what runtime.process sets) to 3; the hook is left out on them. Any other
# release, or one not known, gets it (tests/test_workarounds.py holds the table)
IMPORT_KEEPS_TO_THE_LEVEL = ("2.20.",)
TENSORFLOW_BUILDS = ("tensorflow", "tensorflow-cpu", "tensorflow-tpu")


def import_ignores_the_level():
    """True unless each installed TensorFlow build is a release of IMPORT_KEEPS_TO_THE_LEVEL.

    Read from the distributions' metadata, before TensorFlow loads. No build
    found (a source build, tf-nightly), unreadable metadata, or tensorflow-tpu
    of any release: True, as before. tensorflow-tpu's import can load libtpu,
    which keeps its own log levels (docs/tpus.md), and was not tried here.
    """
    found = []
    try:
        for name in TENSORFLOW_BUILDS:
            try:
                found.append((name, importlib.metadata.version(name) or ""))
            except importlib.metadata.PackageNotFoundError:
                pass
    except Exception:  # a broken install's metadata: keep the hook, as before
        return True
    return not found or any(name == "tensorflow-tpu" or not version.startswith(
        IMPORT_KEEPS_TO_THE_LEVEL) for name, version in found)


def quiet_tensorflow_import():
    """Make the first `import tensorflow` in this process quiet, whoever imports it.

    The package itself does not import TensorFlow: a TPU v5e or v6e needs
    its runtime chosen before TensorFlow loads (platforms.tpu_runtime), and
    a notebook's kernel must not load it at all (platforms.notebook). So the
    first module that needs TensorFlow imports it, and this hook quiets that
    import, as `native_stderr_quiet` quiets the other native moments.

    Upstream: tensorflow/tensorflow#100442 (TF_CPP_MIN_LOG_LEVEL=3 does not
    silence the import; open). Still needed in TensorFlow 2.19.1 (absl's
    preamble, its cuDNN/cuBLAS factory and "computation placer" lines) and
    2.21.0 (absl's preamble, oneDNN and "Could not find cuda drivers", twice),
    which print them at every level (tests/test_workarounds.py). Not needed
    in 2.20.0, whose import prints nothing at levels 1 to 3 and its INFO
    lines at 0: the hook is not installed there (`import_ignores_the_level`).
    """
    if "tensorflow" in sys.modules or os.environ.get(VERBOSE_ENV):
        return
    if not import_ignores_the_level():
        return
    if not any(isinstance(finder, _QuietTensorFlowFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _QuietTensorFlowFinder())


# --- a lost peer, said once ---------------------------------------------------------
#
# When a peer of a cluster dies, TensorFlow's C++ runtime logs the aborted
# collective straight to fd 2 ("Aborting RingReduce", "Collective ops is
# aborted by", and the lines that continue a record: gRPC's details, the
# coordination service's list of unhealthy tasks) before Python hears of it;
# the run then says the same in its one line (cluster.peer_lost). In a
# cluster, fd 2 goes through a filter process that drops those records and
# passes every other line on at once. A process, not a thread: if this one
# dies of a crash, the filter still reads the pipe to its end, so no last
# words are lost. A record starts as TF_LOG_LINE says, in either of
# TensorFlow's forms (argv[1]); the words that mark it dropped follow.

_COLLECTIVE_ABORT = ("RingReduce", "StartAbort", "Collective ops is aborted",
                     "Local rendezvous is aborting", "CollectiveReduce", "CollectiveGather",
                     "CollectiveBcast", "Connection reset by peer", "Socket closed",
                     "stopped sending heartbeats", "Polled an error from coordination service",
                     "Failed to cancel preemption barrier",
                     "Using experimental recoverable task feature")
_FILTER = r"""
import os, re, signal, sys
for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
    signal.signal(sig, signal.SIG_IGN)  # it ends when the pipe does, never before
record = re.compile(sys.argv[1].encode())
# said in place of JAX's record of the end it puts to a process: a peer lost, or a start
# that timed out (its RPC, on a later line, is RegisterTask); b"": the record as it is
lost, not_joined = sys.argv[2].encode(), sys.argv[3].encode()
aborted = tuple(word.encode() for word in sys.argv[4:])
continued = (b"Additional GRPC error information", b":UNKNOWN:", b':{"created":', b"\t [[",
             b"The error could be from a previous operation", b"/job:",
             b"The tasks have crashed.", b"RPC: /tensorflow.", b"\n")
dropping, ending = False, None
out = sys.stdout.buffer

def say(line):
    try:
        out.write(line)
        out.flush()
    except OSError:
        pass  # nobody reads stderr any more: keep draining the pipe

def said_for(ending):
    return (not_joined if b"RegisterTask" in ending else lost) + b"\n"

for line in sys.stdin.buffer:
    if record.match(line):
        if ending is not None:
            say(said_for(ending))
            ending = None
        dropping = any(word in line for word in aborted)
        if lost and b"the JAX distributed service detected fatal errors" in line:
            ending, dropping = line, True  # said once its last lines are in
            continue
    elif dropping and not line.startswith(continued):
        dropping = False
    if ending is not None:
        ending += line
    elif not dropping:
        say(line)
if ending is not None:
    say(said_for(ending))
"""


def filter_collective_noise(record, said=("", "")):
    """fd 2 through the filter process from here on (once; not with PYIMAGESEARCH_VERBOSE_TF).

    `said`: the lines that stand for JAX's record, over several lines, of
    the end it puts to a process (jax_slice.join): a lost peer, a start
    that timed out.

    `record` (runtime.this_process) keeps the filter's process and the real
    stderr until `end_collective_noise_filter(record)`, as the process ends.

    Upstream: none filed: these are TensorFlow's own error records, which
    only TF_CPP_MIN_LOG_LEVEL=3 removes, with every other C++ error (related:
    tensorflow/tensorflow#62770). Still logged by TensorFlow 2.19.1 and 2.21.0.
    """
    if record.noise_filter or os.environ.get("PYIMAGESEARCH_VERBOSE_TF") or os.name != "posix":
        return
    sys.stderr.flush()
    real = os.dup(2)
    reader, writer = os.pipe()
    try:
        process = subprocess.Popen([sys.executable, "-c", _FILTER, TF_LOG_LINE, *said,
                                    *_COLLECTIVE_ABORT],
                                   stdin=reader, stdout=real, stderr=subprocess.DEVNULL)
    except OSError:  # no filter: the lines pass as they are
        os.close(writer)
        os.close(real)
        return
    finally:
        os.close(reader)
    os.dup2(writer, 2)
    os.close(writer)
    record.noise_filter = {"real": real, "process": process}


def end_collective_noise_filter(record, timeout_s=5.0):
    """fd 2 back to the real stderr, after the filter has passed on all it was given."""
    noise_filter, record.noise_filter = record.noise_filter, None
    if not noise_filter:
        return
    try:
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
    os.dup2(noise_filter["real"], 2)  # the pipe's last writer closes: the filter drains, ends
    os.close(noise_filter["real"])
    try:
        noise_filter["process"].wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        noise_filter["process"].kill()
