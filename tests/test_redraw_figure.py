"""tools/redraw_figure.py: a saved run's figure, drawn again as its script drew it."""
import json
import shutil

import pytest

from conftest import one_line, output_files


@pytest.fixture
def name(tiny_runs):
    """The tiny cpu run's name: cpu_epochs-2_batch-size-32_steps-per-epoch-2_data-source-sample."""
    return tiny_runs.names["train_cpu.py"]


@pytest.fixture
def saved_run(tiny_runs, tmp_path, name):
    """A copy of the tiny cpu run's record and model (the fixture's folder is shared)."""
    for suffix in ("json", "keras"):
        shutil.copy(tiny_runs.folder / f"{name}.{suffix}", tmp_path / f"{name}.{suffix}")
    return tmp_path


@pytest.mark.slow  # 9 s of its own run
def test_the_redrawn_figure_is_the_scripts_own(saved_run, tiny_runs, name, in_process):
    (saved_run / f"{name}.png").write_bytes(b"an old figure")  # replaced whole
    result = in_process("tools/redraw_figure.py", saved_run / f"{name}.json")
    assert result.returncode == 0, result.stderr
    # the same digits, predictions, layout and title: the very bytes train_cpu.py wrote
    redrawn = (saved_run / f"{name}.png").read_bytes()
    assert redrawn == (tiny_runs.folder / f"{name}.png").read_bytes()
    assert sorted(p.name for p in saved_run.iterdir()) == output_files(name)
    assert result.stdout.endswith(f"the figure of {name}, redrawn\n")


@pytest.mark.parametrize("case", ["missing model", "missing record", "not a record"])
def test_bad_input_is_one_line_and_exit_2(saved_run, name, in_process, case):
    record, out = saved_run / f"{name}.json", saved_run / f"{name}.png"
    out.write_bytes(b"an earlier figure")
    if case == "missing model":
        (saved_run / f"{name}.keras").unlink()
    elif case == "missing record":
        record.unlink()
    else:
        record.write_text(json.dumps({"name": name}))
    line = one_line(in_process("tools/redraw_figure.py", record))
    assert line.startswith("redraw_figure.py: error: ")
    assert {"missing model": f"{name}.keras not found", "missing record": f"{name}.json not found",
            "not a record": "is not a run record (no data_source"}[case] in line
    assert out.read_bytes() == b"an earlier figure"  # untouched
