"""The training scripts' flags: every wrong value is one line and status 2, nothing written.

The edges of every number flag (0, 1, the largest accepted, one past it), the
folder flags on what is not a folder, flags that must go together, folders the
backup's deletion would take with it, and abbreviations.
"""
import os

import pytest

import train_cpu
from conftest import one_line, run

from pyimagesearch import cli
from pyimagesearch.errors import UserError

ONE_EPOCH = ["--epochs", "1", "--steps-per-epoch", "3", "--batch-size", "32",
             "--data-source", "sample"]


def _refused(device, flags, capsys):
    """The status and stderr of the script's parser on `flags`."""
    with pytest.raises(SystemExit) as stop:
        cli.build_parser(device).parse_args(flags)
    return stop.value.code, capsys.readouterr().err


@pytest.mark.parametrize("flags, complaint", [
    (["--epochs", "0"], "--epochs: must be from 1 to 100000, got 0"),
    (["--epochs", "100001"], "--epochs: must be from 1 to 100000, got 100001"),
    (["--epochs", "1" + "0" * 20], "must be from 1 to 100000"),
    (["--epochs", "abc"], "--epochs: invalid integer value: 'abc'"),
    (["--batch-size", "0"], "--batch-size: must be at least 1, got 0"),
    (["--batch-size", "-3"], "--batch-size: must be at least 1, got -3"),
    (["--steps-per-epoch", "1000001"], "must be from 1 to 1000000, got 1000001"),
    (["--learning-rate", "0"], "--learning-rate: must be a finite number above 0, got 0"),
    (["--learning-rate", "-0.01"], "must be a finite number above 0, got -0.01"),
    (["--learning-rate", "inf"], "must be a finite number above 0, got inf"),
    (["--learning-rate", "nan"], "must be a finite number above 0, got nan"),
    (["--learning-rate", "fast"], "--learning-rate: invalid number value: 'fast'"),
    (["--seed", "-1"], "--seed: must be from 0 to 4294967295, got -1"),
    (["--seed", str(2**32)], "--seed: must be from 0 to 4294967295, got 4294967296"),
    (["--data-source", "floppy"], "--data-source: invalid choice: 'floppy'"),
    (["--backup-every", "0"], "--backup-every: must be at least 1, got 0"),
    (["--profile-steps", "1"], "--profile-steps: expected two steps A,B, got '1'"),
    (["--profile-steps", "3,2"], "expected steps 1 <= A <= B, got '3,2'"),
    (["--profile-steps", "0,2"], "expected steps 1 <= A <= B, got '0,2'"),
    (["--profile-steps", "a,b"], "--profile-steps: expected two steps A,B, got 'a,b'"),
    (["--output", "x"], "unrecognized arguments: --output x"),  # no abbreviations
])
def test_a_bad_flag_is_one_line_and_status_2(flags, complaint, capsys):
    status, said = _refused("cpu", flags, capsys)
    assert status == 2 and said.count("\n") == 1 and complaint in said, said
    assert ": error: argument " in said or ": error: unrecognized arguments" in said


@pytest.mark.parametrize("flags, complaint", [
    (["--rehearse", "0"], "--rehearse: must be from 1 to 64, got 0"),
    (["--rehearse", "65"], "--rehearse: must be from 1 to 64, got 65"),
    (["--startup-timeout", "0"], "must be a finite number above 0 and at most 86400, got 0"),
    (["--startup-timeout", "86401"], "and at most 86400, got 86401"),
    (["--reh", "8"], "unrecognized arguments: --reh 8"),
])
def test_the_accelerator_flags_have_their_edges_too(flags, complaint, capsys):
    status, said = _refused("gpu", flags, capsys)
    assert status == 2 and complaint in said, said


def test_the_largest_and_smallest_accepted_values_parse():
    parse = cli.build_parser("tpu").parse_args
    largest = parse(["--epochs", "100000", "--steps-per-epoch", "1000000", "--startup-timeout",
                     "86400", "--rehearse", "64", "--seed", str(2**32 - 1),
                     "--profile-steps", "5,5", "--batch-size", "1"])
    assert (largest.epochs, largest.steps_per_epoch, largest.startup_timeout, largest.rehearse,
            largest.seed, largest.profile_steps) == (100_000, 1_000_000, 86_400.0, 64,
                                                     2**32 - 1, (5, 5))
    smallest = parse(["--epochs", "1", "--rehearse", "1", "--seed", "0",
                      "--startup-timeout", "1e-3"])
    assert (smallest.epochs, smallest.rehearse, smallest.seed) == (1, 1, 0)
    assert "--rehearse" not in cli.build_parser("cpu").format_help()  # the CPU's own
    assert "--tpu" in cli.build_parser("tpu").format_help()


