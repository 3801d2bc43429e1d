"""notebook.ipynb: valid, without outputs, tied to the README, and run top to bottom in a real kernel.

The notebook runs as a reader on a CPU runtime runs it: in a fresh copy of
the repository (the files git would commit), offline, through nbclient and
an IPython kernel. The default suite runs it with few steps (a cell after
its settings, as papermill injects parameters); the slow suite runs it as
it is committed. The GPU, TPU, Colab and Kaggle branches are held with
stand-ins in test_platforms.py.
"""
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

REPO = pathlib.Path(__file__).resolve().parents[1]
NOTEBOOK = REPO / "notebook.ipynb"
QUICK = "REHEARSE = False\nTRAIN_FLAGS = [\"--epochs\", \"2\", \"--steps-per-epoch\", \"4\"]"
# a bound for a hang, not a speed: the cell that trains three runs took about 2 minutes on
# the Intel machine of docs/machine.md, and 13 on a 2-core AMD EPYC VM on 2026-12-02 whose
# TensorFlow spent half its time in the kernel (the whole test: 901 s, over the old 900)
CELL_TIMEOUT_S = 2400


def read():
    return nbformat.read(NOTEBOOK, as_version=4)


def repository():
    """The address in the notebook's settings cell."""
    settings = next(cell for cell in read().cells if "parameters" in cell.metadata.get("tags", []))
    return re.search(r'^REPOSITORY = "([^"]+)"', settings.source, re.MULTILINE)[1]


def test_the_notebook_is_valid_nbformat_4_without_outputs():
    notebook = read()
    nbformat.validate(notebook)
    assert notebook.nbformat == 4
    for cell in notebook.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, cell.source[:60]


def test_the_readme_and_the_notebook_open_the_same_repository():
    address = repository()
    assert address.startswith("https://github.com/")
    path = address.removeprefix("https://github.com/")
    colab = f"https://colab.research.google.com/github/{path}/blob/main/notebook.ipynb"
    kaggle = f"https://kaggle.com/kernels/welcome?src={address}/blob/main/notebook.ipynb"
    readme = (REPO / "README.md").read_text()
    badges = read().cells[0].source
    for text in (readme, badges):
        assert colab in text and kaggle in text
    assert set(re.findall(r"colab\.research\.google\.com/github/([\w.-]+/[\w.-]+)/",
                          readme + badges)) == {path}


def test_the_notebook_follows_the_article():
    titles = [line[3:] for cell in read().cells if cell.cell_type == "markdown"
              for line in cell.source.splitlines() if line.startswith("## ")]
    assert titles == ["Configuring your environment", "Hardware", "Distribute the training",
                      "A tale of comparison", "Summary"]


# --- running it ------------------------------------------------------------------------------

def fresh_copy(destination):
    """The files git would commit, copied: a fresh clone of the working tree."""
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO,
                            capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        source = REPO / name
        if source.is_file():
            (destination / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, destination / name)
    return destination


