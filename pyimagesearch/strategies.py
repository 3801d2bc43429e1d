"""What stands behind the scripts' strategy lines, and the strategies that stand in for hardware.

- `cpu_only`: the CPU and nothing else (train_cpu.py, rehearsals);
- `check_gpus`: no GPU is one line (TensorFlow's own lines above it say why);
- `rehearsal`: N logical CPU devices under MirroredStrategy, standing in for
  N GPUs or TPU cores: the same replicas, batch, loss scaling and all-reduce;
- `multi_worker`: one worker of a TF_CONFIG cluster (cluster.py reads it);
- `data_parallel`: Keras on JAX's DataParallel over the TPU's chips (or N JAX
  CPU devices), after joining the slice's other hosts (jax_slice.py);
- `set_precision` and the float16 loss scaling every replica agrees on.
The TPU's own set-up is tpu.py's.
"""
import keras
import tensorflow as tf

from pyimagesearch.errors import PeerLost, UserError, first_line

PRECISIONS = ("float32", "mixed_float16", "mixed_bfloat16")


def cpu_only():
    """Make TensorFlow ignore any GPU, so that 'CPU' really means the CPU."""
    if tf.config.list_physical_devices("GPU"):
        try:
            tf.config.set_visible_devices([], "GPU")
        except RuntimeError as error:  # the runtime started with them already
            raise UserError(f"cannot hide the GPUs: {error}") from error


def check_gpus():
    """One line unless TensorFlow sees a GPU; what it logged while looking says why."""
    if not tf.config.list_physical_devices("GPU"):
        raise UserError("no GPU is visible to TensorFlow (its lines above say why: no "
                        'driver, or CUDA libraries missing: pip install "tensorflow[and-cuda]"); '
                        "use --rehearse N to rehearse this run on N logical CPU devices")


def multi_worker(cluster, rehearse=None, startup_timeout_s=300.0):
    """MultiWorkerMirroredStrategy for this process's place in `cluster`, once every peer is up.

    Each worker trains on its GPUs (all-reduced with NCCL), or with --rehearse 1
    on its CPU (TensorFlow's AUTO). TensorFlow puts one replica on a worker's
    CPU, whatever logical devices it has (none public: its TODO b/126786766; still
    so in 2.21): a rehearsal is one device per worker.
    """
    from pyimagesearch.cluster import wait_for_peers  # loaded under TF_CONFIG only
    if rehearse and rehearse > 1:
        raise UserError(f"--rehearse {rehearse} under TF_CONFIG: MultiWorkerMirroredStrategy "
                        "puts one replica on a worker's CPU; use --rehearse 1 and more workers")
    wait_for_peers(cluster, startup_timeout_s)
    if rehearse:
        cpu_only()
    else:
        check_gpus()
    kind = tf.distribute.experimental.CommunicationImplementation
    options = tf.distribute.experimental.CommunicationOptions(
        implementation=kind.AUTO if rehearse else kind.NCCL)
    try:
        strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
    except (tf.errors.DeadlineExceededError, tf.errors.UnavailableError) as error:
        raise PeerLost(f"{cluster.name}: the cluster did not form within its start "
                       f"({first_line(error)}); restart every worker together") from error
    print(f"[INFO] {cluster.name} of a {cluster.workers}-worker cluster; custom loop, since "
          "Keras 3's fit does not run under MultiWorkerMirroredStrategy")
    return strategy


def rehearsal(replicas):
    """MirroredStrategy over `replicas` logical devices carved out of the CPU.

    A process that has at least that many logical CPUs already (a test
    session) uses the first `replicas` of them.
    """
    cpu_only()
    cpu = tf.config.list_physical_devices("CPU")[0]
    try:
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration()] * replicas)
    except RuntimeError:
        pass  # the runtime has started: use the logical devices it has
    devices = [device.name for device in tf.config.list_logical_devices("CPU")]
    if len(devices) < replicas:
        raise UserError(f"cannot rehearse on {replicas} devices: TensorFlow already started "
                        f"with {len(devices)} CPU devices in this process")
    # through one device: collective keys would clash between rehearsals of
    # different sizes in one process (the tests run several)
    return tf.distribute.MirroredStrategy(
        devices[:replicas], cross_device_ops=tf.distribute.ReductionToOneDevice())


class DataParallel(keras.distribution.DataParallel):
    """Keras' DataParallel, with TPUStrategy's `num_replicas_in_sync` (the article's numAcc)
    and, on a slice of several hosts, this process's place in it (jax_slice.Slice)."""

    def __init__(self, devices, cluster=None):
        super().__init__(devices=devices)
        self.cluster = cluster

    @property
    def num_replicas_in_sync(self):
        return int(self.device_mesh.devices.size)


def data_parallel(replicas=None, startup_timeout_s=300.0):
    """Keras on JAX: DataParallel over every TPU chip of the slice, or over `replicas` JAX CPU
    devices that rehearse it (of every process, when the launcher started several)."""
    from pyimagesearch import jax_slice  # lazy: jax is installed on this route only

    cpu_only()  # TensorFlow only reads the data here
    cluster = jax_slice.join(startup_timeout_s, rehearsal=bool(replicas))
    if replicas:
        devices = keras.distribution.list_devices("cpu")
        if cluster is None and len(devices) < replicas:
            raise UserError(f"cannot rehearse on {replicas} JAX CPU devices: JAX started with "
                            f"{len(devices)} (JAX_NUM_CPU_DEVICES, read as JAX starts)")
        return DataParallel(devices if cluster else devices[:replicas], cluster)
    devices = keras.distribution.list_devices()
    if not devices or not devices[0].lower().startswith("tpu"):
        from pyimagesearch.host import detect, installed_version, tensorflow_builds
        kinds = "/".join(sorted({device.split(":")[0] for device in devices})) or "no"
        versions = ", ".join(f"{name} {installed_version(name) or 'not installed'}"
                             for name in ("jax", "jaxlib", "libtpu", "keras"))
        raise UserError(f"no TPU for Keras on JAX: {detect().describe()}; JAX sees "
                        f"{len(devices)} {kinds} device(s); {versions}, {tensorflow_builds()}; "
                        "use --rehearse 8 to rehearse on 8 JAX CPU devices")
    return DataParallel(devices, cluster)


def set_precision(name):
    """Keras' global dtype policy, before the model is built (the last layer stays float32)."""
    keras.mixed_precision.set_global_policy(name)


@keras.saving.register_keras_serializable(package="pyimagesearch")
class ReplicasAgreeLossScaleOptimizer(keras.optimizers.LossScaleOptimizer):
    """Keras' float16 LossScaleOptimizer, with every replica taking the same skip decision.

    Keras 3.15 decides whether gradients overflowed from each replica's own,
    before the all-reduce: under MirroredStrategy the first replica's alone,
    under MultiWorkerMirroredStrategy each one's, so one worker may skip the
    all-reduce another enters, and both hang (none filed; still so in Keras
    3.15.1: tests/test_speed_levers.py). Here the replicas all-reduce their
    "finite" flags first. On JAX one step sees the whole batch's gradient.
    """

    def check_finite(self, grads):
        finite = super().check_finite(grads)
        context = tf.distribute.get_replica_context() if keras.backend.backend() == \
            "tensorflow" else None
        if context is None or context.num_replicas_in_sync == 1:
            return finite
        overflowed = context.all_reduce(tf.distribute.ReduceOp.SUM,
                                        tf.cast(tf.logical_not(finite), tf.float32))
        return tf.equal(overflowed, 0.0)
