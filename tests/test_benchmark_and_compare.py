"""compare.py on records of tiny real runs: Table 1, the figure, bad records.

A bad record (a field of the wrong type or value, JSON nested too deeply, a model of
something else, a pipe) is skipped with one line; a folder that is not there is one line.
"""
import json
import os
import shutil

import pytest

import compare

from pyimagesearch.errors import UserError


def test_compare_builds_table_and_figure(tiny_runs, tmp_path, capsys):
    folder = tmp_path / "runs"
    shutil.copytree(tiny_runs, folder)
    (folder / "broken.json").write_text("{ not json")
    (folder / "foreign.json").write_text(json.dumps({"name": "package.json"}))
    compare.main([str(folder)])
    out, err = capsys.readouterr()
    rows = [line for line in out.splitlines() if line.startswith("| cpu")
            or line.startswith("| tpu_rehearsal")]
    assert len(rows) == 2
    assert "broken.json: not readable JSON" in err and "foreign.json: not a run record" in err
    assert (folder / "comparison.png").read_bytes()[:4] == b"\x89PNG"
    assert "| 2 | 64 | 2 |" in next(line for line in (folder / "comparison.md").read_text()
                                    .splitlines() if line.startswith("| tpu_rehearsal"))


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
    result = in_process("compare.py", str(tmp_path))
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "no run records" in lines[0], result.stderr


def test_a_record_that_is_a_fifo_is_skipped_not_waited_on(tmp_path, capsys):
    import threading

    os.mkfifo(tmp_path / "cpu.json")  # opening it to read would wait for a writer for ever
    found = {}
    reader = threading.Thread(target=lambda: found.update(compare.load_records(tmp_path)),
                              daemon=True)
    reader.start()
    reader.join(60)
    assert not reader.is_alive(), "compare.py waited on a FIFO"
    assert found == {}
    assert f"skipping {tmp_path / 'cpu.json'}: not a regular file" in capsys.readouterr().err


def test_compare_skips_records_with_values_of_the_wrong_type(tmp_path, capsys):
    good = {"device": "cpu", "replicas": 1, "global_batch_size": 32, "steps_per_epoch": 2,
            "epoch_seconds": [1.0, 0.5], "loss": [0.1, 0.05], "val_loss": [0.1, 0.05],
            "data_source": "sample"}
    (tmp_path / "good.json").write_text(json.dumps(good))
    (tmp_path / "bad.json").write_text(json.dumps({**good, "epoch_seconds": ["x", 2]}))
    (tmp_path / "worse.json").write_text(json.dumps({**good, "device": 5}))
    assert sorted(compare.load_records(str(tmp_path))) == ["good"]
    assert capsys.readouterr().err.count("values of the wrong type") == 2


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
    ("machine", "a laptop", "(machine is 'a laptop', not an object)"),
    ("replicas", 0, "(replicas is 0, not a whole number from 1)"),
    ("global_batch_size", True, "(global_batch_size is True, not a whole number"),
    ("steps_per_epoch", 2.5, "(steps_per_epoch is 2.5"),
    ("workers", -1, "(workers is -1"),
    ("learning_rate", float("nan"), "(learning_rate is nan, not a finite number)"),
    ("device", ["cpu"], "(device is ['cpu'], not a name)"),
    ("loss", "0.1", "(loss must be a list of numbers)"),
])
def test_compare_skips_a_record_field_by_field_with_one_line(tmp_path, capsys, field, value,
                                                             said):
    (tmp_path / "good.json").write_text(json.dumps(GOOD_RECORD))
    (tmp_path / "edited.json").write_text(json.dumps({**GOOD_RECORD, field: value}))
    assert sorted(compare.load_records(str(tmp_path))) == ["good"]
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "edited.json" in lines[0] and said in lines[0], lines


