"""terminal.py, workarounds.py and strategies.py: captured native output, and clear failures without hardware.

No accelerator is needed: TensorFlow's log lines are fed in as text, the TPU
resolver and TPU calls are replaced by fakes that fail the way TensorFlow
does, and a crash inside the quiet block is staged in a child process.
"""
import os
import signal
import subprocess
import sys
import threading

import pytest
import tensorflow as tf

import train_tpu
from pyimagesearch import strategies as strategy
from pyimagesearch import tpu_lookup, workarounds
from pyimagesearch import cluster as cluster_module
from pyimagesearch.cluster import collective_communication
from pyimagesearch.errors import UserError
from pyimagesearch import terminal
from pyimagesearch.terminal import native_stderr_quiet

NO_GPU = ("no GPU is visible to TensorFlow; use --rehearse N to rehearse this run "
          "on N logical CPU devices")

# Loads terminal.py alone (no TensorFlow import, so the child starts fast), then
# runs the block named by argv[2].
CHILD = """
import importlib.util, os, sys
spec = importlib.util.spec_from_file_location("quiet", sys.argv[1])
quiet = importlib.util.module_from_spec(spec)
spec.loader.exec_module(quiet)
with quiet.native_stderr_quiet():
    os.write(2, b"F0000 check_op.cc:1] Check failed: the last words\\n")
    if sys.argv[2] == "abort":
        os.abort()
try:
    os.waitpid(-1, os.WNOHANG)
    print("a child process is left")
except ChildProcessError:
    print("no child process left")
"""


def _run_child(block):
    """Run CHILD with `block` ("abort" or "normal"), capturing its real stderr."""
    env = {k: v for k, v in os.environ.items() if k != terminal.VERBOSE_ENV}
    return subprocess.run([sys.executable, "-c", CHILD, terminal.__file__, block],
                          capture_output=True, text=True, timeout=60, env=env)


@pytest.fixture
def capturing(monkeypatch):
    """Make sure the escape hatch is off, whatever the caller's environment."""
    monkeypatch.delenv(terminal.VERBOSE_ENV, raising=False)


def test_abort_inside_the_block_still_shows_its_last_words():
    result = _run_child("abort")
    assert result.returncode == -signal.SIGABRT
    assert "Check failed: the last words" in result.stderr


def test_a_normal_block_stays_quiet_and_leaves_no_process():
    result = _run_child("normal")
    assert result.returncode == 0, result.stderr
    assert "the last words" not in result.stderr
    assert result.stdout.strip() == "no child process left"


def test_the_caller_can_read_what_was_captured(capturing, capfd):
    with native_stderr_quiet() as captured:
        os.write(2, b"W0000 gpu_device.cc:1] native line\n")
    assert captured.text() == "W0000 gpu_device.cc:1] native line\n"
    assert "native line" not in capfd.readouterr().err


@pytest.mark.parametrize("error, replayed", [(ValueError, False), (KeyError, True)])
def test_an_error_replays_the_capture_unless_expected(capturing, capfd, error, replayed):
    with pytest.raises(error):
        with native_stderr_quiet(expected=(ValueError,)):
            os.write(2, b"native line\n")
            raise error("boom")
    assert capfd.readouterr().err.count("native line") == (1 if replayed else 0)


def test_verbose_env_captures_nothing(monkeypatch, capfd):
    monkeypatch.setenv(terminal.VERBOSE_ENV, "1")
    with native_stderr_quiet() as captured:
        os.write(2, b"native line\n")
    assert captured.text() == ""
    assert "native line" in capfd.readouterr().err


# What TensorFlow logs while looking for GPUs, in both of its log formats.
CUINIT_NO_DRIVER_221 = ("E0000 00:00:1796065747.163952    7071 cuda_platform.cc:52] "
                        "failed call to cuInit: INTERNAL: CUDA error: Failed call to "
                        "cuInit: UNKNOWN ERROR (303)\n")
CUINIT_NO_DRIVER_220 = ("2026-11-30 19:11:58.563739: E external/local_xla/xla/stream_"
                        "executor/cuda/cuda_platform.cc:51] failed call to cuInit: "
                        "INTERNAL: CUDA error: Failed call to cuInit: "
                        "UNKNOWN ERROR (303)\n")
