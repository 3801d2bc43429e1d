"""Outputs into buckets: written through tf.io.gfile, staged, never a local "gs:" folder.

TensorFlow's in-memory filesystem (ram://) stands in for gs:// here: both go
through the same tf.io.gfile calls.
"""
import json
import os

import pytest
import tensorflow as tf

import train_cpu
from pyimagesearch import outputs
from pyimagesearch.base import files
from pyimagesearch.base.errors import UserError

TINY = ["--epochs", "1", "--steps-per-epoch", "2", "--batch-size", "32",
        "--data-source", "sample"]
TINY_NAME = "cpu_epochs-1_batch-size-32_steps-per-epoch-2_data-source-sample"  # --help's order


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