def test_compare_skips_deep_json_and_a_model_of_something_else(tmp_path, capsys, tiny_runs):
    import keras

    folder = tmp_path / "runs"
    folder.mkdir()
    for suffix in ("json", "keras"):
        name = f"{tiny_runs.names['train_cpu.py']}.{suffix}"
        shutil.copy(tiny_runs / name, folder / name)
    (folder / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    os.mkfifo(folder / "piped.keras")  # loading it would wait for a writer for ever
    (folder / "piped.json").write_text(json.dumps(GOOD_RECORD))
    (folder / "other.json").write_text(json.dumps(GOOD_RECORD))
    other = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    other.save(folder / "other.keras")
    compare.main([str(folder)])
    err = capsys.readouterr().err
    assert "deep.json: not readable JSON (nested too deeply)" in err
    assert "other.keras in the figure: not a model of the digits" in err
    assert f"skipping {folder / 'piped.keras'}: not a regular file" in err
    assert (folder / "comparison.png").exists() and "Traceback" not in err


@pytest.mark.parametrize("given", ["missing", "a-file", "outputs"])
def test_compare_on_a_folder_that_is_not_there_says_where_it_looked(tmp_path, monkeypatch,
                                                                    given):
    # `python compare.py` from outside the repository looks for ./outputs
    (tmp_path / "a-file").write_text("{}")
    monkeypatch.chdir(tmp_path)
    there = "is not a folder" if given == "a-file" else "does not exist"
    with pytest.raises(UserError, match=rf"^{given} {there} \(in {tmp_path}\); name the"):
        compare.main([given] if given != "outputs" else [])
    assert os.listdir(tmp_path) == ["a-file"]


def test_a_json_output_is_the_old_file_or_the_new_whole(tmp_path, monkeypatch):
    # the benchmarks' --json: written beside, then swapped in (files.py)
    import tensorflow as tf

    from pyimagesearch import files as publish
    from pyimagesearch.errors import UserError

    target = tmp_path / "result.json"
    target.write_text('{"old": true}\n')
    publish.publish_json(str(target), {"new": 1})
    assert json.loads(target.read_text()) == {"new": 1}
    assert os.listdir(tmp_path) == ["result.json"]  # no copy, journal or old file left

    def refused(*args, **kwargs):
        raise tf.errors.ResourceExhaustedError(None, None, "No space left on device")

    monkeypatch.setattr(tf.io.gfile, "copy", refused)  # into the folder: a full disk
    with pytest.raises(UserError, match="earlier outputs are untouched"):
        publish.publish_json(str(target), {"newer": 2})
    assert json.loads(target.read_text()) == {"new": 1}
    monkeypatch.undo()
    monkeypatch.chdir(tmp_path)
    publish.publish_json("bare.json", [])  # a name with no folder: the current one
    assert json.loads((tmp_path / "bare.json").read_text()) == []


def test_a_json_output_follows_a_link_and_refuses_a_pipe(tmp_path):
    # --json link.json writes the link's target and keeps the link; a pipe or a
    # device (--json /dev/full) is refused before the run, and left as it is
    from pyimagesearch.files import check_output_file
    from pyimagesearch import files as publish
    from pyimagesearch.errors import UserError

    link = tmp_path / "link.json"
    link.symlink_to(tmp_path / "records" / "result.json")  # dangling: no folder yet
    check_output_file(str(link))  # creates the target's folder
    publish.publish_json(str(link), {"new": 1})
    assert link.is_symlink() and json.loads(link.read_text()) == {"new": 1}
    assert os.listdir(tmp_path / "records") == ["result.json"]
    pipe = tmp_path / "pipe.json"
    os.mkfifo(pipe)
    for write in (check_output_file, lambda path: publish.publish_json(path, {})):
        with pytest.raises(UserError, match="pipe.json: it is a named pipe, not a file; give"):
            write(str(pipe))
    with pytest.raises(UserError, match="it is a folder, not a file"):
        check_output_file(str(tmp_path))
    assert sorted(os.listdir(tmp_path)) == ["link.json", "pipe.json", "records"]


# --- runs that add up: sessions on several runtimes, flags, reruns ------------------------

def _record(device, flags=(), runtime="cpu", rehearse=None, started="2026-12-03T12:00:00",
            epochs=2):
    """(name, run record) of a run of train_<device>.py FLAGS, as it would be written.

    The name comes from the real flags and plan (plan.py); the numbers are made
    up: nothing trains. `runtime` is what the machine has (a stand-in for a GPU or TPU
    runtime's), `rehearse` the logical devices of --rehearse.
    """
    from pyimagesearch import cli
    from pyimagesearch.plan import plan_run
    from pyimagesearch.plan import Settings, flags_apart

    args = cli.build_parser(device, "").parse_args(list(flags))
    settings = Settings.from_args(args)
    replicas = rehearse or (8 if device == "tpu" else 1)
    plan = plan_run(device, settings, replicas, rehearsal=bool(rehearse), runtime=runtime)
    describe = {"cpu": "Colab, no GPU or TPU", "gpu": "Colab, 1 GPU",
                "tpu": "Colab, 1 TPU v5e chip"}[runtime]
    loss = [0.01 / (epoch + 1) for epoch in range(epochs)]
    return plan.name, {
        "device": device, "name": plan.name, "rehearsal": bool(rehearse), "replicas": replicas,
        "global_batch_size": plan.global_batch_size, "steps_per_epoch": plan.steps_per_epoch,
        "epochs": settings.epochs, "learning_rate": plan.learning_rate,
        "learning_rate_scaling": settings.lr_scaling, "epoch_seconds": [3.0] * epochs,
        "train_seconds": [2.0] * epochs, "loss": loss, "val_loss": loss,
        "data_source": "sample", "flags": flags_apart(device, settings),
        "command": [f"train_{device}.py", *flags], "started_at": started,
        "runtime": {"service": "colab", "accelerator": runtime, "description": describe,
                    "devices": {"gpu": "Tesla T4", "tpu": "TPU v5e"}.get(device)},
        "machine": {"cpu_model": "Intel(R) Xeon(R) CPU", "cpu_count": 2}}


def _write(folder, name, record):
    (folder / f"{name}.json").write_text(json.dumps(record))
    return name


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
    assert sorted(path.stem for path in folder.glob("*.json")) == sorted(set(names))

    compare.main([str(folder)])
    out = capsys.readouterr().out
    rows = {line.split(" | ")[0][2:]: line.split(" | ") for line in out.splitlines()
            if line.startswith("| ") and not line.startswith(("| run |", "| --- |"))}
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


def test_run_names_are_stable_safe_and_keep_the_articles_for_the_defaults():
    from pyimagesearch.plan import Settings, run_name

    assert run_name("cpu", Settings(), runtime="cpu") == "cpu"
    assert run_name("tpu", Settings(batch_size=1024), True, "cpu") == "tpu_rehearsal"
    assert run_name("gpu", Settings(), False, "gpu") == "gpu"
    assert run_name("tpu", Settings(batch_size=1024), False, "tpu") == "tpu"
    # the TPU's default batch is 1024: 128 is a flag of its own there
    assert run_name("tpu", Settings(), False, "tpu") == "tpu_batch-size-128"
    # learning rates that differ in the fourth digit are different runs
    assert run_name("cpu", Settings(learning_rate=0.0011), runtime="cpu") != \
        run_name("cpu", Settings(learning_rate=0.001100001), runtime="cpu")
    # the largest and smallest rates the flag takes are two runs, not one
    assert run_name("cpu", Settings(learning_rate=1e300), runtime="cpu") == \
        "cpu_learning-rate-1e300"
    assert run_name("cpu", Settings(learning_rate=1e-300), runtime="cpu") == \
        "cpu_learning-rate-1e-300"
    many = Settings(epochs=1, batch_size=7, steps_per_epoch=3, data_source="tfrecord",
                    seed=-5, optimizer="sgd", learning_rate=1e-05, lr_scaling="sqrt",
                    loop="custom", precision="mixed_bfloat16", jit_compile=True,
                    output_dir="/x y", logdir="/logs", backup_dir="/b")  # places: not named
    name = run_name("gpu", many, True, "tpu")
    assert name == ("gpu_rehearsal_epochs-1_batch-size-7_steps-per-epoch-3_data-source-"
                    "tfrecord_seed--5_optimizer-sgd_learning-rate-1e-05_lr-scaling-sqrt_"
                    "loop-custom_precision-mixed_bfloat16_jit-compile_tpu-runtime")
    assert len(name + ".keras") < 255 and all(c.isalnum() or c in "._-" for c in name)


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


@pytest.mark.slow  # the default suite's budget (docs/development.md); CI runs it
def test_compare_at_200_runs_loads_only_the_figures_models_and_warns_nothing(
        tiny_runs, tmp_path, capsys, monkeypatch):
    # a notebook that keeps its runs gathers many: the figure draws the latest few,
    # whose models alone are loaded; tools/benchmark_compare.py times the whole
    import warnings

    from pyimagesearch import outputs

    folder = tmp_path / "runs"
    folder.mkdir()
    cpu = next(tiny_runs.glob("cpu*.json")).with_suffix("")  # its name says its flags
    template = json.loads(cpu.with_suffix(".json").read_text())
    for index in range(200):
        name = f"cpu_seed-{index}"
        _write(folder, name, {**template, "name": name, "flags": ["--seed", str(index)],
                              "started_at": f"2026-12-03T{index // 60:02d}:{index % 60:02d}:00"})
        os.link(cpu.with_suffix(".keras"), folder / f"{name}.keras")
    loaded = []
    real_load = outputs.load_model
    monkeypatch.setattr(outputs, "load_model", lambda path: loaded.append(path) or real_load(path))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        compare.main([str(folder)])
    out, err = capsys.readouterr()
    latest = [f"cpu_seed-{index}" for index in range(194, 200)]
    assert sorted(os.path.basename(path)[:-len(".keras")] for path in loaded) == latest
    assert len([line for line in out.splitlines() if line.startswith("| cpu_seed-")]) == 200
    left_out = [line for line in out.splitlines() if "left out:" in line]
    assert len(left_out) == 1 and "6 of the 200 runs" in left_out[0]
    assert "cpu_seed-0, " in left_out[0] and "cpu_seed-199" not in left_out[0]
    assert [str(w.message) for w in caught if "matplotlib" in w.filename
            or "layout" in str(w.message)] == []
    assert "constrained_layout" not in err

    # the runs named on the command line instead; a name not in Table 1 is one line
    loaded.clear()
    compare.main([str(folder), "--figure", "cpu_seed-3", "cpu_seed-150"])
    assert sorted(os.path.basename(path) for path in loaded) == ["cpu_seed-150.keras",
                                                                 "cpu_seed-3.keras"]
    with pytest.raises(compare.UserError, match="--figure names no run called cpu_seed-999"):
        compare.main([str(folder), "--figure", "cpu_seed-999"])


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
    rows = {line.split(" | ")[0][2:]: line.split(" | ")
            for line in capsys.readouterr().out.splitlines()
            if line.startswith("| ") and not line.startswith(("| run |", "| --- |"))}
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
    # the same 8 devices, as one host, a 2-host slice rehearsal (issue 44), 8 hosts of 1,
    # and TensorFlow's 2-worker cluster
    name, record = _record("tpu", (), "cpu", 8)
    record.update(workers=workers, backend=backend)
    assert compare.run_device(record) == device
    lines = compare.run_label(name, record)
    apart = [line for line in lines if "hosts" in line or "workers" in line]
    assert apart == ([label] if label else [])
