"""benchmark_pipeline.py end to end on a tiny stand-in MNIST: the JSON it writes adds up.

Seconds are only checked for being positive and consistent with each other;
how fast this machine is is not a test. Flags that do not go together, and a
--profile-dir it cannot write, are one line and status 2.
"""
import json
import os
import statistics
import tempfile

import pytest

import prepare_mnist
from conftest import one_line

from pyimagesearch import config

SETUPS = {"article-style", "efficient pipeline", "train_cpu.py"}
INPUT_SETUPS = {"article_style", "tfrecord", "in_memory", "article_style_tfds_cache"}


@pytest.fixture
def tiny_mnist(tmp_path, monkeypatch):
    """A tfds data dir holding a 300 + 20 image stand-in, made by prepare_mnist.py."""
    monkeypatch.setattr(config, "TRAIN_IMAGES", 300)
    monkeypatch.setattr(config, "VALIDATION_IMAGES", 20)
    data_dir = tmp_path / "tfds"
    prepare_mnist.prepare(str(data_dir))
    return data_dir


@pytest.mark.slow  # 11 s; the input-only run is the default test
def test_a_short_benchmark_writes_consistent_figures(tiny_mnist, tmp_path, in_process):
    out_file = tmp_path / "out" / "pipeline.json"
    result = in_process("tools/benchmark_pipeline.py", "--data-dir", tiny_mnist, "--steps", 3,
                        "--trials", 2, "--json", out_file)
    assert result.returncode == 0, result.stderr
    figures = json.loads(out_file.read_text())
    assert set(figures) == {"seconds", "median_seconds", "speedup_over_article_style", "steps",
                            "trials", "steps_per_execution", "batch_size", "data"}
    assert figures["steps"] == 3 and figures["trials"] == 2
    assert figures["steps_per_execution"] == 3  # the largest divisor of 3 up to 16
    assert figures["batch_size"] == config.BATCH_SIZE and "stand-in" in figures["data"]
    for table in ("seconds", "median_seconds", "speedup_over_article_style"):
        assert set(figures[table]) == SETUPS
    baseline = figures["median_seconds"]["article-style"]
    for name in SETUPS:
        seconds = figures["seconds"][name]
        assert len(seconds) == 2 and all(value > 0 for value in seconds)
        assert figures["median_seconds"][name] == pytest.approx(statistics.median(seconds))
        assert figures["speedup_over_article_style"][name] == pytest.approx(
            baseline / figures["median_seconds"][name])
    assert figures["speedup_over_article_style"]["article-style"] == pytest.approx(1.0)
    assert "epoch of 3 steps" in result.stdout and result.stdout.count("[INFO] trial") == 6


@pytest.mark.slow  # 6 s
def test_profile_dir_holds_a_trace_of_each_set_up(tiny_mnist, tmp_path, in_process):
    result = in_process("tools/benchmark_pipeline.py", "--data-dir", tiny_mnist, "--steps", 4,
                        "--trials", 1, "--profile-dir", tmp_path / "profile")
    assert result.returncode == 0, result.stderr
    for name in ("article-style", "efficient_pipeline", "train_cpu.py"):
        assert list((tmp_path / "profile" / name).rglob("*.xplane.pb")), name


@pytest.mark.slow  # 9 s
def test_the_floor_benchmark_writes_the_epoch_to_floor_ratio(tmp_path, in_process):
    out = tmp_path / "floor.json"
    result = in_process("tools/benchmark_pipeline.py", "--floor", "--steps", 3, "--trials", 2,
                        "--json", out)
    assert result.returncode == 0, result.stderr
    figures = json.loads(out.read_text())
    assert set(figures["seconds"]) == {"train_cpu.py epoch", "floor"}
    assert figures["validation_images"] == 500 and figures["trials"] == 2  # the sample's
    for epoch, low, ratio in zip(figures["seconds"]["train_cpu.py epoch"],
                                 figures["seconds"]["floor"], figures["epoch_to_floor"]):
        assert epoch > 0 and low > 0 and ratio == pytest.approx(epoch / low)
    assert figures["median_epoch_to_floor"] == pytest.approx(
        statistics.median(figures["epoch_to_floor"]))


def test_input_only_benchmark_writes_consistent_figures(tiny_mnist, tmp_path, in_process,
                                                        monkeypatch):
    scratch = tmp_path / "scratch"  # where its temporary TFRecords go, and are removed from
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    out = tmp_path / "input.json"
    result = in_process("tools/benchmark_pipeline.py", "--data-dir", tiny_mnist, "--input-only",
                        "--steps", 2, "--trials", 2, "--epochs", 1, "--json", out)
    assert result.returncode == 0, result.stderr
    figures = json.loads(out.read_text())
    assert set(figures["speedup_over_article_style"]) == INPUT_SETUPS
    assert figures["speedup_over_article_style"]["article_style"] == pytest.approx(1.0)
    for name in INPUT_SETUPS:
        assert len(figures["trials"][name]) == 2 and all(v > 0 for v in figures["trials"][name])
        assert figures[name] == pytest.approx(statistics.median(figures["trials"][name]))
    assert figures["command"][:2] == ["tools/benchmark_pipeline.py", "--data-dir"]
    assert "stand-in" in figures["tfrecord_data"]
    assert not [name for name in os.listdir(scratch) if name.startswith("pyimagesearch-")]


@pytest.mark.parametrize("flags, complaint", [
    (["--steps", "0"], "argument --steps: must be at least 1, got 0"),
    (["--floor", "--input-only"], "--floor goes alone"),
    (["--steps", "3"], "--data-dir is needed, except with --floor"),
    (["--floor", "--epochs", "2"], "--epochs and --tfrecord-dir go with --input-only")])
def test_flags_that_do_not_go_together_are_one_line(flags, complaint, in_process):
    line = one_line(in_process("tools/benchmark_pipeline.py", *flags))
    assert line.startswith("benchmark_pipeline.py: error: ") and complaint in line


def test_a_profile_dir_that_cannot_be_a_folder_is_one_line(tmp_path, in_process):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    line = one_line(in_process("tools/benchmark_pipeline.py", "--data-dir", tmp_path,
                               "--profile-dir", blocker / "profile"))
    assert f"cannot write to output folder {blocker / 'profile'}" in line
    assert blocker.read_text() == "not a folder"
