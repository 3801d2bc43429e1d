"""Input that once ended in a traceback, a silent success or a machine out of memory.

Each case must end in one clear line (a UserError, which the scripts print
as one line with exit status 2) and leave earlier outputs and backups alone.
"""
import pytest

import train_cpu
import train_gpu
from pyimagesearch import cli, outputs
from pyimagesearch.training.errors import Preempted, UserError

TINY = ["--epochs", "1", "--steps-per-epoch", "3", "--batch-size", "32",
        "--data-source", "sample"]


def _earlier_outputs(folder):
    folder.mkdir()
    for name in ("cpu.png", "cpu.json", "cpu.keras"):
        (folder / name).write_text(f"earlier {name}")


def _untouched(folder):
    return all((folder / name).read_text() == f"earlier {name}"
               for name in ("cpu.png", "cpu.json", "cpu.keras"))


def test_a_diverged_run_stops_before_writing(tmp_path):
    _earlier_outputs(tmp_path / "out")
    with pytest.raises(UserError, match="training diverged.*lower --learning-rate"):
        train_cpu.main(TINY + ["--learning-rate", "1e300", "--output-dir",
                               str(tmp_path / "out")])
    assert _untouched(tmp_path / "out")


def test_a_batch_larger_than_the_data_is_refused_before_training(tmp_path):
    with pytest.raises(UserError, match="100,000,000 images is more than the 4,500"):
        train_cpu.main(["--batch-size", "100000000", "--steps-per-epoch", "1",
                        "--data-source", "sample", "--output-dir", str(tmp_path)])


def test_the_largest_accepted_sizes_parse():
    args = cli.build_parser("gpu", "").parse_args(
        ["--epochs", "100000", "--steps-per-epoch", "1000000", "--startup-timeout", "86400",
         "--rehearse", "64"])
    assert (args.epochs, args.steps_per_epoch, args.startup_timeout, args.rehearse) == (
        100_000, 1_000_000, 86_400.0, 64)


@pytest.mark.parametrize("flag", ["--output-dir", "--backup-dir", "--logdir", "--data-dir"])
def test_an_empty_folder_flag_is_one_line(flag, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError, match=f"^{flag} is empty"):
        train_cpu.main(TINY + [flag, ""])
    assert list(tmp_path.iterdir()) == []


def test_profile_steps_after_the_end_are_refused(tmp_path):
    with pytest.raises(UserError, match="--profile-steps 4,9 starts after the last of the "
                                        "run's 3 steps"):
        train_cpu.main(TINY + ["--profile-steps", "4,9", "--output-dir", str(tmp_path)])


@pytest.mark.parametrize("flags, complaint", [
    (["--rehearse", "65"], "must be at most 64"), (["--rehearse", "0"], "must be at least 1"),
    (["--startup-timeout", "0"], "finite number above 0"),
    (["--startup-timeout", "86401"], "must be at most 86400 (a day)"),
    (["--epochs", "100001"], "must be at most 100000"),
    (["--epochs", "100000000000000000000"], "must be at most 100000"),
    (["--steps-per-epoch", "1000001"], "must be at most 1000000"),
    (["--learning-rate", "-0.01"], "must be a finite number above 0, got -0.01"),
    (["--learning-rate", "nan"], "must be a finite number above 0, got nan")])
def test_sizes_that_take_the_machine_down_are_flag_errors(flags, complaint, capsys):
    with pytest.raises(SystemExit) as stop:
        cli.build_parser("gpu", "").parse_args(flags)
    assert stop.value.code == 2 and complaint in capsys.readouterr().err


def test_an_empty_tf_config_is_no_cluster(tmp_path, monkeypatch):
    monkeypatch.setenv("TF_CONFIG", "")
    train_gpu.main(TINY + ["--rehearse", "1", "--output-dir", str(tmp_path)])
    assert (tmp_path / "gpu_rehearsal.json").exists()


@pytest.fixture(scope="module")
def _one_left_backup(tmp_path_factory):
    """The backup folder of a 1-epoch run whose outputs could not be written, made once."""
    folder = tmp_path_factory.mktemp("left")

    def no_disk(*args, **kwargs):
        raise OSError("disk full")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(outputs.RunOutputs, "__enter__", no_disk)
        with pytest.raises(OSError, match="disk full"):
            train_cpu.main(TINY + ["--backup-dir", str(folder / "backup"),
                                   "--output-dir", str(folder / "out")])
    assert (folder / "backup" / "checkpoints").is_dir()
    return folder / "backup"


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


def test_an_output_folder_inside_the_backup_folder_is_refused(tmp_path):
    for output in (tmp_path / "both", tmp_path / "both" / "out"):
        with pytest.raises(UserError, match="is inside --backup-dir .* separate folders"):
            train_cpu.main(TINY + ["--backup-dir", str(tmp_path / "both"),
                                   "--output-dir", str(output)])
    assert not any(path.is_file() for path in tmp_path.rglob("*"))


def test_a_rerun_after_a_failed_save_writes_the_trained_model(left_backup, tmp_path):
    import keras
    import numpy as np

    _, args = left_backup
    train_cpu.main(args)  # all epochs done: nothing to train, the backup is restored
    train_cpu.main(TINY + ["--output-dir", str(tmp_path / "uninterrupted")])
    resumed = keras.saving.load_model(tmp_path / "out" / "cpu.keras").weights
    uninterrupted = keras.saving.load_model(tmp_path / "uninterrupted" / "cpu.keras").weights
    for a, b in zip(resumed, uninterrupted):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-7)