@pytest.fixture
def kernel_env(tmp_path):
    """The kernel's environment: this Python's tools on PATH, temporary files of its own."""
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    env = dict(os.environ, TMPDIR=str(scratch),
               PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    yield env
    # TensorBoard servers the kernel started: ipykernel ends them at shutdown; make sure
    for info in (scratch / ".tensorboard-info").glob("pid-*.info"):
        try:
            os.kill(int(info.stem.split("-")[1]), signal.SIGTERM)
        except (ProcessLookupError, ValueError):
            pass


def execute(notebook, folder, env, cells=None):
    """Run `notebook` in `folder` (all cells, or those named by id); the notebook, with outputs."""
    client = nbclient.NotebookClient(notebook, timeout=CELL_TIMEOUT_S, kernel_name="python3",
                                     allow_errors=cells is not None,
                                     resources={"metadata": {"path": str(folder)}})
    if cells is None:
        client.execute(env=env)
        return notebook
    with client.setup_kernel(env=env):
        for name in cells:
            index = next(i for i, cell in enumerate(notebook.cells) if cell.get("id") == name)
            client.execute_cell(notebook.cells[index], index)
    return notebook


def with_settings(notebook, source):
    """`notebook` with a cell after its settings cell, as papermill injects parameters."""
    index = next(i for i, cell in enumerate(notebook.cells)
                 if "parameters" in cell.metadata.get("tags", []))
    notebook.cells.insert(index + 1, nbformat.v4.new_code_cell(source, id="injected"))
    return notebook


def outputs(notebook, kind=None):
    """Every output of every code cell, or those with `kind` among their MIME types."""
    found = [output for cell in notebook.cells if cell.cell_type == "code"
             for output in cell.outputs]
    return [output for output in found if kind is None or kind in output.get("data", {})]


def text(notebook):
    return "".join(output.get("text", "") for output in outputs(notebook))


def check_a_full_run(notebook, runs):
    """No error anywhere; each run's figure and numbers shown; Table 1 with every run."""
    errors = [output for output in outputs(notebook) if output.output_type == "error"]
    assert errors == [], errors
    tables = [output.data["text/markdown"] for output in outputs(notebook, "text/markdown")]
    table1 = next(table for table in tables if table.startswith("| run |"))
    assert "val_loss" in table1.splitlines()[0]
    assert [line.split(" | ")[0].lstrip("| ") for line in table1.splitlines()[2:]] == runs
    assert sum("| epoch | loss | val_loss |" in table for table in tables) == len(runs)
    assert len(outputs(notebook, "image/png")) == len(runs) + 1  # the figures, comparison.png
    assert "Traceback" not in text(notebook)


def test_the_notebook_runs_top_to_bottom_on_a_cpu(tmp_path, kernel_env):
    copy = fresh_copy(tmp_path / "clone")
    # the CPU run alone (the rehearsals' branch is test_platforms' and the slow test's)
    notebook = execute(with_settings(read(), QUICK), copy, kernel_env)
    check_a_full_run(notebook, ["cpu"])
    said = text(notebook)
    assert "[INFO] runtime: this machine, no GPU or TPU" in said
    assert "[INFO] this runtime has every package the scripts need" in said
    assert "naive" in said  # the matmul timing, the article's way beside the measured one
    assert (copy / "outputs/notebook/cpu.json").is_file()
    assert any((copy / "outputs/notebook/logs/cpu").rglob("*tfevents*"))
    assert (copy / "outputs/notebook/comparison.png").is_file()


@pytest.mark.slow
def test_the_notebook_as_committed_runs_on_a_cpu(tmp_path, kernel_env):
    copy = fresh_copy(tmp_path / "clone")
    notebook = execute(read(), copy, kernel_env)
    check_a_full_run(notebook, ["cpu", "gpu_rehearsal", "tpu_rehearsal"])


def test_its_cells_can_run_again_and_the_kernel_never_loads_tensorflow(tmp_path, kernel_env):
    copy = fresh_copy(tmp_path / "clone")
    notebook = with_settings(read(), "import sys")
    # what a reader does who runs the first cells, then runs them again
    cells = ["settings", "injected", "get-the-code", "runtime"] * 2
    notebook.cells.append(nbformat.v4.new_code_cell("print('tensorflow' in sys.modules)",
                                                    id="tensorflow-loaded"))
    execute(notebook, copy, kernel_env, cells + ["tensorflow-loaded"])
    assert [output for output in outputs(notebook) if output.output_type == "error"] == []
    assert notebook.cells[-1].outputs[0].text == "False\n"
    assert text(notebook).count(f"[INFO] the code is in {copy}") == 1  # the last run's cell


def _first_error(notebook):
    return next(output for output in outputs(notebook) if output.output_type == "error")


def test_opened_outside_the_repository_with_the_placeholder_it_stops_in_one_line(
        tmp_path, kernel_env):
    alone = tmp_path / "alone"
    alone.mkdir()
    notebook = execute(read(), alone, kernel_env, ["settings", "get-the-code"])
    error = _first_error(notebook)
    assert error.traceback == [
        "stopped: REPOSITORY is still the placeholder https://github.com/OWNER/REPO: set it "
        "in the settings cell to where the code is, or upload the repository here"]


def test_a_clone_that_fails_is_one_line_and_one_that_works_is_used(tmp_path, kernel_env):
    alone = tmp_path / "alone"
    alone.mkdir()
    missing = (tmp_path / "no-such-repo").as_uri()
    notebook = execute(with_settings(read(), f"REPOSITORY = {missing!r}"), alone, kernel_env,
                       ["settings", "injected", "get-the-code"])
    [line] = _first_error(notebook).traceback
    assert line.startswith(f"stopped: git could not clone {missing} (") and \
        line.endswith("); is there a network?")
    assert not (alone / "no-such-repo").exists()

    source = fresh_copy(tmp_path / "published")
    for command in (["init", "-q"], ["add", "-A"],
                    ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "x"]):
        subprocess.run(["git", *command], cwd=source, check=True, capture_output=True)
    notebook = execute(with_settings(read(), f"REPOSITORY = {source.as_uri()!r}"), alone,
                       kernel_env, ["settings", "injected", "get-the-code", "runtime"])
    assert [output for output in outputs(notebook) if output.output_type == "error"] == []
    assert f"[INFO] the code is in {alone / 'published'}" in text(notebook)
    assert (alone / "published" / "train_tpu.py").is_file()
