"""Mixed precision and XLA on the training scripts, and the first things a new user meets."""
import json
import re
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

import types

import compare
import train_cpu
import train_gpu
from conftest import ENV, tensorflows

from pyimagesearch.autoencoder import AutoEncoder
from pyimagesearch.errors import UserError
from pyimagesearch.loop import fit_custom
from pyimagesearch.loss import MSELoss
from pyimagesearch.strategies import ReplicasAgreeLossScaleOptimizer, set_precision


def with_loss_scaling(optimizer, precision):
    return ReplicasAgreeLossScaleOptimizer(optimizer) if precision == "mixed_float16" else optimizer


def _fit_custom(model, strategy, data, global_batch_size):
    """One epoch of one step of the custom loop."""
    plan = types.SimpleNamespace(
        backend="tensorflow", strategy=strategy, global_batch_size=global_batch_size,
        jit_compile=False, settings=types.SimpleNamespace(epochs=1), steps_per_epoch=1,
        steps_per_execution=1, callbacks=(), resume_step=0)
    fit_custom(model, data.repeat(), data, plan, verbose=False)

SHORT = ["--epochs", "2", "--steps-per-epoch", "60", "--batch-size", "64",
         "--data-source", "sample"]


@pytest.fixture(autouse=True)
def _float32_afterwards():
    yield
    set_precision("float32")  # the policy is process-wide


def _check_run(folder, stem, precision):
    """The record and model of the one run in `folder` whose name (it says the flags) is stem_*."""
    [record_path], [model_path] = folder.glob(f"{stem}_*.json"), folder.glob(f"{stem}_*.keras")
    record = json.loads(record_path.read_text())
    assert record["precision"] == precision
    assert np.isfinite(record["loss"]).all() and record["loss"][-1] < record["loss"][0]
    assert record["val_loss"][-1] < 0.1
    model = keras.saving.load_model(model_path)
    output = model(np.zeros((1, 28, 28, 1), "float32"), training=False)
    assert output.dtype == tf.float32  # the last layer stays float32
    return record, model


@pytest.mark.slow  # the default suite's budget (docs/development.md); CI runs it
def test_bfloat16_trains_with_a_float32_output(tmp_path):
    train_cpu.main(SHORT + ["--precision", "mixed_bfloat16", "--output-dir", str(tmp_path)])
    _, model = _check_run(tmp_path, "cpu", "mixed_bfloat16")
    assert model.encoder.layers[0].compute_dtype == "bfloat16"


@pytest.mark.slow  # float16 on a CPU is slow: about 50 s each
@pytest.mark.parametrize("loop", ["fit", "custom"])
def test_float16_on_a_rehearsal_trains_with_loss_scaling(tmp_path, loop):
    train_gpu.main(SHORT + ["--rehearse", "2", "--precision", "mixed_float16", "--loop", loop,
                            "--output-dir", str(tmp_path)])
    _check_run(tmp_path, "gpu_rehearsal", "mixed_float16")


def _one_custom_step(precision, images):
    """Weights before and after one SGD step of the custom loop under `precision`."""
    keras.utils.set_random_seed(0)
    set_precision(precision)
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    with strategy.scope():
        model = AutoEncoder()
        optimizer = with_loss_scaling(keras.optimizers.SGD(1.0), precision)
        model.compile(loss=MSELoss(), optimizer=optimizer)
    before = [w.numpy() for w in model.trainable_weights]
    data = tf.data.Dataset.from_tensor_slices((images, images)).batch(len(images))
    _fit_custom(model, strategy, data, len(images))
    return model, [w.numpy() - b for w, b in zip(model.trainable_weights, before)]


def test_custom_loop_scales_and_unscales_a_float16_loss():
    images = np.random.default_rng(3).random((16, 28, 28, 1)).astype("float32")
    _, reference = _one_custom_step("float32", images)
    model, update = _one_custom_step("mixed_float16", images)
    assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
    assert float(model.optimizer.dynamic_scale) > 1  # the loss really was scaled
    # the applied update (SGD, rate 1: minus the gradient) is the float32 one
    # within float16's precision: unscaled, neither lost nor 32,768 times too big
    for step, expected in zip(update, reference):
        error = np.linalg.norm(step - expected) / np.linalg.norm(expected)
        assert error < 0.05, error  # float16 compute: a few per cent, not 32,768x


@pytest.mark.slow  # the default suite's budget (docs/development.md); CI runs it
def test_xla_trains_and_is_recorded(tmp_path):
    train_cpu.main(SHORT + ["--jit-compile", "--output-dir", str(tmp_path)])
    record, _ = _check_run(tmp_path, "cpu", "float32")
    assert record["jit_compile"] is True


def test_xla_is_refused_on_several_logical_devices(tmp_path):
    with pytest.raises(UserError, match="--jit-compile cannot rehearse"):
        train_gpu.main(SHORT + ["--rehearse", "2", "--jit-compile",
                                "--output-dir", str(tmp_path)])


