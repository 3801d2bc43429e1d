"""More than one machine: read TF_CONFIG and build a MultiWorkerMirroredStrategy.

Every process of a cluster gets a `TF_CONFIG` environment variable, set by
hand, by `launch_workers.py`, or by the platform (Vertex AI custom training,
Kubeflow's TFJob, a GKE job):

    {"cluster": {"worker": ["host-a:12345", "host-b:12345"]},
     "task": {"type": "worker", "index": 0}}

`MultiWorkerMirroredStrategy` then keeps a copy of the model on every worker
(on each of its GPUs, or on one CPU device) and all-reduces the gradients
between the processes over gRPC (NCCL between GPUs). Worker 0, or the chief
if the cluster names one, is the one that writes outputs.

Keras 3's `model.fit` does not run under this strategy (keras-team/keras
issue 20585: "Attempt to convert a value (PerReplica:...)"), so the training
scripts use the custom loop (`loop.py`) there.
"""
import contextlib
import dataclasses
import json
import os
import re

from pyimagesearch.errors import PeerLost, UserError, first_line

ROLES = ("chief", "worker")  # the task types that train; no parameter servers here
# how long a collective (a gradient all-reduce) may wait for its peers before
# it fails; a worker that dies without closing its connections (a lost host)
# is also noticed by the coordination service's heartbeats
COLLECTIVE_TIMEOUT_SECONDS = 120.0


@dataclasses.dataclass(frozen=True)
class Cluster:
    """What TF_CONFIG says about the cluster and this process's place in it."""

    workers: int      # processes that train: the chief, if any, plus the workers
    task_type: str    # "chief" or "worker"
    task_index: int
    has_chief: bool   # the cluster names a chief

    @property
    def is_chief(self):
        """True for the one process that writes: the chief, else worker 0."""
        if self.has_chief:
            return self.task_type == "chief"
        return self.task_index == 0


def read_tf_config(environ=os.environ):
    """The Cluster described by $TF_CONFIG, or None when it is unset or empty.

    A TF_CONFIG that names a cluster of one, a task outside the cluster, a
    task type that does not train, or is not JSON at all raises UserError.
    """
    text = environ.get("TF_CONFIG", "").strip()
    if not text:
        return None
    try:
        spec = json.loads(text)
    except ValueError as error:
        raise UserError(f"TF_CONFIG is not valid JSON ({error})") from error
    if not isinstance(spec, dict) or not isinstance(spec.get("cluster"), dict):
        raise UserError('TF_CONFIG needs a "cluster" object, e.g. {"cluster": '
                        '{"worker": ["host-a:12345", "host-b:12345"]}, "task": '
                        '{"type": "worker", "index": 0}}')
    cluster, task = spec["cluster"], spec.get("task")
    unknown = sorted(set(cluster) - set(ROLES))
    if unknown:
        raise UserError(f"TF_CONFIG's cluster has {', '.join(unknown)} tasks; only "
                        "chief and worker are supported (no parameter servers)")
    tasks = {}
    for role in ROLES:
        hosts = cluster.get(role, [])
        if not isinstance(hosts, list) or not all(
                isinstance(h, str) and h.rpartition(":")[2].isdigit() for h in hosts):
            raise UserError(f'TF_CONFIG\'s cluster "{role}" must be a list of '
                            f'"host:port" strings, got {hosts!r}')
        tasks[role] = hosts
    if len(tasks["chief"]) > 1:
        raise UserError("TF_CONFIG's cluster may name one chief at most")
    workers = len(tasks["chief"]) + len(tasks["worker"])
    if workers < 2:
        raise UserError(f"TF_CONFIG describes a cluster of {workers} task; "
                        "a single machine needs no TF_CONFIG (unset it)")
    if not isinstance(task, dict):
        raise UserError('TF_CONFIG needs a "task" object, e.g. '
                        '{"type": "worker", "index": 0}')
    task_type, index = task.get("type"), task.get("index")
    if task_type not in ROLES:
        raise UserError(f"TF_CONFIG's task type is {task_type!r}; this script "
                        "runs as chief or worker")
    if not isinstance(index, int) or isinstance(index, bool) or not (
            0 <= index < len(tasks[task_type])):
        raise UserError(f"TF_CONFIG's task index {index!r} is outside the cluster's "
                        f"{len(tasks[task_type])} {task_type} task(s)")
    return Cluster(workers, task_type, index, has_chief=bool(tasks["chief"]))


def multi_worker_strategy(cluster, rehearse=None):
    """MultiWorkerMirroredStrategy for this process's place in `cluster`.

    Each worker trains on its GPUs; with `rehearse` K it trains on K logical
    CPU devices instead, so the same command rehearses a cluster of GPU
    machines on CPUs. Must run before TensorFlow's runtime starts.
    """
    import tensorflow as tf

    from pyimagesearch import strategy as strategies

    strategies.plain_device_buffers()
    if rehearse:
        strategies.hide_gpus()
        if rehearse > 1:
            cpu = tf.config.list_physical_devices("CPU")[0]
            tf.config.set_logical_device_configuration(
                cpu, [tf.config.LogicalDeviceConfiguration()] * rehearse)
    elif not tf.config.list_physical_devices("GPU"):
        strategies.gpu_strategy()  # raises the one-line "no GPU" error, with its cause
    options = tf.distribute.experimental.CommunicationOptions(
        timeout_seconds=COLLECTIVE_TIMEOUT_SECONDS)
    with _local_cpu_devices(rehearse):
        strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
    expected = cluster.workers * (rehearse or 1)
    if rehearse and strategy.num_replicas_in_sync != expected:
        raise UserError(f"the rehearsal has {strategy.num_replicas_in_sync} replicas, "
                        f"expected {expected}")
    return strategy


class _local_cpu_devices:
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
def peer_loss_reported(cluster):
    """Turn the error a collective raises when a peer dies into one line (PeerLost).

    On loopback a killed worker resets its connections and the survivors'
    collectives abort within seconds (UnavailableError); a lost host is
    noticed by the coordination service's heartbeats, or at the latest when
    a collective passes COLLECTIVE_TIMEOUT_SECONDS (DeadlineExceededError).
    """
    if cluster is None:
        yield
        return
    import tensorflow as tf

    lost = (tf.errors.UnavailableError, tf.errors.DeadlineExceededError,
            tf.errors.AbortedError, tf.errors.CancelledError, tf.errors.InternalError)
    try:
        yield
    except lost as error:
        raise PeerLost(f"{cluster.task_type} {cluster.task_index} lost a peer of its "
                       f"{cluster.workers}-worker cluster and stopped "
                       f"({type(error).__name__}: {_cause(error)})") from error


def _cause(error):
    """The line of a collective's error that says what happened to the peer."""
    lines = [line.strip() for line in str(getattr(error, "message", error)).splitlines()]
    telling = re.compile(r"aborted|reset|unavailable|deadline|timed? ?out|heartbeat|"
                         r"connect|failed|lost", re.IGNORECASE)
    return next((line for line in lines if telling.search(line)
                 and not line.startswith(("File ", "Detected at node"))), first_line(error))