CUINIT_NO_DEVICE = ("E0000 00:00:1.2 7 cuda_platform.cc:52] failed call to cuInit: "
                    "INTERNAL: CUDA error: Failed call to cuInit: CUDA_ERROR_NO_DEVICE: "
                    "no CUDA-capable device is detected\n")
NO_CUDART = ("I0000 00:00:1.2 7 cudart_stub.cc:31] Could not find cuda drivers on "
             "your machine, GPU will not be used.\n")
DLOPEN = ("W0000 00:00:1.2 7 gpu_device.cc:2344] Cannot dlopen some GPU libraries. "
          "Please make sure the missing libraries mentioned above are installed "
          "properly if you would like to use GPU. Follow the guide at "
          "https://www.tensorflow.org/install/gpu for how to download and setup the "
          "required libraries for your platform.\nSkipping registering GPU devices...\n")
DRIVER_MISMATCH = ("E0000 00:00:1.2 7 cuda_platform.cc:52] failed call to cuInit: "
                   "INTERNAL: CUDA error: Failed call to cuInit: "
                   "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH: system has unsupported display "
                   "driver / cuda driver combination\n")
TOO_OLD = ("I0000 00:00:1.2 7 gpu_device.cc:2100] Ignoring visible gpu device "
           "(device: 0, name: Tesla K40c, compute capability: 3.5) with Cuda compute "
           "capability 3.5. The minimum required Cuda capability is 6.0.\n")


@pytest.mark.parametrize("log", ["", CUINIT_NO_DRIVER_221, CUINIT_NO_DRIVER_220,
                                 CUINIT_NO_DEVICE, NO_CUDART + CUINIT_NO_DRIVER_221])
def test_no_gpu_at_all_gets_the_plain_message(log):
    assert strategy._no_gpu_message(log) == NO_GPU


@pytest.mark.parametrize("log, said, advice", [
    (NO_CUDART + DLOPEN, '"Cannot dlopen some GPU libraries."',
     'pip install "tensorflow[and-cuda]"'),
    (DRIVER_MISMATCH, "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH", "nvidia-smi"),
    (TOO_OLD, "The minimum required Cuda capability is 6.0.", "--rehearse N"),
])
def test_a_gpu_tensorflow_cannot_use_is_not_called_missing(log, said, advice):
    message = strategy._no_gpu_message(log)
    assert "no GPU is visible" not in message and "\n" not in message
    assert said in message and advice in message and "--rehearse N" in message


def test_gpu_strategy_puts_what_tensorflow_logged_in_the_error(capturing, monkeypatch,
                                                               capfd):
    def list_physical_devices(kind):
        os.write(2, (NO_CUDART + DLOPEN).encode())  # as TensorFlow does, on fd 2
        return []

    monkeypatch.setattr(tf.config, "list_physical_devices", list_physical_devices)
    with pytest.raises(UserError, match=r"cannot load its CUDA libraries") as error:
        strategy.check_gpus()
    assert 'pip install "tensorflow[and-cuda]"' in str(error.value)
    assert "Cannot dlopen" not in capfd.readouterr().err  # said once, by us


@pytest.fixture
def no_tpu_env(monkeypatch):
    """No TPU name from the environment, so messages name only what the test passes."""
    for name in ("TPU_NAME", "KUBE_GOOGLE_CLOUD_TPU_ENDPOINTS", "TPU_CONFIG"):
        monkeypatch.delenv(name, raising=False)


def _fake_resolver(monkeypatch, init, devices=("CPU", "TPU_SYSTEM", "TPU")):
    """Replace TPUClusterResolver by a class whose constructor runs `init(tpu)`, on a
    machine where TensorFlow lists logical devices of the types in `devices`."""
    class FakeResolver:
        def __init__(self, tpu=None):
            init(tpu)

        def master(self):
            return ""  # as on a TPU VM: no address to probe (none but loopback here)

    monkeypatch.setattr(tf.distribute.cluster_resolver, "TPUClusterResolver",
                        FakeResolver)
    monkeypatch.setattr(tpu_lookup, "local_devices", lambda: [
        tf.config.LogicalDevice(f"/device:{kind}:0", kind) for kind in devices])


