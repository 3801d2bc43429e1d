"""Each workaround of TensorFlow or Keras, held against the installed versions: still needed?

Every workaround names its upstream issue and the version that ends it (in its
docstring, and in docs/development.md's table). The probes below run the
installed TensorFlow and Keras without the workaround, in a process of their
own, and check that what it works around still happens. When an upgrade fixes
one, its test fails with a line that says which workaround can go, and why. The
quiet import's fault comes and goes between releases (2.20's import keeps to
TF_CPP_MIN_LOG_LEVEL, 2.19's and 2.21's do not): its test holds a table per
release, and the workaround runs only on those where the fault is there.
"""
import importlib
import importlib.metadata
import inspect
import json
import os
import re
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The probes, in one process (TensorFlow imported once, ~5 s): each prints one
# line of JSON, {"probe": name, "still": whether the fault is still there}.
PROBES = r"""
import inspect, json, os, sys, tempfile
import numpy as np
import tensorflow as tf
import keras

def said(name, still, detail=""):
    print(json.dumps({"probe": name, "still": bool(still), "detail": str(detail)[:200]}), flush=True)

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
devices = [device.name for device in tf.config.list_logical_devices("CPU")]
mirrored = tf.distribute.MirroredStrategy(devices, cross_device_ops=tf.distribute.ReductionToOneDevice())

# plain_device_buffers: the per-device buffers are made with autotuning left on
from tensorflow.python.data.ops import multi_device_iterator_ops as ops
made, original = [], ops._create_device_dataset
ops._create_device_dataset = lambda *a, **k: made.append(original(*a, **k)) or made[-1]
next(iter(mirrored.experimental_distribute_dataset(tf.data.Dataset.range(8).batch(4))))
ops._create_device_dataset = original
options = [(d.options().autotune.enabled, d.options().experimental_optimization
            .apply_default_optimizations) for d in made]
said("plain_device_buffers", made and all(o == (None, None) for o in options), options)

# local_cpu_devices: a CPU-only worker of MultiWorkerMirroredStrategy gets one device
from tensorflow.python.distribute import collective_all_reduce_strategy as car
resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
    tf.train.ClusterSpec({"worker": ["localhost:1", "localhost:2"]}), task_type="worker",
    task_id=0, num_accelerators={"CPU": 2})
found, _ = car.CollectiveAllReduceExtended._initialize_local_devices(
    None, resolver, "/job:worker/replica:0/task:0")
said("local_cpu_devices", len(found) == 1, found)

# bound_cluster_start: the strategy takes no limit on the workers' start
signature = inspect.signature(tf.distribute.MultiWorkerMirroredStrategy.__init__)
said("bound_cluster_start", not any("timeout" in name for name in signature.parameters),
     list(signature.parameters))

# preemption_handler_acts: on a Google Cloud CPU VM the handler never saves
from tensorflow.python.distribute.failure_handling import failure_handling_util as util
on_gcp, util.on_gcp = util.on_gcp, (lambda: True)
called = []
config = tf.distribute.experimental.TerminationConfig(
    termination_watcher_fn=lambda: True, exit_fn=lambda: called.append("exit"),
    grace_period=0, save_fn=lambda: called.append("save"))
handler = tf.distribute.experimental.PreemptionCheckpointHandler(
    resolver, tf.train.Checkpoint(), tempfile.mkdtemp(), termination_config=config)
handler.save_checkpoint_if_preempted()
util.on_gcp = on_gcp
said("preemption_handler_acts", not called, called)

# stop_preemption_handler: no public way to stop the handler's watcher threads
public = [name for name in ("close", "stop", "shutdown", "__exit__")
          if hasattr(tf.distribute.experimental.PreemptionCheckpointHandler, name)]
said("stop_preemption_handler", not public, public)

# keras-team/keras#20585: fit under a multi-worker strategy reduces a tuple of PerReplica
strategy = tf.distribute.MultiWorkerMirroredStrategy()
with strategy.scope():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
data = tf.data.Dataset.from_tensor_slices((np.ones((8, 4), "f4"), np.ones((8, 1), "f4"))).batch(4)
strategy.extended._num_workers = 2  # as in a 2-worker cluster: it fails before any collective
try:
    model.fit(data, epochs=1, verbose=0, shuffle=False)
    said("keras_20585", False, "fit ran")
except ValueError as error:
    said("keras_20585", "PerReplica" in str(error), str(error).splitlines()[0])

# keras-team/keras#19005: XLA with fit on several devices reaches across them
with mirrored.scope():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse", jit_compile=True)
try:
    model.fit(data, epochs=1, verbose=0, shuffle=False)
    said("keras_19005", False, "fit ran")
except Exception as error:  # InvalidArgumentError: "Trying to access resource ..."
    said("keras_19005", "Trying to access resource" in str(error), type(error).__name__)

# pipeline.py: a graph seed of 0 and a tensor op seed fail in a flat_map
def seeded(k):
    tf.compat.v1.get_default_graph().seed = 0
    return tf.data.Dataset.range(4).shuffle(4, seed=k)
try:
    list(tf.data.Dataset.range(1).flat_map(seeded))
    said("graph_seed_0", False, "ran")
except Exception as error:
    said("graph_seed_0", "OperatorNotAllowedInGraphError" in type(error).__name__,
         type(error).__name__)

# tpu_lookup: TPUClusterResolver cuts an IPv6 address at its first colon
address = tf.distribute.cluster_resolver.TPUClusterResolver(tpu="grpc://[::1]:8470").master()
said("tpu_ipv6", address != "grpc://[::1]:8470", address)
"""

