"""terminal.py, workarounds.py and strategies.py: captured native output, and clear failures without hardware.

No accelerator is needed: TensorFlow's log lines are fed in as text, GPUs and
TensorFlow's hooks are replaced by fakes, and a crash inside the quiet block is
staged in a child process. The TPU lookup's tests are in test_tpu_lookup.py.
"""
import os
import signal
import subprocess
import sys

import pytest
import tensorflow as tf

from pyimagesearch import strategies as strategy
from pyimagesearch import workarounds
from pyimagesearch import cluster as cluster_module
from pyimagesearch.cluster import collective_communication
from pyimagesearch.errors import UserError
from pyimagesearch import terminal
from pyimagesearch.terminal import native_stderr_quiet

from test_tpu_lookup import _fake_resolver, _tpu_set_up, no_tpu_env  # noqa: F401  (no_tpu_env: a fixture)

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
    assert strategy.no_gpu_message(log) == NO_GPU


@pytest.mark.parametrize("log, said, advice", [
    (NO_CUDART + DLOPEN, '"Cannot dlopen some GPU libraries."',
     'pip install "tensorflow[and-cuda]"'),
    (DRIVER_MISMATCH, "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH", "nvidia-smi"),
    (TOO_OLD, "The minimum required Cuda capability is 6.0.", "--rehearse N"),
])
def test_a_gpu_tensorflow_cannot_use_is_not_called_missing(log, said, advice):
    message = strategy.no_gpu_message(log)
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
    workarounds.warn_hook_missing.cache_clear()
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


def test_real_gpu_and_tpu_strategies_get_no_private_hook(unhooked, monkeypatch, no_tpu_env,  # noqa: F811
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