def _tpu_set_up(tpu, folder):
    """Run train_tpu.py with --tpu `tpu`: here its TPU set-up fails before any training."""
    train_tpu.main(["--tpu", tpu, "--output-dir", str(folder)])


def test_a_tpu_that_cannot_be_resolved_is_not_found(monkeypatch, no_tpu_env, tmp_path):
    def init(tpu):
        raise ValueError("Please provide a TPU Name to connect to.")

    _fake_resolver(monkeypatch, init)
    with pytest.raises(UserError) as error:
        _tpu_set_up("my-tpu", tmp_path)
    assert str(error.value) == (
        "no TPU found (Please provide a TPU Name to connect to.); pass --tpu NAME, "
        "or use --rehearse 8 to rehearse on 8 logical CPU devices")


def test_a_tpu_lookup_that_hangs_is_given_up(monkeypatch, no_tpu_env, tmp_path):
    answer = threading.Event()  # never set until the test is over
    _fake_resolver(monkeypatch, lambda tpu: answer.wait())
    monkeypatch.setattr(tpu_lookup, "TPU_LOOKUP_TIMEOUT_S", 0.01)
    try:
        with pytest.raises(UserError) as error:
            _tpu_set_up("my-tpu", tmp_path)
    finally:
        answer.set()  # let the abandoned lookup thread end
    message = str(error.value)
    assert message.startswith("gave up looking for TPU 'my-tpu' after 0.01 s waiting "
                              "for Google Cloud's metadata server")
    assert "--tpu grpc://" in message and "--rehearse 8" in message


def test_a_tpu_in_use_is_found_but_not_initialised(monkeypatch, no_tpu_env, tmp_path):
    _fake_resolver(monkeypatch, lambda tpu: None)
    monkeypatch.setattr(tf.config, "experimental_connect_to_cluster", lambda r: None)

    def initialize_tpu_system(resolver):
        raise tf.errors.AbortedError(
            None, None, "The TPU is already in use by process with pid 4242. Not "
            "attempting to load libtpu.so in this process.\nmore detail")

    monkeypatch.setattr(tf.tpu.experimental, "initialize_tpu_system",
                        initialize_tpu_system)
    with pytest.raises(UserError) as error:
        _tpu_set_up("local", tmp_path)
    assert str(error.value) == (
        "the TPU on this machine was found but could not be initialised (TensorFlow "
        "said: The TPU is already in use by process with pid 4242. Not attempting to "
        "load libtpu.so in this process.); end the process that holds it, or use "
        "--rehearse 8 to rehearse on 8 logical CPU devices")


@pytest.mark.parametrize("prepared, runtime", [
    ("PJRT through /site/libtpu/libtpu.so (libtpu 0.0.18)",
     "TensorFlow's PJRT runtime, set up as PJRT through /site/libtpu/libtpu.so (libtpu 0.0.18)"),
    ("libtpu is not installed: pip install -r requirements-tpu.txt",
     "libtpu is not installed, and this TPU needs it"),
    ("no TPU that needs PJRT", "on a TPU v5e, v5p or v6e, NEXT_PLUGGABLE_DEVICE_USE_C_API=true "
     "and TF_PLUGGABLE_DEVICE_LIBRARY_PATH=<libtpu's library> set before TensorFlow is "
     "imported (train_tpu.py does it; on v2-v4 PYIMAGESEARCH_TPU_RUNTIME=pjrt asks for it)"),
])
def test_a_tpu_that_cannot_be_initialised_names_the_causes_a_user_can_act_on(
        monkeypatch, no_tpu_env, tmp_path, prepared, runtime):
    from pyimagesearch import tpu_runtime

    monkeypatch.setattr(tpu_runtime, "prepared", prepared)
    _fake_resolver(monkeypatch, lambda tpu: None)
    monkeypatch.setattr(tf.config, "experimental_connect_to_cluster", lambda r: None)

    # what TensorFlow answers where libtpu never loaded: a plain tensorflow
    # build on Colab's v2-8 (googlecolab/colabtools#5203, tensorflow/tensorflow#96203)
    def initialize_tpu_system(resolver):
        raise tf.errors.InvalidArgumentError(
            None, None, "No OpKernel was registered to support Op 'ConfigureDistributedTPU' "
            "used by {{node ConfigureDistributedTPU}} with these attrs: []\nRegistered "
            "devices: [CPU]")

    monkeypatch.setattr(tf.tpu.experimental, "initialize_tpu_system", initialize_tpu_system)
    with pytest.raises(UserError) as error:
        _tpu_set_up("local", tmp_path)
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith("the TPU on this machine was found but could not be initialised "
                              "(TensorFlow said: No OpKernel was registered to support Op "
                              "'ConfigureDistributedTPU'")
    assert f"likely causes: {runtime}; a libtpu that does not match this TensorFlow " \
           "(pip install -r requirements-tpu.txt installs the pair); another process " \
           "holding the chips (a second notebook, an earlier run: end it or restart the " \
           "runtime); or use --rehearse 8" in message


