"""TensorFlow's workarounds, in one place: quiet native logs, and private hooks.

1. `native_stderr_quiet`: TensorFlow's native start-up lines off the
   terminal, without losing them; `quiet_tensorflow_import` does it for
   the first import of TensorFlow, whichever module makes it.
2. `plain_device_buffers`: no autotuning on the per-device input buffers
   of CPU strategies (rehearsal epochs stalled for minutes).
3. `local_cpu_devices`: several logical CPU devices per worker under
   MultiWorkerMirroredStrategy, for rehearsals.
4. `bound_cluster_start`: a limit on how long MultiWorkerMirroredStrategy
   waits for the other workers to start.
5. `preemption_handler_acts` and `stop_preemption_handler`: where
   TensorFlow's PreemptionCheckpointHandler does anything, and stopping its
   watcher threads when training ends.
6. `filter_collective_noise`: in a cluster, TensorFlow's C++ lines about a
   collective aborted by a lost peer off stderr (the run says it in one line).
7. `open_closed_standard_streams`: a standard stream the caller closed
   (`python train_cpu.py >&-`) gets /dev/null, before TensorFlow opens a file
   that would take its number and receive its C++ lines.

The hooks reach into private TensorFlow API; tests check that they still
exist in the TensorFlow versions CI runs (2.20 and 2.21).

Quiet native logs.

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
import importlib.abc
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


def quiet_tensorflow_import():
    """Make the first `import tensorflow` in this process quiet, whoever imports it.

    The package itself does not import TensorFlow: a TPU v5e or v6e needs
    its runtime chosen before TensorFlow loads (platforms.tpu_runtime), and
    a notebook's kernel must not load it at all (platforms.notebook). So the
    first module that needs TensorFlow imports it, and this hook quiets that
    import, as `native_stderr_quiet` quiets the other native moments.
    """
    if "tensorflow" in sys.modules or os.environ.get(VERBOSE_ENV):
        return
    if not any(isinstance(finder, _QuietTensorFlowFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _QuietTensorFlowFinder())


def plain_device_buffers():
    """Make the strategies' per-device input buffers plain: no autotuning, no rewrites.

    Every strategy hands each replica its batches through a small tf.data
    pipeline of its own (a generator feeding a prefetch of 1), with
    autotuning on and TensorFlow's default rewrites, and nothing to tune or
    rewrite. Two things follow. Tearing a buffer down waits for its
    autotuning thread to wake up, and Keras tears them down between epochs:
    with 8 logical CPU devices (TF 2.21) epochs of 6 s took 20 to 140 s, the
    process idle, and the end of training stalled for minutes (6.5 s with
    autotuning off). And the attempted rewrite of a generator logs a warning
    on every run ("Input of GeneratorDatasetOp::Dataset will not be
    optimized"). The hook is private TensorFlow API: where it is missing
    nothing is changed, and a warning says so once, since rehearsals may
    then stall again.

    Only for the CPU (strategies.cpu_only: train_cpu.py and every
    rehearsal), where both were seen. A real GPU or TPU gets no hook: it
    has never run there, and on a TPU the buffers sit on devices whose
    dataset kernels were not checked.
    """
    import tensorflow as tf  # here: the quiet block above must not need TensorFlow

    try:
        from tensorflow.python.data.ops import multi_device_iterator_ops as ops
    except ImportError:
        ops = None
    original = getattr(ops, "_create_device_dataset", None)
    if original is None:
        _warn_hook_missing()
        return
    if getattr(original, "_pyimagesearch", False):
        return  # patched already (a second rehearsal in one process)
    options = tf.data.Options()
    options.autotune.enabled = False
    options.experimental_optimization.apply_default_optimizations = False

    def create_device_dataset(*args, **kwargs):
        return original(*args, **kwargs).with_options(options)

    create_device_dataset._pyimagesearch = True
    create_device_dataset._original = original  # what a test puts back
    ops._create_device_dataset = create_device_dataset


_hook_missing_warned = False


def _warn_hook_missing():
    """Say once per process that the rehearsal stall fix is switched off."""
    global _hook_missing_warned
    if not _hook_missing_warned:
        _hook_missing_warned = True
        print("warning: this TensorFlow has no multi_device_iterator_ops."
              "_create_device_dataset to turn autotuning off on per-device input "
              "buffers, so rehearsal epochs may stall for minutes", file=sys.stderr)


class local_cpu_devices:
    """While building the strategy, give each worker `count` CPU devices, not one.

    MultiWorkerMirroredStrategy puts one replica per GPU, or a single one on
    the CPU (CollectiveAllReduceExtended._initialize_local_devices); a
    rehearsal of K GPUs per worker needs K logical CPU devices there. Private
    TensorFlow API: where it is missing, --rehearse K > 1 is refused.
    """

    def __init__(self, count):
        self.count = count or 1

    def __enter__(self):
        if self.count == 1:
            return
        from tensorflow.python.distribute import collective_all_reduce_strategy as car

        extended = car.CollectiveAllReduceExtended
        self._original = getattr(extended, "_initialize_local_devices", None)
        if self._original is None:
            from pyimagesearch.training.errors import UserError  # here: see plain_device_buffers

            raise UserError("this TensorFlow cannot rehearse several devices per "
                            "worker; use --rehearse 1 and more workers")
        count = self.count

        def cpu_devices(self_, cluster_resolver, worker_device):
            return tuple(f"{worker_device}/device:CPU:{i}" for i in range(count)), "CPU"

        extended._initialize_local_devices = cpu_devices

    def __exit__(self, *exc):
        if self.count > 1:
            from tensorflow.python.distribute import collective_all_reduce_strategy as car

            car.CollectiveAllReduceExtended._initialize_local_devices = self._original
        return False


@contextlib.contextmanager
def private_api(what):
    """A private TensorFlow API that is gone (renamed, moved) is one line naming the version.

    Every real cluster run goes through the hooks below; a TensorFlow other
    than those CI runs (2.20, 2.21) may lack one, and would print a traceback.
    """
    try:
        yield
    except (ImportError, AttributeError) as error:
        import tensorflow as tf

        from pyimagesearch.training.errors import UserError  # here: see plain_device_buffers

        raise UserError(f"TensorFlow {tf.__version__} lacks {what} ({error}), a private API "
                        "that multi-worker runs use; install TensorFlow 2.20 or 2.21, the "
                        "versions this repo is tested with") from error


def bound_cluster_start(timeout_s):
    """Make MultiWorkerMirroredStrategy give up after `timeout_s` waiting for the workers.

    The strategy sets up TensorFlow's coordination service, with no limit on
    how long every worker may take to register: a worker that never starts
    leaves the others waiting for ever, and in C++, where neither Ctrl-C nor
    SIGTERM reaches Python. It configures the service only if nothing has,
    so it is configured here first, the same way, plus the limit.
    """
    import tensorflow as tf

    with private_api("the coordination service's configuration"):
        # the protobuf module as the strategy itself imports it (its path moves)
        from tensorflow.python.distribute import collective_all_reduce_strategy as car
        from tensorflow.python.distribute import multi_worker_util
        from tensorflow.python.eager import context

        spec = tf.distribute.cluster_resolver.TFConfigClusterResolver().cluster_spec()
        jobs = [car.coordination_config_pb2.CoordinatedJob(name=job,
                                                           num_tasks=spec.num_tasks(job))
                for job in ("chief", "worker") if job in spec.jobs]
        leader = multi_worker_util.coordination_leader(spec)
        runtime = context.context()
        runtime.configure_coordination_service(
            service_type="standalone", service_leader=leader, coordinated_jobs=jobs,
            cluster_register_timeout_in_ms=int(timeout_s * 1000))
        # the limit covers the service's own task too only when registering
        # waits at a barrier for all tasks (the service's leader otherwise waits
        # for the others with no limit)
        runtime.coordination_service.cluster_register_with_barrier = True


def preemption_handler_acts():
    """Whether PreemptionCheckpointHandler acts here, by TensorFlow's own test.

    On Google Cloud it asks the metadata server what it runs on; on a CPU or
    TPU VM there its run() and save_checkpoint_if_preempted() do nothing at
    all ("does not support usage with TPU or CPU device on GCP",
    failure_handling.py). Elsewhere, and on GPU VMs, it acts.
    """
    with private_api("failure_handling_util.detect_platform"):
        from tensorflow.python.distribute.failure_handling import (
            failure_handling_util as util,
        )

        return util.detect_platform() not in (util.PlatformDevice.GCE_CPU,
                                              util.PlatformDevice.GCE_TPU)


def stop_preemption_handler(handler):
    """Stop a PreemptionCheckpointHandler's watcher threads once training is over.

    They block in the coordination service until a key is set; the handler
    stops them itself only in its __del__, which a thread that still holds
    it never lets run.
    """
    # training is over: a TensorFlow without these stops them in __del__ (no
    # reason to lose the run for it)
    for name in ("_stop_cluster_wise_termination_watcher_thread",
                 "_stop_poll_termination_signal_thread"):
        getattr(handler, name, lambda: None)()


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
                     "stopped sending heartbeats")
_FILTER = r"""
import os, re, signal, sys
for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
    signal.signal(sig, signal.SIG_IGN)  # it ends when the pipe does, never before
record = re.compile(sys.argv[1].encode())
aborted = tuple(word.encode() for word in sys.argv[2:])
continued = (b"Additional GRPC error information", b":UNKNOWN:", b':{"created":', b"\t [[",
             b"The error could be from a previous operation", b"/job:",
             b"The tasks have crashed.")
dropping = False
out = sys.stdout.buffer
for line in sys.stdin.buffer:
    if record.match(line):
        dropping = any(word in line for word in aborted)
    elif dropping and not line.startswith(continued):
        dropping = False
    if not dropping:
        try:
            out.write(line)
            out.flush()
        except OSError:
            pass  # nobody reads stderr any more: keep draining the pipe
"""
_noise_filter = {}


def filter_collective_noise():
    """fd 2 through the filter process from here on (once; not with PYIMAGESEARCH_VERBOSE_TF)."""
    if _noise_filter or os.environ.get("PYIMAGESEARCH_VERBOSE_TF") or os.name != "posix":
        return
    sys.stderr.flush()
    real = os.dup(2)
    reader, writer = os.pipe()
    try:
        process = subprocess.Popen([sys.executable, "-c", _FILTER, TF_LOG_LINE,
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
    _noise_filter.update(real=real, process=process)


def end_collective_noise_filter(timeout_s=5.0):
    """fd 2 back to the real stderr, after the filter has passed on all it was given."""
    if not _noise_filter:
        return
    try:
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
    os.dup2(_noise_filter["real"], 2)  # the pipe's last writer closes: the filter drains, ends
    os.close(_noise_filter["real"])
    try:
        _noise_filter["process"].wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _noise_filter["process"].kill()
    _noise_filter.clear()