def test_a_bad_flag_from_a_fresh_process_is_its_last_line(tmp_path):
    # TensorFlow's import may say its own lines first (tensorflow/tensorflow#100442)
    (tmp_path / "cpu.png").write_text("earlier")
    result = run("train_cpu.py", "--epochs", "0", "--output-dir", tmp_path, timeout=120)
    said = "train_cpu.py: error: argument --epochs: must be from 1 to 100000, got 0 (see --help)"
    assert one_line(result) == said == result.stderr.strip().splitlines()[-1]
    assert (tmp_path / "cpu.png").read_text() == "earlier"


@pytest.mark.parametrize("flag", ["--output-dir", "--backup-dir", "--logdir", "--data-dir"])
def test_an_empty_folder_flag_is_one_line(flag, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError, match=f"^{flag} is empty"):
        train_cpu.main(ONE_EPOCH + [flag, ""])
    assert list(tmp_path.iterdir()) == []


def test_backup_every_needs_a_backup_dir(tmp_path):
    with pytest.raises(UserError, match="^--backup-every needs --backup-dir$"):
        cli.parse_args("cpu", "", ["--backup-every", "1", "--output-dir", str(tmp_path)])


@pytest.mark.parametrize("flag, kind", [("--output-dir", "output folder"),
                                        ("--backup-dir", "--backup-dir folder"),
                                        ("--logdir", "--logdir folder")])
@pytest.mark.parametrize("blocker", ["a file", "a named pipe", "a dangling link",
                                     "a loop of links"])
def test_a_folder_flag_on_what_is_not_a_folder_is_one_line_naming_the_flag(tmp_path, flag,
                                                                          kind, blocker):
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


def test_an_output_folder_under_a_file_is_one_line(in_process, tmp_path):
    (tmp_path / "a-file").write_text("not a folder")
    result = in_process("train_cpu.py", "--output-dir", tmp_path / "a-file" / "out")
    assert "cannot write to output folder" in one_line(result)


@pytest.mark.parametrize("layout", ["output inside", "output is backup", "output linked in",
                                    "backup linked to output", "logdir linked in",
                                    "data-dir linked in"])
def test_a_folder_the_backups_deletion_would_take_is_refused(tmp_path, layout):
    backup, out = tmp_path / "backup", tmp_path / "out"
    backup.mkdir()
    flags = {"--backup-dir": str(backup), "--output-dir": str(out)}
    flag = "--output-dir"
    if layout == "output inside":
        flags["--output-dir"] = str(backup / "out")
    elif layout == "output is backup":
        flags["--output-dir"] = str(backup)
    elif layout == "output linked in":
        (tmp_path / "link").symlink_to(backup)
        flags["--output-dir"] = str(tmp_path / "link" / "out")
    elif layout == "backup linked to output":
        out.mkdir()
        (tmp_path / "link").symlink_to(out)
        flags["--backup-dir"] = str(tmp_path / "link")
    else:
        flag = "--logdir" if layout.startswith("logdir") else "--data-dir"
        (tmp_path / "link").symlink_to(backup)
        flags[flag] = str(tmp_path / "link" / "sub")
    with pytest.raises(UserError, match=rf"^{flag} .* is inside --backup-dir .*, which is "
                                        "deleted when the run ends; give them separate"):
        cli.parse_args("cpu", "", [arg for pair in flags.items() for arg in pair])
    assert sorted(os.listdir(backup)) == []  # nothing written


@pytest.mark.slow  # 9 s; tests/test_notebook.py holds the notebook unsetting it
def test_keras_backend_jax_is_set_aside_for_tensorflow_in_one_line(tmp_path):
    # JAX-first TPU images set KERAS_BACKEND=jax; the TensorFlow scripts run on TensorFlow
    result = run("train_cpu.py", *ONE_EPOCH, "--epochs", "1", "--output-dir", tmp_path,
                 env={**os.environ, "KERAS_BACKEND": "jax", "TF_CPP_MIN_LOG_LEVEL": "2"})
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stderr.splitlines()[0] == ("[INFO] KERAS_BACKEND=jax set aside: this code "
                                             "runs Keras on TensorFlow")
    assert "Keras on JAX" not in result.stdout and len(list(tmp_path.glob("*.keras"))) == 1