# What tensorflow-tpu 2.20.0 with libtpu 0.0.18 raised from initialize_tpu_system on a
# host without chips and without PJRT (docs/tpus.md): the frame first, the cause last
GRAPH_ERROR = ("Graph execution error:\n\nDetected at node disconnect_tpu_host/_1 defined at "
               "(most recent call last):\n<stack traces unavailable>\nRET_CHECK failure "
               "(learning/45eac/google/xla/tpu_node_interfaces.cc:432) *platform \n\t "
               "[[{{node disconnect_tpu_host/_1}}]] [Op:__inference__tpu_init_fn_4]")
# the same frame where the node's stack is known (error_interpolation.py)
GRAPH_ERROR_WITH_STACK = (
    "Graph execution error:\n\nDetected at node 'ConfigureDistributedTPU' defined at (most "
    "recent call last):\n  File \"train_tpu.py\", line 38, in main\n    "
    "tf.tpu.experimental.initialize_tpu_system(tpu)\nNode: 'ConfigureDistributedTPU'\n"
    "No TPU platform found.")


@pytest.mark.parametrize("text, cause", [
    (GRAPH_ERROR, "RET_CHECK failure (learning/45eac/google/xla/tpu_node_interfaces.cc:432) "
                  "*platform"),
    (GRAPH_ERROR_WITH_STACK, "No TPU platform found."),
    ("The TPU is already in use by process with pid 4242.\nmore detail",
     "The TPU is already in use by process with pid 4242."),
    ("Graph execution error:\n\nDetected at node X defined at (most recent call last):",
     "Graph execution error:"),  # nothing but the frame: its first line, as before
    ("", "InternalError"),
])
def test_the_cause_is_told_from_tensorflows_frame_around_it(text, cause):
    assert tpu_lookup.tensorflow_cause(tf.errors.InternalError(None, None, text)) == cause


def test_a_tpu_that_fails_inside_its_graph_gives_the_cause_in_one_line(
        monkeypatch, no_tpu_env, tmp_path):
    _fake_resolver(monkeypatch, lambda tpu: None)
    monkeypatch.setattr(tf.config, "experimental_connect_to_cluster", lambda r: None)

    def initialize_tpu_system(resolver):
        raise tf.errors.InternalError(None, None, GRAPH_ERROR)

    monkeypatch.setattr(tf.tpu.experimental, "initialize_tpu_system", initialize_tpu_system)
    with pytest.raises(UserError) as error:
        _tpu_set_up("local", tmp_path)
    message = str(error.value)
    assert "\n" not in message and "Graph execution error" not in message
    assert message.startswith("the TPU on this machine was found but could not be initialised "
                              "(TensorFlow said: RET_CHECK failure (learning/45eac/google/xla/"
                              "tpu_node_interfaces.cc:432) *platform); likely causes")


def test_no_tpu_device_is_said_before_anything_initialises_the_tpu(monkeypatch, no_tpu_env,
                                                                  tmp_path):
    # the devices tensorflow-tpu 2.20.0 listed on a host without chips, with libtpu loaded,
    # PJRT or not; with PJRT, initialize_tpu_system then died of SIGSEGV (docs/tpus.md)
    _fake_resolver(monkeypatch, lambda tpu: None, devices=("CPU", "TPU_SYSTEM"))
    monkeypatch.setattr(tf.config, "experimental_connect_to_cluster",
                        lambda r: pytest.fail("connected without a TPU device"))
    monkeypatch.setattr(tf.tpu.experimental, "initialize_tpu_system",
                        lambda r: pytest.fail("initialised without a TPU device"))
    with pytest.raises(UserError) as error:
        _tpu_set_up("local", tmp_path)
    message = str(error.value)
    assert message.startswith("TensorFlow lists no TPU device on this machine (only CPU, "
                              "TPU_SYSTEM), so its TPU cannot be initialised; likely causes: ")
    assert message.endswith("or use --rehearse 8 to rehearse on 8 logical CPU devices")


