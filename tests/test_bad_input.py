"""Input that once ended in a traceback, a silent success or a machine out of memory.

Each case must end in one clear line (a UserError, which the scripts print
as one line with exit status 2) and leave earlier outputs and backups alone.
"""
import errno
import json
import os
import subprocess
import sys

import pytest
import tensorflow as tf

import train_cpu
import train_gpu
from conftest import output_files, outputs_name
from pyimagesearch import cli, outputs
from pyimagesearch.training import exits
from pyimagesearch.base.errors import Preempted, UserError

TINY = ["--epochs", "1", "--steps-per-epoch", "3", "--batch-size", "32",
        "--data-source", "sample"]


def _earlier_outputs(folder, names):
    folder.mkdir()
    for name in names:
        (folder / name).write_text(f"earlier {name}")


def _untouched(folder, names):
    return all((folder / name).read_text() == f"earlier {name}" for name in names)


def test_a_diverged_run_stops_before_writing(tmp_path):
    args = TINY + ["--learning-rate", "1e300", "--output-dir", str(tmp_path / "out")]
    names = output_files(outputs_name("cpu", args))  # what the run would replace
    _earlier_outputs(tmp_path / "out", names)
    with pytest.raises(UserError, match="training diverged.*lower --learning-rate"):
        train_cpu.main(args)
    assert _untouched(tmp_path / "out", names)


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
    args = TINY + ["--rehearse", "1", "--output-dir", str(tmp_path)]
    train_gpu.main(args)
    assert (tmp_path / f"{outputs_name('gpu', args)}.json").exists()


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


def test_scratch_folders_of_killed_processes_are_removed(tmp_path, monkeypatch):
    import os
    import tempfile

    from pyimagesearch.base.files import scratch_folder

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


@pytest.mark.parametrize("flag, kind", [("--output-dir", "output folder"),
                                        ("--backup-dir", "--backup-dir folder"),
                                        ("--logdir", "--logdir folder")])
@pytest.mark.parametrize("blocker", ["a file", "a named pipe", "a dangling link",
                                     "a loop of links"])
def test_a_folder_flag_on_what_is_not_a_folder_is_one_line_naming_the_flag(tmp_path, flag,
                                                                          kind, blocker):
    from pyimagesearch import cli

    path = tmp_path / "in-the-way"
    if blocker == "a file":
        path.write_text("kept")
    elif blocker == "a named pipe":
        os.mkfifo(path)
    elif blocker == "a dangling link":
        path.symlink_to(tmp_path / "gone")
    else:
        path.symlink_to(tmp_path / "back")
        (tmp_path / "back").symlink_to(path)
    flags = {"--output-dir": str(tmp_path / "out"), flag: str(path)}
    with pytest.raises(UserError, match=rf"^cannot write to {kind} {path}: ") as refused:
        cli.parse_args("cpu", "", [arg for pair in flags.items() for arg in pair])
    if blocker == "a dangling link":
        assert f"symbolic link to {tmp_path / 'gone'}, which does not exist" in str(refused.value)
    assert not (tmp_path / "gone").exists()  # nothing made where the link points
    if blocker == "a file":
        assert path.read_text() == "kept"


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


def _preempted_mid_epoch_2(tmp_path, monkeypatch, epochs, steps):
    """Train `epochs` of `steps` (two executions each) with a backup, stopped by SIGTERM
    after the first execution of epoch 2 (a stand-in for the signal); the run's flags."""
    from pyimagesearch.training import preemption

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


# --- issue 22: nothing lost at the moment of writing ---------------------------------

class _Killed(BaseException):
    """Stands in for SIGKILL: nothing after it runs, no handler, no undo."""


QUICK = ["--epochs", "1", "--steps-per-epoch", "2", "--batch-size", "32", "--data-source",
         "sample"]
# the outputs of a run of QUICK (cpu_epochs-1_batch-size-32_...), which the runs below replace
NAMES = tuple(f"{outputs_name('cpu', QUICK)}.{suffix}" for suffix in ("png", "json", "keras"))


