"""--backup-dir on Keras' JAX backend: Keras' own weights file in place of a tf.train.Checkpoint.

The runs on JAX are real processes (this session's Keras runs on
TensorFlow), rehearsed on 2 JAX CPU devices: stopped by SIGTERM or killed
with SIGKILL at a line of their output, then run again with the same
command; each must end with the weights an uninterrupted run ends with.
Each JAX run takes half a minute here, so they are marked slow.

The weights file is the same on every backend, so what a damaged or
left-over JAX backup does is tried here, in this process, on TensorFlow:
`backup.KerasBackup` stands in for `backup.Backup` in train_cpu.py's runs.
"""
import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import types

import keras
import numpy as np
import pytest

import train_cpu
from conftest import REPO, outputs_name
from test_backup_and_logs import backup_left_by_a_failed_write

from pyimagesearch import backup, outputs
from pyimagesearch.errors import UserError
from pyimagesearch.plan import Settings, plan_run

pytest.importorskip("jax")  # requirements-dev.txt installs it

# 2 epochs of 2 steps, each epoch one call into the compiled step (a TPU's)
JAX_TINY = ["--rehearse", "2", "--epochs", "2", "--steps-per-epoch", "2",
            "--data-source", "sample"]
# one epoch of 3 steps on train_cpu.py, for the backups tried in this process
TINY = ["--epochs", "1", "--steps-per-epoch", "3", "--batch-size", "32",
        "--data-source", "sample"]
JAX_NAME = "tpu_rehearsal_epochs-2_steps-per-epoch-2_data-source-sample_jax"


def _jax_env():
    """This environment with Keras on JAX, on JAX CPU devices (train_tpu.py sets how many)."""
    return {**os.environ, "KERAS_BACKEND": "jax", "JAX_PLATFORMS": "cpu"}


def _weights(path):
    return [np.asarray(w) for w in outputs.load_model(path).weights]


def _assert_same_weights(resumed, uninterrupted):
    assert len(resumed) == len(uninterrupted) == 10  # 5 layers: kernels and biases
    for a, b in zip(resumed, uninterrupted):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-7)


def _jax_run(repo, args, stop_at=None, sig=None):
    """train_tpu.py on JAX with `args`; `sig` sent once it prints a line starting `stop_at`.

    Its status and everything it printed (stderr folded in).
    """
    process = subprocess.Popen([sys.executable, "train_tpu.py", *args], cwd=repo,
                               env=_jax_env(), stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, start_new_session=True)
    lines = []
    try:
        for text in process.stdout:
            lines.append(text)
            if stop_at and text.startswith(stop_at):
                os.kill(process.pid, sig)
                break
        lines.extend(process.stdout)  # what it says on its way out
        process.wait(timeout=300)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    return process.returncode, "".join(lines)


@pytest.fixture(scope="module")
def jax_uninterrupted(tmp_path_factory):
    """The weights of the JAX rehearsal that nothing stopped, trained once for the module."""
    folder = tmp_path_factory.mktemp("jax_uninterrupted")
    status, output = _jax_run(REPO, JAX_TINY + ["--output-dir", str(folder)])
    assert status == 0, output[-3000:]
    return _weights(folder / f"{JAX_NAME}.keras")


# --- on JAX, end to end ----------------------------------------------------------------------