def test_no_device_check_for_a_tpu_at_an_address(monkeypatch):
    """A TPU Node's devices are remote: what answers at its address is the check."""
    class Remote:
        def __init__(self, tpu=None):
            pass

        def master(self):
            return "grpc://10.0.0.2:8470"

    monkeypatch.setattr(tpu_lookup, "answers", lambda address, timeout_s: True)
    monkeypatch.setattr(tpu_lookup, "local_devices", lambda: pytest.fail("devices listed"))
    assert isinstance(tpu_lookup._find_tpu(Remote, "grpc://10.0.0.2:8470"), Remote)


def _machine(root, device_file):
    """A TPU VM without a readable /sys, as in a container: one chip device file."""
    (root / device_file).parent.mkdir(parents=True, exist_ok=True)
    (root / device_file).write_text("")
    return root


@pytest.mark.parametrize("device_file", ["dev/vfio/3", "dev/accel2", "dev/vfio/0",
                                         "dev/accel0"])
def test_a_tpu_vm_is_local_whatever_chip_device_it_shows(monkeypatch, no_tpu_env, tmp_path,
                                                          device_file):
    from pyimagesearch import runtime as host

    monkeypatch.setenv(host.ROOT_ENV, str(_machine(tmp_path, device_file)))
    asked = []
    assert tpu_lookup._tpu_resolver(_colab_resolver(asked), None) == "local"
    assert asked == ["local"]
    assert tpu_lookup._tpu_resolver(_colab_resolver(asked), "my-tpu") == "my-tpu"  # --tpu wins


def test_without_chips_the_plain_lookup_decides(monkeypatch, no_tpu_env, tmp_path):
    from pyimagesearch import runtime as host

    monkeypatch.setenv(host.ROOT_ENV, str(_machine(tmp_path, "dev/vfio/vfio")))  # no chip
    asked = []
    with pytest.raises(ValueError, match="Please provide a TPU Name"):
        tpu_lookup._tpu_resolver(_colab_resolver(asked), None)
    assert asked == [None]


def _colab_resolver(asked):
    """TPUClusterResolver as on Colab's and Kaggle's TPU VMs: no name, no TPU; records calls."""
    def resolver(tpu=None):
        asked.append(tpu)
        if tpu is None:
            raise ValueError("Please provide a TPU Name to connect to.")
        return tpu
    return resolver


def test_a_tpu_that_cannot_be_reached_says_so(monkeypatch, no_tpu_env, tmp_path):
    _fake_resolver(monkeypatch, lambda tpu: None)

    def connect(resolver):
        raise tf.errors.UnavailableError(None, None, "failed to connect to all addresses")

    monkeypatch.setattr(tf.config, "experimental_connect_to_cluster", connect)
    with pytest.raises(UserError, match=r"^could not connect to TPU 'grpc://10\.0\.0\.2"
                                        r":8470' \(TensorFlow said: failed to connect"):
        _tpu_set_up("grpc://10.0.0.2:8470", tmp_path)


@pytest.mark.parametrize("chips, said", [
    (0, "where the TPU should be; on a TPU VM pass --tpu local, else check its address"),
    # TPU_NAME naming the VM itself: TPUClusterResolver gives grpc://<its ip>:8470,
    # where nothing listens; this machine's chips are local devices
    (4, "where the TPU should be; this machine has TPU chips: on a TPU VM pass --tpu local"),
])
def test_a_tpu_address_where_nothing_answers_is_one_line(monkeypatch, tmp_path, chips, said):
    import re
    import socket

    from pyimagesearch import runtime as host

    with socket.create_server(("127.0.0.1", 0)) as probe:
        closed = probe.getsockname()[1]
    address = f"grpc://127.0.0.1:{closed}"
    resolver = tf.distribute.cluster_resolver.TPUClusterResolver
    monkeypatch.setattr(tpu_lookup, "_tpu_resolver", lambda found, tpu: resolver(tpu=address))
    monkeypatch.setattr(tpu_lookup, "detect", lambda: host.Host("local", 0, chips, "v4"))
    monkeypatch.setattr(tf.config, "experimental_connect_to_cluster", None)  # never reached
    with pytest.raises(UserError, match=f"^nothing answers at {address}, {re.escape(said)}"):
        _tpu_set_up(address, tmp_path)