def _earlier(folder, names=NAMES):
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        (folder / name).write_text(f"earlier {name}")


def _state(folder, names=NAMES):
    """'old' or 'new' if the folder holds that whole set and nothing else; what it holds if not."""
    held = sorted(os.listdir(folder))
    texts = {name: (folder / name).read_text() for name in names if name in held}
    if held == sorted(names) and all(text == f"earlier {n}" for n, text in texts.items()):
        return "old"
    if held == sorted(names) and all(text == f"new {n}" for n, text in texts.items()):
        return "new"
    return held, texts


def _staged(tmp_path):
    staged = tmp_path / "staged"
    staged.mkdir()
    for name in NAMES:
        (staged / name).write_text(f"new {name}")
    return {name: str(staged / name) for name in NAMES}


def _gfile_calls(monkeypatch, at, action):
    """Make the `at`-th tf.io.gfile copy, rename or remove call of publish do `action()` first."""
    import tensorflow as tf

    calls = []
    for name in ("copy", "rename", "remove"):
        real = getattr(tf.io.gfile, name)

        def wrapper(*args, real=real, **kwargs):
            calls.append(args[0])
            if len(calls) == at:
                action()
            return real(*args, **kwargs)

        monkeypatch.setattr(tf.io.gfile, name, wrapper)
    return calls


# copies 3, journal 1, aside 3, in place 3, journal done 1, then removals: every step
PUBLISH_STEPS = range(1, 15)


@pytest.mark.parametrize("at", PUBLISH_STEPS)
def test_a_kill_at_any_step_of_the_publish_leaves_what_the_next_run_makes_whole(
        tmp_path, monkeypatch, capsys, at):
    from pyimagesearch.base import publish

    out = tmp_path / "out"
    _earlier(out)
    staged = _staged(tmp_path)

    def kill():
        raise _Killed()

    with monkeypatch.context() as patch:
        calls = _gfile_calls(patch, at, kill)
        try:
            publish.publish(str(out), staged)
            killed = False
        except _Killed:
            killed = True
    if not killed:
        assert len(calls) < at and _state(out) == "new"  # it had ended before that step
        return
    monkeypatch.setattr(publish, "running", lambda pid: False)  # the killed process is gone
    capsys.readouterr()
    publish.recover(str(out))
    state = _state(out)
    assert state in ("old", "new"), state
    said = capsys.readouterr().out.strip().splitlines()
    assert len(said) <= 1 and all(line.startswith("[INFO]") for line in said), said
    if said and "back in place" in said[0]:
        assert state == "old"
    if said and "all in place" in said[0]:
        assert state == "new"


@pytest.mark.parametrize("sig, stop", [("SIGINT", KeyboardInterrupt), ("SIGTERM", Preempted)])
@pytest.mark.parametrize("at", PUBLISH_STEPS)
def test_a_signal_at_any_step_of_the_publish_waits_for_the_new_set(tmp_path, monkeypatch,
                                                                   at, sig, stop):
    import signal

    from pyimagesearch.base import publish
    from pyimagesearch.training import preemption

    out = tmp_path / "out"
    _earlier(out)
    staged = _staged(tmp_path)
    monkeypatch.setattr(publish, "published", [])
    with monkeypatch.context() as patch:
        patch.setattr(preemption, "_terminated", __import__("threading").Event())
        preemption.watch()
        calls = _gfile_calls(patch, at, lambda: os.kill(os.getpid(), getattr(signal, sig)))
        try:
            publish.publish(str(out), staged)
            stopped = False
        except stop:
            stopped = True
    # a signal sent during the publish stops the run, but only once the swap is over
    assert stopped == (len(calls) >= at), (at, calls)
    assert _state(out) == "new", (at, calls)  # the swap ran to its end first
    assert publish.published == [str(out)]


