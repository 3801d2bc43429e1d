"""What stands behind the scripts' strategy calls: devices checked, failures in one line.

The scripts build their strategy in plain view (`tf.distribute.TPUStrategy`,
`MirroredStrategy`, TensorFlow's default one); this module holds what those calls
need around them, and the strategies that stand in for hardware:

- `cpu_only`: the CPU and nothing else, for train_cpu.py and rehearsals;
- `check_gpus`: no GPU, or a CUDA that will not load, is one line that
  gives TensorFlow's own cause;
- `tpu_errors`: the article's four TPU calls inside it fail in one line
  that gives TensorFlow's cause, and its TPUClusterResolver() is found
  within a time limit (tpu_lookup.py, loaded for a TPU only);
- `rehearsal`: N logical CPU devices under MirroredStrategy, standing in
  for N GPUs or TPU cores;
- `multi_worker`: MultiWorkerMirroredStrategy for one worker of a
  TF_CONFIG cluster, after the other workers have started (cluster.py,
  loaded for a cluster only);
- `data_parallel`: Keras on JAX's DataParallel, for train_tpu.py on a JAX TPU image.

Beside them, the compute precision (`set_precision`, loss scaling for
float16), set before the model is built.

Device set-up in TensorFlow must happen before its runtime starts (the first
op), so the scripts build their strategy first thing after parsing flags.
"""
import contextlib
import re

import keras
import tensorflow as tf

from pyimagesearch.errors import UserError, first_line
from pyimagesearch.runtime import DEVICES, this_process
from pyimagesearch.terminal import TF_LOG_LINE, filter_collective_noise, native_stderr_quiet


def cpu_only():
    """Make TensorFlow ignore any GPU, so 'CPU' really means the CPU."""
    with native_stderr_quiet():  # a machine without a GPU logs a failed cuInit
        gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        try:
            tf.config.set_visible_devices([], "GPU")
        except RuntimeError as error:  # the runtime already started with them
            raise UserError(f"cannot hide the GPUs: {error}") from error


_LOG_LINE = re.compile(TF_LOG_LINE)  # a TensorFlow log line, in 2.21's or 2.20's form

# What TensorFlow logs while it looks for GPUs, and what it means (seen with
# TF 2.20 and 2.21 on a machine without a GPU; the texts are in
# libtensorflow_framework.so):
# - "failed call to cuInit: ... UNKNOWN ERROR (303)": libcuda.so.1, the NVIDIA
#   driver, could not be loaded, so CUDA's stub cannot even name the error;
#   "... CUDA_ERROR_NO_DEVICE": a driver but no GPU. Both just mean no GPU.
#   Any other cuInit failure is a driver that is there but broken.
# - "Cannot dlopen some GPU libraries": logged once a GPU has been counted,
#   when CUDA's runtime libraries (cudart, cuDNN, cuBLAS, ...) are missing.
# - "Ignoring visible gpu device": a GPU this build does not support.
# "Could not find cuda drivers on your machine" comes from cudart_stub.cc at
# import when libcudart is missing, with or without a driver: it decides nothing.
_NO_GPU_SIGNS = ("UNKNOWN ERROR (", "CUDA_ERROR_NO_DEVICE")
_REHEARSE_GPU = "use --rehearse N to rehearse this run on N logical CPU devices"


def _log_messages(text):
    """(level, message) for each TensorFlow log line in `text`; level is I, W, E or F."""
    messages = []
    for line in text.splitlines():
        match = _LOG_LINE.match(line)
        if match:
            messages.append((match["absl"] or match["tsl"], match["message"].strip()))
    return messages


def no_gpu_message(log):
    """One line on why TensorFlow listed no GPU, from what it logged while looking."""
    messages = _log_messages(log)

    def said(needle):
        return next((message for _, message in messages if needle in message), None)

    dlopen = said("Cannot dlopen some GPU libraries")
    if dlopen:
        first_sentence = dlopen.split(". ")[0].rstrip(".") + "."
        return ("a GPU is present but TensorFlow cannot load its CUDA libraries "
                f'(TensorFlow said: "{first_sentence}"); install them with '
                f'pip install "tensorflow[and-cuda]", or {_REHEARSE_GPU}')
    ignored = said("Ignoring visible gpu device")
    if ignored:
        return ("a GPU is present but TensorFlow will not use it "
                f'(TensorFlow said: "{ignored}"); {_REHEARSE_GPU}')
    cuinit = said("failed call to cuInit")
    if cuinit and not any(sign in cuinit for sign in _NO_GPU_SIGNS):
        return ("the NVIDIA driver is there but CUDA would not start "
                f'(TensorFlow said: "{cuinit}"); check the driver with nvidia-smi, '
                f"or {_REHEARSE_GPU}")
    # an error we do not know yet: still worth showing, in TensorFlow's words
    errors = [message for level, message in messages if level in "EF"
              and not any(sign in message for sign in _NO_GPU_SIGNS)]
    if errors:
        return (f'no GPU is visible to TensorFlow (it said: "{errors[0]}"); '
                f"{_REHEARSE_GPU}")
    return f"no GPU is visible to TensorFlow; {_REHEARSE_GPU}"