def test_a_tpu_at_an_ipv6_address_is_one_line_that_names_it(tmp_path):
    with pytest.raises(UserError, match=r"^TensorFlow's TPUClusterResolver cannot take the "
                                        r"IPv6 address grpc://\[::1\]:8470; give"):
        train_tpu.main(["--tpu", "grpc://[::1]:8470", "--output-dir", str(tmp_path)])


def _device_buffer_hook():
    """The module of TensorFlow's private per-device dataset hook."""
    from tensorflow.python.data.ops import multi_device_iterator_ops
    return multi_device_iterator_ops


def test_the_rehearsal_hook_exists_in_this_tensorflow():
    # if this fails, TensorFlow renamed the hook: rehearsals stall again
    assert callable(getattr(_device_buffer_hook(), "_create_device_dataset", None))


def test_the_per_worker_devices_hook_exists_in_this_tensorflow():
    # if this fails, --rehearse K > 1 under TF_CONFIG is refused with one line
    from tensorflow.python.distribute import collective_all_reduce_strategy as car

    assert callable(getattr(car.CollectiveAllReduceExtended, "_initialize_local_devices",
                            None))


def test_the_preemption_handler_hooks_exist_in_this_tensorflow():
    # if this fails, a cluster's SIGTERM no longer stops every worker at one step
    handler = tf.distribute.experimental.PreemptionCheckpointHandler
    for name in ("_stop_cluster_wise_termination_watcher_thread",
                 "_stop_poll_termination_signal_thread", "save_checkpoint_if_preempted"):
        assert callable(getattr(handler, name, None)), name
    assert workarounds.preemption_handler_acts()  # off Google Cloud it acts


def test_the_preemption_handler_is_for_clusters_only(tmp_path):
    from pyimagesearch import exits as preemption

    def never():
        raise AssertionError("not called")

    for alone in (tf.distribute.get_strategy(), strategy.rehearsal(2)):
        assert preemption.cluster_handler(alone, str(tmp_path), never, never) is None


def test_where_the_preemption_handler_does_nothing_workers_stop_alone(
        monkeypatch, tmp_path, capsys):
    from pyimagesearch import exits as preemption

    class Cluster:  # a multi-worker strategy's cluster, as far as the handler looks
        cluster_resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
            tf.train.ClusterSpec({"worker": ["127.0.0.1:1", "127.0.0.1:2"]}),
            task_type="worker", task_id=0)

    monkeypatch.setattr(tf.distribute, "MultiWorkerMirroredStrategy", Cluster)
    monkeypatch.setattr(workarounds, "preemption_handler_acts", lambda: False)
    assert preemption.cluster_handler(Cluster(), str(tmp_path), None, None) is None
    assert "does nothing on Google Cloud CPU VMs" in capsys.readouterr().out


def test_cpu_strategies_get_plain_device_buffers(monkeypatch):
    rehearsal = strategy.rehearsal(2)
    ops = _device_buffer_hook()
    patched = ops._create_device_dataset
    assert getattr(patched, "_pyimagesearch", False)
    made = []

    def spy(*args, **kwargs):
        made.append(patched(*args, **kwargs))
        return made[-1]

    # the patched hook is the one MirroredStrategy's input pipeline calls
    monkeypatch.setattr(ops, "_create_device_dataset", spy)
    dataset = tf.data.Dataset.range(8).batch(4)
    next(iter(rehearsal.experimental_distribute_dataset(dataset)))
    assert made and all(ds.options().autotune.enabled is False for ds in made)
    # no rewrite of the generator, so no "will not be optimized" warning
    assert all(ds.options().experimental_optimization.apply_default_optimizations is False
               for ds in made)