# Runs train_cpu.py as `python train_cpu.py ARGS` would, with one thing done to it
# first (argv[1]): "kill" SIGKILLs the process at the 3rd rename of its publish (the
# journal written, one old file set aside), "term" sends it SIGTERM at the 2nd,
# "late-term" sends SIGTERM from inside a finalizer once the outputs are written,
# where Python prints the exception and drops it; "after" sends it once main()
# has returned, and "exiting" from an exit hook that runs before the run's own.
SIGNAL_DRIVER = r"""
import atexit, gc, os, signal, sys
sys.path.insert(0, os.getcwd())
mode, args = sys.argv[1], sys.argv[2:]
sys.argv = ["train_cpu.py", *args]
import tensorflow as tf
import train_cpu
from pyimagesearch import cli
from pyimagesearch.base import publish as publishing

real_publish, real_rename = publishing.publish, tf.io.gfile.rename

def publish(folder, staged):
    calls = []

    def rename(*a, **k):
        calls.append(1)
        if mode == "kill" and len(calls) == 3:
            os.kill(os.getpid(), signal.SIGKILL)
        if mode == "term" and len(calls) == 2:
            os.kill(os.getpid(), signal.SIGTERM)
        return real_rename(*a, **k)

    tf.io.gfile.rename = rename
    try:
        real_publish(folder, staged)
    finally:
        tf.io.gfile.rename = real_rename
    if mode == "late-term":
        class Finalized:
            def __del__(self):
                os.kill(os.getpid(), signal.SIGTERM)
                sum(range(1000))  # the handler runs here, inside the finalizer
        Finalized()
        gc.collect()

publishing.publish = publish
cli.run_main(train_cpu.main, args)
if mode == "after":
    os.kill(os.getpid(), signal.SIGTERM)
if mode == "exiting":
    atexit.register(os.kill, os.getpid(), signal.SIGTERM)
"""

def _driven(repo, mode, out, *flags):
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-c", SIGNAL_DRIVER, mode, *QUICK, "--output-dir",
                           str(out), *flags], cwd=repo, capture_output=True, text=True,
                          timeout=300)


@pytest.mark.slow  # the default run stops a publish at each of its steps in this process
def test_a_run_killed_mid_swap_is_made_whole_by_the_next_run(repo, tmp_path, in_process):
    import signal

    out = tmp_path / "out"
    _earlier(out)
    killed = _driven(repo, "kill", out)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    assert _state(out) not in ("old", "new")  # caught mid-swap: one file set aside
    again = in_process("train_cpu.py", *QUICK, "--output-dir", str(out))
    assert again.returncode == 0, again.stderr
    said = [line for line in again.stdout.splitlines() if "was stopped while" in line]
    assert len(said) == 1 and "set aside are back in place" in said[0]
    assert sorted(os.listdir(out)) == sorted(NAMES)  # its own new set, no leftovers
    assert json.loads((out / NAMES[1]).read_text())["device"] == "cpu"


# the default run sends signals at every step of a publish in this process ("term"),
# and from a finalizer in tests/test_preemption.py ("late-term"); these are the same
# in a fresh process
@pytest.mark.parametrize("mode", ["term", "late-term", "after", "exiting"])
@pytest.mark.slow
def test_sigterm_during_or_after_the_swap_says_the_new_outputs_are_written(repo, tmp_path,
                                                                          mode):
    out = tmp_path / "out"
    _earlier(out)
    done = _driven(repo, mode, out, "--backup-dir", str(tmp_path / "backup"))
    assert done.returncode == 143, done.stdout[-2000:] + done.stderr[-2000:]  # not swallowed
    errors = [line for line in done.stderr.splitlines() if ": error: " in line]
    ended = " after the run had ended" if mode in ("after", "exiting") else ""
    assert len(errors) == 1 and f"stopped by SIGTERM{ended}; its new outputs were all " \
        f"written to {out}" in errors[0], done.stderr
    assert "--backup-dir" not in errors[0]  # the outputs are written: nothing to resume
    assert "Traceback" not in done.stderr.replace("Exception ignored", "")
    assert sorted(os.listdir(out)) == sorted(NAMES)
    assert json.loads((out / NAMES[1]).read_text())["device"] == "cpu"  # the new set


