"""train_cpu.py end to end on tiny runs: its outputs, its figure, and how they are written.

Each output file is replaced whole (a temporary name, then a rename): a failure
on the way is one line that says which files are new; a diverged run writes
nothing; the standard streams a caller closed get /dev/null.
"""
import errno
import json
import os
import signal
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

import train_cpu
from conftest import ENV, REPO, one_line, output_files, outputs_name

from pyimagesearch import cli, exits, files, outputs
from pyimagesearch.errors import UserError
from pyimagesearch.plan import Plan, Settings, make_plan, steps_per_execution
from pyimagesearch.sources import SampleSource

TINY = ["--epochs", "2", "--steps-per-epoch", "3", "--batch-size", "32", "--data-source", "sample"]
CPU = outputs_name("cpu", TINY)
RECORD_KEYS = {"device", "strategy", "replicas", "global_batch_size", "steps_per_epoch",
               "epochs", "data_source", "tensorflow_version", "epoch_seconds",
               "train_seconds", "images_per_second", "loss", "val_loss", "command", "flags",
               "runtime", "machine", "started_at", "name"}


def test_a_tiny_run_writes_its_figure_record_and_a_model_that_loads(tmp_path):
    train_cpu.main(TINY + ["--output-dir", str(tmp_path)])
    assert sorted(os.listdir(tmp_path)) == output_files(CPU)  # no temporary left
    assert (tmp_path / f"{CPU}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    record = json.loads((tmp_path / f"{CPU}.json").read_text())
    assert RECORD_KEYS <= record.keys()
    assert (record["device"], record["replicas"], record["global_batch_size"],
            record["steps_per_epoch"], record["rehearsal"]) == ("cpu", 1, 32, 3, False)
    assert record["data_source"] == "sample"
    assert record["strategy"] == "DefaultDistributionStrategy"
    assert len(record["loss"]) == len(record["val_loss"]) == len(record["epoch_seconds"]) == 2
    assert record["flags"] == ["--epochs", "2", "--batch-size", "32", "--steps-per-epoch", "3",
                               "--data-source", "sample"]
    model = keras.saving.load_model(tmp_path / f"{CPU}.keras")
    assert model.predict(np.zeros((1, 28, 28, 1), "float32"), verbose=0).shape == (1, 28, 28, 1)


def test_the_default_run_is_the_articles():
    args = cli.build_parser("cpu").parse_args([])
    plan = make_plan("cpu", Settings.from_args(args), replicas=1)
    assert (plan.global_batch_size, plan.steps_per_epoch, plan.settings.epochs) == (128, 468, 5)
    assert plan.name == "cpu" and plan.config.CPU_IMG_PATH == os.path.join("outputs", "cpu.png")


@pytest.mark.parametrize("steps, expected", [
    (468, 13), (234, 13), (117, 13), (58, 29), (29, 29), (1, 1), (64, 16), (7, 7),
    (59, 59), (1_000_000, 16), (999_983, 1)])  # a prime: no divisor near 16
def test_steps_per_execution_divides_the_epoch(steps, expected):
    assert steps_per_execution(steps, limit=16) == expected


def _earlier(folder, names):
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        (folder / name).write_text(f"earlier {name}")


def test_a_diverged_run_stops_before_writing(tmp_path):
    args = TINY + ["--learning-rate", "1e300", "--output-dir", str(tmp_path)]
    names = output_files(outputs_name("cpu", args))
    _earlier(tmp_path, names)
    with pytest.raises(UserError, match="training diverged.*lower --learning-rate.*untouched"):
        train_cpu.main(args)
    assert all((tmp_path / name).read_text() == f"earlier {name}" for name in names)


def test_a_batch_larger_than_the_data_is_refused_before_training(tmp_path):
    with pytest.raises(UserError, match="100,000,000 images is more than the 4,500"):
        train_cpu.main(["--batch-size", "100000000", "--steps-per-epoch", "1",
                        "--data-source", "sample", "--output-dir", str(tmp_path)])


@pytest.mark.parametrize("failing", ["keras", "png"])
def test_a_failure_while_writing_says_which_files_are_new(tmp_path, monkeypatch, failing):
    _earlier(tmp_path, output_files(CPU))
    if failing == "keras":
        monkeypatch.setattr(keras.Model, "save", lambda *args, **kwargs: (_ for _ in ()).throw(
            OSError(errno.ENOSPC, "No space left on device")))
        said = "earlier outputs are untouched"
    else:
        real = files.dump
        monkeypatch.setattr(outputs, "dump", lambda local, content: (_ for _ in ()).throw(
            OSError(errno.ENOSPC, "No space left on device")) if local.endswith(".png")
            else real(local, content))
        said = f"{tmp_path / CPU}.keras new, the rest as before"
    with pytest.raises(UserError, match=rf"cannot write .*{failing} \(No space left on device\);"
                                        rf" {said}"):
        train_cpu.main(TINY + ["--output-dir", str(tmp_path)])
    kept = output_files(CPU) if failing == "keras" else [f"{CPU}.json", f"{CPU}.png"]
    assert all((tmp_path / name).read_text() == f"earlier {name}" for name in kept)
    assert sorted(os.listdir(tmp_path)) == output_files(CPU)  # no temporary left


@pytest.mark.parametrize("kind", ["a folder", "a named pipe"])
def test_what_is_no_file_in_the_way_of_an_output_is_one_line_and_left_alone(tmp_path, kind):
    path = tmp_path / f"{CPU}.png"
    os.mkdir(path) if kind == "a folder" else os.mkfifo(path)
    with pytest.raises(UserError, match=f"cannot write {path}: it is {kind}, not a file"):
        train_cpu.main(TINY + ["--output-dir", str(tmp_path)])
    assert os.path.exists(path) and not os.path.isfile(path)


def test_an_output_that_is_a_link_replaces_the_file_it_points_to(tmp_path):
    (tmp_path / "kept").mkdir()
    (tmp_path / "kept" / "figure.png").write_text("earlier")
    (tmp_path / f"{CPU}.png").symlink_to(tmp_path / "kept" / "figure.png")
    train_cpu.main(TINY + ["--output-dir", str(tmp_path)])
    assert os.path.islink(tmp_path / f"{CPU}.png")  # the link stays
    assert (tmp_path / "kept" / "figure.png").read_bytes()[:4] == b"\x89PNG"


def test_a_run_writes_into_a_bucket(tmp_path):
    # ram:// stands in for gs://: every write goes through tf.io.gfile
    folder = "ram://bucket/runs"
    train_cpu.main(TINY + ["--output-dir", folder])
    assert sorted(tf.io.gfile.listdir(folder)) == output_files(CPU)
    assert not os.path.exists("ram:") and not os.path.exists(REPO / "ram:")
    record = json.loads(tf.io.gfile.GFile(f"{folder}/{CPU}.json").read())
    assert record["name"] == CPU


@pytest.mark.slow  # 9 s
def test_an_unreachable_bucket_is_one_line_and_no_local_folder(in_process, tmp_path,
                                                              monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GCE_METADATA_HOST", "127.0.0.1:9")  # no credentials to be found
    result = in_process("train_cpu.py", *TINY, "--output-dir", "gs://no-such-bucket-here/x")
    assert "cannot write to output folder gs://no-such-bucket-here/x" in one_line(result)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("code, words", [
    (errno.EFBIG, "File too large"), (errno.EROFS, "Read-only file system"),
    (errno.ENOSPC, "No space left on device"), (errno.EDQUOT, "Disk quota exceeded")])
def test_every_write_the_system_refuses_is_one_line_naming_the_file(code, words):
    error = OSError(code, words, "/logs/events.out")
    said = exits.explained(error)
    assert str(said) == (f"the system refused to write /logs/events.out ({words}); free some "
                         "space or lift the limit, or give another folder; earlier outputs "
                         "are untouched")
    # TensorFlow's own errors carry the system's words in their message
    wrapped = tf.errors.OutOfRangeError(None, None, f"/logs/x.tfevents; {words}")
    assert f"/logs/x.tfevents ({words})" in str(exits.explained(wrapped))
    assert exits.explained(ValueError("a bug")) is None  # its traceback stays


def test_a_full_output_disk_is_one_line_and_keeps_the_earlier_outputs(tiny_disk):
    disk = tiny_disk("out", "16k")
    _earlier(disk, output_files(CPU))
    with pytest.raises(UserError, match="No space left on device.*(untouched|as before)"):
        train_cpu.main(TINY + ["--output-dir", str(disk)])
    assert (disk / f"{CPU}.json").read_text() == f"earlier {CPU}.json"  # the last one written


def test_a_split_with_fewer_classes_fills_up_with_digits_spread_over_it():
    from pyimagesearch.data import figure_digits

    class Few(SampleSource):
        def examples(self, split):
            images = np.arange(10 * 28 * 28, dtype=np.uint8).reshape(10, 28, 28, 1)
            return images, np.array([3] * 5 + [1] * 5)

    digits = figure_digits(Few("few"))
    assert len(digits) == 8 and len({d.tobytes() for d in digits}) == 8


def test_the_figure_shows_eight_different_digits_the_same_for_every_run():
    from pyimagesearch.data import figure_digits

    source = SampleSource("test")
    images, labels = source.examples("test")
    digits = figure_digits(source)
    picked = [int(np.flatnonzero((images.astype(np.float32) / 255.0 == d).all(axis=(1, 2, 3)))[0])
              for d in digits]
    assert [int(labels[i]) for i in picked] == list(range(8))  # 0 to 7, each once
    for replicas in (1, 3, 8, 40):  # repeated to a multiple of the replicas
        many = figure_digits(source, replicas)
        assert len(many) % replicas == 0 and np.array_equal(many[:8], digits)


def test_the_figure_shows_the_digits_left_in_their_grey_levels_and_predictions_right(
        tmp_path, monkeypatch):
    import matplotlib.axes

    shown, imshow = [], matplotlib.axes.Axes.imshow

    def recording(self, data, *args, **kwargs):
        image = imshow(self, data, *args, **kwargs)
        shown.append((np.asarray(data), image.norm.vmin, image.norm.vmax))
        return image

    monkeypatch.setattr(matplotlib.axes.Axes, "imshow", recording)
    monkeypatch.setattr(Plan, "predict", lambda self, model, images: np.full_like(images, 0.5))
    train_cpu.main(TINY + ["--output-dir", str(tmp_path)])
    images, labels = SampleSource("test").examples("test")
    expected = [images[np.flatnonzero(labels == digit)[0]] / 255.0 for digit in range(8)]
    assert len(shown) == 16  # each row: the input (left), then the prediction
    for (pixels, vmin, vmax), digit in zip(shown[0::2], expected):
        assert (vmin, vmax) == (0, 1)
        np.testing.assert_allclose(pixels, digit[..., 0], rtol=0, atol=1e-6)
    assert all((pixels == 0.5).all() for pixels, _, _ in shown[1::2])


def test_the_epoch_timer_separates_training_from_validation(monkeypatch):
    from pyimagesearch import callbacks

    clock = iter([10.0, 13.0, 14.5, 20.0, 22.0])  # begin, validation, end; begin, end
    monkeypatch.setattr(callbacks.time, "perf_counter", lambda: next(clock))
    timer = callbacks.EpochTimer()
    timer.on_epoch_begin(0)
    timer.on_test_begin()
    timer.on_test_begin()  # a second evaluation pass does not move the mark
    timer.on_epoch_end(0)
    timer.on_epoch_begin(1)
    timer.on_epoch_end(1)
    assert timer.epoch_seconds == [4.5, 2.0] and timer.train_seconds == [3.0, 2.0]


@pytest.mark.slow
def test_fit_and_the_custom_loop_train_the_same_losses(tmp_path):
    histories = {}
    for loop in ("fit", "custom"):
        train_cpu.main(TINY + ["--loop", loop, "--output-dir", str(tmp_path / loop)])
        name = outputs_name("cpu", TINY + ["--loop", loop])
        histories[loop] = json.loads((tmp_path / loop / f"{name}.json").read_text())
    for key in ("loss", "val_loss"):
        np.testing.assert_allclose(histories["custom"][key], histories["fit"][key], rtol=1e-4)
        assert histories["fit"][key][-1] < histories["fit"][key][0]  # it learns


def test_the_custom_loop_runs_every_step_of_an_uneven_epoch(tmp_path):
    train_cpu.main(["--epochs", "1", "--steps-per-epoch", "5", "--batch-size", "8",
                    "--data-source", "sample", "--loop", "custom", "--output-dir",
                    str(tmp_path)])
    name = outputs_name("cpu", ["--epochs", "1", "--steps-per-epoch", "5", "--batch-size", "8",
                                "--data-source", "sample", "--loop", "custom"])
    model = keras.saving.load_model(tmp_path / f"{name}.keras")
    assert int(model.optimizer.iterations) == 5  # 5 steps in calls of up to 16: none dropped


CLOSED_STREAMS = r"""
import json, os, sys
from pyimagesearch import host
host.open_closed_streams()  # as every script's first call does
opened = os.open(sys.argv[1] + ".probe", os.O_WRONLY | os.O_CREAT)
print("to stdout"), print("to stderr", file=sys.stderr)
os.write(1, b"fd 1"), os.write(2, b"fd 2")
with open(sys.argv[1], "w") as handle:
    json.dump({"opened": opened}, handle)
"""


@pytest.mark.parametrize("closed", [(1,), (2,), (0, 1, 2)])
def test_closed_standard_streams_get_dev_null_and_no_file_takes_their_number(tmp_path, closed):
    record = tmp_path / "record.json"
    done = subprocess.run([sys.executable, "-c", CLOSED_STREAMS, str(record)], cwd=REPO,
                          preexec_fn=lambda: [os.close(fd) for fd in closed], timeout=60)
    assert done.returncode == 0
    assert json.loads(record.read_text())["opened"] > 2
    assert (tmp_path / "record.json.probe").read_text() == ""  # no line landed in it


@pytest.mark.slow
def test_a_run_with_stdout_and_stderr_closed_writes_its_outputs(tmp_path):
    done = subprocess.run([sys.executable, "train_cpu.py", *TINY, "--output-dir", str(tmp_path)],
                          cwd=REPO, timeout=300, env=ENV,
                          preexec_fn=lambda: (os.close(1), os.close(2)))
    assert done.returncode == 0
    assert sorted(os.listdir(tmp_path)) == output_files(CPU)


def test_a_reader_that_closes_the_pipe_ends_the_run_in_one_line(tmp_path):
    # `python train_cpu.py | head -1`: one line, status 141 (128 + SIGPIPE), as Unix tools
    _earlier(tmp_path, output_files(CPU))
    process = subprocess.Popen([sys.executable, "train_cpu.py", *TINY, "--output-dir",
                                str(tmp_path)], cwd=REPO, env=ENV, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    process.stdout.readline()
    process.stdout.close()  # the reader is gone
    _, stderr = process.communicate(timeout=300)
    assert process.returncode == 141, stderr
    assert stderr.strip().splitlines()[-1] == (
        "train_cpu.py: error: stopped: standard output was closed by its reader; earlier "
        "outputs are untouched")
    assert "Traceback" not in stderr and "Exception ignored" not in stderr
    assert all((tmp_path / name).read_text() == f"earlier {name}" for name in output_files(CPU))


LOADED = r"""
import json, pathlib, sys
sys.argv = ["train_cpu.py"]
import train_cpu
train_cpu.main(%r)
loaded = sorted(name for name in sys.modules if name.startswith("pyimagesearch"))
print(json.dumps({name: len(pathlib.Path(sys.modules[name].__file__).read_text().splitlines())
                  for name in loaded}))
"""
OPT_IN = {"backup", "cluster", "jax_slice", "jax_loop", "loop", "tfrecords", "tpu", "notebook"}
MAX_PLAIN_RUN_LINES = 2_500  # of the package's 4,200 at most


def test_a_plain_run_loads_only_what_it_uses():
    flags = ["--epochs", "1", "--steps-per-epoch", "2", "--data-source", "sample",
             "--output-dir", "/tmp/pyimagesearch-plain-run"]
    done = subprocess.run([sys.executable, "-c", LOADED % flags], cwd=REPO, env=ENV,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    loaded = json.loads(done.stdout.splitlines()[-1])
    names = {name.removeprefix("pyimagesearch.") for name in loaded}
    assert {"config", "data", "autoencoder", "loss"} <= names
    assert names.isdisjoint(OPT_IN), sorted(names & OPT_IN)
    assert sum(loaded.values()) <= MAX_PLAIN_RUN_LINES, loaded


@pytest.mark.slow  # 6 s; tests/test_signals.py sends SIGTERM at every moment
def test_a_sigterm_stops_a_run_in_one_line_and_keeps_the_earlier_outputs(tmp_path):
    _earlier(tmp_path, output_files(CPU))
    process = subprocess.Popen([sys.executable, "train_cpu.py", *TINY, "--epochs", "50",
                                "--output-dir", str(tmp_path)], cwd=REPO, env=ENV,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for line in process.stdout:
        if "training the autoencoder" in line:
            process.send_signal(signal.SIGTERM)
            break
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 143, stderr
    assert stderr.strip().splitlines()[-1] == ("train_cpu.py: error: stopped by SIGTERM; "
                                               "earlier outputs are untouched")
    name = outputs_name("cpu", TINY + ["--epochs", "50"])
    assert not list(tmp_path.glob(f"{name}*"))  # nothing of its own written
    assert all((tmp_path / n).read_text() == f"earlier {n}" for n in output_files(CPU))


def test_the_data_dir_of_tfds_not_there_yet_does_not_stop_a_sample_run(in_process, tmp_path,
                                                                       monkeypatch):
    monkeypatch.setenv("TFDS_DATA_DIR", str(tmp_path / "not-yet"))
    result = in_process("train_cpu.py", *TINY, "--output-dir", tmp_path / "out")
    assert result.returncode == 0, result.stderr
    assert not (tmp_path / "not-yet").exists()
    assert "\x1b" not in result.stdout  # redirected: no terminal escapes
