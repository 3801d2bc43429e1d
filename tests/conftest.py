"""Test session set-up: four logical CPU devices, quiet TensorFlow, repo and tools/ on sys.path.

TensorFlow fixes its devices when its runtime starts, so the split of the
CPU into logical devices (used by the distribution tests) happens here,
before any test runs an op. Single-device code still runs on /cpu:0.
"""
import os
import pathlib
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
# the tools are scripts, not a package: tests import them by name, as
# `python tools/NAME.py` (and benchmark_levers importing benchmark_pipeline) does
sys.path.insert(0, str(REPO / "tools"))

import pytest  # noqa: E402

import pyimagesearch  # noqa: E402,F401  (first: TensorFlow's start-up notices stay quiet)
import tensorflow as tf  # noqa: E402

from pyimagesearch.training.workarounds import native_stderr_quiet  # noqa: E402

LOGICAL_CPUS = 4
with native_stderr_quiet():  # a machine without a GPU logs a failed cuInit here
    _cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        _cpu, [tf.config.LogicalDeviceConfiguration()] * LOGICAL_CPUS)
    tf.config.set_visible_devices([], "GPU")


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


@pytest.fixture(scope="session")
def tiny_runs(tmp_path_factory):
    """A folder of three tiny real runs: cpu, gpu_rehearsal (2 devices), tpu_rehearsal (2).

    Their records, models and figures, made once for every test that reads
    run records (compare.py's); copy what a test changes.
    """
    import train_cpu
    import train_gpu
    import train_tpu

    folder = tmp_path_factory.mktemp("tiny_runs")
    tiny = ["--epochs", "2", "--steps-per-epoch", "2", "--data-source", "sample",
            "--output-dir", str(folder)]
    train_cpu.main(tiny + ["--batch-size", "32"])
    train_gpu.main(tiny + ["--batch-size", "32", "--rehearse", "2"])
    train_tpu.main(tiny + ["--batch-size", "64", "--rehearse", "2"])
    return folder
