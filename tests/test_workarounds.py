"""Each workaround of TensorFlow, Keras or JAX, held against the installed versions: still needed?

Every workaround names its upstream issue (or says none was filed) and the
version that still needs it. The probes run the installed TensorFlow and Keras
without the workaround, in a process of their own, and check that what it works
around still happens: when an upgrade fixes one, its test fails with a line that
says which workaround can go.
"""
import importlib
import inspect
import json
import os
import re
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The probes, in one process (TensorFlow imported once): each prints one line of JSON,
# {"probe": name, "still": whether the fault is still there}.
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

# data.distribute: a rehearsal's per-device buffers are made with autotuning on, which
# stalls epochs as Keras tears them down; one pipeline per replica avoids them
from tensorflow.python.data.ops import multi_device_iterator_ops as ops
made, original = [], ops._create_device_dataset
ops._create_device_dataset = lambda *a, **k: made.append(original(*a, **k)) or made[-1]
next(iter(mirrored.experimental_distribute_dataset(tf.data.Dataset.range(8).batch(4))))
ops._create_device_dataset = original
options = [d.options().autotune.enabled for d in made]
said("per_device_buffers", made and all(o is None for o in options), options)

# strategies.multi_worker: a CPU-only worker of MultiWorkerMirroredStrategy gets one device
from tensorflow.python.distribute import collective_all_reduce_strategy as car
resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
    tf.train.ClusterSpec({"worker": ["localhost:1", "localhost:2"]}), task_type="worker",
    task_id=0, num_accelerators={"CPU": 2})
found, _ = car.CollectiveAllReduceExtended._initialize_local_devices(
    None, resolver, "/job:worker/replica:0/task:0")
said("one_cpu_replica_per_worker", len(found) == 1, found)

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

# pipeline.seeded_passes: a graph seed of 0 and a tensor op seed fail in a flat_map
def seeded(k):
    tf.compat.v1.get_default_graph().seed = 0
    return tf.data.Dataset.range(4).shuffle(4, seed=k)
try:
    list(tf.data.Dataset.range(1).flat_map(seeded))
    said("graph_seed_0", False, "ran")
except Exception as error:
    said("graph_seed_0", "OperatorNotAllowedInGraphError" in type(error).__name__,
         type(error).__name__)

# tpu.find_tpu: TPUClusterResolver cuts an IPv6 address at its first colon
address = tf.distribute.cluster_resolver.TPUClusterResolver(tpu="grpc://[::1]:8470").master()
said("tpu_ipv6", address != "grpc://[::1]:8470", address)

"""

# each probe: the workaround, where it is, its upstream issue
WORKAROUNDS = {
    "per_device_buffers": ("data.distribute", "none filed (its warning: "
                           "tensorflow/tensorflow#61816)"),
    "one_cpu_replica_per_worker": ("strategies.multi_worker", "none public (TensorFlow's TODO "
                                   "b/126786766 in collective_all_reduce_strategy.py)"),
    "preemption_handler_acts": ("backup.preemption_handler_acts", "none filed "
                                "(failure_handling.py: 'We can make it work upon request')"),
    "stop_preemption_handler": ("backup.Backup.on_train_end", "none filed"),
    "keras_20585": ("plan.make_plan", "keras-team/keras#20585"),
    "keras_19005": ("cli.refuse", "keras-team/keras#19005"),
    "graph_seed_0": ("pipeline.seeded_passes", "tensorflow/tensorflow#17284"),
    "tpu_ipv6": ("tpu.find_tpu", "none filed"),
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
        f"{where} (upstream: {upstream}) works around ({probed[probe]['detail']}): remove the "
        "workaround, and say in its docstring which version ended it")


UPSTREAM = re.compile(r"[\w-]+/[\w.-]+#\d+|none filed|none public|no upstream report")


@pytest.mark.parametrize("module, name", [
    ("pyimagesearch.data", "distribute"), ("pyimagesearch.pipeline", "seeded_passes"),
    ("pyimagesearch.tpu", "find_tpu"), ("pyimagesearch.host", "leave_the_tpu_alone"),
    ("pyimagesearch.backup", "preemption_handler_acts"),
    ("pyimagesearch.strategies", "ReplicasAgreeLossScaleOptimizer"),
    ("pyimagesearch.plan", "Plan.predict"), ("pyimagesearch.strategies", "multi_worker")])
def test_every_workaround_names_its_upstream_issue(module, name):
    thing = importlib.import_module(module)
    for part in name.split("."):
        thing = getattr(thing, part)
    source = inspect.getsource(thing)
    assert UPSTREAM.search(source), f"{module}.{name} names no upstream issue"
