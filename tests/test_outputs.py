"""Outputs into buckets: written through tf.io.gfile, staged, never a local "gs:" folder.

TensorFlow's in-memory filesystem (ram://) stands in for gs:// here: both go
through the same tf.io.gfile calls.
"""
import json
import os
import subprocess
import sys

import pytest
import tensorflow as tf

import train_cpu
from pyimagesearch import files, outputs

TINY = ["--epochs", "1", "--steps-per-epoch", "2", "--batch-size", "32",
        "--data-source", "sample"]


def test_a_run_writes_into_a_bucket_like_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    folder = "ram://bucket/runs"
    train_cpu.main(TINY + ["--output-dir", folder])
    for suffix in ("png", "json", "keras"):
        assert tf.io.gfile.exists(f"{folder}/cpu.{suffix}")
    with tf.io.gfile.GFile(f"{folder}/cpu.json") as handle:
        assert json.load(handle)["device"] == "cpu"
    assert sorted(tf.io.gfile.listdir(folder)) == ["cpu.json", "cpu.keras", "cpu.png"]
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
    with pytest.raises(tf.errors.UnavailableError):
        with outputs.StagedOutputs(folder) as staged:
            for name in ("a.json", "b.json"):
                files.write_json(staged.path(name), {"new": 1})
    for name in ("a.json", "b.json"):
        with tf.io.gfile.GFile(f"{folder}/{name}") as handle:
            assert handle.read() == "old"
    assert sorted(tf.io.gfile.listdir(folder)) == ["a.json", "b.json"]  # no temporaries


def test_an_unreachable_bucket_is_one_line_and_no_local_folder(repo, tmp_path):
    # offline here: the bucket cannot be reached, and nothing local is created
    result = subprocess.run([sys.executable, str(repo / "train_cpu.py"), *TINY,
                             "--output-dir", "gs://pyimagesearch-no-such-bucket/out"],
                            cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "cannot write to output folder gs://" in lines[0], result.stderr
    assert os.listdir(tmp_path) == []
