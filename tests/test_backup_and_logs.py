"""Surviving a crash (--backup-dir) and watching a run (--logdir, --profile-steps).

The crash is real: a training subprocess is killed with SIGKILL during its
third epoch, and the same command is run again. A backup that cannot be used
(damaged, another run's or seed's, past the epochs asked for, in use by a live
process, around the outputs or logs, on a full disk) is one line and is left
in place; a backup saved mid-epoch counts every step trained after it.
"""
import json
import os
import re
import signal
import subprocess
import sys

import pytest
from tensorboard.backend.event_processing import event_accumulator

import train_cpu
from conftest import earlier_outputs, one_line, output_files, outputs_name, outputs_state

from pyimagesearch import backup as backup_module
from pyimagesearch import outputs
from pyimagesearch.errors import Preempted, UserError

SHORT = ["--steps-per-epoch", "60", "--batch-size", "64", "--data-source", "sample"]
# one epoch of 3 steps: the runs whose backup is damaged, refused or left behind
TINY = ["--epochs", "1", "--steps-per-epoch", "3", "--batch-size", "32",
        "--data-source", "sample"]


def _start(repo, args):
    return subprocess.Popen([sys.executable, "train_cpu.py", *args], cwd=repo,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)


@pytest.mark.tf_versions
@pytest.mark.slow  # the default suite's budget (docs/development.md); CI runs it
@pytest.mark.parametrize("loop", ["fit", "custom"])
def test_a_killed_run_resumes_from_its_backup(repo, tmp_path, in_process, loop):
    args = SHORT + ["--epochs", "4", "--loop", loop, "--backup-dir", str(tmp_path / "backup"),
                    "--output-dir", str(tmp_path / "out")]
    first = _start(repo, args)
    try:
        for line in first.stdout:
            if line.startswith("Epoch 3/4"):
                os.kill(first.pid, signal.SIGKILL)  # a crash in the middle of epoch 3
                break
        first.wait(timeout=60)
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
            first.wait()
    assert first.returncode == -signal.SIGKILL
    name = "cpu_epochs-4_batch-size-64_steps-per-epoch-60_data-source-sample" + (
        "_loop-custom" if loop == "custom" else "")
    assert not (tmp_path / "out" / f"{name}.json").exists()  # the killed run wrote nothing

    again = in_process("train_cpu.py", *args)  # the same command, after the crash
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-2000:]
    epochs = re.findall(r"^Epoch (\d)/4", again.stdout, flags=re.MULTILINE)
    assert epochs == ["3", "4"]  # epochs 1 and 2 were not trained again
    record = json.loads((tmp_path / "out" / f"{name}.json").read_text())
    assert record["resumed_from_epoch"] == 2 and len(record["epoch_seconds"]) == 2
    assert len(record["loss"]) == len(record["val_loss"]) == 4
    assert record["loss"] == sorted(record["loss"], reverse=True)  # falling, no restart
    assert not (tmp_path / "backup").exists()  # a finished run deletes its backup


def test_a_backup_of_another_run_is_refused(tmp_path):
    backup = tmp_path / "backup"
    backup.mkdir()
    (backup / "run.json").write_text(json.dumps({
        "run": "cpu",  # a backup's run is the script's, without its flags (backup.identity)
        "model": "AutoEncoder", "global_batch_size": 64, "replicas": 1,
        "steps_per_epoch": 2, "loop": "fit", "optimizer": "adam", "data_source": "sample",
        "precision": "float32", "learning_rate": 0.001, "data_dir": None, "seed": 42,
        "jit_compile": False}))
    (backup / "training_metadata.json").write_text('{"epoch": 1, "batch": 0}')
    args = ["--epochs", "2", "--steps-per-epoch", "2", "--batch-size", "32",
            "--data-source", "sample", "--backup-dir", str(backup),
            "--output-dir", str(tmp_path / "out")]
    with pytest.raises(UserError, match=r"another run \(global_batch_size 64 -> 32\); "
                                        r"delete it"):
        train_cpu.main(args)
    assert (backup / "training_metadata.json").exists()  # left as it was
    (backup / "run.json").unlink()
    with pytest.raises(UserError, match="holds files of something else"):
        train_cpu.main(args)


# --- a backup that cannot be used: one line, and the backup left in place ------------