# each probe: the workaround, where it is, its upstream issue, and what its end would look like
WORKAROUNDS = {
    "plain_device_buffers": ("workarounds.py", "none filed (the warning it also "
                             "removes: tensorflow/tensorflow#61816)"),
    "local_cpu_devices": ("workarounds.py", "none public (TensorFlow's TODO "
                          "b/126786766 in collective_all_reduce_strategy.py)"),
    "bound_cluster_start": ("workarounds.py", "none filed"),
    "preemption_handler_acts": ("workarounds.py", "none filed (failure_handling.py: "
                                "'We can make it work upon request')"),
    "stop_preemption_handler": ("workarounds.py", "none filed"),
    "keras_20585": ("cluster.py, plan.py", "keras-team/keras#20585"),
    "keras_19005": ("plan.py", "keras-team/keras#19005"),
    "graph_seed_0": ("pipeline.py", "none filed (related: tensorflow/tensorflow#17284)"),
    "tpu_ipv6": ("tpu_lookup.py", "none filed"),
}


@pytest.fixture(scope="module")
def probed():
    done = subprocess.run([sys.executable, "-c", PROBES], cwd=REPO, capture_output=True,
                          text=True, timeout=300,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "JAX_PLATFORMS": "cpu"})
    assert done.returncode == 0, done.stderr[-3000:]
    return {line["probe"]: line for line in map(json.loads, done.stdout.splitlines())}


@pytest.mark.parametrize("probe", sorted(WORKAROUNDS))
def test_the_fault_each_workaround_works_around_is_still_there(probed, probe):
    where, upstream = WORKAROUNDS[probe]
    import keras
    import tensorflow as tf

    assert probed[probe]["still"], (
        f"TensorFlow {tf.__version__} with Keras {keras.__version__} no longer shows what "
        f"{probe} ({where}; upstream: {upstream}) works around ({probed[probe]['detail']}): "
        "remove the workaround, and say in its docstring which version ended it")


# Does `import tensorflow` print at TF_CPP_MIN_LOG_LEVEL=3 (tensorflow/tensorflow#100442),
# and at 1, what runtime.process sets? Per release (the start of its version); observed
# on a CPU-only machine on 2026-12-05 with `TF_CPP_MIN_LOG_LEVEL=N python -c "import
# tensorflow"`: 2.19.1 and 2.21.0 print at every level; 2.20.0 at 0 only (INFO lines).
# terminal.py's import hook runs where this says True (IMPORT_KEEPS_TO_THE_LEVEL).
IMPORT_PRINTS_AT_LEVELS_1_TO_3 = {"2.19.": True, "2.20.": False, "2.21.": True}


def _release(version):
    """The key of IMPORT_PRINTS_AT_LEVELS_1_TO_3 that `version` starts with, or None."""
    return next((key for key in IMPORT_PRINTS_AT_LEVELS_1_TO_3 if version.startswith(key)),
                None)


