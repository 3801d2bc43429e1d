"""train_gpu.py and train_tpu.py: rehearsals on logical CPUs, and fast failure without hardware."""
import json
import os
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

import train_cpu
import train_gpu
import train_tpu
from conftest import saved_weights

import dataclasses

from pyimagesearch import cli, config, data
from pyimagesearch.errors import UserError
from pyimagesearch.sources import SampleSource
from pyimagesearch.plan import Settings, make_plan, scaled_learning_rate, with_validation


def plan_run(device, settings, replicas):
    return make_plan(device, settings, replicas)

ONE_SGD_STEP = ["--epochs", "1", "--steps-per-epoch", "1", "--optimizer", "sgd",
                "--learning-rate", "0.5", "--data-source", "sample"]


def test_rehearsed_gpu_step_saves_the_same_weights_as_the_cpu(tmp_path):
    train_cpu.main(ONE_SGD_STEP + ["--batch-size", "256", "--output-dir", str(tmp_path)])
    train_gpu.main(ONE_SGD_STEP + ["--batch-size", "128", "--rehearse", "2",
                                   "--output-dir", str(tmp_path)])
    # a run's name says its flags off the defaults (128 is train_gpu.py's batch)
    cpu = "cpu_epochs-1_batch-size-256_steps-per-epoch-1_data-source-sample_optimizer-sgd_" \
        "learning-rate-0.5"
    gpu = "gpu_rehearsal_epochs-1_steps-per-epoch-1_data-source-sample_optimizer-sgd_" \
        "learning-rate-0.5"
    record = json.loads((tmp_path / f"{gpu}.json").read_text())
    assert (record["replicas"], record["global_batch_size"]) == (2, 256)
    assert np.isfinite(record["loss"]).all() and np.isfinite(record["val_loss"]).all()
    assert record["rehearsal"] is True and record["strategy"] == "MirroredStrategy"
    cpu, gpu = saved_weights(tmp_path / f"{cpu}.keras"), saved_weights(tmp_path / f"{gpu}.keras")
    for a, b in zip(cpu, gpu):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
    assert not list(tmp_path.glob("gpu[._][!r]*"))  # a rehearsal is never named gpu.*


@pytest.mark.parametrize("loop", ["fit", pytest.param("custom", marks=pytest.mark.slow)])
def test_rehearsed_tpu_run_uses_the_tpu_configuration(tmp_path, loop):
    # the test session has 4 logical CPUs; `python train_tpu.py --rehearse 8`
    # is the same code path with 8
    train_tpu.main(["--rehearse", "4", "--batch-size", "64", "--steps-per-epoch", "2",
                    "--epochs", "1", "--data-source", "sample", "--loop", loop,
                    "--output-dir", str(tmp_path)])
    name = "tpu_rehearsal_epochs-1_batch-size-64_steps-per-epoch-2_data-source-sample" + (
        "_loop-custom" if loop == "custom" else "")
    record = json.loads((tmp_path / f"{name}.json").read_text())
    assert record["replicas"] == 4 and record["global_batch_size"] == 64
    assert record["per_replica_batch_size"] == 16 and record["validation_steps"] == 500 // 64
    assert np.isfinite(record["loss"]).all() and np.isfinite(record["val_loss"]).all()
    assert record["loop"] == loop and record["device"] == "tpu"
    assert (tmp_path / f"{name}.png").exists() and not list(tmp_path.glob("tpu[._][!r]*"))


def test_tpu_defaults_are_the_articles():
    args = cli.build_parser("tpu").parse_args([])
    plan = plan_run("tpu", Settings.from_args(args), replicas=8)
    assert (plan.global_batch_size, plan.steps_per_epoch) == (1024, 58)
    assert plan.steps_per_epoch == config.TPU_STEPS_PER_EPOCH
    assert plan.global_batch_size // plan.replicas == 128 and plan.whole_epochs


ONE_DEVICE = tf.distribute.OneDeviceStrategy("/cpu:0")


def validation_data(strategy, plan, source):
    """The validation batches a run of `plan` reads from `source`, and what they hold."""
    plan = with_validation(dataclasses.replace(plan, strategy=strategy), source)
    return (data.get_data(config.DATA_NAME, config.VALIDATION_FLAG, plan.global_batch_size,
                          plan=plan), plan.validation)


