"""One place that turns "cpu", "gpu", "tpu" or a rehearsal into a tf.distribute strategy.

Device set-up in TensorFlow must happen before its runtime starts (the first
op), so each training script builds its strategy first thing after parsing
flags. Every failure a user can cause (no GPU, no TPU, a bad rehearsal
count) raises UserError with a line that says what to do instead.
"""
import os

import tensorflow as tf

from pyimagesearch.errors import UserError
from pyimagesearch.quiet import native_stderr_quiet


def _hide_gpus():
    """Make TensorFlow ignore any GPU, so 'CPU' really means the CPU."""
    with native_stderr_quiet():  # a machine without a GPU logs a failed cuInit
        gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        try:
            tf.config.set_visible_devices([], "GPU")
        except RuntimeError as error:  # the runtime already started with them
            raise UserError(f"cannot hide the GPUs: {error}") from error


def cpu_strategy():
    """All work on /cpu:0, even when a GPU is visible."""
    _hide_gpus()
    return tf.distribute.OneDeviceStrategy("/cpu:0")


def gpu_strategy():
    """MirroredStrategy over every visible GPU (one GPU is the article's case)."""
    with native_stderr_quiet():
        gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        raise UserError("no GPU is visible to TensorFlow; use --rehearse N to "
                        "rehearse this run on N logical CPU devices")
    return tf.distribute.MirroredStrategy()


def _no_autotune_on_device_buffers():
    """Turn off tf.data autotuning on MirroredStrategy's per-device input buffers.

    Each replica's input buffer is a small tf.data pipeline of its own, with
    autotuning on by default and nothing to tune. Tearing one down waits for
    its autotuning thread to wake up, and Keras tears them down between
    epochs: with 8 logical CPU devices (TF 2.21) epochs of 6 s took 20 to
    140 s, the process idle, and the end of training stalled for minutes.
    With autotuning off there, epochs take 6.5 s. The hook is private
    TensorFlow API, so where it is missing nothing is changed.
    """
    try:
        from tensorflow.python.data.ops import multi_device_iterator_ops as ops
    except ImportError:
        return
    original = getattr(ops, "_create_device_dataset", None)
    if original is None or getattr(original, "_pyimagesearch", False):
        return
    options = tf.data.Options()
    options.autotune.enabled = False

    def create_device_dataset(*args, **kwargs):
        return original(*args, **kwargs).with_options(options)

    create_device_dataset._pyimagesearch = True
    ops._create_device_dataset = create_device_dataset


def rehearsal_strategy(replicas):
    """MirroredStrategy over `replicas` logical devices carved out of the CPU.

    This is how a TPU or multi-GPU configuration is checked without one: the
    same global batch, per-replica split, loss scaling and gradient all-reduce,
    only slower. If the process already has at least that many logical CPUs
    (a test session, say), the first `replicas` of them are used.
    """
    if replicas < 1:
        raise UserError(f"--rehearse needs at least 1 device, got {replicas}")
    _hide_gpus()
    cpu = tf.config.list_physical_devices("CPU")[0]
    try:
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration()] * replicas)
    except RuntimeError:
        pass  # runtime already started: use the logical devices that exist
    devices = [device.name for device in tf.config.list_logical_devices("CPU")]
    if len(devices) < replicas:
        raise UserError(f"cannot rehearse on {replicas} devices: TensorFlow already "
                        f"started with {len(devices)} CPU devices in this process")
    _no_autotune_on_device_buffers()
    # reduce through one device: collective all-reduce keys would clash
    # between rehearsals of different sizes in one process (tests do that)
    return tf.distribute.MirroredStrategy(
        devices[:replicas], cross_device_ops=tf.distribute.ReductionToOneDevice())


def _tpu_resolver(tpu):
    """Find the TPU from `tpu`, the Colab/Kaggle environment, or a TPU VM."""
    resolver = tf.distribute.cluster_resolver.TPUClusterResolver
    if tpu:
        return resolver(tpu=tpu)
    try:
        return resolver()  # Colab and Kaggle set what this reads
    except ValueError:
        # on a Cloud TPU VM the chips are local devices: /dev/accel* or vfio
        if any(os.path.exists(p) for p in ("/dev/accel0", "/dev/vfio/0")):
            return resolver(tpu="local")
        raise


def tpu_strategy(tpu=None):
    """Connect to and initialise the TPU system, then build a TPUStrategy."""
    # OSError: a resolver that asks Google Cloud's metadata server off Cloud
    expected = (ValueError, RuntimeError, OSError, tf.errors.OpError)
    try:
        with native_stderr_quiet(expected):
            resolver = _tpu_resolver(tpu)
            tf.config.experimental_connect_to_cluster(resolver)
            tf.tpu.experimental.initialize_tpu_system(resolver)
    except expected as error:
        detail = str(error).strip().splitlines()[0] if str(error).strip() else ""
        raise UserError(f"no TPU found ({detail or type(error).__name__}); pass "
                        "--tpu NAME, or use --rehearse 8 to rehearse on 8 logical "
                        "CPU devices") from error
    return tf.distribute.TPUStrategy(resolver)


def get_strategy(device, rehearse=None, tpu=None):
    """The strategy for `device` ("cpu", "gpu", "tpu"), or a rehearsal of it."""
    if device not in ("cpu", "gpu", "tpu"):
        raise UserError(f"unknown device {device!r}; choose cpu, gpu or tpu")
    if rehearse:
        return rehearsal_strategy(rehearse)
    if device == "cpu":
        return cpu_strategy()
    if device == "gpu":
        return gpu_strategy()
    return tpu_strategy(tpu)