def backup_left_by_a_failed_write(folder, backup_class=None):
    """FOLDER/backup: the backup of a 1-epoch train_cpu.py run whose outputs could not be
    written (the disk full as they were), kept by `backup_class` (None: the package's own)."""
    def no_disk(*args, **kwargs):
        raise OSError("disk full")

    with pytest.MonkeyPatch.context() as patch:
        if backup_class is not None:
            patch.setattr(backup_module, "Backup", backup_class)
        patch.setattr(outputs.RunOutputs, "__enter__", no_disk)
        with pytest.raises(OSError, match="disk full"):
            train_cpu.main(TINY + ["--backup-dir", str(folder / "backup"),
                                   "--output-dir", str(folder / "out")])
    return folder / "backup"


@pytest.fixture(scope="module")
def _one_left_backup(tmp_path_factory):
    """The backup folder of a 1-epoch run whose outputs could not be written, made once."""
    left = backup_left_by_a_failed_write(tmp_path_factory.mktemp("left"))
    assert (left / "checkpoints").is_dir()
    return left


@pytest.fixture
def left_backup(_one_left_backup, tmp_path):
    """A copy of that backup for one test to damage or resume, and the run's flags."""
    import shutil

    shutil.copytree(_one_left_backup, tmp_path / "backup")
    args = TINY + ["--backup-dir", str(tmp_path / "backup"), "--output-dir",
                   str(tmp_path / "out")]
    return tmp_path / "backup", args