@pytest.mark.slow
def test_sigterm_on_jax_saves_at_the_epoch_end_and_the_rerun_ends_uninterrupted(
        repo, tmp_path, jax_uninterrupted):
    # --backup-every 1 is taken, but a call runs the whole epoch: the save
    # comes at its end (step 2), with SIGTERM's stop. The line comes before
    # the first step is even compiled (seconds), so the signal is there well
    # before epoch 1 ends.
    args = JAX_TINY + ["--backup-every", "1", "--backup-dir", str(tmp_path / "backup"),
                       "--output-dir", str(tmp_path / "out")]
    status, output = _jax_run(repo, args, "Epoch 1/2", signal.SIGTERM)
    assert status == 143, output[-3000:]
    errors = [line for line in output.splitlines() if "error" in line]
    assert errors == [f"train_tpu.py: error: stopped by SIGTERM after 2 steps; the backup in "
                      f"{tmp_path / 'backup'} holds them: run the same command to resume"]
    assert "Traceback" not in output
    assert not list((tmp_path / "out").iterdir())  # nothing written but the backup

    # the folder holds what the TensorFlow route's does, a weights file in place of
    # checkpoints/: the same run.json fields, the losses of the epoch done
    held = sorted(path.name for path in (tmp_path / "backup").iterdir())
    assert held == [".lock", "checkpoint-2.weights.h5", "checkpoint.json", "history.json",
                    "run.json"]
    run = json.loads((tmp_path / "backup" / "run.json").read_text())
    assert set(run) == set(backup.identity(_plan("tensorflow")))
    assert (run["run"], run["replicas"], run["global_batch_size"]) == (
        "tpu_rehearsal_jax", 2, 1024)
    history = json.loads((tmp_path / "backup" / "history.json").read_text())
    assert [len(history["loss"]), len(history["val_loss"])] == [1, 1]
    assert json.loads((tmp_path / "backup" / "checkpoint.json").read_text()) == {
        "step": 2, "weights": "checkpoint-2.weights.h5"}

    status, output = _jax_run(repo, args)  # the same command: no signal now
    assert status == 0, output[-3000:]
    assert "[INFO] resuming from" in output and "Epoch 1/2" not in output
    record = json.loads((tmp_path / "out" / f"{JAX_NAME}.json").read_text())
    assert (record["resumed_from_epoch"], record["resumed_from_step"]) == (1, 2)
    assert record["loss"][0] == history["loss"][0] and len(record["loss"]) == 2
    _assert_same_weights(_weights(tmp_path / "out" / f"{JAX_NAME}.keras"), jax_uninterrupted)
    assert not (tmp_path / "backup").exists()  # a finished run deletes its backup


@pytest.mark.slow
def test_a_jax_run_killed_in_epoch_2_resumes_to_the_uninterrupted_weights(
        repo, tmp_path, jax_uninterrupted):
    # "Epoch 2/2" is printed after epoch 1's backup is saved
    args = JAX_TINY + ["--backup-dir", str(tmp_path / "backup"),
                       "--output-dir", str(tmp_path / "out")]
    status, output = _jax_run(repo, args, "Epoch 2/2", signal.SIGKILL)
    assert status == -signal.SIGKILL, output[-3000:]
    status, output = _jax_run(repo, args)
    assert status == 0, output[-3000:]
    record = json.loads((tmp_path / "out" / f"{JAX_NAME}.json").read_text())
    assert (record["resumed_from_epoch"], record["resumed_from_step"]) == (1, 2)
    _assert_same_weights(_weights(tmp_path / "out" / f"{JAX_NAME}.keras"), jax_uninterrupted)


# --- what a JAX backup is, and which one is refused ----------------------------------------

def _plan(backend):
    """The plan of `train_tpu.py --rehearse 2` on `backend`, with the sample as its data."""
    plan = plan_run("tpu", Settings(batch_size=1024), 2, rehearsal=True, runtime="cpu",
                    backend=backend)
    return dataclasses.replace(plan, source=types.SimpleNamespace(label="sample"))


def test_a_backup_belongs_to_its_backend():
    # a TensorFlow backup holds checkpoints/, which the JAX run cannot read: refused
    assert backup.identity(_plan("tensorflow"))["run"] == "tpu_rehearsal"
    assert backup.identity(_plan("jax"))["run"] == "tpu_rehearsal_jax"


@pytest.mark.parametrize("content, complaint", [
    (None, None),
    ('{"step": 2, "weights": "checkpoint-2.weights.h5"}', None),
    ('{"step": 2, "weights": "../elsewhere.weights.h5"}', "does not name a checkpoint"),
    ('{"step": -1, "weights": "checkpoint--1.weights.h5"}', "does not name a checkpoint"),
    ("[2]", "does not name a checkpoint"),
    ('{"step": 3, "weights": "checkpoint-3.weights.h5"}',
     "checkpoint-3.weights.h5, which checkpoint.json names, is missing"),
])
def test_saved_weights_reads_what_checkpoint_json_names(tmp_path, content, complaint):
    (tmp_path / "checkpoint-2.weights.h5").write_bytes(b"weights")
    if content is not None:
        (tmp_path / "checkpoint.json").write_text(content)
    if complaint:
        with pytest.raises(ValueError, match=complaint):
            backup.saved_weights(str(tmp_path))
    elif content is None:
        assert backup.saved_weights(str(tmp_path)) == (0, None)
    else:
        assert backup.saved_weights(str(tmp_path)) == (
            2, str(tmp_path / "checkpoint-2.weights.h5"))