def test_a_missing_rehearsal_hook_is_reported_once(monkeypatch, capsys):
    monkeypatch.delattr(_device_buffer_hook(), "_create_device_dataset")
    # no public way: the warning is said once per process, and an earlier test may have
    # said it already; forget that it was
    workarounds._warn_hook_missing.cache_clear()
    workarounds.plain_device_buffers()
    workarounds.plain_device_buffers()
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and "rehearsal epochs may stall" in lines[0]


def test_several_gpu_machines_all_reduce_with_nccl(monkeypatch):
    # no GPU here: TensorFlow is told it has one, and the strategy is recorded
    made = {}

    class Recorded:
        def __init__(self, communication_options=None):
            made["options"] = communication_options

    monkeypatch.setattr(tf.config, "list_physical_devices",
                        lambda kind=None: ["GPU:0"] if kind == "GPU" else [])
    monkeypatch.setattr(tf.distribute, "MultiWorkerMirroredStrategy", Recorded)
    monkeypatch.setattr(cluster_module, "wait_for_peers", lambda cluster, timeout_s: None)
    cluster = type("Cluster", (), {"workers": 2, "task_type": "worker", "task_index": 0})()
    strategy.multi_worker(cluster)
    nccl = tf.distribute.experimental.CommunicationImplementation.NCCL
    assert made["options"].implementation == nccl
    # a rehearsal on CPUs keeps TensorFlow's default
    assert collective_communication(rehearse=1).name == "AUTO"


class _Built(Exception):
    """Raised by a fake strategy's constructor: the set-up got that far."""


class _FakeGpus:
    """MirroredStrategy over two GPUs, as far as the scripts look before training."""

    num_replicas_in_sync = 2

    def __init__(self, *args, **kwargs):
        self.extended = type("Extended", (), {"worker_devices": ("/gpu:0", "/gpu:1")})()


def _two_gpus(monkeypatch, strategy_class):
    """TensorFlow sees two GPUs; MirroredStrategy() is `strategy_class`."""
    real = tf.config.list_physical_devices
    monkeypatch.setattr(tf.config, "list_physical_devices", lambda kind=None: [
        "GPU:0", "GPU:1"] if kind == "GPU" else real(kind))
    monkeypatch.setattr(tf.distribute, "MirroredStrategy", strategy_class)


@pytest.fixture
def unhooked(monkeypatch):
    """TensorFlow's own per-device dataset function, as a process starts with it."""
    ops = _device_buffer_hook()
    original = getattr(ops._create_device_dataset, "_original", ops._create_device_dataset)
    monkeypatch.setattr(ops, "_create_device_dataset", original)
    return ops


def test_real_gpu_and_tpu_strategies_get_no_private_hook(unhooked, monkeypatch, no_tpu_env,
                                                         tmp_path):
    import train_gpu

    original, mirrored = unhooked._create_device_dataset, tf.distribute.MirroredStrategy

    def refuse(*args, **kwargs):
        raise _Built()

    _two_gpus(monkeypatch, refuse)
    with pytest.raises(_Built):
        train_gpu.main(["--output-dir", str(tmp_path)])
    assert unhooked._create_device_dataset is original
    _fake_resolver(monkeypatch, lambda tpu: None)
    monkeypatch.setattr(tf.config, "experimental_connect_to_cluster", lambda r: None)
    monkeypatch.setattr(tf.tpu.experimental, "initialize_tpu_system", lambda r: None)
    monkeypatch.setattr(tf.distribute, "TPUStrategy", refuse)
    with pytest.raises(_Built):
        _tpu_set_up("local", tmp_path)
    assert unhooked._create_device_dataset is original
    monkeypatch.setattr(tf.distribute, "MirroredStrategy", mirrored)
    strategy.rehearsal(2)  # a rehearsal, on the CPU, does get it
    assert getattr(unhooked._create_device_dataset, "_pyimagesearch", False)


