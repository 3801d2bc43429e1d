"""compare.py on records of tiny real runs: Table 1, the figure, bad records; the tools' --json.

A bad record (a field of the wrong type or value, JSON nested too deeply, a model of
something else, a pipe) is skipped with one line; a folder that is not there is one line.
A tool's --json file is replaced whole, follows a link and refuses a pipe (files.write_json).
"""
import json
import os
import shutil
import threading

import pytest

import compare
from conftest import one_line

from pyimagesearch.errors import UserError


def test_compare_builds_table_and_figure(tiny_runs, tmp_path, in_process):
    folder = tmp_path / "runs"
    shutil.copytree(tiny_runs.folder, folder)
    (folder / "broken.json").write_text("{ not json")
    (folder / "foreign.json").write_text(json.dumps({"name": "package.json"}))
    result = in_process("compare.py", folder)
    assert result.returncode == 0, result.stderr
    rows = [line for line in result.stdout.splitlines()
            if line.startswith(("| cpu", "| gpu_rehearsal", "| tpu_rehearsal"))]
    assert len(rows) == 3
    assert "broken.json: not readable JSON" in result.stderr
    assert "foreign.json: not a run record" in result.stderr
    assert (folder / "comparison.png").read_bytes()[:4] == b"\x89PNG"
    table = (folder / "comparison.md").read_text()
    assert "| 2 | 64 | 2 |" in next(line for line in table.splitlines()
                                    if line.startswith("| tpu_rehearsal"))
    assert not [name for name in os.listdir(folder) if name.startswith(".")]


def test_compare_row_separates_the_first_epoch():
    record = {"device": "cpu", "replicas": 1, "global_batch_size": 100,
              "steps_per_epoch": 10, "epoch_seconds": [9.0, 2.0, 4.0],
              "train_seconds": [8.0, 1.0, 3.0], "loss": [0.5, 0.1], "val_loss": [0.4, 0.2],
              "data_source": "sample"}
    row = compare.table_row("cpu", record)
    assert row[8:12] == (9.0, 3.0, 200.0, 500)  # epoch 1, later mean, ms/step, images/s
    assert row[12:14] == ("0.1000", "0.2000")
    assert row[3] == 2  # epochs: those with a loss


def test_compare_without_records_is_one_line(in_process, tmp_path):
    assert "no run records" in one_line(in_process("compare.py", tmp_path))
    assert os.listdir(tmp_path) == []


def test_a_record_that_is_a_fifo_is_skipped_not_waited_on(tmp_path, capsys):
    os.mkfifo(tmp_path / "cpu.json")  # opening it to read would wait for a writer for ever
    found = {}
    reader = threading.Thread(target=lambda: found.update(compare.load_records(tmp_path)),
                              daemon=True)
    reader.start()
    reader.join(60)
    assert not reader.is_alive(), "compare.py waited on a FIFO"
    assert found == {}
    assert f"skipping {tmp_path / 'cpu.json'}: not a regular file" in capsys.readouterr().err


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
    ("epoch_seconds", ["x", 2], "values of the wrong type (epoch_seconds must be a list"),
    ("machine", "a laptop", "(machine is 'a laptop', not an object)"),
    ("replicas", 0, "(replicas is 0, not a whole number from 1)"),
    ("global_batch_size", True, "(global_batch_size is True, not a whole number"),
    ("steps_per_epoch", 2.5, "(steps_per_epoch is 2.5"),
    ("workers", -1, "(workers is -1"),
    ("learning_rate", float("nan"), "(learning_rate is nan, not a finite number)"),
    ("device", ["cpu"], "values of the wrong type (device is ['cpu'], not a name)"),
    ("loss", "0.1", "(loss must be a list of numbers)"),
])
def test_compare_skips_a_record_field_by_field_with_one_line(tmp_path, capsys, field, value,
                                                             said):
    (tmp_path / "good.json").write_text(json.dumps(GOOD_RECORD))
    (tmp_path / "edited.json").write_text(json.dumps({**GOOD_RECORD, field: value}))
    assert sorted(compare.load_records(str(tmp_path))) == ["good"]
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "edited.json" in lines[0] and said in lines[0], lines


