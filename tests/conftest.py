"""Test session set-up: four logical CPU devices, quiet TensorFlow, repo and tools/ on sys.path.

TensorFlow fixes its devices when its runtime starts, so the split of the
CPU into logical devices (used by the distribution tests) happens here,
before any test runs an op. Single-device code still runs on /cpu:0.

Also what several test files share: a run's output names (outputs_name,
output_files), earlier outputs to keep and the state a folder of them is in
(earlier_outputs, outputs_state), a script's one error line (one_line), and
the fixtures repo, in_process, tiny_runs and tiny_disk.
"""
import os
import pathlib
import signal
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
# the tools are scripts, not a package: tests import them by name, as
# `python tools/NAME.py` (and benchmark_levers importing benchmark_pipeline) does
sys.path.insert(0, str(REPO / "tools"))

import pytest  # noqa: E402

from pyimagesearch import runtime as backend  # noqa: E402

# as the scripts' first call: quiet TensorFlow, the TPU left alone, and Keras on TensorFlow
# (this session's; JAX's tests start processes of their own)
backend.tensorflow()
import pyimagesearch.outputs  # noqa: E402,F401  (the classes keras.saving.load_model needs)
import tensorflow as tf  # noqa: E402

from pyimagesearch.terminal import native_stderr_quiet  # noqa: E402

# a shell that starts the suite in the background (`cmd &` in a script) has it
# ignore Ctrl-C, and so would every process it starts: the tests send SIGINT
# and expect what Ctrl-C at a terminal does (the scripts keep an ignored SIGINT
# ignored, as Unix programs do)
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

LOGICAL_CPUS = 4
with native_stderr_quiet():  # a machine without a GPU logs a failed cuInit here
    _cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        _cpu, [tf.config.LogicalDeviceConfiguration()] * LOGICAL_CPUS)
    tf.config.set_visible_devices([], "GPU")


def outputs_name(script_or_device, args=()):
    """The stem a run of `script_or_device` with `args` names its outputs and logs with.

    `script_or_device`: "train_gpu.py" (any path) or "gpu"; `args`: the
    script's flags as typed (numbers may be ints). The name is the scripts'
    own (settings.run_name: the device, `rehearsal`, each flag off the script's
    defaults, the runtime's suffix), worked out from the flags as the script
    parses them, without the side effects of cli.parse_args.
    """
    from pyimagesearch import cli
    from pyimagesearch.plan import Settings, run_name

    device = os.path.basename(str(script_or_device))
    device = device.removeprefix("train_").removesuffix(".py")
    parsed = cli.build_parser(device, "").parse_args([str(arg) for arg in args])
    return run_name(device, Settings.from_args(parsed), bool(getattr(parsed, "rehearse", None)))


def output_files(name):
    """The figure, run record and model a run called `name` writes, sorted."""
    return [f"{name}.json", f"{name}.keras", f"{name}.png"]


