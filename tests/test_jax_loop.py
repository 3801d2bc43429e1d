"""The custom loop, the profiler and float16 on train_tpu.py's JAX route, rehearsed.

Keras on JAX runs in processes of its own (tests/test_jax_route.py says
why), on JAX CPU devices. The custom loop's JAX step (pyimagesearch/jax_loop.py)
takes the same SGD step on N devices as one device's `fit` on the same global
batch, as TensorFlow's custom loop does (tests/test_loss_scaling.py); a
rehearsal with it keeps the history, the callbacks' logs and a profiler
trace where TensorFlow's route writes them.
"""
import json
import os
import subprocess
import sys

import pytest
from conftest import REPO

pytest.importorskip("jax")  # requirements-dev.txt installs it
# every test here is slow (the default suite's budget, docs/development.md); CI runs them,
# and the default suite keeps the JAX route's 8-device rehearsal and its step test
pytestmark = pytest.mark.slow

TINY = ["--epochs", "2", "--steps-per-epoch", "2", "--data-source", "sample"]


def _jax_env(devices=None):
    """This environment with KERAS_BACKEND=jax (and `devices` JAX CPU devices)."""
    env = {**os.environ, "KERAS_BACKEND": "jax"}
    if devices:
        env.update(JAX_PLATFORMS="cpu", JAX_NUM_CPU_DEVICES=str(devices))
    return env


def _step_record(*args):
    """tools/jax_loss_step.py's record for `args`, on 8 JAX CPU devices."""
    done = subprocess.run([sys.executable, "tools/jax_loss_step.py", *args], cwd=REPO,
                          env=_jax_env(8), capture_output=True, text=True, timeout=300,
                          check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


# --- the JAX step: one SGD step on N devices is one device's -------------------------------

def test_the_custom_loops_jax_step_on_n_devices_is_one_devices_fit_step():
    record = _step_record("--loop", "custom", "2:1", "8:8")
    assert (record["backend"], record["loop"]) == ("jax", "custom")
    assert record["step_size"] > 1e-3  # a real step, not round-off
    # 8:8: the compiled MSELoss's scale does not enter the custom loop's loss
    for case in ("2:1", "8:8"):
        step = record["steps"][case]
        assert abs(step["ratio"] - 1.0) < 1e-3, step
        assert step["max_difference"] < 1e-3 * record["step_size"], step


@pytest.mark.parametrize("loop", ["fit", "custom"])
def test_float16_with_loss_scaling_takes_the_float32_step_on_jax(loop):
    record = _step_record("--loop", loop, "--precision", "mixed_float16", "2:1")
    step = record["steps"]["2:1"]
    assert step["loss_scale"] == 2.0 ** 15  # the step was taken, not skipped
    # float16's precision, not the 32768 of a scale left in the gradient
    assert abs(step["ratio"] - 1.0) < 1e-2, step


# --- a rehearsal: history, callbacks, validation, and the trace -----------------------------

def _rehearse(tmp_path, *flags):
    """train_tpu.py on 2 JAX CPU devices with `flags`; its run record and its log folder."""
    logs = tmp_path / "logs"
    done = subprocess.run([sys.executable, "train_tpu.py", *TINY, "--rehearse", "2", *flags,
                           "--logdir", str(logs), "--output-dir", str(tmp_path / "out")],
                          cwd=REPO, env=_jax_env(), capture_output=True, text=True,
                          timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    [record] = (tmp_path / "out").glob("*.json")
    [run] = logs.iterdir()
    [attempt] = run.iterdir()
    return json.loads(record.read_text()), attempt, done.stdout


def _traces(attempt):
    """The profiler's .xplane.pb files under `attempt`, where TensorBoard's plugin looks."""
    return sorted((attempt / "train" / "plugins" / "profile").glob("*/*.xplane.pb"))


def test_the_custom_loop_on_jax_trains_validates_logs_and_traces(tmp_path):
    record, attempt, out = _rehearse(tmp_path, "--loop", "custom", "--profile-steps", "1,2")
    assert (record["backend"], record["loop"]) == ("jax", "custom")
    assert len(record["loss"]) == len(record["val_loss"]) == 2
    assert record["loss"][1] < record["loss"][0]  # it trains
    assert 0 < record["val_loss"][-1] < 1
    assert "custom loop, Keras on JAX" in out
    traces = _traces(attempt)
    assert traces and traces[0].stat().st_size > 0
    # TensorBoard's summaries after the trace: TensorFlow's tracing switch survived it
    assert list((attempt / "validation").glob("events.out.tfevents.*"))


def test_fit_on_jax_traces_the_steps_asked_for_under_float16(tmp_path):
    record, attempt, _ = _rehearse(tmp_path, "--profile-steps", "2,2",
                                   "--precision", "mixed_float16")
    assert (record["backend"], record["loop"]) == ("jax", "fit")
    assert all(0 < loss < 1 for loss in record["loss"] + record["val_loss"])
    assert _traces(attempt)


# an overflow on one device's half of the batch: every device skips the step
SKIP_ON_OVERFLOW = """
import itertools, json
import keras, numpy as np
from pyimagesearch.autoencoder import AutoEncoder
from pyimagesearch.jax_route import DataParallel
from pyimagesearch.loop import fit_custom
from pyimagesearch.strategies import with_loss_scaling

keras.mixed_precision.set_global_policy("mixed_float16")
keras.utils.set_random_seed(0)
strategy = DataParallel(devices=keras.distribution.list_devices("cpu")[:2])
images = np.random.default_rng(7).random((32, 28, 28, 1)).astype("float32")
poisoned = images.copy()
poisoned[-1] = np.inf  # the last image: the second device's half
with strategy.scope():
    model = AutoEncoder()
    model.compile(loss="mse", optimizer=with_loss_scaling(keras.optimizers.SGD(1.0),
                                                          "mixed_float16"))
    model.build((None, 28, 28, 1))
    before = [keras.ops.convert_to_numpy(w) for w in model.trainable_weights]
    fit_custom(model, strategy, itertools.repeat((poisoned, images)), [(images, images)],
               epochs=1, steps_per_epoch=1, global_batch_size=32, verbose=False,
               backend="jax")
after = [keras.ops.convert_to_numpy(w) for w in model.trainable_weights]
print(json.dumps({"unchanged": all(np.array_equal(a, b) for a, b in zip(after, before)),
                  "loss_scale": float(keras.ops.convert_to_numpy(
                      model.optimizer.dynamic_scale))}))
"""


def test_an_overflow_on_one_device_skips_the_step_and_halves_the_loss_scale():
    done = subprocess.run([sys.executable, "-c", SKIP_ON_OVERFLOW], cwd=REPO,
                          env=_jax_env(2), capture_output=True, text=True, timeout=300,
                          check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.splitlines()[-1])
    assert found == {"unchanged": True, "loss_scale": 2.0 ** 14}
