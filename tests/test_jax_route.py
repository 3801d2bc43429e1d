"""train_tpu.py on Keras' JAX backend: the route Colab's and Kaggle's TPUs take, rehearsed.

Keras' backend is fixed when Keras is first imported, and this session's is
TensorFlow's, so what runs on JAX runs in processes of its own, with
JAX_NUM_CPU_DEVICES giving JAX N CPU devices, as `--rehearse N` does.
"""
import json
import os
import subprocess
import sys

import pytest

from conftest import REPO, output_files, outputs_name

from pyimagesearch import runtime as backend
from pyimagesearch import tpu_runtime
from pyimagesearch.runtime import Host
from pyimagesearch import jax_route as data_parallel
from pyimagesearch.errors import UserError
from pyimagesearch.plan import Settings

pytest.importorskip("jax")  # requirements-dev.txt installs it

TINY = ["--epochs", "1", "--steps-per-epoch", "2", "--data-source", "sample"]
TPU_V5E_8 = Host(service="kaggle", gpus=0, tpu_chips=8, tpu_generation="v5e")
NO_TPU = Host(service="local", gpus=0, tpu_chips=0, tpu_generation="")


def _jax_env(devices=None):
    """This environment with KERAS_BACKEND=jax (and `devices` JAX CPU devices)."""
    env = {**os.environ, "KERAS_BACKEND": "jax"}
    if devices:
        env.update(JAX_PLATFORMS="cpu", JAX_NUM_CPU_DEVICES=str(devices))
    return env


# --- the loss on JAX: the article's scale=1 takes the one-device step ---------------------------