@pytest.fixture
def tiny_disk(tmp_path):
    """mount_disk(name, size): a tmpfs of `size` at tmp_path/name, unmounted after the test.

    Needs the right to mount (root, as here and in CI); skipped without it.
    """
    import subprocess

    mounted = []

    def mount_disk(name, size):
        folder = tmp_path / name
        folder.mkdir()
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs",
                               str(folder)], capture_output=True, text=True)
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
        mounted.append(folder)
        return folder

    yield mount_disk
    for folder in mounted:
        subprocess.run(["umount", "-l", str(folder)], capture_output=True)


def _one_line(result):
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr[-3000:]
    return lines[0]


def test_a_full_backup_disk_is_one_line_and_keeps_the_last_backup(tiny_disk, in_process,
                                                                  tmp_path):
    disk = tiny_disk("disk", "64k")  # room for one checkpoint of the model, not two
    args = [*QUICK[:-4], "--epochs", "2", "--steps-per-epoch", "3", "--batch-size", "32",
            "--data-source", "sample", "--backup-every", "1",
            "--backup-dir", str(disk / "backup"), "--output-dir", str(tmp_path / "out")]
    names = output_files(outputs_name("cpu", args))  # what the run would replace
    _earlier(tmp_path / "out", names)
    line = _one_line(in_process("train_cpu.py", *args))
    assert f"cannot save the backup in {disk / 'backup'}" in line
    assert "No space left on device" in line and "earlier outputs are untouched" in line
    from pyimagesearch.training.backup import saved_checkpoint

    step, _ = saved_checkpoint(str(disk / "backup"))
    assert step >= 1 and f"it holds the backup of {step:,} steps" in line  # what is there
    assert _state(tmp_path / "out", names) == "old"
    assert not list((disk / "backup" / "checkpoints").glob("checkpoint.tmp*"))


@pytest.mark.parametrize("flag, where", [("--output-dir", "cannot replace the outputs in"),
                                         ("--logdir", "no space left on the device of")])
def test_a_full_output_or_log_disk_is_one_line(tiny_disk, in_process, tmp_path, flag, where):
    disk = tiny_disk("disk", "16k" if flag == "--output-dir" else "8k")  # 2 pages of logs
    out = disk if flag == "--output-dir" else tmp_path / "out"
    _earlier(out)
    extra = ["--logdir", str(disk / "logs")] if flag == "--logdir" else []
    line = _one_line(in_process("train_cpu.py", *QUICK, "--output-dir", str(out), *extra))
    assert where in line and str(disk) in line and "earlier outputs are untouched" in line
    assert _state(out) == "old"


def test_a_full_scratch_folder_is_one_line(tiny_disk, in_process, tmp_path, monkeypatch):
    import tempfile

    scratch = tiny_disk("tmp", "16k")
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    _earlier(tmp_path / "out")
    line = _one_line(in_process("train_cpu.py", *QUICK, "--output-dir", str(tmp_path / "out")))
    assert "cannot write the outputs in the scratch folder" in line and str(scratch) in line
    assert "set TMPDIR" in line and _state(tmp_path / "out") == "old"
    assert os.listdir(scratch) == []  # its scratch copy is gone too


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


GOOD_RECORD = {"device": "cpu", "replicas": 1, "global_batch_size": 32, "steps_per_epoch": 2,
               "epoch_seconds": [1.0, 0.5], "train_seconds": [0.9, 0.4],
               "loss": [0.1, 0.05], "val_loss": [0.1, 0.05], "data_source": "sample",
               "learning_rate": 0.001, "machine": {"cpu_model": "x", "cpu_count": 2}}