def check_gpus():
    """Stop with one line, TensorFlow's cause in it, unless TensorFlow sees a GPU."""
    with native_stderr_quiet() as captured:
        gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        raise UserError(no_gpu_message(captured.text()))


def rehearsal(replicas):
    """MirroredStrategy over `replicas` logical devices carved out of the CPU.

    This is how a TPU or multi-GPU configuration is checked without one: the
    same global batch, per-replica split, loss scaling and gradient all-reduce,
    only slower. If the process already has at least that many logical CPUs
    (a test session, say), the first `replicas` of them are used.
    """
    from pyimagesearch.workarounds import plain_device_buffers

    if replicas < 1:
        raise UserError(f"--rehearse needs at least 1 device, got {replicas}")
    cpu_only()
    # per-device input buffers without autotuning: with it, rehearsal epochs
    # stalled, and every run logged a warning of TensorFlow's (workarounds.py)
    plain_device_buffers()
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
    # reduce through one device: collective all-reduce keys would clash
    # between rehearsals of different sizes in one process (tests do that)
    return tf.distribute.MirroredStrategy(
        devices[:replicas], cross_device_ops=tf.distribute.ReductionToOneDevice())


def data_parallel(replicas=None):
    """Keras on JAX: DataParallel over the TPU's devices, or `replicas` JAX CPU devices that
    rehearse it (jax_route.py)."""
    from pyimagesearch import jax_route

    cpu_only()  # TensorFlow only reads the data here: no GPU of its own, quietly
    return jax_route.strategy(replicas)


@contextlib.contextmanager
def tpu_errors(tpu=None):
    """Around the article's TPU set-up: whatever fails ends the run in one line.

    with strategies.tpu_errors(args.tpu):
        tpu = tf.distribute.cluster_resolver.TPUClusterResolver()
        ...

    Inside the block the article's `TPUClusterResolver()` finds `tpu` (--tpu:
    a name or a grpc:// address; None: what Colab, Kaggle or a TPU VM
    provide) within tpu_lookup.TPU_LOOKUP_TIMEOUT_S and checks that something
    answers at its address; TensorFlow's own class is back when the block
    ends. The lookup, its time limit and the one-line failures are
    tpu_lookup.py's, loaded by the TPU scripts only.
    """
    from pyimagesearch.tpu_lookup import tpu_errors as around_tpu_set_up

    resolvers = tf.distribute.cluster_resolver
    resolver = resolvers.TPUClusterResolver
    with around_tpu_set_up(tpu) as find:
        resolvers.TPUClusterResolver = lambda: find(resolver)
        try:
            yield
        finally:
            resolvers.TPUClusterResolver = resolver


def multi_worker(cluster, rehearse=None, startup_timeout_s=None):
    """MultiWorkerMirroredStrategy for this process's place in `cluster`.

    Each worker trains on its GPUs; with `rehearse` K it trains on K logical
    CPU devices instead, so the same command rehearses a cluster of GPU
    machines on CPUs. Must run before TensorFlow's runtime starts. It waits
    for every worker to start, first where SIGTERM and Ctrl-C still act,
    then inside the strategy; after `startup_timeout_s` seconds in either
    (None: for ever) it gives up with one line naming who is missing.
    """
    from pyimagesearch.cluster import collective_communication, wait_for_peers
    from pyimagesearch.workarounds import local_cpu_devices, plain_device_buffers

    wait_for_peers(cluster, float("inf") if startup_timeout_s is None else startup_timeout_s)
    filter_collective_noise(this_process)  # a lost peer is one line, not TensorFlow's gRPC errors too
    if rehearse:
        cpu_only()
        plain_device_buffers()  # as in rehearsal()
        if rehearse > 1:
            cpu = tf.config.list_physical_devices("CPU")[0]
            tf.config.set_logical_device_configuration(
                cpu, [tf.config.LogicalDeviceConfiguration()] * rehearse)
    else:
        check_gpus()
    # no per-collective timeout (TensorFlow calls it a debugging aid: a thread
    # per collective); a lost peer is noticed by the coordination service
    options = tf.distribute.experimental.CommunicationOptions(
        implementation=collective_communication(rehearse))
    with local_cpu_devices(rehearse):
        strategy = _while_peers_start(
            lambda: tf.distribute.MultiWorkerMirroredStrategy(communication_options=options),
            cluster, startup_timeout_s)
    expected = cluster.workers * (rehearse or 1)  # every worker has as many devices
    if rehearse and strategy.num_replicas_in_sync != expected:
        raise UserError(f"the rehearsal has {strategy.num_replicas_in_sync} replicas, "
                        f"expected {expected}")
    print(f"[INFO] {cluster.task_type} {cluster.task_index} of a {cluster.workers}-worker "
          "cluster; custom loop, since Keras 3's fit does not run under "
          "MultiWorkerMirroredStrategy")
    return strategy