# level 3 is the one that differs between the releases (2.20 is silent there)
@pytest.mark.parametrize("level", [pytest.param("1", marks=pytest.mark.slow), "3"])
def test_tensorflows_own_switch_leaves_import_lines_where_the_table_says(repo, level):
    import tensorflow as tf

    done = subprocess.run([sys.executable, "-c", "import tensorflow"], cwd=repo,
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": level})
    assert done.returncode == 0, done.stderr[-3000:]
    printed = done.stderr.strip()
    release = _release(tf.__version__)
    assert release is not None, (
        f"TensorFlow {tf.__version__} is not in IMPORT_PRINTS_AT_LEVELS_1_TO_3: add it "
        "(tensorflow/tensorflow#100442); at TF_CPP_MIN_LOG_LEVEL=" + level + " its import "
        + (f"printed:\n{printed[:1500]}" if printed else "printed nothing"))
    if IMPORT_PRINTS_AT_LEVELS_1_TO_3[release]:
        assert printed, (
            f"TF_CPP_MIN_LOG_LEVEL={level} now silences TensorFlow {tf.__version__}'s import "
            "(tensorflow/tensorflow#100442): set it False in IMPORT_PRINTS_AT_LEVELS_1_TO_3 and "
            "add it to terminal.py's IMPORT_KEEPS_TO_THE_LEVEL, which leaves the hook out")
    else:
        assert not printed, (
            f"TensorFlow {tf.__version__}'s import prints at TF_CPP_MIN_LOG_LEVEL={level} "
            "(tensorflow/tensorflow#100442), which IMPORT_PRINTS_AT_LEVELS_1_TO_3 says it does "
            "not: set it True there and take it out of terminal.py's "
            f"IMPORT_KEEPS_TO_THE_LEVEL, so the import hook runs on it:\n{printed[:1500]}")


@pytest.mark.parametrize("release", sorted(IMPORT_PRINTS_AT_LEVELS_1_TO_3))
def test_the_quiet_import_runs_on_the_releases_whose_import_prints(release, monkeypatch):
    # what terminal.py decides from the installed builds' metadata, against the table
    from pyimagesearch import terminal

    quiet_on_their_own = {key for key, prints in IMPORT_PRINTS_AT_LEVELS_1_TO_3.items()
                          if not prints}
    assert set(terminal.IMPORT_KEEPS_TO_THE_LEVEL) <= quiet_on_their_own

    def installed(builds):
        monkeypatch.setattr(importlib.metadata, "version", lambda name: (
            builds[name] if name in builds else _not_found(name)))
        return terminal.import_ignores_the_level()

    version = release + "0"
    assert installed({"tensorflow": version}) is IMPORT_PRINTS_AT_LEVELS_1_TO_3[release]
    assert installed({"tensorflow-cpu": version}) is IMPORT_PRINTS_AT_LEVELS_1_TO_3[release]
    # tensorflow-tpu, a release not in the table, or no build found: the hook, as before
    assert installed({"tensorflow-tpu": version}) is True
    assert installed({"tensorflow-cpu": version, "tensorflow": "2.99.0"}) is True
    assert installed({}) is True


def _not_found(name):
    raise importlib.metadata.PackageNotFoundError(name)


UPSTREAM = re.compile(r"[\w-]+/[\w.-]+#\d+|none filed|none public|https://github\.com/\S+")


@pytest.mark.parametrize("module, names", [
    ("pyimagesearch.workarounds", ["plain_device_buffers", "local_cpu_devices",
                                            "bound_cluster_start", "preemption_handler_acts",
                                            "stop_preemption_handler"]),
    ("pyimagesearch.terminal", ["quiet_tensorflow_import", "filter_collective_noise"]),
    ("pyimagesearch.pipeline", ["seeded_passes"]),
    ("pyimagesearch.tpu_lookup", ["find_tpu"]),
    ("pyimagesearch.runtime", ["leave_the_tpu_alone"]),
])
def test_every_workaround_names_its_upstream_issue_and_where_it_ends(module, names):
    loaded = importlib.import_module(module)
    for name in names:
        said = inspect.getdoc(getattr(loaded, name)) or ""
        assert UPSTREAM.search(said), f"{module}.{name} names no upstream issue"
        assert re.search(r"(still|until|ends|ended|needed).{0,80}\d+\.\d+", said, re.S | re.I), \
            f"{module}.{name} does not say which version still needs it or ends it"