@pytest.mark.parametrize("field, value, said", [
    ("train_seconds", [0.0, 0.4], "seconds that are not above 0 (train_seconds"),
    ("epoch_seconds", [1.0, float("inf")], "not finite (epoch_seconds"),
    ("loss", [float("nan"), 0.05], "not finite (loss"),
    ("val_loss", [], "no epochs (val_loss is empty)"),
    ("loss", [], "no epochs (loss is empty)"),
    ("epoch_seconds", [], "no epochs (epoch_seconds is empty)"),
    ("machine", "a laptop", "(machine is 'a laptop', not an object)"),
    ("replicas", 0, "(replicas is 0, not a whole number from 1)"),
    ("global_batch_size", True, "(global_batch_size is True, not a whole number"),
    ("steps_per_epoch", 2.5, "(steps_per_epoch is 2.5"),
    ("workers", -1, "(workers is -1"),
    ("learning_rate", float("nan"), "(learning_rate is nan, not a finite number)"),
    ("device", ["cpu"], "(device is ['cpu'], not a name)"),
    ("loss", "0.1", "(loss must be a list of numbers)"),
])
def test_compare_skips_a_record_field_by_field_with_one_line(tmp_path, capsys, field, value,
                                                             said):
    import compare

    (tmp_path / "good.json").write_text(json.dumps(GOOD_RECORD))
    (tmp_path / "edited.json").write_text(json.dumps({**GOOD_RECORD, field: value}))
    assert sorted(compare.load_records(str(tmp_path))) == ["good"]
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "edited.json" in lines[0] and said in lines[0], lines


