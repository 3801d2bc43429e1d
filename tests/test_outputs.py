"""Outputs into buckets: written through tf.io.gfile, staged, never a local "gs:" folder.

TensorFlow's in-memory filesystem (ram://) stands in for gs:// here: both go
through the same tf.io.gfile calls.

The swap of a staged set into place (files.py) leaves the old set or
the new one: a kill at any of its steps, which the next run makes whole, and
SIGINT or SIGTERM at any of them, which wait for its end. A full disk (tiny
tmpfs disks) and every write the system refuses are one line (exits.py)
that keeps the earlier outputs; scratch folders of killed processes are removed.
"""
import errno
import json
import os
import subprocess
import sys

import pytest
import tensorflow as tf

import train_cpu
from conftest import earlier_outputs, one_line, outputs_state

from pyimagesearch import files, outputs
from pyimagesearch.errors import Preempted, UserError
from pyimagesearch import exits
from pyimagesearch.runtime import this_process

TINY = ["--epochs", "1", "--steps-per-epoch", "2", "--batch-size", "32",
        "--data-source", "sample"]
TINY_NAME = "cpu_epochs-1_batch-size-32_steps-per-epoch-2_data-source-sample"  # --help's order


@pytest.mark.slow  # the default suite's budget (docs/development.md); CI runs it
def test_a_run_writes_into_a_bucket_like_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    folder = "ram://bucket/runs"
    train_cpu.main(TINY + ["--output-dir", folder])
    with tf.io.gfile.GFile(f"{folder}/{TINY_NAME}.json") as handle:
        record = json.load(handle)
    assert record["device"] == "cpu" and record["name"] == TINY_NAME
    assert record["flags"] == ["--epochs", "1", "--batch-size", "32", "--steps-per-epoch", "2",
                               "--data-source", "sample"]  # what sets it apart
    assert record["runtime"]["accelerator"] == "cpu"
    assert sorted(tf.io.gfile.listdir(folder)) == [f"{TINY_NAME}.{suffix}"
                                                   for suffix in ("json", "keras", "png")]
    assert os.listdir(tmp_path) == []  # no local "ram:" (or "gs:") folder


def test_a_failed_publish_keeps_the_old_files_in_the_bucket(monkeypatch):
    folder = "ram://bucket/keep"
    tf.io.gfile.makedirs(folder)
    for name in ("a.json", "b.json"):
        with tf.io.gfile.GFile(f"{folder}/{name}", "w") as handle:
            handle.write("old")
    real_copy = tf.io.gfile.copy
    calls = []

    def copy_then_fail(source, target, overwrite=False):
        calls.append(target)
        if len(calls) == 2:
            raise tf.errors.UnavailableError(None, None, "bucket went away")
        real_copy(source, target, overwrite=overwrite)

    monkeypatch.setattr(tf.io.gfile, "copy", copy_then_fail)
    with pytest.raises(UserError, match="bucket went away.*earlier outputs are untouched"):
        _publish(folder, ("a.json", "b.json"))
    _assert_old(folder, ("a.json", "b.json"))


def _publish(folder, names):
    with outputs.StagedOutputs(folder) as staged:
        for name in names:
            files.write_json(staged.path(name), {"new": 1})


def _assert_old(folder, names):
    for name in names:
        with tf.io.gfile.GFile(f"{folder}/{name}") as handle:
            assert handle.read() == "old"
    assert sorted(tf.io.gfile.listdir(folder)) == sorted(names)  # no temporaries


@pytest.mark.parametrize("failing", [1, 2, 3, 4, 5])
def test_a_rename_that_fails_at_any_point_puts_every_old_file_back(monkeypatch, failing):
    # an immutable file, a permission, a bucket that goes away between two renames
    folder = f"ram://bucket/renames{failing}"
    names = ("a.json", "b.json", "c.json")
    tf.io.gfile.makedirs(folder)
    for name in names:
        with tf.io.gfile.GFile(f"{folder}/{name}", "w") as handle:
            handle.write("old")
    real_rename, calls = tf.io.gfile.rename, []

    def rename_then_fail(source, target, overwrite=False):
        calls.append(target)
        if len(calls) == failing:
            raise tf.errors.PermissionDeniedError(None, None, "Operation not permitted")
        real_rename(source, target, overwrite=overwrite)

    monkeypatch.setattr(tf.io.gfile, "rename", rename_then_fail)
    with pytest.raises(UserError, match="Operation not permitted"):
        _publish(folder, names)
    monkeypatch.setattr(tf.io.gfile, "rename", real_rename)
    _assert_old(folder, names)


