"""Watching a run: TensorBoard's logs (--logdir) and the profiler (--profile-steps).

The logs are read back with TensorBoard's own reader, and served by a real
`tensorboard` on loopback; a trace is TensorBoard's profile plugin's file.
"""
import json
import os
import re
import subprocess
import sys

import pytest
from tensorboard.backend.event_processing import event_accumulator

import train_cpu

from pyimagesearch.errors import UserError

TINY = ["--epochs", "1", "--steps-per-epoch", "3", "--batch-size", "32",
        "--data-source", "sample"]


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