def test_a_truncated_checkpoint_is_one_line(left_backup):
    backup, args = left_backup
    data = next((backup / "checkpoints").glob("*.data-*"))
    data.write_bytes(data.read_bytes()[: data.stat().st_size // 2])
    with pytest.raises(UserError, match="cannot read the checkpoint.*delete the backup folder"):
        train_cpu.main(args)
    assert data.exists()  # the backup is left for the user to look at


def _replace_checkpoints_with_a_file(backup):
    import shutil
    shutil.rmtree(backup / "checkpoints")
    (backup / "checkpoints").write_text("not a folder")


def _remove_the_index(backup):
    next((backup / "checkpoints").glob("*.index")).unlink()


def _name_a_missing_checkpoint(backup):
    state = backup / "checkpoints" / "checkpoint"
    state.write_text('model_checkpoint_path: "ckpt-999"\n')


@pytest.mark.parametrize("damage, complaint", [
    (_replace_checkpoints_with_a_file, "is a file, not a folder"),
    (_remove_the_index, r"ckpt-\d+, which its state file names, is missing"),
    (_name_a_missing_checkpoint, "ckpt-999, which its state file names, is missing"),
    (lambda b: (b / "history.json").write_text('{"loss": "x", "val_loss": 3}'),
     "does not hold a backup's losses"),
    # a history short of the checkpoint's epochs resumed, and its record held
    # fewer losses than epochs, silently
    (lambda b: (b / "history.json").write_text('{"loss": [], "val_loss": []}'),
     "holds the loss of 0 epochs, but the backup's checkpoint has 1 epoch done"),
    (lambda b: (b / "history.json").unlink(),
     "holds the loss of 0 epochs, but the backup's checkpoint has 1 epoch done"),
    (lambda b: (b / "run.json").write_text("[1, 2]"), "does not describe a run"),
])
def test_a_broken_backup_is_one_line_and_left_in_place(left_backup, damage, complaint,
                                                      capfd):
    backup, args = left_backup
    damage(backup)
    before = sorted(p.name for p in backup.rglob("*"))
    with pytest.raises(UserError, match=complaint + ".*delete the backup folder"):
        train_cpu.main(args)
    assert sorted(p.name for p in backup.rglob("*")) == before
    assert "ERROR" not in capfd.readouterr().err  # TensorFlow said nothing of its own


@pytest.mark.slow  # the default suite's budget (docs/development.md); CI runs it
def test_a_rerun_after_a_failed_save_writes_the_trained_model(left_backup, tmp_path):
    import keras
    import numpy as np

    _, args = left_backup
    train_cpu.main(args)  # all epochs done: nothing to train, the backup is restored
    train_cpu.main(TINY + ["--output-dir", str(tmp_path / "uninterrupted")])
    model = f"{outputs_name('cpu', TINY)}.keras"  # both runs have the same flags and name
    resumed = keras.saving.load_model(tmp_path / "out" / model).weights
    uninterrupted = keras.saving.load_model(tmp_path / "uninterrupted" / model).weights
    for a, b in zip(resumed, uninterrupted):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-7)


def test_a_backup_is_not_resumed_under_another_seed(left_backup):
    backup, args = left_backup
    with pytest.raises(UserError, match=r"another run \(seed 42 -> 7\)"):
        train_cpu.main(args + ["--seed", "7"])
    assert (backup / "checkpoints").is_dir()


def _preempted_mid_epoch_2(tmp_path, monkeypatch, epochs, steps):
    """Train `epochs` of `steps` (two executions each) with a backup, stopped by SIGTERM
    after the first execution of epoch 2 (a stand-in for the signal); the run's flags."""
    from pyimagesearch import exits as preemption

    args = ["--epochs", str(epochs), "--steps-per-epoch", str(steps), "--batch-size", "32",
            "--data-source", "sample", "--backup-dir", str(tmp_path / "backup"),
            "--output-dir", str(tmp_path / "out")]
    asked = []

    def sigterm_at_the_third_question():
        asked.append(1)
        return len(asked) == 3  # after execution 1, epoch 1's end, then execution 3

    with monkeypatch.context() as patch:
        patch.setattr(preemption, "requested", sigterm_at_the_third_question)
        with pytest.raises(Preempted, match=f"after {steps + steps // 2} steps"):
            train_cpu.main(args)
    return args


@pytest.mark.slow  # the default suite's budget (docs/development.md); CI runs it
def test_a_run_resumed_mid_epoch_counts_every_step_it_trains(tmp_path, monkeypatch):
    # fit trains the rest of a part-trained epoch in a call of its own: the
    # steps of both calls must reach the backup, or a later resume retrains
    import tensorflow as tf

    args = _preempted_mid_epoch_2(tmp_path, monkeypatch, epochs=3, steps=32)

    def no_disk(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(outputs.RunOutputs, "__enter__", no_disk)
    with pytest.raises(OSError, match="disk full"):
        train_cpu.main(args)  # the rest of epoch 2, then epoch 3; the backup stays
    latest = tf.train.latest_checkpoint(str(tmp_path / "backup" / "checkpoints"))
    assert tf.train.load_variable(latest, "step/.ATTRIBUTES/VARIABLE_VALUE") == 3 * 32


def test_a_backup_past_the_epochs_asked_for_says_what_it_holds(tmp_path, monkeypatch):
    args = _preempted_mid_epoch_2(tmp_path, monkeypatch, epochs=2, steps=34)
    args[1] = "1"  # now only 1 epoch: the backup is past it
    with pytest.raises(UserError, match=r"has 51 steps done \(1 epoch and 17 steps\), more "
                                        r"than the 34 of --epochs 1"):
        train_cpu.main(args)


def test_a_second_run_on_a_backup_folder_in_use_is_refused_and_a_dead_ones_taken_over(
        tmp_path):
    import socket

    backup = tmp_path / "backup"
    args = TINY + ["--backup-dir", str(backup), "--output-dir", str(tmp_path / "out")]
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        backup.mkdir()
        (backup / ".lock").write_text(json.dumps({"host": socket.gethostname(),
                                                  "pid": other.pid}))
        with pytest.raises(UserError, match=rf"is in use by the run of process {other.pid}"):
            train_cpu.main(args)
        assert not (backup / "run.json").exists()  # the folder is the other run's
    finally:
        other.kill()
        other.wait()
    train_cpu.main(args)  # that process is gone: its lock is taken over
    assert (tmp_path / "out" / f"{outputs_name('cpu', args)}.json").exists()
    assert not backup.exists()


def test_an_output_folder_inside_the_backup_folder_is_refused(tmp_path):
    for output in (tmp_path / "both", tmp_path / "both" / "out"):
        with pytest.raises(UserError, match="is inside --backup-dir .* separate folders"):
            train_cpu.main(TINY + ["--backup-dir", str(tmp_path / "both"),
                                   "--output-dir", str(output)])
    assert not any(path.is_file() for path in tmp_path.rglob("*"))


def _link(link, target):
    target.mkdir(parents=True, exist_ok=True)
    link.symlink_to(target, target_is_directory=True)
    return link


@pytest.mark.parametrize("case", ["output link into backup", "backup link to output",
                                  "logdir link into backup", "logdir is backup",
                                  "data-dir link into backup"])
def test_folders_are_compared_as_the_file_system_sees_them(tmp_path, case):
    backup, out = tmp_path / "backup", tmp_path / "out"
    flags = {"--backup-dir": backup, "--output-dir": out}
    if case == "output link into backup":
        flags["--output-dir"] = _link(tmp_path / "out-link", backup / "out")
        named = "--output-dir"
    elif case == "backup link to output":
        flags["--backup-dir"] = _link(tmp_path / "backup-link", out)
        named = "--output-dir"
    elif case == "logdir link into backup":
        flags["--logdir"] = _link(tmp_path / "logs", backup / "logs")
        named = "--logdir"
    elif case == "logdir is backup":
        flags["--logdir"] = backup
        named = "--logdir"
    else:
        flags["--data-dir"] = _link(tmp_path / "records", backup / "records")
        named = "--data-dir"
    args = [item for pair in flags.items() for item in (pair[0], str(pair[1]))]
    with pytest.raises(UserError, match=rf"^{named} .* is inside --backup-dir .*, which is "
                                        "deleted when the run ends; give them separate"):
        train_cpu.main(TINY + args)
    assert not any(path.is_file() for path in tmp_path.rglob("*"))  # nothing written


def test_a_full_backup_disk_is_one_line_and_keeps_the_last_backup(tiny_disk, in_process,
                                                                  tmp_path):
    disk = tiny_disk("disk", "64k")  # room for one checkpoint of the model, not two
    args = ["--epochs", "2", "--steps-per-epoch", "3", "--batch-size", "32",
            "--data-source", "sample", "--backup-every", "1",
            "--backup-dir", str(disk / "backup"), "--output-dir", str(tmp_path / "out")]
    names = output_files(outputs_name("cpu", args))  # what the run would replace
    earlier_outputs(tmp_path / "out", names)
    line = one_line(in_process("train_cpu.py", *args))
    assert f"cannot save the backup in {disk / 'backup'}" in line
    assert "No space left on device" in line and "earlier outputs are untouched" in line
    from pyimagesearch.backup import saved_checkpoint

    step, _ = saved_checkpoint(str(disk / "backup"))
    assert step >= 1 and f"it holds the backup of {step:,} steps" in line  # what is there
    assert outputs_state(tmp_path / "out", names) == "old"
    assert not list((disk / "backup" / "checkpoints").glob("checkpoint.tmp*"))


# --- TensorBoard logs and the profiler --------------------------------------------

def _attempts(logs):
    """logs/NAME/TIME: the attempt folders of the one run logged in `logs`, oldest first."""
    runs = os.listdir(logs)
    assert len(runs) == 1, runs
    return sorted(logs / runs[0] / attempt for attempt in os.listdir(logs / runs[0]))


def _logged(folder):
    """{tag: number of values} of the TensorBoard events in `folder`."""
    events = event_accumulator.EventAccumulator(
        str(folder), size_guidance={event_accumulator.TENSORS: 0})
    events.Reload()
    return {tag: len(events.Tensors(tag)) for tag in events.Tags()["tensors"]}


@pytest.mark.tf_versions
@pytest.mark.parametrize("loop", ["fit", pytest.param("custom", marks=pytest.mark.slow)])
def test_tensorboard_logs_hold_one_value_per_epoch(tmp_path, loop):
    train_cpu.main(["--epochs", "3", "--steps-per-epoch", "3", "--batch-size", "32",
                    "--data-source", "sample", "--loop", loop, "--logdir",
                    str(tmp_path / "logs"), "--output-dir", str(tmp_path / "out")])
    [attempt] = _attempts(tmp_path / "logs")
    train, validation = _logged(attempt / "train"), _logged(attempt / "validation")
    assert train["epoch_loss"] == validation["epoch_loss"] == 3
    assert train["epoch_learning_rate"] == train["epoch_images_per_second"] == 3
    assert validation["reconstructions"] == 3


@pytest.mark.tf_versions
@pytest.mark.parametrize("loop", ["fit", pytest.param("custom", marks=pytest.mark.slow)])
def test_profile_steps_leave_a_trace(tmp_path, loop):
    train_cpu.main(["--epochs", "1", "--steps-per-epoch", "4", "--batch-size", "32",
                    "--data-source", "sample", "--loop", loop, "--profile-steps", "2,3",
                    "--logdir", str(tmp_path / "logs"), "--output-dir", str(tmp_path / "out")])
    traces = [os.path.join(folder, name)
              for folder, _, names in os.walk(_attempts(tmp_path / "logs")[0])
              for name in names if name.endswith(".xplane.pb")]
    assert traces and os.path.getsize(traces[0]) > 0


@pytest.mark.parametrize("flag, complaint", [
    ("1", "expected two steps A,B"), ("3,2", "1 <= A <= B"), ("0,2", "1 <= A <= B")])
def test_bad_profile_steps_are_a_flag_error(flag, complaint):
    with pytest.raises(SystemExit):
        train_cpu.cli.build_parser("cpu", "").parse_args(["--profile-steps", flag])


def test_profile_steps_after_the_end_are_refused(tmp_path):
    with pytest.raises(UserError, match="--profile-steps 4,9 starts after the last of the "
                                        "run's 3 steps"):
        train_cpu.main(TINY + ["--profile-steps", "4,9", "--output-dir", str(tmp_path)])


@pytest.mark.tf_versions
@pytest.mark.slow
def test_tensorboard_serves_the_logged_tags(tmp_path):
    train_cpu.main(["--epochs", "2", "--steps-per-epoch", "2", "--batch-size", "32",
                    "--data-source", "sample", "--logdir", str(tmp_path / "logs"),
                    "--output-dir", str(tmp_path / "out")])
    import urllib.request

    server = subprocess.Popen(
        [os.path.join(os.path.dirname(sys.executable), "tensorboard"), "--logdir",
         str(tmp_path / "logs"), "--host", "127.0.0.1", "--port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        for line in server.stdout:
            found = re.search(r"http://127\.0\.0\.1:(\d+)/", line)
            if found:
                break
        else:
            pytest.fail("tensorboard printed no address")
        base = f"http://127.0.0.1:{found[1]}"
        with urllib.request.urlopen(f"{base}/data/plugin/scalars/tags", timeout=30) as page:
            scalars = json.load(page)
        with urllib.request.urlopen(f"{base}/data/plugin/images/tags", timeout=30) as page:
            images = json.load(page)
    finally:
        server.kill()
        server.wait()
    run = "/".join(_attempts(tmp_path / "logs")[0].parts[-2:])  # NAME/TIME
    assert "epoch_loss" in scalars[f"{run}/train"] and "epoch_loss" in scalars[f"{run}/validation"]
    assert "reconstructions" in images[f"{run}/validation"]


@pytest.mark.slow  # the default suite's budget (docs/development.md); CI runs it
def test_tensorboard_counts_epochs_from_1_as_the_log_does_and_a_rerun_starts_afresh(tmp_path):
    # logs/NAME, as docs/notebook.md says; a rerun of the same run gets a folder of its
    # own beside the first, so its curves never double back over the earlier ones
    flags = ["--epochs", "2", "--steps-per-epoch", "2", "--batch-size", "32",
             "--data-source", "sample", "--logdir", str(tmp_path / "logs"),
             "--output-dir", str(tmp_path / "out")]
    train_cpu.main(flags)
    train_cpu.main(flags)
    name = "cpu_epochs-2_batch-size-32_steps-per-epoch-2_data-source-sample"
    assert os.listdir(tmp_path / "logs") == [name]
    attempts = _attempts(tmp_path / "logs")
    assert len(attempts) == 2
    for attempt in attempts:
        for folder, tags in (("train", ("epoch_loss", "epoch_images_per_second")),
                             ("validation", ("epoch_loss", "reconstructions"))):
            events = event_accumulator.EventAccumulator(
                str(attempt / folder), size_guidance={event_accumulator.TENSORS: 0})
            events.Reload()
            for tag in tags:
                assert [event.step for event in events.Tensors(tag)] == [1, 2]


def test_a_second_attempt_within_the_same_second_gets_a_folder_of_its_own(tmp_path):
    import datetime

    from pyimagesearch.callbacks import attempt_logdir

    now = datetime.datetime(2026, 12, 3, 12, 0, 0)
    first = attempt_logdir(str(tmp_path), "cpu", now)
    second = attempt_logdir(str(tmp_path), "cpu", now)
    assert first.endswith("cpu/20261203-120000") and second.endswith("cpu/20261203-120000-2")
    assert sorted(os.listdir(tmp_path / "cpu")) == ["20261203-120000", "20261203-120000-2"]