def test_a_folder_in_the_way_of_an_output_is_one_line(tmp_path):
    for name in ("a.json", "b.json"):
        (tmp_path / name).write_text("old")
    (tmp_path / "c.json").mkdir()
    with pytest.raises(UserError, match=r"c.json: a folder has that name"):
        _publish(str(tmp_path), ("a.json", "b.json", "c.json"))
    assert (tmp_path / "a.json").read_text() == "old" == (tmp_path / "b.json").read_text()
    assert sorted(os.listdir(tmp_path)) == ["a.json", "b.json", "c.json"]


@pytest.mark.parametrize("kind", ["a symbolic link", "a named pipe", "a socket"])
def test_a_link_pipe_or_socket_in_the_way_of_an_output_is_left_as_it_is(tmp_path, kind):
    # a rename over it would replace it: a link to a shared figure, a pipe a
    # reader waits on (a device, /dev/full, is refused the same way)
    import socket

    (tmp_path / "a.json").write_text("old")
    (tmp_path / "elsewhere.json").write_text("target")
    in_the_way = tmp_path / "b.json"
    if kind == "a symbolic link":
        in_the_way.symlink_to(tmp_path / "elsewhere.json")
    elif kind == "a named pipe":
        os.mkfifo(in_the_way)
    else:
        bound = socket.socket(socket.AF_UNIX)
        bound.bind(str(in_the_way))
        bound.close()
    with pytest.raises(UserError, match=rf"b.json: {kind} has that name; move it away"):
        _publish(str(tmp_path), ("a.json", "b.json"))
    assert (tmp_path / "a.json").read_text() == "old"  # untouched, and no temporaries
    assert sorted(os.listdir(tmp_path)) == ["a.json", "b.json", "elsewhere.json"]
    assert files.not_a_file(str(in_the_way)) == kind
    assert (tmp_path / "elsewhere.json").read_text() == "target"


def test_an_unreachable_bucket_is_one_line_and_no_local_folder(in_process, monkeypatch,
                                                               tmp_path):
    # offline here: the bucket cannot be reached, and nothing local is created
    monkeypatch.chdir(tmp_path)
    result = in_process("train_cpu.py", *TINY,
                        "--output-dir", "gs://pyimagesearch-no-such-bucket/out")
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "cannot write to output folder gs://" in lines[0], result.stderr
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("kind", ["a named pipe", "a folder"])
def test_a_small_file_that_is_not_a_file_is_one_line_not_a_wait(tmp_path, kind):
    # a record, a journal, a lock or TFRecords' metadata.json: a pipe would keep
    # the read waiting for a writer for ever
    path = tmp_path / "metadata.json"
    os.mkfifo(path) if kind == "a named pipe" else path.mkdir()
    with pytest.raises(UserError, match=rf"^cannot read {path} \(.*\); delete it$"):
        files.read_json(str(path), advice="delete it")
    assert files.read_json(str(tmp_path / "absent.json"), advice="") is None


# --- issue 22: nothing lost at the moment of writing (files.py) ---------------

class _Killed(BaseException):
    """Stands in for SIGKILL: nothing after it runs, no handler, no undo."""


# the outputs of a run of TINY, which the runs below replace
NAMES = tuple(f"{TINY_NAME}.{suffix}" for suffix in ("png", "json", "keras"))


def _staged(tmp_path):
    staged = tmp_path / "staged"
    staged.mkdir()
    for name in NAMES:
        (staged / name).write_text(f"new {name}")
    return {name: str(staged / name) for name in NAMES}


