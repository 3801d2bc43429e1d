"""train_cpu.py end to end on a tiny run, and what it does with bad input.

Bad input: the flags (sizes that would take the machine down, numbers in forms no one
types, folder flags that are empty or name what is not a folder), a batch larger than
the data and a diverged run: each one line, nothing written.
"""
import json
import os
import subprocess
import sys

import keras
import numpy as np
import pytest

import train_cpu
from conftest import earlier_outputs, output_files, outputs_name

from pyimagesearch import cli, outputs
from pyimagesearch.errors import UserError
from pyimagesearch import files, sources

TINY = ["--epochs", "2", "--steps-per-epoch", "3", "--batch-size", "32",
        "--data-source", "sample"]
CPU = "cpu_epochs-2_batch-size-32_steps-per-epoch-3_data-source-sample"  # TINY's run name
RECORD_KEYS = {"device", "strategy", "replicas", "global_batch_size",
               "steps_per_epoch", "epochs", "data_source", "tensorflow_version",
               "epoch_seconds", "images_per_second", "loss", "val_loss"}


def _run_script(repo, *args):
    """Run a training script as a reader would; return the finished process."""
    return subprocess.run([sys.executable, *args], cwd=repo, capture_output=True,
                          text=True, timeout=300)


def test_tiny_run_writes_figure_record_and_loadable_model(tmp_path):
    train_cpu.main(TINY + ["--output-dir", str(tmp_path)])
    assert (tmp_path / f"{CPU}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    record = json.loads((tmp_path / f"{CPU}.json").read_text())
    assert RECORD_KEYS <= record.keys()
    assert record["device"] == "cpu" and record["replicas"] == 1
    assert record["global_batch_size"] == 32 and record["steps_per_epoch"] == 3
    assert record["data_source"] == "sample" and record["rehearsal"] is False
    assert len(record["loss"]) == len(record["val_loss"]) == 2
    assert len(record["epoch_seconds"]) == len(record["images_per_second"]) == 2
    model = keras.saving.load_model(tmp_path / f"{CPU}.keras")
    assert model.predict(np.zeros((1, 28, 28, 1), "float32"), verbose=0).shape == (1, 28, 28, 1)
    leftovers = [name for name in os.listdir(tmp_path) if name.startswith(".")]
    assert leftovers == []


def test_default_epoch_keeps_the_article_length():
    from pyimagesearch.plan import Settings, plan_run

    args = train_cpu.cli.build_parser("cpu", "").parse_args([])
    plan = plan_run("cpu", Settings.from_args(args), replicas=1)
    assert (plan.global_batch_size, plan.steps_per_epoch) == (128, 468)


def test_failure_while_saving_leaves_earlier_outputs_untouched(tmp_path, monkeypatch):
    for name in (f"{CPU}.png", f"{CPU}.json", f"{CPU}.keras"):
        (tmp_path / name).write_text(f"earlier {name}")

    def broken_save(self, path, *args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(keras.Model, "save", broken_save)
    # one line since issue 22 (a traceback before): it names the scratch folder
    with pytest.raises(UserError, match=r"cannot write the outputs in the scratch folder "
                                        r".*\(disk full\).*earlier outputs are untouched"):
        train_cpu.main(TINY + ["--output-dir", str(tmp_path)])
    for name in (f"{CPU}.png", f"{CPU}.json", f"{CPU}.keras"):
        assert (tmp_path / name).read_text() == f"earlier {name}"
    assert sorted(os.listdir(tmp_path)) == [f"{CPU}.json", f"{CPU}.keras", f"{CPU}.png"]


def test_staged_outputs_replace_only_on_success(tmp_path):
    (tmp_path / "a.json").write_text("old")
    with outputs.StagedOutputs(str(tmp_path)) as staged:
        files.write_json(staged.path("a.json"), {"new": 1})
        assert (tmp_path / "a.json").read_text() == "old"  # not yet
    assert json.loads((tmp_path / "a.json").read_text()) == {"new": 1}


@pytest.mark.slow  # the default suite's budget (docs/development.md); CI runs it
def test_a_bad_flag_is_one_line_and_exit_2_from_a_fresh_process(repo, tmp_path):
    # the other flag tests run in this process; this one also proves that
    # TensorFlow's start-up says nothing on stderr around the one line
    (tmp_path / "cpu.png").write_text("earlier")
    result = _run_script(repo, "train_cpu.py", "--epochs", "0", "--output-dir", str(tmp_path))
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "--epochs: must be at least 1" in lines[0], result.stderr
    assert (tmp_path / "cpu.png").read_text() == "earlier"


@pytest.mark.parametrize("flags, complaint", [
    (["--epochs", "0"], "--epochs: must be at least 1"),
    (["--batch-size", "-3"], "--batch-size: must be at least 1"),
    (["--epochs", "abc"], "--epochs: expected an integer"),
    (["--learning-rate", "0"], "--learning-rate: must be a finite number above 0"),
    (["--learning-rate", "inf"], "--learning-rate: must be a finite number above 0"),
    (["--seed", str(2**32)], "--seed: must be at most 4294967295"),
    (["--data-source", "floppy"], "--data-source: invalid choice"),
])
def test_bad_flags_give_one_line_and_exit_2(in_process, tmp_path, flags, complaint):
    (tmp_path / "cpu.png").write_text("earlier")
    result = in_process("train_cpu.py", *flags, "--output-dir", str(tmp_path))
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and complaint in lines[0], result.stderr
    assert (tmp_path / "cpu.png").read_text() == "earlier"


def test_unwritable_output_folder_gives_one_line(in_process, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    result = in_process("train_cpu.py", "--output-dir", str(blocker / "out"))
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "cannot write to output folder" in lines[0], result.stderr


# one epoch of TINY's 3 steps: bad input refused before or during its first epoch
ONE_EPOCH = ["--epochs", "1", "--steps-per-epoch", "3", "--batch-size", "32",
             "--data-source", "sample"]


def test_a_diverged_run_stops_before_writing(tmp_path):
    args = ONE_EPOCH + ["--learning-rate", "1e300", "--output-dir", str(tmp_path / "out")]
    names = output_files(outputs_name("cpu", args))  # what the run would replace
    earlier_outputs(tmp_path / "out", names)
    with pytest.raises(UserError, match="training diverged.*lower --learning-rate"):
        train_cpu.main(args)
    assert all((tmp_path / "out" / name).read_text() == f"earlier {name}" for name in names)


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
        train_cpu.main(ONE_EPOCH + [flag, ""])
    assert list(tmp_path.iterdir()) == []


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


@pytest.mark.parametrize("source", ["sample", "auto"])
def test_a_tfds_data_dir_not_there_yet_does_not_stop_a_run(in_process, monkeypatch,
                                                          tmp_path, source):
    if source == "auto" and sources.probe_network()["verdict"] == sources.ANSWERS:
        pytest.skip("auto would download MNIST on a machine with network")
    monkeypatch.setenv("TFDS_DATA_DIR", str(tmp_path / "not-yet"))
    result = in_process("train_cpu.py", *TINY[:-2], "--data-source", source,
                        "--output-dir", str(tmp_path / "out"))
    assert result.returncode == 0, result.stderr
    name = CPU if source == "sample" else CPU.removesuffix("_data-source-sample")
    assert json.loads((tmp_path / "out" / f"{name}.json").read_text())["data_source"] == "sample"
    assert "\x1b" not in result.stdout + result.stderr  # redirected: no terminal escapes


@pytest.mark.skipif(sources.probe_network()["verdict"] != sources.REFUSED,
                    reason="needs a machine whose network says no at once")
def test_tfds_source_offline_gives_one_line_within_the_probe(in_process, tmp_path):
    result = in_process("train_cpu.py", "--data-source", "tfds",
                        "--data-dir", str(tmp_path), "--output-dir", str(tmp_path))
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "--data-source sample" in lines[0], result.stderr
    assert not list(tmp_path.glob("*.png"))  # no figure, of any name


@pytest.mark.parametrize("steps, expected", [
    (468, 13), (234, 13), (117, 13), (58, 29), (29, 29), (1, 1), (64, 16), (7, 7),
    (59, 59), (1_000_000, 16), (999_983, 1)])  # a prime: no divisor near 16
def test_steps_per_execution_divides_the_epoch(steps, expected):
    from pyimagesearch.plan import steps_per_execution

    assert steps_per_execution(steps, limit=16) == expected


@pytest.mark.slow  # the default suite's budget (docs/development.md); CI runs it
def test_fit_and_custom_loop_train_the_same_losses(tmp_path):
    histories = {}
    for loop, name in (("fit", ""), ("custom", "_loop-custom")):
        train_cpu.main(TINY + ["--loop", loop, "--output-dir", str(tmp_path / loop)])
        histories[loop] = json.loads((tmp_path / loop / f"{CPU}{name}.json").read_text())
    for key in ("loss", "val_loss"):
        np.testing.assert_allclose(histories["custom"][key], histories["fit"][key],
                                   rtol=1e-4)
        assert histories["fit"][key][-1] < histories["fit"][key][0]  # it learns


def test_epoch_timer_separates_training_from_validation(monkeypatch):
    from pyimagesearch import callbacks

    clock = iter([10.0, 13.0, 14.5,   # epoch 1: begin, validation begins, end
                  20.0, 22.0])        # epoch 2: begin, end (no validation)
    monkeypatch.setattr(callbacks.time, "perf_counter", lambda: next(clock))
    timer = callbacks.EpochTimer()
    timer.on_epoch_begin(0)
    timer.on_test_begin()
    timer.on_test_begin()  # a second evaluation pass does not move the mark
    timer.on_epoch_end(0)
    timer.on_epoch_begin(1)
    timer.on_epoch_end(1)
    assert timer.epoch_seconds == [4.5, 2.0]
    assert timer.train_seconds == [3.0, 2.0]


def test_custom_loop_runs_every_step_of_an_uneven_epoch():
    import tensorflow as tf

    from pyimagesearch.autoencoder import AutoEncoder
    from pyimagesearch.loop import execution_sizes, fit_custom
    from pyimagesearch.loss import MSELoss

    assert execution_sizes(10, 4) == [4, 4, 2] and execution_sizes(8, 4) == [4, 4]
    images = np.zeros((8, 28, 28, 1), "float32")
    dataset = tf.data.Dataset.from_tensor_slices((images, images)).batch(4)
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    with strategy.scope():
        model = AutoEncoder()
        model.compile(loss=MSELoss(), optimizer="sgd")
    fit_custom(model, strategy, dataset.repeat(), dataset, epochs=1, steps_per_epoch=5,
               global_batch_size=4, steps_per_execution=3, verbose=False)
    assert int(model.optimizer.iterations) == 5  # 3 + 2, none dropped


def test_the_figure_shows_the_inputs_left_and_the_predictions_right(tmp_path, monkeypatch):
    # the model "predicts" white images: a right column of inputs (black
    # digits' backgrounds) or of anything but the predictions shows up dark
    import matplotlib.image

    def white(self, images, **kwargs):
        return np.ones_like(images)

    monkeypatch.setattr(keras.Model, "predict", white)
    train_cpu.main(TINY + ["--output-dir", str(tmp_path)])
    pixels = matplotlib.image.imread(tmp_path / f"{CPU}.png")[..., :3].mean(axis=-1)
    left, right = np.array_split(pixels, 2, axis=1)
    dark = 0.1  # MNIST's background is 0: black in the figure
    assert (left < dark).mean() > 0.3  # the input digits, mostly background
    assert (right < dark).mean() < 0.05  # white predictions; titles and frames only


def _sample_validation():
    return sources.SampleSource().examples("test")


def test_the_figure_shows_eight_different_digits_the_same_for_every_run():
    from pyimagesearch.data import figure_digits

    images, labels = _sample_validation()
    digits = figure_digits((images, labels))
    picked = [int(np.flatnonzero((images.astype(np.float32) / 255.0 == d).all(axis=(1, 2, 3)))[0])
              for d in digits]
    assert [int(labels[i]) for i in picked] == list(range(8))  # 0 to 7, each once
    # repeated to a multiple of the replicas, up to 40 (5 machines of 8 GPUs)
    for replicas in (1, 3, 8, 40):
        many = figure_digits((images, labels), replicas)
        assert len(many) % replicas == 0 and len(many) >= 8
        assert np.array_equal(many[:8], digits)


def test_a_split_with_fewer_classes_fills_up_with_digits_spread_over_it():
    from pyimagesearch.data import figure_digits

    images = np.arange(10 * 28 * 28, dtype=np.uint8).reshape(10, 28, 28, 1)
    digits = figure_digits((images, np.array([3] * 5 + [1] * 5)))
    assert len(digits) == 8
    assert len({d.tobytes() for d in digits}) == 8  # no image twice


def test_the_left_column_shows_the_digits_in_their_grey_levels(tmp_path, monkeypatch):
    # a mutation that handed the figure its digits unscaled (0-255 instead
    # of 0-1) still drew white digits; here every panel's pixels and scale
    # are compared with the digits the run was meant to show
    import matplotlib.axes

    shown, imshow = [], matplotlib.axes.Axes.imshow

    def recording(self, data, *args, **kwargs):
        image = imshow(self, data, *args, **kwargs)
        shown.append((np.asarray(data), image.norm.vmin, image.norm.vmax))
        return image

    monkeypatch.setattr(matplotlib.axes.Axes, "imshow", recording)
    train_cpu.main(TINY + ["--output-dir", str(tmp_path)])
    images, labels = _sample_validation()  # the first 0, 1, ..., 7 of the split, in [0, 1]
    expected = [images[np.flatnonzero(labels == digit)[0]] / 255.0 for digit in range(8)]
    assert len(shown) == 16  # each row: the input (left), then the prediction
    for (pixels, vmin, vmax), digit in zip(shown[0::2], expected):
        assert (vmin, vmax) == (0, 1)
        np.testing.assert_allclose(pixels, digit[..., 0], rtol=0, atol=1e-6)


@pytest.mark.slow
def test_a_reader_that_closes_the_pipe_early_loses_nothing(repo, tmp_path):
    # `python train_cpu.py | head -c 1`: the run goes on without printing,
    # and writes its outputs; no BrokenPipeError traceback
    process = subprocess.Popen(
        [sys.executable, "train_cpu.py", *TINY, "--output-dir", str(tmp_path)], cwd=repo,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    process.stdout.read(1)
    process.stdout.close()  # the reader is gone
    _, stderr = process.communicate(timeout=300)
    assert process.returncode == 0, stderr
    assert "Traceback" not in stderr and "BrokenPipe" not in stderr, stderr
    for suffix in ("png", "json", "keras"):
        assert (tmp_path / f"{CPU}.{suffix}").is_file()


CLOSED_STREAMS = r"""
import json, os, sys
from pyimagesearch import runtime as startup
startup.process()  # as every script's first call does
from pyimagesearch import cli

def main(argv):
    opened = os.open(sys.argv[1] + ".probe", os.O_WRONLY | os.O_CREAT)
    print("to stdout"), print("to stderr", file=sys.stderr)
    with open(sys.argv[1], "w") as handle:
        json.dump({"opened": opened, "stdout": sys.stdout.fileno(),
                   "stderr": sys.stderr.fileno()}, handle)

cli.run_main(main, [])
"""


# one closed stream in the default suite; the other two are slow (its budget)
@pytest.mark.parametrize("closed", [(1,), pytest.param((2,), marks=pytest.mark.slow),
                                    pytest.param((0, 1, 2), marks=pytest.mark.slow)])
def test_closed_standard_streams_get_dev_null_and_no_file_takes_their_number(repo, tmp_path,
                                                                            closed):
    # `python train_cpu.py >&-`: a file opened later took fd 1 (and TensorFlow's
    # lines went into it), and the exit hook's sys.stdout.flush() was a traceback
    record = tmp_path / "record.json"
    process = subprocess.run([sys.executable, "-c", CLOSED_STREAMS, str(record)], cwd=repo,
                             preexec_fn=lambda: [os.close(fd) for fd in closed], timeout=120)
    assert process.returncode == 0
    seen = json.loads(record.read_text())
    assert seen["opened"] > 2 and (seen["stdout"], seen["stderr"]) == (1, 2), seen
    assert (tmp_path / "record.json.probe").read_text() == ""  # no line landed in it


@pytest.mark.slow
def test_a_run_with_stdout_and_stderr_closed_writes_its_outputs(repo, tmp_path):
    process = subprocess.run([sys.executable, "train_cpu.py", *TINY, "--output-dir",
                              str(tmp_path)], cwd=repo, timeout=300,
                             preexec_fn=lambda: (os.close(1), os.close(2)))
    assert process.returncode == 0
    assert sorted(os.listdir(tmp_path)) == [f"{CPU}.json", f"{CPU}.keras", f"{CPU}.png"]


@pytest.mark.slow
def test_a_jax_backend_in_the_environment_is_set_aside_in_one_line(repo, tmp_path):
    # JAX-first TPU images set KERAS_BACKEND=jax; Keras then failed at its first
    # import (no jax here) or ran the scripts' TensorFlow code on JAX
    result = subprocess.run(
        [sys.executable, "train_cpu.py", *TINY, "--output-dir", str(tmp_path)], cwd=repo,
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "KERAS_BACKEND": "jax"})
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stderr.splitlines()[0] == ("[INFO] KERAS_BACKEND=jax set aside: this code "
                                             "runs Keras on TensorFlow")
    assert "Traceback" not in result.stderr
    assert (tmp_path / f"{CPU}.keras").is_file()


# What a plain run loads of the package, each for what it does there; the
# cluster, JobSet, TFRecord, backup, custom-loop, TPU, JAX and notebook
# modules load only when a flag or the environment asks for them.
# a plain run loads the article's modules and the few it needs (counted as
# every pyimagesearch name in sys.modules, the package itself included);
# clusters, TFRecords, backups, the custom loop, the TPU and JAX load where
# their flag or environment asks
MAX_PLAIN_RUN_MODULES = 17
OPT_IN = {"pyimagesearch.backup", "pyimagesearch.cluster", "pyimagesearch.jax_route",
          "pyimagesearch.loop", "pyimagesearch.tfrecords", "pyimagesearch.tfrecord_writer",
          "pyimagesearch.tpu_lookup", "pyimagesearch.tpu_runtime", "pyimagesearch.workarounds",
          "pyimagesearch.notebook"}
LOADED = r"""
import json, sys
sys.argv = ["train_cpu.py"]
import train_cpu
train_cpu.main(sys.argv[1:] + %r)
print(json.dumps(sorted(name for name in sys.modules if name.startswith("pyimagesearch"))))
"""


def test_a_plain_run_loads_only_what_it_uses(repo, tmp_path):
    flags = ["--epochs", "1", "--steps-per-epoch", "2", "--data-source", "sample",
             "--output-dir", str(tmp_path)]
    done = subprocess.run([sys.executable, "-c", LOADED % flags], cwd=repo,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    loaded = set(json.loads(done.stdout.splitlines()[-1]))
    assert len(loaded) <= MAX_PLAIN_RUN_MODULES, sorted(loaded)
    assert {"pyimagesearch.config", "pyimagesearch.data", "pyimagesearch.autoencoder",
            "pyimagesearch.loss"} <= loaded
    assert loaded.isdisjoint(OPT_IN), sorted(loaded & OPT_IN)
