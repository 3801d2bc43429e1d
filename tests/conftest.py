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
import tensorflow as tf  # noqa: E402

LOGICAL_CPUS = 4
_cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(
    _cpu, [tf.config.LogicalDeviceConfiguration()] * LOGICAL_CPUS)
tf.config.set_visible_devices([], "GPU")


@pytest.fixture
def repo():
    """The repository root, for running the scripts as a reader would."""
    return REPO