def _while_peers_start(build, cluster, timeout_s):
    """`build()`, which waits until every worker has started, for `timeout_s` at most."""
    from pyimagesearch.cluster import gave_up_waiting, missing_peers
    from pyimagesearch.workarounds import bound_cluster_start

    if timeout_s is not None:
        bound_cluster_start(timeout_s)
    late = (tf.errors.DeadlineExceededError, tf.errors.UnavailableError)
    try:
        with native_stderr_quiet(late):  # our line says what TensorFlow logs at length
            return build()
    except late as error:
        raise gave_up_waiting(cluster, timeout_s, missing_peers(cluster),
                              first_line(error)) from error


def for_device(device, rehearse=None, tpu=None):
    """The strategy train_<device>.py builds, for the benchmarks in tools/ ("cpu", "gpu", "tpu").

    With `rehearse` N, N logical CPU devices stand in for the GPUs or TPU cores.
    """
    if device not in DEVICES:  # runtime.HARDWARE's
        raise UserError(f"unknown device {device!r}; choose cpu, gpu or tpu")
    if rehearse:
        return rehearsal(rehearse)
    if device == "cpu":
        cpu_only()
        return tf.distribute.get_strategy()  # train_cpu.py's: TensorFlow's default
    if device == "gpu":
        check_gpus()
        return tf.distribute.MirroredStrategy()
    with tpu_errors(tpu):
        found = tf.distribute.cluster_resolver.TPUClusterResolver()
        tf.config.experimental_connect_to_cluster(found)
        tf.tpu.experimental.initialize_tpu_system(found)
    return tf.distribute.TPUStrategy(found)


# --- The two speed levers TensorFlow's performance guide puts first: mixed precision and XLA ---
# Mixed precision computes in 16 bits where it is safe and keeps the variables
# in float32. `mixed_float16` is for NVIDIA GPUs with tensor cores (Volta and
# later); its narrow range needs loss scaling (Keras' `LossScaleOptimizer`,
# which multiplies the loss before the gradients and divides them after).
# `mixed_bfloat16` has float32's range and needs none: it is what TPUs compute
# in natively, and what recent CPUs (AVX512-BF16, AMX) and Ampere-or-later GPUs
# support. The model's last layer and the loss stay float32 (see AutoEncoder and
# loss.per_image_mse), so the saved model's output is float32.
#
# XLA (`--jit-compile`) compiles the train step into fused kernels.
PRECISIONS = ("float32", "mixed_float16", "mixed_bfloat16")


def set_precision(name):
    """Set Keras' global dtype policy; call it before the model is built."""
    keras.mixed_precision.set_global_policy(name)


def with_loss_scaling(optimizer, name):
    """Wrap `optimizer` in a LossScaleOptimizer where float16 needs it.

    Keras would wrap it inside `compile` too; wrapping here makes it the same
    optimizer for `fit` and the custom loop, which scales its loss itself.
    """
    if name == "mixed_float16":
        return ReplicasAgreeLossScaleOptimizer(optimizer)
    return optimizer


@keras.saving.register_keras_serializable(package="pyimagesearch")
class ReplicasAgreeLossScaleOptimizer(keras.optimizers.LossScaleOptimizer):
    """Keras' LossScaleOptimizer, with every replica taking the same skip decision.

    Keras 3.15 decides whether gradients overflowed from each replica's own
    gradients before they are all-reduced: under MirroredStrategy from the
    first replica's alone (so another replica's inf reaches the update and
    stays in Adam's state), under MultiWorkerMirroredStrategy per replica (so
    one worker enters the all-reduce inside `apply` while another skips it,
    and both hang). Here the replicas all-reduce their "finite" flags first.
    On Keras' JAX backend it is Keras' own: one jitted step sees the gradient
    of the whole global batch, so every device takes the same decision.
    """

    def check_finite(self, grads):
        finite = super().check_finite(grads)
        if keras.backend.backend() != "tensorflow":
            return finite
        context = tf.distribute.get_replica_context()
        if context is None or context.num_replicas_in_sync == 1:
            return finite
        overflowed = context.all_reduce(tf.distribute.ReduceOp.SUM,
                                        tf.cast(tf.logical_not(finite), tf.float32))
        return tf.equal(overflowed, 0.0)
