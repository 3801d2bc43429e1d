"""Surviving a crash (--backup-dir) and watching a run (--logdir, --profile-steps).

The crash is real: a training subprocess is killed with SIGKILL during its
third epoch, and the same command is run again.
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
from pyimagesearch.base.errors import UserError

SHORT = ["--steps-per-epoch", "60", "--batch-size", "64", "--data-source", "sample"]


def _start(repo, args):
    return subprocess.Popen([sys.executable, "train_cpu.py", *args], cwd=repo,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)


@pytest.mark.tf_versions
@pytest.mark.parametrize("loop", ["fit", pytest.param("custom", marks=pytest.mark.slow)])
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

    from pyimagesearch.training.callbacks import attempt_logdir

    now = datetime.datetime(2026, 12, 3, 12, 0, 0)
    first = attempt_logdir(str(tmp_path), "cpu", now)
    second = attempt_logdir(str(tmp_path), "cpu", now)
    assert first.endswith("cpu/20261203-120000") and second.endswith("cpu/20261203-120000-2")
    assert sorted(os.listdir(tmp_path / "cpu")) == ["20261203-120000", "20261203-120000-2"]