@pytest.mark.parametrize("batch, steps", [(64, 7), (1024, 1)])
def test_tpu_validation_is_exactly_the_recorded_full_batches(batch, steps):
    # Keras would round validation_steps up to whole steps_per_execution, so
    # the count is fixed in the dataset itself: read to its end, it has `steps`
    args = cli.build_parser("tpu").parse_args(["--batch-size", str(batch)])
    plan = plan_run("tpu", Settings.from_args(args), replicas=4)
    dataset, validation = validation_data(ONE_DEVICE, plan, SampleSource("test"))
    recorded, images = validation.steps, validation.images
    sizes = [len(batch_images) for batch_images, _ in dataset]
    assert recorded == steps and sizes == [batch] * steps and images == batch * steps
    assert config.TPU_VALIDATION_STEPS == config.VALIDATION_IMAGES // 1024 == 9


def test_cpu_validation_is_one_full_pass():
    args = cli.build_parser("cpu").parse_args([])
    plan = plan_run("cpu", Settings.from_args(args), replicas=1)
    dataset, validation = validation_data(ONE_DEVICE, plan, SampleSource("test"))
    recorded, images = validation.steps, validation.images
    assert recorded is None and images == 500
    assert sum(len(batch_images) for batch_images, _ in dataset) == 500


def test_gpu_global_batch_grows_with_the_replicas():
    args = cli.build_parser("gpu").parse_args([])
    assert plan_run("gpu", Settings.from_args(args), replicas=2).global_batch_size == 256


@pytest.mark.parametrize("device, replicas, flags, steps", [
    ("gpu", 2, [], 234), ("gpu", 8, [], 58), ("gpu", 3, ["--batch-size", "100"], 200),
    ("cpu", 1, [], 468), ("tpu", 8, ["--batch-size", "512"], 117), ("tpu", 1, [], 58),
])
def test_steps_per_epoch_come_from_the_global_batch(device, replicas, flags, steps):
    # an epoch is the article's 60,000 images in global batches (a mutation that
    # divided by the per-replica batch passed every default test before this one)
    args = cli.build_parser(device).parse_args(flags)
    assert plan_run(device, Settings.from_args(args), replicas=replicas).steps_per_epoch == steps


def test_tpu_batch_must_split_evenly():
    args = cli.build_parser("tpu").parse_args(["--batch-size", "1020"])
    with pytest.raises(UserError, match="does not split evenly"):
        plan_run("tpu", Settings.from_args(args), replicas=8)


def test_learning_rate_scaling():
    assert scaled_learning_rate(1e-3, "none", 1024) == 1e-3
    assert scaled_learning_rate(1e-3, "linear", 1024) == pytest.approx(8e-3)
    assert scaled_learning_rate(1e-3, "sqrt", 1024) == pytest.approx(1e-3 * 8 ** 0.5)


@pytest.mark.parametrize("script, hint, figure", [
    ("train_gpu.py", "no GPU is visible", "gpu.png"),
    ("train_tpu.py", "no TPU found", "tpu.png"),
])
def test_no_accelerator_fails_fast_with_one_line(in_process, tmp_path, script, hint, figure):
    import tensorflow as tf

    if script == "train_gpu.py" and tf.config.list_physical_devices("GPU"):
        pytest.skip("a GPU is visible")
    tpu_hints = ("TPU_NAME", "COLAB_TPU_ADDR", "TPU_ACCELERATOR_TYPE")
    if script == "train_tpu.py" and (any(os.environ.get(v) for v in tpu_hints)
                                     or os.path.exists("/dev/accel0")):
        pytest.skip("this machine may have a TPU")
    (tmp_path / figure).write_text("earlier")
    result = in_process(script, "--output-dir", str(tmp_path))
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and hint in lines[0] and "--rehearse" in lines[0], result.stderr
    assert lines[0].startswith(f"{script}: error: ")
    assert (tmp_path / figure).read_text() == "earlier"


