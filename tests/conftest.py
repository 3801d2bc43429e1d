"""Test session set-up: four logical CPU devices, Keras on TensorFlow, the repo and tools/ on sys.path.

TensorFlow fixes its devices when its runtime starts, so the CPU is split here,
before any test runs an op. What several test files share: a run's output
names, a script's one error line, and the fixtures `in_process`, `tiny_runs`,
`tiny_disk` and `script`.
"""
import os
import pathlib
import signal
import subprocess
import sys
import types

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tools"))  # the tools are scripts: tests import them by name
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"

from pyimagesearch import host  # noqa: E402

host.prepare_tensorflow()  # as every script's first call
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

import pyimagesearch.outputs  # noqa: E402,F401  (the classes keras.saving.load_model needs)

# a shell that starts the suite in the background has it ignore Ctrl-C, and so would
# every process it starts: the tests send SIGINT and expect what Ctrl-C does
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

LOGICAL_CPUS = 4
tf.config.set_logical_device_configuration(
    tf.config.list_physical_devices("CPU")[0], [tf.config.LogicalDeviceConfiguration()] * LOGICAL_CPUS)
tf.config.set_visible_devices([], "GPU")
# the scripts' fresh processes: quiet TensorFlow, this Python, this repo
ENV = {**os.environ, "PYTHONUNBUFFERED": "1"}


def outputs_name(script_or_device, args=()):
    """The stem a run of `script_or_device` ("train_gpu.py" or "gpu") with `args` names its
    outputs with, as the script works it out from its flags."""
    from pyimagesearch import cli
    from pyimagesearch.plan import Settings, run_name

    device = os.path.basename(str(script_or_device)).removeprefix("train_").removesuffix(".py")
    parsed = cli.build_parser(device).parse_args([str(arg) for arg in args])
    return run_name(device, Settings.from_args(parsed), bool(getattr(parsed, "rehearse", None)))


def output_files(name):
    """The model, figure and run record a run called `name` writes, sorted."""
    return [f"{name}.json", f"{name}.keras", f"{name}.png"]


def one_line(result):
    """The one line a script that ended with status 2 said on stderr (asserted to be one)."""
    lines = [line for line in result.stderr.strip().splitlines() if not tensorflows(line)]
    assert result.returncode == 2 and len(lines) == 1, result.stderr[-3000:]
    return lines[0]


def saved_weights(path):
    """A saved model's weights, as NumPy arrays (keras.saving.load_model)."""
    import keras
    return [weight.numpy() for weight in keras.saving.load_model(path).weights]


def tensorflows(line):
    """Whether `line` is one of TensorFlow's, JAX's or libtpu's own native log lines (absl's
    form, or TensorFlow 2.19's and 2.20's "2026-12-06 22:32:17.115541: E external/..."; libtpu
    installed on a machine without a TPU, as a TPU VM's packages are here)."""
    import re
    return bool(re.match(r"^([IWEF]\d{4} |[\d-]+ [\d:.]+: [IWEF] |WARNING: All log messages"
                         r"|To enable the following "
                         r"instructions|E0000 |I0000 |W0000 |WARNING: Logging before InitGoogle"
                         r"|Failed to find host bounds for accelerator type: WARNING: could not"
                         r"|=== Source Location Trace: ===|learning/45eac/)", line))


def run(*args, timeout=300, env=None, cwd=REPO, **kwargs):
    """`python ARGS` as a reader runs it, in the repo: the finished process."""
    return subprocess.run([sys.executable, *map(str, args)], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout, env=env or ENV, **kwargs)


@pytest.fixture
def repo():
    return REPO


@pytest.fixture
def in_process(capfd, monkeypatch):
    """Run a script's main() here, through its one-line exit (exits.run_main), with sys.argv as
    the command line gives it; returned as subprocess.run returns a process.

    Not for runs that end in a signal or a lost peer: those leave through os._exit.
    """
    import importlib

    from pyimagesearch import exits

    def call(script, *args):
        module = importlib.import_module(os.path.splitext(os.path.basename(script))[0])
        capfd.readouterr()
        monkeypatch.setattr(sys, "argv", [script, *map(str, args)])
        handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            exits.run_main(module.main, [str(arg) for arg in args])
            status = 0
        except SystemExit as stop:
            status = stop.code if isinstance(stop.code, int) else 1
        finally:
            for sig, handler in handlers.items():
                signal.signal(sig, handler)
        out, err = capfd.readouterr()
        return types.SimpleNamespace(returncode=status, stdout=out, stderr=err)

    return call


@pytest.fixture
def tiny_disk(tmp_path):
    """mount_disk(name, size): a tmpfs of `size` at tmp_path/name, unmounted after the test;
    skipped where this process may not mount."""
    mounted = []

    def mount_disk(name, size):
        folder = tmp_path / name
        folder.mkdir()
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs",
                               str(folder)], capture_output=True, text=True)
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
        mounted.append(folder)
        return folder

    yield mount_disk
    for folder in mounted:
        subprocess.run(["umount", "-l", str(folder)], capture_output=True)


# the tiny runs' flags: every script's, then each script's own
TINY_RUN_FLAGS = ["--epochs", "2", "--steps-per-epoch", "2", "--data-source", "sample"]
TINY_RUNS = {"train_cpu.py": ["--batch-size", "32"],
             "train_gpu.py": ["--batch-size", "32", "--rehearse", "2"],
             "train_tpu.py": ["--batch-size", "64", "--rehearse", "2"]}


@pytest.fixture(scope="session")
def tiny_runs(tmp_path_factory):
    """A folder of three tiny real runs (train_cpu.py, a GPU and a TPU rehearsal on 2
    devices), made once for both pytest-xdist processes: copy what a test changes.
    `tiny_runs.names[script]` is the stem of its outputs."""
    import fcntl

    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent  # the session's folder, above each xdist process's own
    folder = shared / "tiny_runs"
    with open(shared / "tiny_runs.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (folder / "done").exists():
            folder.mkdir(exist_ok=True)
            for script, flags in TINY_RUNS.items():
                module = __import__(script[:-3])
                module.main(TINY_RUN_FLAGS + flags + ["--output-dir", str(folder)])
            (folder / "done").write_text("")
    names = {script: outputs_name(script, TINY_RUN_FLAGS + flags)
             for script, flags in TINY_RUNS.items()}
    return types.SimpleNamespace(folder=folder, names=names)