def test_compare_skips_deep_json_and_a_model_of_something_else(tmp_path, capsys, tiny_runs):
    import shutil

    import compare
    import keras

    folder = tmp_path / "runs"
    folder.mkdir()
    for suffix in ("json", "keras"):
        name = f"{tiny_runs.names['train_cpu.py']}.{suffix}"
        shutil.copy(tiny_runs / name, folder / name)
    (folder / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    os.mkfifo(folder / "piped.keras")  # loading it would wait for a writer for ever
    (folder / "piped.json").write_text(json.dumps(GOOD_RECORD))
    (folder / "other.json").write_text(json.dumps(GOOD_RECORD))
    other = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    other.save(folder / "other.keras")
    compare.main([str(folder)])
    err = capsys.readouterr().err
    assert "deep.json: not readable JSON (nested too deeply)" in err
    assert "other.keras in the figure: not a model of the digits" in err
    assert f"skipping {folder / 'piped.keras'}: not a regular file" in err
    assert (folder / "comparison.png").exists() and "Traceback" not in err


def test_a_shard_swapped_for_another_of_the_same_size_is_refused(tmp_path):
    from pyimagesearch.datasets import sources, tfrecord_writer

    images, labels = sources.SampleSource().examples("test")
    tfrecord_writer.write_folder(str(tmp_path), {"train": (images[:40], labels[:40]),
                                           "test": (images[:40], labels[:40])}, "mnist",
                           origin="sample", origin_reason="a test", command=["test"], shards=4)
    first, second = sorted(tmp_path.glob("test-*"))[:2]
    assert first.stat().st_size == second.stat().st_size  # fixed-size records
    first.write_bytes(second.read_bytes())  # the same size, count and shapes
    with pytest.raises(UserError, match=rf"{first.name} is not the shard metadata.json lists "
                                        r"\(its SHA-256 differs\)"):
        sources.resolve_source("tfrecord", "mnist", str(tmp_path))


def test_a_cluster_on_ipv6_loopback_waits_for_its_peer_like_one_on_ipv4():
    import socket

    from pyimagesearch.training.cluster import Cluster, read_tf_config, wait_for_peers

    if not socket.has_ipv6:
        pytest.skip("no IPv6 here")
    probes = [socket.create_server(("::1", 0), family=socket.AF_INET6) for _ in range(2)]
    port, peer = (probe.getsockname()[1] for probe in probes)
    for probe in probes:
        probe.close()
    config = {"cluster": {"worker": [f"[::1]:{port}", f"[::1]:{peer}"]},
              "task": {"type": "worker", "index": 0}}
    cluster = read_tf_config({"TF_CONFIG": json.dumps(config)})
    assert isinstance(cluster, Cluster) and cluster.address == f"[::1]:{port}"
    with socket.create_server(("::1", peer), family=socket.AF_INET6):
        wait_for_peers(cluster, 2.0, poll_s=0.05)  # listens on [::1] itself, finds the peer


def test_a_tpu_at_an_ipv6_address_is_one_line_that_names_it(tmp_path):
    import train_tpu

    with pytest.raises(UserError, match=r"^TensorFlow's TPUClusterResolver cannot take the "
                                        r"IPv6 address grpc://\[::1\]:8470; give"):
        train_tpu.main(["--tpu", "grpc://[::1]:8470", "--output-dir", str(tmp_path)])


def test_a_second_run_on_a_backup_folder_in_use_is_refused_and_a_dead_ones_taken_over(
        tmp_path):
    import socket
    import subprocess
    import sys

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


@pytest.mark.parametrize("flags, complaint", [
    (["--epochs", "1_0"], "--epochs: expected an integer, got '1_0'"),
    (["--seed", "\u0663"], "--seed: expected an integer, got '\u0663'"),
    (["--learning-rate", "1_0"], "--learning-rate: expected a number, got '1_0'"),
    (["--profile-steps", "1,\u0663"], "--profile-steps: expected two steps A,B"),
    (["--batch-size", "\uff11"], "--batch-size: expected an integer")])  # a full-width 1
def test_numbers_in_forms_no_one_types_are_refused(flags, complaint, capsys):
    with pytest.raises(SystemExit) as stop:
        cli.build_parser("cpu", "").parse_args(flags)
    assert stop.value.code == 2 and complaint in capsys.readouterr().err


def test_a_backup_past_the_epochs_asked_for_says_what_it_holds(tmp_path, monkeypatch):
    args = _preempted_mid_epoch_2(tmp_path, monkeypatch, epochs=2, steps=34)
    args[1] = "1"  # now only 1 epoch: the backup is past it
    with pytest.raises(UserError, match=r"has 51 steps done \(1 epoch and 17 steps\), more "
                                        r"than the 34 of --epochs 1"):
        train_cpu.main(args)


@pytest.mark.parametrize("error, line", [
    (OSError(errno.EFBIG, "File too large", "/logs/cpu/events.out"),
     "the system refused to write /logs/cpu/events.out (File too large)"),
    (OSError(errno.EROFS, "Read-only file system", "/ro/cpu.png"),
     "the system refused to write /ro/cpu.png (Read-only file system)"),
    (OSError(errno.EIO, "Input/output error", "/mnt/usb/cpu.keras"),
     "the system refused to write /mnt/usb/cpu.keras (Input/output error)"),
    (OSError(errno.EDQUOT, "Disk quota exceeded", "/home/me/logs"),
     "no space left on the device of /home/me/logs"),
    (tf.errors.OutOfRangeError(None, None, "/tmp/logs/cpu/train/events.out.tfevents.1; File "
                                           "too large"),
     "the system refused to write /tmp/logs/cpu/train/events.out.tfevents.1 (File too large)"),
])
def test_every_write_the_system_refuses_is_one_line(monkeypatch, error, line):
    from pyimagesearch.base import publish

    monkeypatch.setattr(publish, "published", [])  # no run of this process got that far
    said = exits._write_refused(error)
    assert said is not None and str(said).startswith(line), said
    assert str(said).endswith("earlier outputs are untouched") and "\n" not in str(said)


def test_a_read_that_fails_with_eio_is_not_called_a_refused_write():
    assert exits._write_refused(tf.errors.DataLossError(None, None, "Input/output error")) is None
    assert exits._write_refused(ValueError("something else")) is None


@pytest.mark.slow
def test_a_file_size_limit_ends_the_run_in_one_line(repo, tmp_path):
    # EFBIG: what a ulimit -f, or a file system's own limit, answers
    import resource

    def limit_file_size():
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))

    result = subprocess.run(
        [sys.executable, "train_cpu.py", "--epochs", "1", "--steps-per-epoch", "2",
         "--data-source", "sample", "--logdir", str(tmp_path / "logs"),
         "--output-dir", str(tmp_path / "out")],
        cwd=repo, capture_output=True, text=True, timeout=300, preexec_fn=limit_file_size)
    assert result.returncode == 2, result.stderr[-3000:]
    lines = result.stderr.strip().splitlines()
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    assert "File too large" in lines[-1] and lines[-1].startswith("train_cpu.py: error: "), lines
    assert not list((tmp_path / "out").glob("*.png"))  # no figure, of any name