@pytest.fixture(scope="module")
def jax_steps():
    done = subprocess.run(
        [sys.executable, "tools/jax_loss_step.py", "2:1", "8:1", "8:8"], cwd=REPO,
        env=_jax_env(8), capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    record = json.loads(done.stdout.splitlines()[-1])
    return dict(record["steps"], backend=record["backend"], step_size=record["step_size"])


def test_on_jax_the_articles_scale_1_takes_the_one_device_step(jax_steps):
    assert jax_steps["backend"] == "jax"
    assert jax_steps["step_size"] > 1e-3  # a real step, not round-off
    for replicas in (2, 8):
        step = jax_steps[f"{replicas}:1"]
        assert abs(step["ratio"] - 1.0) < 1e-3, step
        assert step["max_difference"] < 1e-3 * jax_steps["step_size"], step


def test_on_jax_tensorflows_scale_n_would_shrink_the_step_n_times(jax_steps):
    # what scale=numAcc, right on tf.distribute, would do on JAX
    assert abs(jax_steps["8:8"]["ratio"] - 1 / 8) < 1e-3


def test_the_quoted_jax_record_says_the_same(repo):
    record = json.loads((repo / "outputs/quoted/listings/jax_loss_step.json").read_text())
    assert record["backend"] == "jax" and record["command"][0] == "jax_loss_step.py"
    assert abs(record["steps"]["8:1"]["ratio"] - 1.0) < 1e-3
    assert abs(record["steps"]["8:8"]["ratio"] - 1 / 8) < 1e-3


@pytest.mark.parametrize("cases, said", [
    (["9:1"], "9 devices asked for, JAX has 8: set JAX_NUM_CPU_DEVICES=9"),
    (["0:1"], "N and SCALE must be at least 1, got '0:1'"),
    (["8"], "expected N:SCALE, such as 8:1, got '8'"),
])
def test_the_step_tool_refuses_in_one_line(repo, cases, said):
    done = subprocess.run([sys.executable, "tools/jax_loss_step.py", *cases], cwd=repo,
                          env=_jax_env(8), capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1].endswith(said), done.stderr


# --- the route: which backend train_tpu.py takes ---------------------------------------------

@pytest.mark.parametrize("asked, host, jax_installed, tf_tpu, route", [
    (None, TPU_V5E_8, True, False, "jax"),          # Colab's and Kaggle's TPU images
    (None, TPU_V5E_8, True, True, "tensorflow"),    # tensorflow-tpu installed: its route
    (None, TPU_V5E_8, False, False, "tensorflow"),  # no JAX
    (None, NO_TPU, True, False, "tensorflow"),      # no TPU: the article's, rehearsed
    ("jax", NO_TPU, False, False, "jax"),           # asked for: taken as asked
    ("tensorflow", TPU_V5E_8, True, False, "tensorflow"),
])
def test_the_route_follows_keras_backend_else_the_tpu_image(asked, host, jax_installed,
                                                            tf_tpu, route):
    environ = {} if asked is None else {"KERAS_BACKEND": asked}
    assert backend.tpu_route(environ, host, jax_installed, tf_tpu) == route
    # what Keras reads at its import (unset, it takes TensorFlow)
    assert environ.get("KERAS_BACKEND", "tensorflow") == route


@pytest.mark.parametrize("asked", ["torch", "numpy", ""])
def test_a_backend_neither_route_takes_is_refused(asked):
    with pytest.raises(UserError, match=f"not KERAS_BACKEND={asked}; set KERAS_BACKEND=jax"):
        backend.tpu_route({"KERAS_BACKEND": asked}, TPU_V5E_8, True, False)


def test_prepare_on_jax_gives_a_rehearsal_its_devices_and_leaves_the_tpu_alone(monkeypatch):
    monkeypatch.delitem(sys.modules, "tensorflow")  # as at the top of train_tpu.py
    environ = {"KERAS_BACKEND": "jax", "TPU_LOAD_LIBRARY": "0",
               "PYIMAGESEARCH_TPU_LOAD_LIBRARY": "0"}
    said = tpu_runtime.prepare(["--rehearse", "8"], environ, TPU_V5E_8, lambda: "/lib/libtpu.so")
    assert said == "Keras on JAX: a rehearsal on 8 JAX CPU devices"
    assert environ["JAX_NUM_CPU_DEVICES"] == "8" and environ["JAX_PLATFORMS"] == "cpu"
    assert environ["TPU_LOAD_LIBRARY"] == "0"  # the chips stay free for a real run


def test_prepare_on_jax_lets_jax_take_the_tpu_and_sets_no_tensorflow_runtime(monkeypatch):
    monkeypatch.delitem(sys.modules, "tensorflow")
    environ = {"TPU_LOAD_LIBRARY": "0", "PYIMAGESEARCH_TPU_LOAD_LIBRARY": "0"}
    monkeypatch.setattr(backend, "installed", lambda module: True)
    monkeypatch.setattr(backend, "tensorflow_tpu_installed", lambda: False)
    said = tpu_runtime.prepare([], environ, TPU_V5E_8, lambda: "/lib/libtpu.so")
    assert said.startswith("Keras on JAX: JAX's libtpu reaches the TPU")
    assert environ == {"KERAS_BACKEND": "jax"}  # no hold on libtpu, no PJRT for TensorFlow


# --- what the route refuses, before any training -------------------------------------------

@pytest.mark.parametrize("flags, named", [
    ({"jit_compile": True}, "--jit-compile"),
])
def test_what_jax_cannot_do_here_is_refused_in_one_line(flags, named):
    with pytest.raises(UserError) as refused:
        data_parallel.refuse_levers(Settings(**flags))
    assert str(refused.value).startswith(f"{named}: not on Keras' JAX backend")
    assert "\n" not in str(refused.value)


def test_the_levers_jax_keeps_are_not_refused():
    data_parallel.refuse_levers(Settings(precision="mixed_bfloat16", logdir="logs",
                                         lr_scaling="sqrt", optimizer="sgd",
                                         backup_dir="backups", backup_every=5))
    # run on JAX since issue 43: tests/test_jax_loop.py
    data_parallel.refuse_levers(Settings(loop="custom", profile_steps=(1, 2),
                                         precision="mixed_float16"))


# --- the rehearsal, end to end -------------------------------------------------------------

def test_the_jax_rehearsal_trains_on_8_devices_and_writes_its_outputs(repo, tmp_path):
    args = TINY + ["--rehearse", "8", "--logdir", str(tmp_path / "logs")]
    done = subprocess.run([sys.executable, "train_tpu.py", *args, "--output-dir",
                           str(tmp_path)], cwd=repo, env=_jax_env(), capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    name = outputs_name("tpu", args) + "_jax"
    assert name == "tpu_rehearsal_epochs-1_steps-per-epoch-2_data-source-sample_jax"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["logs"] + output_files(name)
    record = json.loads((tmp_path / f"{name}.json").read_text())
    assert (record["backend"], record["strategy"]) == ("jax", "DataParallel")
    assert (record["replicas"], record["global_batch_size"]) == (8, 1024)
    assert record["per_replica_batch_size"] == 128
    assert record["jax_version"] not in (None, "not installed")
    assert "[INFO] Number of accelerators: 8" in done.stdout
    assert "Keras on JAX" in done.stdout
    assert "Traceback" not in done.stderr
    assert list((tmp_path / "logs").iterdir())  # TensorBoard's logs, on JAX too


@pytest.mark.slow  # the default suite's budget (docs/development.md); CI runs it
def test_on_jax_with_no_tpu_one_line_says_what_was_found(repo, tmp_path):
    done = subprocess.run([sys.executable, "train_tpu.py", *TINY, "--output-dir",
                           str(tmp_path)], cwd=repo, env=_jax_env(), capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2
    said = done.stderr.strip().splitlines()
    assert len(said) == 1, done.stderr
    assert said[0].startswith("train_tpu.py: error: no TPU for Keras on JAX: this machine, no GPU "
                              "or TPU; JAX sees 1 cpu")
    assert "jax 0." in said[0] and "tensorflow 2." in said[0] and "libtpu" in said[0]
    assert not list(tmp_path.iterdir())


@pytest.mark.slow  # the default suite's budget (docs/development.md); CI runs it
def test_on_jax_jit_compile_is_refused_before_training(repo, tmp_path):
    done = subprocess.run([sys.executable, "train_tpu.py", *TINY, "--rehearse", "2",
                           "--jit-compile", "--output-dir", str(tmp_path)], cwd=repo,
                          env=_jax_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "train_tpu.py: error: --jit-compile: not on Keras' JAX backend (JAX compiles "
        "every step with XLA anyway); run with KERAS_BACKEND=tensorflow"]
    assert "[INFO] training the autoencoder" not in done.stdout


def test_a_keras_backend_neither_route_takes_is_one_line_and_status_2(repo):
    done = subprocess.run([sys.executable, "train_tpu.py", "--rehearse", "2"], cwd=repo,
                          env={**os.environ, "KERAS_BACKEND": "torch"}, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "train_tpu.py: error: train_tpu.py runs Keras on TensorFlow or on JAX, not "
        "KERAS_BACKEND=torch; set KERAS_BACKEND=jax or KERAS_BACKEND=tensorflow"]


def test_the_run_names_keep_jax_apart():
    from pyimagesearch.plan import run_name

    tf_name = run_name("tpu", Settings(batch_size=1024), True, "cpu")
    jax_name = run_name("tpu", Settings(batch_size=1024), True, "cpu", "jax")
    assert (tf_name, jax_name) == ("tpu_rehearsal", "tpu_rehearsal_jax")
    assert run_name("tpu", Settings(batch_size=1024), False, "tpu", "jax") == "tpu_jax"


def test_strategy_found_names_both_frameworks_devices():
    line = data_parallel.found(["cpu:0"])
    assert line.startswith("this machine, no GPU or TPU; JAX sees 1 cpu device(s), TensorFlow "
                           "CPU; jax ")
