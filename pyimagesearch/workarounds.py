"""TensorFlow's private hooks, in one place, each naming what it works around.

1. `plain_device_buffers`: no autotuning on the per-device input buffers
   of CPU strategies (rehearsal epochs stalled for minutes).
2. `local_cpu_devices`: several logical CPU devices per worker under
   MultiWorkerMirroredStrategy, for rehearsals.
3. `bound_cluster_start`: a limit on how long MultiWorkerMirroredStrategy
   waits for the other workers to start.
4. `preemption_handler_acts` and `stop_preemption_handler`: where
   TensorFlow's PreemptionCheckpointHandler does anything, and stopping its
   watcher threads when training ends.

The hooks reach into private TensorFlow API; tests check that they still
exist, and still do what is worked around, in the TensorFlow versions CI runs.
"""
import contextlib
import functools
import sys

import tensorflow as tf

from pyimagesearch.errors import UserError


class _Gone:
    """A private TensorFlow module this TensorFlow lacks: any use raises its ImportError.

    So a TensorFlow that moved one breaks only the hook that uses it, where
    `private_api` makes it one line, not the import of this module.
    """

    def __init__(self, error):
        self._error = error

    def __getattr__(self, name):
        raise self._error


# the private modules the hooks reach into (`import tensorflow` has loaded them all). One
# that this TensorFlow lacks stands in as _Gone: only the hook that uses it fails, in one
# line; the device buffers' hook, which may be missing, is None then.
try:
    from tensorflow.python.data.ops import multi_device_iterator_ops
except ImportError:
    multi_device_iterator_ops = None
try:  # a multi-worker run's: bound_cluster_start needs all three
    from tensorflow.python.distribute import collective_all_reduce_strategy, multi_worker_util
    from tensorflow.python.eager import context
except ImportError as error:
    collective_all_reduce_strategy = multi_worker_util = context = _Gone(error)
try:
    from tensorflow.python.distribute.failure_handling import failure_handling_util
except ImportError as error:
    failure_handling_util = _Gone(error)


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

    Only for rehearsals on the CPU (strategies.rehearsal and a cluster's
    --rehearse), where both were seen; a plain train_cpu.py trains on
    TensorFlow's default strategy, which makes no such buffers. A real GPU or TPU gets no hook: it
    has never run there, and on a TPU the buffers sit on devices whose
    dataset kernels were not checked.

    Upstream: none filed for the stall; the warning is the one of
    tensorflow/tensorflow#61816 (closed for 2.15, still logged here). Still
    needed in TensorFlow 2.19.1 and 2.21.0 (tests/test_workarounds.py).
    """
    ops = multi_device_iterator_ops
    original = getattr(ops, "_create_device_dataset", None)
    if original is None:
        warn_hook_missing()
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


@functools.cache  # what says it once: a second call returns the first one's None
def warn_hook_missing():
    """Say once per process that the rehearsal stall fix is switched off."""
    print("warning: this TensorFlow has no multi_device_iterator_ops."
          "_create_device_dataset to turn autotuning off on per-device input "
          "buffers, so rehearsal epochs may stall for minutes", file=sys.stderr)


class local_cpu_devices:
    """While building the strategy, give each worker `count` CPU devices, not one.

    MultiWorkerMirroredStrategy puts one replica per GPU, or a single one on
    the CPU (CollectiveAllReduceExtended._initialize_local_devices); a
    rehearsal of K GPUs per worker needs K logical CPU devices there. Private
    TensorFlow API: where it is missing, --rehearse K > 1 is refused.

    Upstream: none public (TensorFlow's TODO b/126786766 beside the code).
    Still needed in TensorFlow 2.19.1 and 2.21.0 (tests/test_workarounds.py).
    """

    def __init__(self, count):
        self.count = count or 1

    def __enter__(self):
        if self.count == 1:
            return
        extended = collective_all_reduce_strategy.CollectiveAllReduceExtended
        self._original = getattr(extended, "_initialize_local_devices", None)
        if self._original is None:
            raise UserError("this TensorFlow cannot rehearse several devices per "
                            "worker; use --rehearse 1 and more workers")
        count = self.count

        def cpu_devices(self_, cluster_resolver, worker_device):
            return tuple(f"{worker_device}/device:CPU:{i}" for i in range(count)), "CPU"

        extended._initialize_local_devices = cpu_devices

    def __exit__(self, *exc):
        if self.count > 1:
            extended = collective_all_reduce_strategy.CollectiveAllReduceExtended
            extended._initialize_local_devices = self._original
        return False


@contextlib.contextmanager
def private_api(what):
    """A private TensorFlow API that is gone (renamed, moved) is one line naming the version.

    Every real cluster run goes through the hooks below; a TensorFlow other
    than those CI runs (2.19, 2.21) may lack one, and would print a traceback.
    """
    try:
        yield
    except (ImportError, AttributeError) as error:
        raise UserError(f"TensorFlow {tf.__version__} lacks {what} ({error}), a private API "
                        "that multi-worker runs use; install TensorFlow 2.19, 2.20 or 2.21, "
                        "the versions this repo is tested with") from error


def bound_cluster_start(timeout_s):
    """Make MultiWorkerMirroredStrategy give up after `timeout_s` waiting for the workers.

    The strategy sets up TensorFlow's coordination service with its own
    limit on how long every worker may take to register, an hour: a worker
    that never starts leaves the others waiting that long, in C++, where
    neither Ctrl-C nor SIGTERM reaches Python. It configures the service only if nothing has,
    so it is configured here first, the same way, plus the limit.

    Upstream: none filed (the strategy takes no such limit). Still needed in
    TensorFlow 2.19.1 and 2.21.0 (tests/test_workarounds.py).
    """
    with private_api("the coordination service's configuration"):
        spec = tf.distribute.cluster_resolver.TFConfigClusterResolver().cluster_spec()
        # the protobuf module as the strategy itself imports it (its path moves)
        protos = collective_all_reduce_strategy.coordination_config_pb2
        jobs = [protos.CoordinatedJob(name=job, num_tasks=spec.num_tasks(job))
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

    Upstream: none filed (failure_handling.py: "We can make it work upon
    request"). Still needed in TensorFlow 2.19.1 and 2.21.0
    (tests/test_workarounds.py).
    """
    with private_api("failure_handling_util.detect_platform"):
        platform = failure_handling_util.detect_platform()
        devices = failure_handling_util.PlatformDevice
        return platform not in (devices.GCE_CPU, devices.GCE_TPU)


def stop_preemption_handler(handler):
    """Stop a PreemptionCheckpointHandler's watcher threads once training is over.

    They block in the coordination service until a key is set; the handler
    stops them itself only in its __del__, which a thread that still holds
    it never lets run.

    Upstream: none filed (the handler has no public stop). Still needed in
    TensorFlow 2.19.1 and 2.21.0 (tests/test_workarounds.py).
    """
    # training is over: a TensorFlow without these stops them in __del__ (no
    # reason to lose the run for it)
    for name in ("_stop_cluster_wise_termination_watcher_thread",
                 "_stop_poll_termination_signal_thread"):
        getattr(handler, name, lambda: None)()