def test_compare_skips_deep_json_and_a_model_of_something_else(tmp_path, tiny_runs,
                                                               in_process):
    import keras

    folder = tmp_path / "runs"
    folder.mkdir()
    for suffix in ("json", "keras"):
        name = f"{tiny_runs.names['train_cpu.py']}.{suffix}"
        shutil.copy(tiny_runs.folder / name, folder / name)
    (folder / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    os.mkfifo(folder / "piped.keras")  # loading it would wait for a writer for ever
    (folder / "piped.json").write_text(json.dumps(GOOD_RECORD))
    (folder / "other.json").write_text(json.dumps(GOOD_RECORD))
    other = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    other.save(folder / "other.keras")
    result = in_process("compare.py", folder)
    assert result.returncode == 0, result.stderr
    assert "deep.json: not readable JSON (nested too deeply)" in result.stderr
    assert "other.keras in the figure: not a model of the digits" in result.stderr
    assert f"skipping {folder / 'piped.keras'}: not a regular file" in result.stderr
    assert (folder / "comparison.png").exists() and "Traceback" not in result.stderr


@pytest.mark.parametrize("given", ["missing", "a-file", "outputs"])
def test_compare_on_a_folder_that_is_not_there_says_where_it_looked(tmp_path, monkeypatch,
                                                                    in_process, given):
    # `python compare.py` from outside the repository looks for ./outputs
    (tmp_path / "a-file").write_text("{}")
    monkeypatch.chdir(tmp_path)
    there = "is not a folder" if given == "a-file" else "does not exist"
    line = one_line(in_process("compare.py", *([given] if given != "outputs" else [])))
    assert line.startswith(f"compare.py: error: {given} {there} (in {tmp_path}); name the")
    assert os.listdir(tmp_path) == ["a-file"]


# --- runs that add up: sessions on several runtimes, flags, reruns ------------------------

def _record(device, flags=(), runtime="cpu", rehearse=None, started="2026-12-03T12:00:00",
            epochs=2):
    """(name, run record) of a run of train_<device>.py FLAGS, as it would be written.

    The name and numbers come from the real flags and plan (plan.py); the
    seconds and losses are made up: nothing trains. `runtime` is what the machine
    has (a stand-in for a GPU or TPU runtime's), `rehearse` the logical devices.
    """
    from pyimagesearch import cli
    from pyimagesearch.plan import Settings, flags_apart, make_plan

    settings = Settings.from_args(cli.build_parser(device).parse_args(list(flags)))
    replicas = rehearse or (8 if device == "tpu" else 1)
    plan = make_plan(device, settings, replicas, rehearsal=bool(rehearse), runtime=runtime)
    describe = {"cpu": "Colab, no GPU or TPU", "gpu": "Colab, 1 GPU",
                "tpu": "Colab, 1 TPU v5e chip"}[runtime]
    loss = [0.01 / (epoch + 1) for epoch in range(epochs)]
    return plan.name, {
        "device": device, "name": plan.name, "rehearsal": bool(rehearse), "replicas": replicas,
        "global_batch_size": plan.global_batch_size, "steps_per_epoch": plan.steps_per_epoch,
        "epochs": settings.epochs, "learning_rate": plan.learning_rate,
        "learning_rate_scaling": settings.lr_scaling, "epoch_seconds": [3.0] * epochs,
        "train_seconds": [2.0] * epochs, "loss": loss, "val_loss": loss,
        "data_source": "sample", "command": [f"train_{device}.py", *flags],
        "flags": [word for flag, value in flags_apart(device, settings)
                  for word in (f"--{flag}",) + ((value,) if value is not None else ())],
        "started_at": started,
        "runtime": {"service": "colab", "accelerator": runtime, "description": describe,
                    "devices": {"gpu": "Tesla T4", "tpu": "TPU v5e"}.get(device)},
        "machine": {"cpu_model": "Intel(R) Xeon(R) CPU", "cpu_count": 2}}


def _write(folder, name, record):
    (folder / f"{name}.json").write_text(json.dumps(record))
    return name


def _rows(out):
    """Table 1's rows printed in `out`, by run name: their cells."""
    return {line.split(" | ")[0][2:]: line.split(" | ") for line in out.splitlines()
            if line.startswith("| ") and not line.startswith(("| run |", "| --- |"))}


def test_a_cpu_then_gpu_then_tpu_session_keeps_every_run_apart(tmp_path, capsys):
    # the notebook's promise: switch the runtime, run all again, see every run in one place
    folder = tmp_path / "runs"
    folder.mkdir()
    sessions = [  # (runtime, script's device, flags, --rehearse): what each session ran
        ("cpu", "cpu", (), None), ("cpu", "gpu", (), 2), ("cpu", "tpu", (), 8),
        ("gpu", "gpu", (), None),
        ("gpu", "cpu", (), None),                       # DEVICE="cpu" on a GPU runtime
        ("tpu", "tpu", (), None),
        ("tpu", "tpu", ("--lr-scaling", "sqrt"), None),  # the README's fix, tried...
        ("tpu", "tpu", ("--lr-scaling", "linear"), None),  # ...and the other one
        ("tpu", "tpu", ("--lr-scaling=sqrt",), None),    # the first, tried again
        ("tpu", "tpu", (), None),                        # the default, run again
    ]
    names = []
    for minute, (runtime, device, flags, rehearse) in enumerate(sessions):
        name, record = _record(device, flags, runtime, rehearse,
                               started=f"2026-12-03T12:{minute:02d}:00")
        names.append(_write(folder, name, record))
    assert names[:8] == ["cpu", "gpu_rehearsal", "tpu_rehearsal", "gpu", "cpu_gpu-runtime",
                         "tpu", "tpu_lr-scaling-sqrt", "tpu_lr-scaling-linear"]
    assert names[8:] == ["tpu_lr-scaling-sqrt", "tpu"]  # a rerun replaces itself only

    compare.main([str(folder)])
    rows = _rows(capsys.readouterr().out)
    assert sorted(rows) == sorted(set(names))
    column = {name: index for index, name in enumerate(compare.COLUMNS)}
    cell = lambda run, name: rows[run][column[name]]  # noqa: E731
    assert cell("cpu", "runtime") == "Colab, no GPU or TPU"
    assert cell("cpu_gpu-runtime", "runtime") == "Colab, 1 GPU"
    assert cell("cpu_gpu-runtime", "device") == cell("cpu", "device") == \
        "CPU: Intel Xeon CPU (2 CPUs)"
    assert cell("gpu", "device") == "Tesla T4 x 1"
    assert cell("tpu", "device") == "TPU v5e, 8 cores"
    assert cell("tpu_rehearsal", "device") == "8 logical devices on CPU: Intel Xeon CPU (2 CPUs)"
    assert cell("tpu", "flags") == "" and cell("tpu_lr-scaling-sqrt", "flags") == \
        "--lr-scaling sqrt"
    assert cell("tpu_lr-scaling-linear", "flags") == "--lr-scaling linear"
    assert {cell(run, "epochs") for run in rows} == {"2"}
    # no two rows say the same about where and how they ran
    told = [tuple(cell(run, c) for c in ("device", "runtime", "flags")) for run in rows]
    assert len(set(told)) == len(told)


def test_table1_leaves_later_epochs_empty_after_one_epoch():
    _, record = _record("cpu", ("--epochs", "1"), epochs=1)
    row = dict(zip(compare.COLUMNS, compare.table_row("cpu_epochs-1", record)))
    assert row["epochs"] == 1 and row["epoch 1 (s, with val.)"] == 3.0
    assert row["later epochs (s, with val.)"] is None
    assert row["ms/step (training)"] is None and row["images/s (training)"] is None
    assert "| 3.0 |  |  |  |" in compare.markdown_table([tuple(row.values())])


def test_a_record_without_flags_shows_its_commands_flags_but_for_folders():
    record = {"command": ["train_tpu.py", "--rehearse", "8", "--lr-scaling", "sqrt",
                          "--output-dir", "out", "--logdir=logs", "--seed", "3"]}
    assert compare.run_flags(record) == "--lr-scaling sqrt --seed 3"
    assert compare.run_runtime(record) == "not recorded"


def test_compare_at_200_runs_loads_only_the_figures_models_and_warns_nothing(
        tiny_runs, tmp_path, in_process, monkeypatch):
    # a notebook that keeps its runs gathers many: the figure draws the latest few,
    # whose models alone are loaded; tools/benchmark_compare.py times the whole
    from pyimagesearch import outputs

    folder = tmp_path / "runs"
    folder.mkdir()
    cpu = tiny_runs.folder / tiny_runs.names["train_cpu.py"]
    template = json.loads(cpu.with_suffix(".json").read_text())
    for index in range(200):
        name = f"cpu_seed-{index}"
        _write(folder, name, {**template, "name": name, "flags": ["--seed", str(index)],
                              "started_at": f"2026-12-03T{index // 60:02d}:{index % 60:02d}:00"})
        os.link(cpu.with_suffix(".keras"), folder / f"{name}.keras")
    loaded = []
    real_load = outputs.load_model
    monkeypatch.setattr(outputs, "load_model", lambda path: loaded.append(path) or real_load(path))
    result = in_process("compare.py", folder)
    assert result.returncode == 0, result.stderr
    latest = [f"cpu_seed-{index}" for index in range(194, 200)]
    assert sorted(os.path.basename(path)[:-len(".keras")] for path in loaded) == latest
    assert len([row for row in _rows(result.stdout) if row.startswith("cpu_seed-")]) == 200
    left_out = [line for line in result.stdout.splitlines() if "left out:" in line]
    assert len(left_out) == 1 and "6 of the 200 runs" in left_out[0]
    assert "cpu_seed-0, " in left_out[0] and "cpu_seed-199" not in left_out[0]
    assert "Warning" not in result.stderr and "constrained_layout" not in result.stderr

    # the runs named on the command line instead; a name not in Table 1 is one line
    loaded.clear()
    result = in_process("compare.py", folder, "--figure", "cpu_seed-3", "cpu_seed-150")
    assert result.returncode == 0, result.stderr
    assert sorted(os.path.basename(path) for path in loaded) == ["cpu_seed-150.keras",
                                                                 "cpu_seed-3.keras"]
    line = one_line(in_process("compare.py", folder, "--figure", "cpu_seed-999"))
    assert "--figure names no run called cpu_seed-999" in line


def test_tensorflows_and_jaxs_tpu_runs_stand_side_by_side(tmp_path, capsys):
    # a Kaggle v5e-8 on JAX, a Cloud TPU VM on TensorFlow, and both rehearsals
    folder = tmp_path / "runs"
    folder.mkdir()
    for rehearse, backend, devices in ((None, "tensorflow", "TPU v5e"),
                                       (None, "jax", "TPU v5e, 8 chips"),
                                       (8, "tensorflow", None), (8, "jax", None)):
        name, record = _record("tpu", (), "tpu" if rehearse is None else "cpu", rehearse)
        if backend == "jax":
            name = record["name"] = name + "_jax"
            record["backend"] = "jax"
        record["runtime"]["devices"] = devices
        _write(folder, name, record)
    compare.main([str(folder)])
    rows = _rows(capsys.readouterr().out)
    device = compare.COLUMNS.index("device")
    assert {run: cells[device] for run, cells in rows.items()} == {
        "tpu": "TPU v5e, 8 cores",
        "tpu_jax": "TPU v5e, 8 chips, 8 replicas; Keras on JAX",
        "tpu_rehearsal": "8 logical devices on CPU: Intel Xeon CPU (2 CPUs)",
        "tpu_rehearsal_jax": "8 JAX CPU devices on CPU: Intel Xeon CPU (2 CPUs); Keras on JAX"}


@pytest.mark.parametrize("workers, backend, device, label", [
    (1, "jax", "8 JAX CPU devices on CPU: Intel Xeon CPU (2 CPUs); Keras on JAX", None),
    (2, "jax", "4 JAX CPU devices on CPU: Intel Xeon CPU (2 CPUs); 2 hosts x 4 devices; "
     "Keras on JAX", "2 hosts x 4 devices"),
    (8, "jax", "1 JAX CPU device on CPU: Intel Xeon CPU (2 CPUs); 8 hosts x 1 device; "
     "Keras on JAX", "8 hosts x 1 device"),
    (2, "tensorflow", "4 logical devices on CPU: Intel Xeon CPU (2 CPUs); 2 workers",
     "2 workers"),
])
def test_a_slices_hosts_and_devices_are_told_apart_from_a_clusters_workers(
        workers, backend, device, label):
    # the same 8 devices, as one host, a 2-host slice rehearsal, 8 hosts of 1,
    # and TensorFlow's 2-worker cluster
    name, record = _record("tpu", (), "cpu", 8)
    record.update(workers=workers, backend=backend)
    assert compare.run_device(record) == device
    lines = compare.run_label(name, record)
    apart = [line for line in lines if "hosts" in line or "workers" in line]
    assert apart == ([label] if label else [])


def test_compare_takes_several_folders_and_names_repeated_runs_by_folder(tmp_path, capsys):
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        _write(tmp_path / folder, *_record("cpu"))
    _write(tmp_path / "b", *_record("tpu", (), "cpu", 8))
    compare.main([str(tmp_path / "a"), str(tmp_path / "b"), "--output-dir",
                  str(tmp_path / "figure")])
    assert sorted(_rows(capsys.readouterr().out)) == ["a/cpu", "b/cpu", "tpu_rehearsal"]
    assert sorted(os.listdir(tmp_path / "figure")) == ["comparison.md", "comparison.png"]


# --- the tools' --json: files.write_json ---------------------------------------------------

def test_a_json_output_is_the_old_file_or_the_new_whole(tmp_path, tiny_disk, monkeypatch):
    from pyimagesearch import files

    disk = tiny_disk("disk", "16k")
    target = disk / "result.json"
    target.write_text('{"old": true}\n')
    files.write_json(str(target), {"new": 1})
    assert json.loads(target.read_text()) == {"new": 1}
    assert os.listdir(disk) == ["result.json"]  # no temporary left beside it
    with pytest.raises(UserError, match=r"result.json \(.*No space left on device.*\); "
                                        "the earlier file is untouched"):
        files.write_json(str(target), {"newer": "x" * 64_000})  # more than the disk holds
    assert json.loads(target.read_text()) == {"new": 1}
    assert os.listdir(disk) == ["result.json"]
    monkeypatch.chdir(tmp_path)
    files.write_json("bare.json", [])  # a name with no folder: the current one
    assert json.loads((tmp_path / "bare.json").read_text()) == []


def test_a_json_output_follows_a_link_and_refuses_a_pipe(tmp_path):
    # --json link.json writes the link's target and keeps the link; a pipe or a
    # device (--json /dev/full) is refused before the run, and left as it is
    from pyimagesearch import files

    link = tmp_path / "link.json"
    link.symlink_to(tmp_path / "records" / "result.json")  # dangling: no folder yet
    files.check_output_file(str(link))  # creates the target's folder
    files.write_json(str(link), {"new": 1})
    assert link.is_symlink() and json.loads(link.read_text()) == {"new": 1}
    assert os.listdir(tmp_path / "records") == ["result.json"]
    pipe = tmp_path / "pipe.json"
    os.mkfifo(pipe)
    for write in (files.check_output_file, lambda path: files.write_json(path, {})):
        with pytest.raises(UserError, match="pipe.json: it is a named pipe, not a file; give"):
            write(str(pipe))
    with pytest.raises(UserError, match="it is a folder, not a file"):
        files.check_output_file(str(tmp_path))
    assert sorted(os.listdir(tmp_path)) == ["link.json", "pipe.json", "records"]