def _gfile_calls(monkeypatch, at, action):
    """Make the `at`-th tf.io.gfile copy, rename or remove call of publish do `action()` first."""
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
    from pyimagesearch import files as publish

    out = tmp_path / "out"
    earlier_outputs(out, NAMES)
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
        # it had ended before that step
        assert len(calls) < at and outputs_state(out, NAMES) == "new"
        return
    monkeypatch.setattr(publish, "running", lambda pid: False)  # the killed process is gone
    capsys.readouterr()
    publish.recover(str(out))
    state = outputs_state(out, NAMES)
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

    from pyimagesearch import files as publish
    from pyimagesearch import exits as preemption

    out = tmp_path / "out"
    earlier_outputs(out, NAMES)
    staged = _staged(tmp_path)
    monkeypatch.setattr(this_process, "published", [])
    with monkeypatch.context() as patch:
        preemption.watch(fresh=True)
        calls = _gfile_calls(patch, at, lambda: os.kill(os.getpid(), getattr(signal, sig)))
        try:
            publish.publish(str(out), staged)
            stopped = False
        except stop:
            stopped = True
        finally:
            preemption.watch(fresh=True)  # the SIGTERM is forgotten, as a next run forgets it
    # a signal sent during the publish stops the run, but only once the swap is over
    assert stopped == (len(calls) >= at), (at, calls)
    assert outputs_state(out, NAMES) == "new", (at, calls)  # the swap ran to its end first
    assert this_process.published == [str(out)]


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
from pyimagesearch import files as publishing

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
    return subprocess.run([sys.executable, "-c", SIGNAL_DRIVER, mode, *TINY, "--output-dir",
                           str(out), *flags], cwd=repo, capture_output=True, text=True,
                          timeout=300)


@pytest.mark.slow  # the default run stops a publish at each of its steps in this process
def test_a_run_killed_mid_swap_is_made_whole_by_the_next_run(repo, tmp_path, in_process):
    import signal

    out = tmp_path / "out"
    earlier_outputs(out, NAMES)
    killed = _driven(repo, "kill", out)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    # caught mid-swap: one file set aside
    assert outputs_state(out, NAMES) not in ("old", "new")
    again = in_process("train_cpu.py", *TINY, "--output-dir", str(out))
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
    earlier_outputs(out, NAMES)
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


# --- a full disk, a write the system refuses: one line, earlier outputs kept ----------

@pytest.mark.parametrize("flag, where", [("--output-dir", "cannot replace the outputs in"),
                                         ("--logdir", "no space left on the device of")])
def test_a_full_output_or_log_disk_is_one_line(tiny_disk, in_process, tmp_path, flag, where):
    disk = tiny_disk("disk", "16k" if flag == "--output-dir" else "8k")  # 2 pages of logs
    out = disk if flag == "--output-dir" else tmp_path / "out"
    earlier_outputs(out, NAMES)
    extra = ["--logdir", str(disk / "logs")] if flag == "--logdir" else []
    line = one_line(in_process("train_cpu.py", *TINY, "--output-dir", str(out), *extra))
    assert where in line and str(disk) in line and "earlier outputs are untouched" in line
    assert outputs_state(out, NAMES) == "old"


def test_a_full_scratch_folder_is_one_line(tiny_disk, in_process, tmp_path, monkeypatch):
    import tempfile

    scratch = tiny_disk("tmp", "16k")
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    earlier_outputs(tmp_path / "out", NAMES)
    line = one_line(in_process("train_cpu.py", *TINY, "--output-dir", str(tmp_path / "out")))
    assert "cannot write the outputs in the scratch folder" in line and str(scratch) in line
    assert "set TMPDIR" in line and outputs_state(tmp_path / "out", NAMES) == "old"
    assert os.listdir(scratch) == []  # its scratch copy is gone too


def test_scratch_folders_of_killed_processes_are_removed(tmp_path, monkeypatch):
    import tempfile

    from pyimagesearch.files import scratch_folder

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    dead = tmp_path / "pyimagesearch-ckpt-4194305-abc"  # above Linux's pid limit
    alive = tmp_path / f"pyimagesearch-ckpt-{os.getppid()}-def"
    other = tmp_path / "pyimagesearch-outputs-4194305-ghi"
    for folder in (dead, alive, other):
        folder.mkdir()
    new = scratch_folder("ckpt")
    assert not dead.exists() and alive.exists() and other.exists()
    assert os.path.basename(new).startswith(f"pyimagesearch-ckpt-{os.getpid()}-")


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

    monkeypatch.setattr(this_process, "published", [])  # no run of this process got that far
    said = exits.write_refused(error)
    assert said is not None and str(said).startswith(line), said
    assert str(said).endswith("earlier outputs are untouched") and "\n" not in str(said)


def test_a_read_that_fails_with_eio_is_not_called_a_refused_write():
    assert exits.write_refused(tf.errors.DataLossError(None, None, "Input/output error")) is None
    assert exits.write_refused(ValueError("something else")) is None


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