def earlier_outputs(folder, names):
    """Put files `names` in `folder` (made if need be), each holding "earlier NAME"."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        (folder / name).write_text(f"earlier {name}")


def outputs_state(folder, names):
    """'old' or 'new' if the folder holds that whole set and nothing else; what it holds if not.

    'old': the files of earlier_outputs; 'new': each holding "new NAME".
    """
    held = sorted(os.listdir(folder))
    texts = {name: (folder / name).read_text() for name in names if name in held}
    if held == sorted(names) and all(text == f"earlier {n}" for n, text in texts.items()):
        return "old"
    if held == sorted(names) and all(text == f"new {n}" for n, text in texts.items()):
        return "new"
    return held, texts


def one_line(result):
    """The one line a script that ended with status 2 said on stderr (asserted to be one)."""
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr[-3000:]
    return lines[0]


@pytest.fixture
def repo():
    """The repository root, for running the scripts as a reader would."""
    return REPO


@pytest.fixture
def in_process(capfd, monkeypatch):
    """Run a script's main() here as `python SCRIPT ARGS` would; its status and output.

    For the tests whose point is what the script says and returns, not that it
    is a fresh process: it goes through the scripts' own one-line error exit
    (cli.run_main), with sys.argv as the command line gives it, and is returned
    as subprocess.run would return it (returncode, stdout, stderr). Not for
    runs that end in a signal or a lost peer: those leave through os._exit.
    """
    import importlib
    import types

    from pyimagesearch import cli

    def run(script, *args):
        module = importlib.import_module(os.path.splitext(os.path.basename(script))[0])
        capfd.readouterr()  # what came before is not this run's
        monkeypatch.setattr(sys, "argv", [script, *args])
        try:
            cli.run_main(module.main, list(args))
            status = 0
        except SystemExit as stop:
            status = stop.code if isinstance(stop.code, int) else 1
        out, err = capfd.readouterr()
        return types.SimpleNamespace(returncode=status, stdout=out, stderr=err)

    return run


@pytest.fixture
def tiny_disk(tmp_path):
    """mount_disk(name, size): a tmpfs of `size` at tmp_path/name, unmounted after the test.

    Needs the right to mount (root, as here and in CI); skipped without it.
    """
    import subprocess

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


class _RunsFolder(type(pathlib.Path())):
    """A folder that also carries what the runs in it called (`calls`)."""


@pytest.fixture(scope="session")
def tiny_runs(tmp_path_factory):
    """A folder of three tiny real runs: train_cpu.py, a gpu and a tpu rehearsal (2 devices).

    Their records, models and figures, made once for every test that reads
    run records (compare.py's), and once for both pytest-xdist processes (the
    first to ask makes them, under a lock; the other reads them): copy what a
    test changes. Each script runs as `python SCRIPT` runs it (runpy), with
    get_data, Model.fit and Model.predict wrapped before it starts:
    `tiny_runs.calls[script]` counts what it called (tests/test_listing.py),
    `tiny_runs.names[script]` is the name of its outputs (cpu_epochs-2_...).
    """
    import fcntl
    import json

    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent  # the session's folder, above each xdist process's own
    folder = _RunsFolder(shared / "tiny_runs")
    counted = shared / "tiny_runs_calls.json"  # written last: the runs are all there
    with open(shared / "tiny_runs.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not counted.exists():
            folder.mkdir(exist_ok=True)
            counted.write_text(json.dumps(_tiny_runs_in(folder)))
    folder.calls = json.loads(counted.read_text())
    folder.names = {script: outputs_name(script, TINY_RUN_FLAGS + flags)
                    for script, flags in TINY_RUNS.items()}
    return folder


# the tiny runs' flags: every script's, then each script's own
TINY_RUN_FLAGS = ["--epochs", "2", "--steps-per-epoch", "2", "--data-source", "sample"]
TINY_RUNS = {"train_cpu.py": ["--batch-size", "32"],
             "train_gpu.py": ["--batch-size", "32", "--rehearse", "2"],
             "train_tpu.py": ["--batch-size", "64", "--rehearse", "2"]}


def _tiny_runs_in(folder):
    """Run the three scripts into `folder`; what each called, by script."""
    import runpy

    import keras

    from pyimagesearch import data

    tiny = TINY_RUN_FLAGS + ["--output-dir", str(folder)]
    counts = {}
    for script, flags in TINY_RUNS.items():
        calls = counts[script] = {"get_data": 0, "fit": 0, "predict": 0}

        def counting(name, function, calls=calls):
            def wrapper(*args, **kwargs):
                calls[name] += 1
                return function(*args, **kwargs)
            return wrapper

        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(data, "get_data", counting("get_data", data.get_data))
            patch.setattr(keras.Model, "fit", counting("fit", keras.Model.fit))
            patch.setattr(keras.Model, "predict", counting("predict", keras.Model.predict))
            patch.setattr(sys, "argv", [script, *tiny, *flags])
            runpy.run_path(str(REPO / script), run_name="__main__")
    return counts