@pytest.mark.slow  # the default suite's budget (docs/development.md); CI runs it
@pytest.mark.parametrize("loop", ["fit", "custom"])
def test_uneven_validation_on_three_replicas_is_the_exact_mean(tmp_path, loop):
    # 500 validation digits, a global batch of 498 over 3 replicas: the last
    # batch of 2 would leave a replica empty (a Conv2D error on CPU, NaN on GPU)
    train_gpu.main(["--rehearse", "3", "--batch-size", "166", "--epochs", "1",
                    "--steps-per-epoch", "2", "--data-source", "sample", "--loop", loop,
                    "--output-dir", str(tmp_path)])
    name = "gpu_rehearsal_epochs-1_batch-size-166_steps-per-epoch-2_data-source-sample" + (
        "_loop-custom" if loop == "custom" else "")
    record = json.loads((tmp_path / f"{name}.json").read_text())
    assert (record["replicas"], record["global_batch_size"]) == (3, 498)
    assert (record["validation_images"], record["validation_split_images"]) == (498, 500)
    assert np.isfinite(record["loss"]).all() and np.isfinite(record["val_loss"]).all()
    # val_loss is the mean squared error over exactly the first 498 digits
    digits = SampleSource("test").examples(config.VALIDATION_FLAG)[0][:498]
    digits = digits.astype("float32") / 255.0
    model = keras.saving.load_model(tmp_path / f"{name}.keras")
    expected = float(np.mean((model.predict(digits, verbose=0) - digits) ** 2))
    assert record["val_loss"][-1] == pytest.approx(expected, rel=1e-4)


def test_a_tpu_runs_a_whole_epoch_per_execution():
    args = cli.build_parser("tpu").parse_args([])
    plan = plan_run("tpu", Settings.from_args(args), replicas=8)
    assert plan.steps_per_execution == plan.steps_per_epoch == 58  # not 2 x 29


@pytest.mark.slow  # the default suite's budget (docs/development.md); CI runs it
def test_config_edits_change_the_tpu_run(tmp_path, monkeypatch):
    # a reader edits config.py, as the article suggests for the blur
    monkeypatch.setattr(config, "TPU_BATCH_SIZE", 64)
    monkeypatch.setattr(config, "TPU_STEPS_PER_EPOCH", 7)
    monkeypatch.setattr(config, "TPU_VALIDATION_STEPS", 3)
    monkeypatch.setattr(config, "TPU_IMG_PATH", str(tmp_path / "figures" / "my_tpu.png"))
    train_tpu.main(["--rehearse", "4", "--epochs", "1", "--data-source", "sample"])
    name = "my_tpu_rehearsal_epochs-1_data-source-sample"  # 64: the config's default now
    record = json.loads((tmp_path / "figures" / f"{name}.json").read_text())
    assert (record["global_batch_size"], record["steps_per_epoch"]) == (64, 7)
    assert (record["validation_steps"], record["validation_images"]) == (3, 192)
    assert (tmp_path / "figures" / f"{name}.png").exists()
    # a flag still overrides the config
    args = cli.build_parser("tpu").parse_args(["--steps-per-epoch", "5"])
    assert plan_run("tpu", Settings.from_args(args), replicas=4).steps_per_epoch == 5


@pytest.mark.slow
def test_more_than_32_replicas_predict_their_digits_and_write_every_output(repo, tmp_path):
    # 5 machines of 8 GPUs: Keras' default predict batch of 32 left replicas
    # without an image, and the run failed after training, writing nothing
    result = subprocess.run(
        [sys.executable, "train_gpu.py", "--rehearse", "40", "--epochs", "1",
         "--steps-per-epoch", "1", "--batch-size", "1", "--data-source", "sample",
         "--output-dir", str(tmp_path)], cwd=repo, capture_output=True, text=True, timeout=900,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    assert result.returncode == 0, result.stderr[-2000:]
    assert "[INFO] Number of accelerators: 40" in result.stdout
    for suffix in ("png", "json", "keras"):
        name = "gpu_rehearsal_epochs-1_batch-size-1_steps-per-epoch-1_data-source-sample"
        assert (tmp_path / f"{name}.{suffix}").is_file()