def test_a_prepared_dataset_without_its_splits_is_one_line(tmp_path):
    # a dataset_info.json that parses but lists no split: tfds.load raised
    # KeyError ("`splits` is empty") from inside, a traceback
    info = tmp_path / "tfds" / "mnist" / "3.0.1" / "dataset_info.json"
    info.parent.mkdir(parents=True)
    info.write_text(json.dumps({"name": "mnist", "version": "3.0.1", "splits": []}))
    with pytest.raises(UserError, match=r"^the prepared mnist in .*tfds has no readable train "
                                        r"split \(Trying to access `splits\['train'\]` but "
                                        r"`splits` is empty.*\); delete its mnist folder"):
        train_cpu.main(["--data-source", "tfds", "--data-dir", str(tmp_path / "tfds"),
                        "--epochs", "1", "--steps-per-epoch", "1",
                        "--output-dir", str(tmp_path / "out")])
    assert not list((tmp_path / "out").glob("*.png"))  # no figure, of any name


# a run that has ended well, and a signal while its process ends: as the scripts
# end (`cli.run_main(main)` is their last line), with a main() that writes nothing
ENDED_RUN = r"""
import os, signal, sys
from pyimagesearch.platforms import backend
backend.tensorflow()  # as every script's first call does
from pyimagesearch import cli
sys.argv = ["train_cpu.py"]
def main(argv):
    print("trained", flush=True)
how = os.environ["HOW"]
cli.run_main(main, [])
if how == "after":
    os.kill(os.getpid(), getattr(signal, os.environ["SIG"]))
    sum(range(1000))  # the handler runs here
"""


@pytest.mark.parametrize("how, sig, status", [
    ("after", "SIGTERM", 143), pytest.param("none", None, 0, marks=pytest.mark.slow)])
def test_a_signal_while_an_ended_run_exits_is_one_line_and_its_status(repo, how, sig, status):
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", ENDED_RUN], cwd=repo, capture_output=True,
                          text=True, timeout=120, env={**os.environ, "HOW": how,
                                                       "SIG": sig or ""})
    assert done.returncode == status, done.stderr
    assert done.stdout == "trained\n"
    if sig:
        assert done.stderr.splitlines() == [
            f"train_cpu.py: error: stopped by {sig} after the run had ended; earlier "
            "outputs are untouched"]
    else:
        assert done.stderr == ""


def test_a_signal_blocked_at_the_very_end_is_said_not_lost(monkeypatch, capsys):
    # the exit hook blocks both signals; one that came before it looked is said
    import signal

    exited = []
    monkeypatch.setattr(exits, "_process", {**exits._process, "over": True, "main": object()})
    monkeypatch.setattr(exits.os, "_exit", exited.append)
    monkeypatch.setattr(exits.signal, "pthread_sigmask", lambda how, mask: set())
    monkeypatch.setattr(exits.signal, "sigpending", lambda: {signal.SIGTERM})
    exits._at_the_very_end()
    assert exited == [143]
    assert "stopped by SIGTERM after the run had ended" in capsys.readouterr().err


@pytest.mark.parametrize("given", ["missing", "a-file", "outputs"])
def test_compare_on_a_folder_that_is_not_there_says_where_it_looked(tmp_path, monkeypatch,
                                                                    given):
    # `python compare.py` from outside the repository looks for ./outputs
    import compare

    (tmp_path / "a-file").write_text("{}")
    monkeypatch.chdir(tmp_path)
    there = "is not a folder" if given == "a-file" else "does not exist"
    with pytest.raises(UserError, match=rf"^{given} {there} \(in {tmp_path}\); name the"):
        compare.main([given] if given != "outputs" else [])
    assert os.listdir(tmp_path) == ["a-file"]
