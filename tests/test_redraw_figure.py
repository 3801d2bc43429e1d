"""tools/redraw_figure.py: a saved run's figure, drawn again as its script drew it."""
import json
import shutil

import pytest

import redraw_figure


@pytest.fixture
def saved_run(tiny_runs, tmp_path):
    """A copy of the tiny cpu run's record and model (the fixture's folder is shared)."""
    for suffix in ("json", "keras"):
        shutil.copy(tiny_runs / f"cpu.{suffix}", tmp_path / f"cpu.{suffix}")
    return tmp_path


def test_the_redrawn_figure_is_the_scripts_own(saved_run, tiny_runs, in_process, monkeypatch):
    titles = []

    def drawing(record, images, predicted, draw=redraw_figure.draw):
        fig = draw(record, images, predicted)
        titles.append(fig.get_suptitle())
        return fig

    monkeypatch.setattr(redraw_figure, "draw", drawing)
    (saved_run / "cpu.png").write_bytes(b"an old figure")  # replaced whole
    result = in_process("tools/redraw_figure.py", str(saved_run / "cpu.json"))
    assert result.returncode == 0, result.stderr
    redrawn = (saved_run / "cpu.png").read_bytes()
    # the same digits, predictions, layout and title: the very bytes train_cpu.py wrote
    assert redrawn == (tiny_runs / "cpu.png").read_bytes()
    assert titles[0].splitlines()[0].startswith("cpu: val_loss ")
    assert titles[0].splitlines()[2] == "digits 0-7 of the 5,000-digit sample, not MNIST"
    assert sorted(p.name for p in saved_run.iterdir()) == ["cpu.json", "cpu.keras", "cpu.png"]


@pytest.mark.parametrize("case", ["missing model", "missing record", "not a record"])
def test_bad_input_is_one_line_and_exit_2(saved_run, in_process, case):
    record, out = saved_run / "cpu.json", saved_run / "cpu.png"
    out.write_bytes(b"an earlier figure")
    if case == "missing model":
        (saved_run / "cpu.keras").unlink()
    elif case == "missing record":
        record.unlink()
    else:
        record.write_text(json.dumps({"name": "cpu"}))
    result = in_process("tools/redraw_figure.py", str(record))
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("redraw_figure.py: error: ")
    assert {"missing model": "cpu.keras not found", "missing record": "cpu.json not found",
            "not a record": "is not a run record (no data_source"}[case] in lines[0]
    assert out.read_bytes() == b"an earlier figure"  # untouched