def test_a_backup_is_not_resumed_under_another_seed(left_backup):
    backup, args = left_backup
    with pytest.raises(UserError, match=r"another run \(seed 42 -> 7\)"):
        train_cpu.main(args + ["--seed", "7"])
    assert (backup / "checkpoints").is_dir()


def test_scratch_folders_of_killed_processes_are_removed(tmp_path, monkeypatch):
    import os
    import tempfile

    from pyimagesearch.training.files import scratch_folder

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    dead = tmp_path / "pyimagesearch-ckpt-4194305-abc"  # above Linux's pid limit
    alive = tmp_path / f"pyimagesearch-ckpt-{os.getppid()}-def"
    other = tmp_path / "pyimagesearch-outputs-4194305-ghi"
    for folder in (dead, alive, other):
        folder.mkdir()
    new = scratch_folder("ckpt")
    assert not dead.exists() and alive.exists() and other.exists()
    assert os.path.basename(new).startswith(f"pyimagesearch-ckpt-{os.getpid()}-")


def test_compare_skips_records_with_values_of_the_wrong_type(tmp_path, capsys):
    import json

    import compare

    good = {"device": "cpu", "replicas": 1, "global_batch_size": 32, "steps_per_epoch": 2,
            "epoch_seconds": [1.0, 0.5], "loss": [0.1, 0.05], "val_loss": [0.1, 0.05],
            "data_source": "sample"}
    (tmp_path / "good.json").write_text(json.dumps(good))
    (tmp_path / "bad.json").write_text(json.dumps({**good, "epoch_seconds": ["x", 2]}))
    (tmp_path / "worse.json").write_text(json.dumps({**good, "device": 5}))
    assert sorted(compare.load_records(str(tmp_path))) == ["good"]
    assert capsys.readouterr().err.count("values of the wrong type") == 2


def test_benchmark_profile_dir_that_is_a_file_is_one_line(tmp_path):
    import benchmark_pipeline

    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    with pytest.raises(UserError, match="cannot write to output folder"):
        benchmark_pipeline.main(["--data-dir", str(tmp_path), "--profile-dir",
                                 str(blocker / "profile")])


@pytest.mark.parametrize("args, complaint", [
    (["--workers", "100", "--", "train_gpu.py"], "from 2 to 16, got 100"),
    (["--workers", "1", "--", "train_gpu.py"], "from 2 to 16, got 1"),
    (["--", "tools"], "tools is a folder; give the training script"),
    (["--", "no_such.py"], "no_such.py not found")])
def test_launch_workers_refuses_what_it_cannot_start(repo, args, complaint):
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "tools/launch_workers.py", *args], cwd=repo,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and complaint in lines[0], result.stderr


def test_a_tfrecord_folder_that_is_a_file_or_a_shard_that_is_a_folder(tmp_path):
    from pyimagesearch.datasets import sources, tfrecords

    (tmp_path / "metadata.json").write_text("{}")
    with pytest.raises(UserError, match="metadata.json is a file, not a folder"):
        sources.resolve_source("tfrecord", "mnist", str(tmp_path / "metadata.json"))
    (tmp_path / "shard").mkdir()
    with pytest.raises(UserError, match="shard is a folder"):
        tfrecords._verify_shard(str(tmp_path / "shard"), 1, 1, (28, 28, 1), "")


def test_a_broken_prepared_dataset_is_one_line(tmp_path):
    from pyimagesearch.datasets import sources

    info = tmp_path / "mnist" / "3.0.1" / "dataset_info.json"
    info.parent.mkdir(parents=True)
    info.write_text("{not json")
    with pytest.raises(UserError, match=r"^cannot read the prepared mnist in .*prepare it "
                                        "again"):
        sources.tfds_prepared("mnist", str(tmp_path))


def test_a_run_resumed_mid_epoch_counts_every_step_it_trains(tmp_path, monkeypatch):
    # fit trains the rest of a part-trained epoch in a call of its own: the
    # steps of both calls must reach the backup, or a later resume retrains
    import tensorflow as tf

    from pyimagesearch.training import preemption

    args = ["--epochs", "3", "--steps-per-epoch", "32", "--batch-size", "32",
            "--data-source", "sample", "--backup-dir", str(tmp_path / "backup"),
            "--output-dir", str(tmp_path / "out")]  # 2 executions of 16 steps per epoch
    asked = []

    def sigterm_at_the_third_question():
        asked.append(1)
        return len(asked) == 3  # after step 16, epoch 1's end, then step 48

    with monkeypatch.context() as patch:
        patch.setattr(preemption, "requested", sigterm_at_the_third_question)
        with pytest.raises(Preempted, match="after 48 steps"):
            train_cpu.main(args)

    def no_disk(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(outputs.RunOutputs, "__enter__", no_disk)
    with pytest.raises(OSError, match="disk full"):
        train_cpu.main(args)  # the rest of epoch 2, then epoch 3; the backup stays
    latest = tf.train.latest_checkpoint(str(tmp_path / "backup" / "checkpoints"))
    assert tf.train.load_variable(latest, "step/.ATTRIBUTES/VARIABLE_VALUE") == 3 * 32