@pytest.mark.slow  # the default suite's budget (docs/development.md); CI runs it
def test_redirected_output_has_no_terminal_escapes(repo, tmp_path):
    tiny = ["--epochs", "2", "--steps-per-epoch", "2", "--batch-size", "32",
            "--data-source", "sample"]
    # TensorFlow's own log level as a reader's shell has it: not set
    env = {key: value for key, value in ENV.items() if key != "TF_CPP_MIN_LOG_LEVEL"}
    result = subprocess.run([sys.executable, "train_gpu.py", *tiny, "--rehearse", "2",
                             "--output-dir", str(tmp_path)], cwd=repo, capture_output=True,
                            text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stderr
    assert "\x1b" not in result.stdout + result.stderr
    assert "Epoch 2/2" in result.stdout  # one line per epoch instead of a progress bar
    # TensorFlow's import says its own lines (tensorflow/tensorflow#100442); past it, none:
    # not the generator rewrite warning of per-device input buffers, nor INFO lines
    assert "will not be optimized" not in result.stderr
    lines = (result.stdout + result.stderr).splitlines()
    assert not [line for line in lines if re.match(r"[IW]\d{4} ", line)
                and not tensorflows(line) and "port.cc" not in line], lines


def test_compare_takes_several_folders(tiny_runs, tmp_path, capsys):
    import shutil

    for folder, stems in (("a", ["cpu"]), ("b", ["cpu", "gpu_rehearsal"])):
        (tmp_path / folder).mkdir()
        for stem in stems:
            for suffix in ("json", "keras", "png"):
                [run] = tiny_runs.folder.glob(f"{stem}_epochs-*.{suffix}")  # by its flags
                shutil.copy(run, tmp_path / folder / f"{stem}.{suffix}")
    compare.main([str(tmp_path / "a"), str(tmp_path / "b"), "--output-dir",
                  str(tmp_path / "cmp")])
    rows = [line.split("|")[1].strip() for line in capsys.readouterr().out.splitlines()
            if line.startswith("| ") and not line.startswith(("| run", "| ---"))]
    assert rows == ["a/cpu", "b/cpu", "gpu_rehearsal"]  # repeated names get their folder
    assert (tmp_path / "cmp" / "comparison.png").exists()


@pytest.mark.slow  # five set-ups trained (about 8 s)
def test_the_levers_benchmark_reports_every_set_up(tmp_path):
    import benchmark_levers

    out = tmp_path / "levers.json"
    benchmark_levers.main(["--steps", "3", "--trials", "1", "--batch-size", "32",
                           "--json", str(out)])
    result = json.loads(out.read_text())
    assert set(result["median_seconds"]) == {"float32", "mixed_bfloat16", "xla"}
    assert all(value > 0 for value in result["median_seconds"].values())
    assert result["speedup_over_float32"]["float32"] == 1.0


@pytest.mark.parametrize("loop", ["fit", pytest.param("custom", marks=pytest.mark.slow)])
def test_an_overflow_on_one_replica_skips_the_step_on_every_replica(loop):
    # replica 1's half of the batch overflows float16; replica 0's does not.
    # Seeded: whether it overflows depends on the initial weights, which
    # would otherwise follow from whatever ran before in the session
    keras.utils.set_random_seed(0)
    set_precision("mixed_float16")
    strategy = tf.distribute.MirroredStrategy(
        ["/cpu:0", "/cpu:1"], cross_device_ops=tf.distribute.ReductionToOneDevice())
    images = np.zeros((4, 28, 28, 1), "float32")
    images[2:] = 3e4
    with strategy.scope():
        model = AutoEncoder()
        optimizer = with_loss_scaling(keras.optimizers.Adam(1e-3), "mixed_float16")
        model.compile(loss=MSELoss(scale=2), optimizer=optimizer)
        model.build((None, 28, 28, 1))
        optimizer.build(model.trainable_variables)
    before = [w.numpy() for w in model.trainable_weights]
    data = tf.data.Dataset.from_tensor_slices((images, images)).batch(4)
    if loop == "custom":
        _fit_custom(model, strategy, data, 4)
    else:
        model.fit(data.repeat(), epochs=1, steps_per_epoch=1, verbose=0)
    after = [w.numpy() for w in model.trainable_weights]
    assert all(np.isfinite(w).all() for w in after)
    assert all(np.array_equal(a, b) for a, b in zip(after, before))  # skipped everywhere
    assert float(np.asarray(optimizer.dynamic_scale.value)) == 2.0 ** 14  # halved once
    slots = [v.numpy() for v in optimizer.inner_optimizer.variables if v.dtype == "float32"]
    assert all(np.isfinite(v).all() for v in slots)  # no inf in Adam's state


class _FakeGpus:
    """MirroredStrategy over two GPUs, as far as the scripts look before training."""

    num_replicas_in_sync = 2

    def __init__(self, *args, **kwargs):
        self.extended = type("Extended", (), {"worker_devices": ("/gpu:0", "/gpu:1")})()


def test_xla_with_fit_on_several_gpus_is_refused_and_the_custom_loop_is_not(monkeypatch,
                                                                           tmp_path):
    # keras-team/keras#19005: fit compiles every GPU's step into one XLA program
    real = tf.config.list_physical_devices
    monkeypatch.setattr(tf.config, "list_physical_devices", lambda kind=None: [
        "GPU:0", "GPU:1"] if kind == "GPU" else real(kind))
    monkeypatch.setattr(tf.distribute, "MirroredStrategy", _FakeGpus)
    with pytest.raises(UserError, match=r"^--jit-compile with fit cannot train on 2 "
                                        r"replicas: .*add --loop custom"):
        train_gpu.main(["--jit-compile", "--data-source", "sample", "--output-dir",
                        str(tmp_path)])
    # the custom loop compiles each GPU's step on its own: past the check, the fake
    # strategy's missing parts are what stops it
    with pytest.raises(AttributeError):
        train_gpu.main(["--jit-compile", "--loop", "custom", "--data-source", "sample",
                        "--output-dir", str(tmp_path)])
