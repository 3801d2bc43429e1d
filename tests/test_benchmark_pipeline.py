"""benchmark_pipeline.py end to end on a tiny stand-in MNIST: the JSON it writes adds up.

Seconds are only checked for being positive and consistent with each other;
how fast this machine is is not a test. A --profile-dir it cannot write is one line.
"""
import json
import statistics

import pytest

import benchmark_pipeline
import prepare_mnist

from pyimagesearch import config
from pyimagesearch.errors import UserError

SETUPS = {"article-style", "efficient pipeline", "train_cpu.py"}
KEYS = {"seconds", "median_seconds", "speedup_over_article_style", "steps", "trials",
        "steps_per_execution", "batch_size", "data"}


@pytest.fixture
def tiny_mnist(tmp_path, monkeypatch):
    """A tfds data dir holding a 300 + 20 image stand-in, made by prepare_mnist.py."""
    monkeypatch.setattr(config, "TRAIN_IMAGES", 300)
    monkeypatch.setattr(config, "VALIDATION_IMAGES", 20)
    data_dir = tmp_path / "tfds"
    prepare_mnist.prepare(str(data_dir))
    return data_dir


@pytest.mark.slow  # the default suite's budget (docs/development.md); CI runs it
def test_a_short_benchmark_writes_consistent_figures(tiny_mnist, tmp_path, capsys):
    out_file = tmp_path / "out" / "pipeline.json"
    benchmark_pipeline.main(["--data-dir", str(tiny_mnist), "--steps", "3",
                             "--trials", "2", "--json", str(out_file)])
    figures = json.loads(out_file.read_text())
    assert set(figures) == KEYS
    assert figures["steps"] == 3 and figures["trials"] == 2
    assert figures["steps_per_execution"] == 3  # the largest divisor of 3 up to 16
    assert figures["batch_size"] == config.BATCH_SIZE
    assert "stand-in" in figures["data"]
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
    out = capsys.readouterr().out
    assert "epoch of 3 steps" in out and out.count("[INFO] trial") == 6


def test_steps_must_be_positive(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        benchmark_pipeline.main(["--data-dir", str(tmp_path), "--steps", "0"])
    assert exit_info.value.code == 2
    assert "--steps" in capsys.readouterr().err


@pytest.mark.slow  # a profile of three set-ups (about 7 s)
def test_profile_dir_holds_a_trace_of_each_set_up(tiny_mnist, tmp_path):
    benchmark_pipeline.main(["--data-dir", str(tiny_mnist), "--steps", "4", "--trials", "1",
                             "--profile-dir", str(tmp_path / "profile")])
    for name in ("article-style", "efficient_pipeline", "train_cpu.py"):
        traces = list((tmp_path / "profile" / name).rglob("*.xplane.pb"))
        assert traces, name


def test_benchmark_profile_dir_that_is_a_file_is_one_line(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    with pytest.raises(UserError, match="cannot write to output folder"):
        benchmark_pipeline.main(["--data-dir", str(tmp_path), "--profile-dir",
                                 str(blocker / "profile")])


@pytest.mark.slow  # the default suite's budget (docs/development.md); CI runs it
def test_the_floor_benchmark_writes_the_epoch_to_floor_ratio(tmp_path):
    out = tmp_path / "floor.json"
    benchmark_pipeline.main(["--floor", "--steps", "3", "--trials", "2", "--json", str(out)])
    figures = json.loads(out.read_text())
    assert set(figures["seconds"]) == {"train_cpu.py epoch", "floor"}
    assert figures["validation_images"] == 500 and figures["trials"] == 2  # the sample's
    for epoch, low, ratio in zip(figures["seconds"]["train_cpu.py epoch"],
                                 figures["seconds"]["floor"], figures["epoch_to_floor"]):
        assert epoch > 0 and low > 0 and ratio == pytest.approx(epoch / low)
    assert figures["median_epoch_to_floor"] == pytest.approx(
        statistics.median(figures["epoch_to_floor"]))


@pytest.mark.parametrize("flags, complaint", [
    (["--floor", "--input-only"], "--floor goes alone"),
    (["--steps", "3"], "--data-dir is needed, except with --floor")])
def test_floor_and_data_dir_flags_are_checked(flags, complaint, capsys):
    with pytest.raises(SystemExit) as stop:
        benchmark_pipeline.main(flags)
    assert stop.value.code == 2 and complaint in capsys.readouterr().err
