"""--backup-dir: a run stopped by SIGTERM or killed resumes to the uninterrupted run's weights.

The stops are real: a training subprocess gets SIGTERM (it saves at the next
step, one line, status 143) or SIGKILL (it resumes from the last save), and the
same command runs again. A backup that cannot be used (damaged, another run's or
seed's, past the epochs asked for, in use, on a full disk) is one line, and is
left as it was.
"""
import json
import os
import signal
import subprocess
import sys

import numpy as np
import pytest

import train_cpu
from conftest import ENV, REPO, one_line, outputs_name, saved_weights

from pyimagesearch import files, outputs
from pyimagesearch.errors import UserError

TINY = ["--epochs", "1", "--steps-per-epoch", "3", "--batch-size", "32",
        "--data-source", "sample"]
# long enough to be stopped mid-epoch: 2 epochs of 40 steps, a save every 4
RESUMED = ["--epochs", "2", "--steps-per-epoch", "40", "--batch-size", "16",
           "--data-source", "sample"]


def _stopped(args, signum, after="Epoch 2/2"):
    """Run train_cpu.py `args`; send `signum` once it prints `after`; the finished process."""
    process = subprocess.Popen([sys.executable, "train_cpu.py", *args], cwd=REPO, env=ENV,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for line in process.stdout:
        if line.startswith(after):
            process.send_signal(signum)
            break
    out, err = process.communicate(timeout=300)
    return process.returncode, err


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """The weights and record of RESUMED run without a stop, per loop."""
    folder, made = tmp_path_factory.mktemp("uninterrupted"), {}

    def get(loop):
        if loop not in made:
            args = RESUMED + ["--loop", loop, "--output-dir", str(folder / loop)]
            train_cpu.main(args)
            name = outputs_name("cpu", RESUMED + ["--loop", loop])
            made[loop] = (saved_weights(folder / loop / f"{name}.keras"),
                          json.loads((folder / loop / f"{name}.json").read_text()))
        return made[loop]

    return get


@pytest.mark.tf_versions
@pytest.mark.parametrize("signum, loop", [
    (signal.SIGTERM, "fit"),
    pytest.param(signal.SIGTERM, "custom", marks=pytest.mark.slow),
    pytest.param(signal.SIGKILL, "fit", marks=pytest.mark.slow),
    pytest.param(signal.SIGKILL, "custom", marks=pytest.mark.slow)])
def test_a_stopped_run_resumes_to_the_uninterrupted_weights(tmp_path, uninterrupted, signum,
                                                             loop):
    args = RESUMED + ["--loop", loop, "--backup-dir", str(tmp_path / "backup"),
                      "--backup-every", "4", "--output-dir", str(tmp_path / "out")]
    status, err = _stopped(args, signum)
    name = outputs_name("cpu", RESUMED + ["--loop", loop])
    state = json.loads((tmp_path / "backup" / "backup.json").read_text())
    if signum == signal.SIGTERM:  # saved at the next step, in one line
        assert status == 143
        assert err.strip().splitlines()[-1] == (
            f"train_cpu.py: error: stopped by SIGTERM after {state['step']} steps; the backup "
            f"in {tmp_path / 'backup'} holds them: run the same command to resume")
        assert state["step"] > 40  # in the second epoch
    else:
        assert status == -signal.SIGKILL
    assert not (tmp_path / "out" / f"{name}.json").exists()  # the stopped run wrote nothing
    train_cpu.main(args)  # the same command
    record = json.loads((tmp_path / "out" / f"{name}.json").read_text())
    assert record["resumed_from_step"] == state["step"]
    assert record["resumed_from_epoch"] == state["step"] // 40
    weights, whole = uninterrupted(loop)
    for resumed, reference in zip(saved_weights(tmp_path / "out" / f"{name}.keras"), weights):
        np.testing.assert_array_equal(resumed, reference)
    assert record["val_loss"] == whole["val_loss"] and len(record["loss"]) == 2
    assert not (tmp_path / "backup").exists()  # a finished run deletes its backup


def _left_backup(folder):
    """FOLDER/backup: the backup of a 1-epoch run whose outputs could not be written."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(outputs, "replace_file", lambda *a, **k: (_ for _ in ()).throw(
            UserError("cannot write the outputs (a full disk)")))
        with pytest.raises(UserError, match="a full disk"):
            train_cpu.main(TINY + ["--backup-dir", str(folder / "backup"),
                                   "--output-dir", str(folder / "out")])
    return folder / "backup"


@pytest.fixture
def backup(tmp_path):
    return _left_backup(tmp_path)


def _snapshot(folder):
    return {name: (folder / name).read_bytes() for name in sorted(os.listdir(folder))}


def test_a_failed_write_leaves_a_backup_the_rerun_finishes_from(backup, tmp_path):
    assert sorted(os.listdir(backup)) == [".lock", "backup.json", "weights-3.weights.h5"]
    state = json.loads((backup / "backup.json").read_text())
    assert state["step"] == 3 and len(state["history"]["loss"]) == 1
    train_cpu.main(TINY + ["--backup-dir", str(backup), "--output-dir", str(tmp_path / "out")])
    record = json.loads((tmp_path / "out" / f"{outputs_name('cpu', TINY)}.json").read_text())
    assert record["resumed_from_epoch"] == 1 and record["epoch_seconds"] == []
    assert record["loss"] == state["history"]["loss"]  # the backup's epochs, in the record
    assert not backup.exists()


@pytest.mark.parametrize("change, complaint", [
    (["--batch-size", "16"], r"another run \(global_batch_size 32 -> 16\); delete it"),
    (["--seed", "7"], r"another run \(seed 42 -> 7\)"),
    (["--learning-rate", "0.01"], r"another run \(learning_rate 0.001 -> 0.01\)")])
def test_a_backup_of_another_run_is_refused_and_left_as_it_was(backup, tmp_path, change,
                                                               complaint):
    before = _snapshot(backup)
    args = TINY + change + ["--backup-dir", str(backup), "--output-dir", str(tmp_path / "o")]
    with pytest.raises(UserError, match=complaint):
        train_cpu.main(args)
    assert _snapshot(backup) == before


def _damage(backup, how):
    state = json.loads((backup / "backup.json").read_text())
    if how == "cut weights":
        path = backup / state["weights"]
        os.truncate(path, path.stat().st_size // 2)
    elif how == "no weights":
        (backup / state["weights"]).unlink()
    elif how == "not json":
        (backup / "backup.json").write_text("{cut")
    elif how == "a list":
        (backup / "backup.json").write_text("[1, 2]")
    elif how == "another file":
        (backup / "backup.json").write_text(json.dumps({**state, "weights": "../x.h5"}))
    elif how == "no history":
        (backup / "backup.json").write_text(json.dumps({**state, "history": {
            "loss": [], "val_loss": []}}))
    elif how == "past the epochs":
        (backup / "backup.json").write_text(json.dumps({**state, "step": 4, "weights":
                                                        "weights-4.weights.h5"}))
        (backup / state["weights"]).rename(backup / "weights-4.weights.h5")
    elif how == "something else":
        (backup / "backup.json").unlink()
        (backup / "notes.txt").write_text("mine")


@pytest.mark.parametrize("how, complaint", [
    ("cut weights", r"^cannot read the backup .*weights-3.weights.h5 \(.*\); delete the backup"),
    ("no weights", r"weights-3.weights.h5, which backup.json names, is missing; delete"),
    ("not json", r"^cannot read .*backup.json \(.*\); delete the backup folder"),
    ("a list", r"backup.json does not describe a backup; delete the backup folder"),
    ("another file", r"backup.json does not describe a backup"),
    ("no history", r"holds the losses of fewer epochs than its 1 epoch done; delete"),
    ("past the epochs", r"has 4 steps done \(1 epoch and 1 step\), more than the 3 of "
                        r"--epochs 1; raise --epochs, or delete the backup"),
    ("something else", r"holds files of something else; choose an empty or new folder")])
def test_a_backup_that_cannot_be_used_is_one_line_and_left_in_place(backup, tmp_path, how,
                                                                    complaint):
    _damage(backup, how)
    before = _snapshot(backup)
    with pytest.raises(UserError, match=complaint):
        train_cpu.main(TINY + ["--backup-dir", str(backup), "--output-dir", str(tmp_path / "o")])
    assert _snapshot(backup) == before


def test_a_backup_in_use_by_a_live_run_is_refused_and_a_dead_ones_taken_over(backup, tmp_path):
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        lock = {"host": os.uname().nodename, "pid": sleeper.pid}
        (backup / ".lock").write_text(json.dumps(lock))
        with pytest.raises(UserError, match=f"in use by process {sleeper.pid} on "):
            train_cpu.main(TINY + ["--backup-dir", str(backup), "--output-dir",
                                   str(tmp_path / "o")])
    finally:
        sleeper.kill()
        sleeper.wait()
    train_cpu.main(TINY + ["--backup-dir", str(backup), "--output-dir", str(tmp_path / "o")])
    assert not backup.exists()  # taken over, finished, deleted


def test_a_full_backup_disk_is_one_line_and_keeps_the_last_backup(tiny_disk, tmp_path):
    disk = tiny_disk("backup", "64k")  # a weights file is about 60 kB: the second save fails
    with pytest.raises(UserError, match=r"^cannot (save the backup|write) .*No space left on "
                                        "device.*(no backup was kept yet|backup of)"):
        train_cpu.main(TINY + ["--backup-every", "1", "--backup-dir", str(disk / "b"),
                               "--output-dir", str(tmp_path / "o")])
    assert not [name for name in os.listdir(disk / "b") if name.startswith(".tmp")]


def test_a_backup_into_a_bucket(tmp_path):
    folder = "ram://backups/run"
    train_cpu.main(TINY + ["--backup-dir", folder, "--output-dir", str(tmp_path)])
    import tensorflow as tf
    assert not tf.io.gfile.exists(folder)  # written while it ran, deleted at its end
    files  # noqa: B018


def test_a_second_run_on_the_same_backup_in_this_process_is_its_own(in_process, tmp_path):
    args = TINY + ["--backup-dir", str(tmp_path / "b"), "--output-dir", str(tmp_path / "o")]
    assert in_process("train_cpu.py", *args).returncode == 0
    assert in_process("train_cpu.py", *args).returncode == 0  # its own lock, not another's
    bad = in_process("train_cpu.py", *TINY, "--backup-every", "0")
    assert "--backup-every: must be at least 1" in one_line(bad)