def test_a_checkpoint_json_that_is_not_json_is_one_line(tmp_path):
    (tmp_path / "checkpoint.json").write_text("{cut")
    with pytest.raises(UserError, match="cannot read .*checkpoint.json .*delete the backup"):
        backup.saved_weights(str(tmp_path))


# --- a JAX backup, tried on TensorFlow: damaged, left over, resumed -------------------------

@pytest.fixture(scope="module")
def _one_keras_backup(tmp_path_factory):
    """A KerasBackup folder of a 1-epoch run whose outputs could not be written, made once."""
    return backup_left_by_a_failed_write(tmp_path_factory.mktemp("keras_backup"),
                                         backup.KerasBackup)


@pytest.fixture
def keras_backup(_one_keras_backup, tmp_path, monkeypatch):
    """A copy of that backup for one test, KerasBackup in place, and the run's flags."""
    shutil.copytree(_one_keras_backup, tmp_path / "backup")
    monkeypatch.setattr(backup, "Backup", backup.KerasBackup)
    return tmp_path / "backup", TINY + ["--backup-dir", str(tmp_path / "backup"),
                                        "--output-dir", str(tmp_path / "out")]


def test_the_keras_backup_holds_the_tf_routes_files_and_one_weights_file(keras_backup):
    folder, _ = keras_backup
    assert sorted(path.name for path in folder.iterdir()) == [
        ".lock", "checkpoint-3.weights.h5", "checkpoint.json", "history.json", "run.json"]
    assert backup.saved_weights(str(folder)) == (3, str(folder / "checkpoint-3.weights.h5"))


def _cut_the_weights(folder):
    path = folder / "checkpoint-3.weights.h5"
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


@pytest.mark.parametrize("damage, complaint", [
    (_cut_the_weights, r"cannot read the checkpoint in .*backup \("),
    (lambda folder: (folder / "checkpoint-3.weights.h5").unlink(),
     "checkpoint-3.weights.h5, which checkpoint.json names, is missing"),
    (lambda folder: (folder / "checkpoint.json").write_text("{cut"),
     r"cannot read .*checkpoint.json \("),
    (lambda folder: (folder / "history.json").unlink(),
     "holds the loss of 0 epochs, but the backup's checkpoint has 1 epoch done"),
])
def test_a_broken_keras_backup_is_one_line_and_left_in_place(keras_backup, damage, complaint):
    folder, args = keras_backup
    damage(folder)
    before = {path.name: path.read_bytes() for path in folder.iterdir()}
    with pytest.raises(UserError, match=complaint + ".*delete the backup folder"):
        train_cpu.main(args)
    assert {path.name: path.read_bytes() for path in folder.iterdir()} == before


def test_a_keras_backup_resumes_and_a_killed_saves_file_is_not_read(keras_backup, tmp_path):
    folder, args = keras_backup
    (folder / "checkpoint-9.weights.h5").write_bytes(b"cut short by SIGKILL")
    train_cpu.main(args)  # all epochs done: nothing to train, the backup is restored
    record = json.loads((tmp_path / "out" / f"{outputs_name('cpu', TINY)}.json").read_text())
    assert (record["resumed_from_epoch"], record["resumed_from_step"]) == (1, 3)
    train_cpu.main(TINY + ["--output-dir", str(tmp_path / "uninterrupted")])
    model = f"{outputs_name('cpu', TINY)}.keras"
    resumed = [w.numpy() for w in keras.saving.load_model(tmp_path / "out" / model).weights]
    _assert_same_weights(resumed, [w.numpy() for w in keras.saving.load_model(
        tmp_path / "uninterrupted" / model).weights])
    assert not folder.exists()


def test_a_full_disk_keeps_the_last_keras_backup(tiny_disk, in_process, tmp_path,
                                                 monkeypatch):
    disk = tiny_disk("disk", "128k")  # room for one weights file of the model, not two
    monkeypatch.setattr(backup, "Backup", backup.KerasBackup)
    args = ["--epochs", "2", "--steps-per-epoch", "3", "--batch-size", "32",
            "--data-source", "sample", "--backup-every", "1",
            "--backup-dir", str(disk / "backup"), "--output-dir", str(tmp_path / "out")]
    done = in_process("train_cpu.py", *args)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr[-3000:]
    assert f"cannot save the backup in {disk / 'backup'}" in lines[0]
    step, path = backup.saved_weights(str(disk / "backup"))
    assert step >= 1 and f"it holds the backup of {step:,} steps" in lines[0]
    assert sorted(p.name for p in (disk / "backup").glob("*.weights.h5")) == [
        os.path.basename(path)]  # the half-written one removed