def test_xla_with_fit_on_several_gpus_is_refused_and_the_custom_loop_is_not(monkeypatch,
                                                                           tmp_path):
    import train_gpu

    _two_gpus(monkeypatch, _FakeGpus)
    with pytest.raises(UserError, match=r"^--jit-compile with fit cannot train on 2 "
                                        r"replicas: .*add --loop custom"):
        train_gpu.main(["--jit-compile", "--output-dir", str(tmp_path)])
    # the custom loop compiles each GPU's step on its own: past the levers'
    # check, the fake strategy's missing parts are what stops it
    with pytest.raises(AttributeError):
        train_gpu.main(["--jit-compile", "--loop", "custom", "--data-source", "sample",
                        "--output-dir", str(tmp_path)])


class _TpuNode:
    """TPUStrategy on a TPU Node, as far as cli.plan looks: 8 cores behind a grpc:// address."""

    num_replicas_in_sync = 8

    def __init__(self, address="grpc://10.0.0.2:8470"):
        self.cluster_resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=address)


@pytest.mark.parametrize("flags, named", [
    (["--backup-dir", "backup"], "--backup-dir backup"),
    (["--logdir", "logs"], "--logdir logs"),
    (["--profile-steps", "1,2"], "--logdir logs"),
    (["--data-source", "tfrecord", "--data-dir", "records"], "--data-dir records")])
def test_a_tpu_node_refuses_local_folders_its_host_cannot_see(flags, named, tmp_path,
                                                              monkeypatch):
    from pyimagesearch import cli

    monkeypatch.chdir(tmp_path)
    if "--data-source" not in flags:
        flags = flags + ["--data-source", "sample"]
    args = cli.parse_args("tpu", "", flags)
    with pytest.raises(UserError, match=rf"^a TPU Node \(grpc://10\.0\.0\.2:8470\) reads and "
                                        rf"writes through its own host.*{named} must be in a "
                                        r"bucket \(gs://\.\.\.\)"):
        cli.plan("tpu", args, _TpuNode())


def test_a_tpu_node_takes_buckets_and_the_sample_and_a_tpu_vm_takes_anything(tmp_path,
                                                                            monkeypatch):
    from pyimagesearch import cli

    monkeypatch.chdir(tmp_path)
    node = cli.tpu_node(_TpuNode())
    assert node == "grpc://10.0.0.2:8470"
    buckets = cli.parse_args("tpu", "", ["--backup-dir", "ram://b/backup", "--logdir",
                                         "ram://b/logs", "--data-source", "sample"])
    from pyimagesearch.plan import Settings

    cli.check_tpu_node_paths(Settings.from_args(buckets), node)  # no complaint
    assert cli.tpu_node(_TpuNode("local")) is None  # a TPU VM: its own disk
    assert cli.tpu_node(strategy.rehearsal(2)) is None


def test_a_tpu_node_refuses_mnist_prepared_on_this_machine(tmp_path, monkeypatch):
    from pyimagesearch import cli, sources

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sources, "tfds_prepared", lambda name, data_dir: True)
    monkeypatch.setattr(sources, "is_stand_in", lambda name, data_dir: False)
    args = cli.parse_args("tpu", "", ["--data-dir", str(tmp_path / "tfds")])
    with pytest.raises(UserError, match=r"cannot read mnist prepared on this machine's disk "
                                        r".*--data-dir gs://"):
        cli.plan("tpu", args, _TpuNode())


@pytest.mark.parametrize("source", ["auto", "tfds"])
def test_a_tpu_node_refuses_mnist_before_downloading_it_here(tmp_path, monkeypatch, source):
    # not prepared, the network answers: tfds would download to this machine's
    # disk, which the Node's host cannot read; refused before any download
    import tensorflow_datasets as tfds

    from pyimagesearch import cli, sources

    def no_download(*args, **kwargs):
        raise AssertionError("nothing may be downloaded for a TPU Node's local data dir")

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(tfds, "load", no_download)
    monkeypatch.setattr(sources, "probe_network", lambda: {"verdict": sources.ANSWERS,
                                                           "via": "storage.googleapis.com:443"})
    args = cli.parse_args("tpu", "", ["--data-source", source, "--data-dir", "tfds"])
    with pytest.raises(UserError, match=r"cannot read mnist downloaded to this machine's "
                                        r"disk .*--data-dir gs://"):
        cli.plan("tpu", args, _TpuNode())
    assert not (tmp_path / "tfds").exists()
