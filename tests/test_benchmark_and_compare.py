"""compare.py on records of tiny real runs: Table 1, the figure, bad records."""
import json
import os
import shutil

import pytest

import compare


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
    assert "| tpu_rehearsal | 2 | 64 | 2 |" in (folder / "comparison.md").read_text()


def test_compare_row_separates_the_first_epoch():
    record = {"device": "cpu", "replicas": 1, "global_batch_size": 100,
              "steps_per_epoch": 10, "epoch_seconds": [9.0, 2.0, 4.0],
              "train_seconds": [8.0, 1.0, 3.0], "loss": [0.5, 0.1], "val_loss": [0.4, 0.2],
              "data_source": "sample"}
    row = compare.table_row("cpu", record)
    assert row[4:8] == (9.0, 3.0, 200.0, 500)  # epoch 1, later mean, ms/step, images/s
    assert row[8:10] == ("0.1000", "0.2000")


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


def test_a_json_output_is_the_old_file_or_the_new_whole(tmp_path, monkeypatch):
    # the benchmarks' --json: written beside, then swapped in (training/publish.py)
    import tensorflow as tf

    from pyimagesearch.training import publish
    from pyimagesearch.training.errors import UserError

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
    from pyimagesearch import cli
    from pyimagesearch.training import publish
    from pyimagesearch.training.errors import UserError

    link = tmp_path / "link.json"
    link.symlink_to(tmp_path / "records" / "result.json")  # dangling: no folder yet
    cli.check_output_file(str(link))  # creates the target's folder
    publish.publish_json(str(link), {"new": 1})
    assert link.is_symlink() and json.loads(link.read_text()) == {"new": 1}
    assert os.listdir(tmp_path / "records") == ["result.json"]
    pipe = tmp_path / "pipe.json"
    os.mkfifo(pipe)
    for write in (cli.check_output_file, lambda path: publish.publish_json(path, {})):
        with pytest.raises(UserError, match="pipe.json: it is a named pipe, not a file; give"):
            write(str(pipe))
    with pytest.raises(UserError, match="it is a folder, not a file"):
        cli.check_output_file(str(tmp_path))
    assert sorted(os.listdir(tmp_path)) == ["link.json", "pipe.json", "records"]
