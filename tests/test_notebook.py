"""notebook.ipynb: valid, without outputs, tied to the README, and run top to bottom in a real kernel.

The notebook runs as a reader on a CPU runtime runs it: in a fresh copy of
the repository (the files git would commit), offline, through nbclient and
an IPython kernel. The default suite runs it with few steps (a cell after
its settings, as papermill injects parameters); the slow suite runs it as
it is committed. The GPU, TPU, Colab and Kaggle branches are held with
stand-ins in test_platforms.py.
"""
import json
import os
import pathlib
import re
import signal
import statistics
import subprocess
import sys

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

from conftest import outputs_name  # noqa: E402
from time_notebook import fresh_copy  # noqa: E402  (tools/: the files git would commit, copied)

REPO = pathlib.Path(__file__).resolve().parents[1]
NOTEBOOK = REPO / "notebook.ipynb"
QUICK = "REHEARSE = False\nEPOCHS = 2\nTRAIN_FLAGS = [\"--steps-per-epoch\", \"4\"]"
QUICK_FLAGS = ["--epochs", "2", "--steps-per-epoch", "4"]  # what QUICK's runs are given
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


ARTICLE_SECTIONS = ["Configuring your environment", "Project structure", "Hardware",
                    "Distribute the training", "Data", "Losses", "A tale of comparison",
                    "Summary"]


def test_the_notebook_follows_the_article():
    titles = [line[3:] for cell in read().cells if cell.cell_type == "markdown"
              for line in cell.source.splitlines() if line.startswith("## ")]
    assert titles == ARTICLE_SECTIONS


def _section_code(title):
    """The source of the code cells under the `## title` heading."""
    found, inside = [], False
    for cell in read().cells:
        if cell.cell_type == "markdown" and "\n## " in "\n" + cell.source:
            inside = f"\n## {title}" in "\n" + cell.source
        elif cell.cell_type == "code" and inside:
            found.append(cell.source)
    return "\n".join(found)


def test_each_section_shows_what_the_article_shows_there():
    assert "listings.project_structure()" in _section_code("Project structure")
    hardware = _section_code("Hardware")
    for call in ("notebook.say_tpu_cores(host)", "records.matmul_table(RUNS)",
                 "notebook.matmul_wanted(host, DEVICE, TIME_MATMUL)",
                 '"tools/matmul_benchmark.py"'):
        assert call in hardware
    assert "listings.show_differences()" in _section_code("Distribute the training")
    assert 'show_listing("pyimagesearch/data.py", name="get_data")' in _section_code("Data")
    losses = _section_code("Losses")
    assert 'show_listing("pyimagesearch/loss.py", name="MSELoss")' in losses
    assert "records.loss_scaling_rows(losses)" in losses and "if MEASURE_LOSSES:" in losses
    tale = _section_code("A tale of comparison")
    # the cells run each script as a process, then compare.py, as a reader would
    assert tale.index("name=\"AutoEncoder\"") < tale.index("for run in runs:")
    assert tale.index("notebook.run_script([*run.argv") < tale.index('["compare.py", RUNS')
    assert _section_code("Summary") == ""


def test_the_drive_consent_is_announced_before_the_cell_that_asks():
    cells = read().cells
    index = next(i for i, cell in enumerate(cells) if "notebook.keep_runs_in(" in cell.source)
    before = cells[index - 1]
    assert before.cell_type == "markdown"
    said = " ".join(before.source.split())
    assert "asks for access to your Google Drive" in said and "outlive this runtime" in said


# --- running it ------------------------------------------------------------------------------

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


def check_a_full_run(notebook, runs, copy):
    """No error; each run's script, figure and numbers shown; Table 1: every run, the article's."""
    errors = [output for output in outputs(notebook) if output.output_type == "error"]
    assert errors == [], errors
    tables = [output.data["text/markdown"] for output in outputs(notebook, "text/markdown")]
    [table1] = [table for table in tables if table.startswith("| run |")]  # shown once
    assert "| run |" not in text(notebook)  # compare.py's printed copy is left out
    assert "val_loss" in table1.splitlines()[0]
    ours = table1.split("\n\n")[0].splitlines()[2:]
    # a record's name is the scripts' (device, rehearsal, flags): it starts with the device
    names = [line.split(" | ")[0].lstrip("| ") for line in ours]
    assert len(names) == len(runs) and all(
        name.startswith(run.split("_")[0]) for name, run in zip(sorted(names), sorted(runs)))
    for article in ("| article: CPU |", "| article: GPU (Tesla T4) |",
                    "| article: TPU (8 cores) |"):
        assert article in table1  # compare.py --with-article
    assert sum("| epoch | loss | val_loss |" in table for table in tables) == len(runs)
    assert len(outputs(notebook, "image/png")) == len(runs) + 1  # the figures, comparison.png
    assert "Traceback" not in text(notebook)
    # the matmul table, the Losses numbers
    assert any("| the article: GPU | 0.000436 |" in table for table in tables)
    assert any("one SGD step with `MSELoss(scale=1)`" in table for table in tables)
    # before each run, its script as it is in the copy, then the run
    shown = [(index, output.data["text/plain"]) for index, output in enumerate(outputs(notebook))
             if "text/html" in output.get("data", {})]
    for run in runs:
        script = "train_" + run.split("_")[0] + ".py"
        started = next(index for index, output in enumerate(outputs(notebook))
                       if f"$ python {script}" in output.get("text", ""))
        listing = [said for index, said in shown if index < started
                   and said.startswith("   1  ")][-1]
        assert listing.splitlines() == [f"{number:4d}  {line}" for number, line in
                                        enumerate((copy / script).read_text().splitlines(), 1)]


def test_the_notebook_runs_top_to_bottom_on_a_cpu(tmp_path, kernel_env):
    copy = fresh_copy(tmp_path / "clone")
    changed = copy / "train_cpu.py"  # the listing shown is the script's, read when it runs
    changed.write_text(changed.read_text() + "# a line that only this copy has\n")
    # the CPU run alone (the rehearsals' branch is test_platforms' and the slow test's), every
    # cell but TensorBoard's, which the test of cells run again runs twice
    notebook = with_settings(read(), QUICK)
    notebook = execute(notebook, copy, kernel_env, [cell.id for cell in notebook.cells
                                                    if cell.id != "tensorboard"])
    check_a_full_run(notebook, ["cpu"], copy)
    said = text(notebook)
    assert "# a line that only this copy has" in "".join(
        output.data["text/html"] for output in outputs(notebook, "text/html"))
    assert "[INFO] runtime: this machine, no GPU or TPU" in said
    assert "[INFO] this runtime has every package the scripts need" in said
    assert re.search(r"\[INFO\] cpu: about [0-9.]+ (s|min) on Colab's free CPU for 2 epoch", said)
    name = outputs_name("cpu", QUICK_FLAGS)  # cpu_epochs-2_steps-per-epoch-4
    assert (copy / f"outputs/notebook/{name}.json").is_file()
    assert any((copy / f"outputs/notebook/logs/{name}").rglob("*tfevents*"))
    assert (copy / "outputs/notebook/comparison.png").is_file()


@pytest.mark.slow
def test_the_notebook_as_committed_runs_on_a_cpu(tmp_path, kernel_env):
    copy = fresh_copy(tmp_path / "clone")
    notebook = execute(read(), copy, kernel_env)
    check_a_full_run(notebook, ["cpu", "tpu_rehearsal"], copy)


@pytest.mark.slow  # the default suite's budget (docs/development.md); CI runs it
def test_its_cells_can_run_again_and_the_kernel_never_loads_tensorflow(tmp_path, kernel_env):
    copy = fresh_copy(tmp_path / "clone")
    (copy / "burst.py").write_text("for i in range(40):\n    print(f'line {i}')\n")
    notebook = with_settings(read(), "import sys")
    # what a reader does who runs the first cells, then runs them again
    cells = ["settings", "injected", "get-the-code", "runtime"] * 2 + [
        "project-structure", "distribute", "data", "losses", "model"]
    notebook.cells.append(nbformat.v4.new_code_cell("notebook.run_script(['burst.py'])",
                                                    id="burst"))
    notebook.cells.append(nbformat.v4.new_code_cell("print('tensorflow' in sys.modules)",
                                                    id="tensorflow-loaded"))
    # then %tensorboard, twice (it loads TensorFlow into the kernel: TPU_LOAD_LIBRARY=0 keeps
    # it off the TPU, tests/test_platforms.py); the second finds the first's server
    execute(notebook, copy, kernel_env,
            cells + ["burst", "tensorflow-loaded", "tensorboard", "tensorboard"])
    assert [output for output in outputs(notebook) if output.output_type == "error"] == []
    board = next(cell for cell in notebook.cells if cell.get("id") == "tensorboard")
    assert any("text/html" in output.get("data", {}) for output in board.outputs), board.outputs
    # a script's lines as a terminal shows them: the lines printed together come in one
    # output, not one output each, which viewers drew with a blank line after every line
    burst = [output for output in notebook.cells[-2].outputs if output.output_type == "stream"]
    assert "".join(output.text for output in burst) == "[INFO] $ python burst.py\n" + "".join(
        f"line {i}\n" for i in range(40))
    assert len(burst) < 10, len(burst)
    # the kernel may send one print in more than one stream message
    assert "".join(output.text for output in notebook.cells[-1].outputs
                   if output.output_type == "stream") == "False\n"
    assert text(notebook).count(f"[INFO] the code is in {copy}") == 1  # the last run's cell


ARTICLE_SHAPES = 'SHAPES = {"w": (1024, 512, 16), "x": (1024, 16, 512), "b": (1024, 512, 512)}'
TINY_SHAPES = 'SHAPES = {"w": (8, 32, 16), "x": (8, 16, 32), "b": (8, 32, 32)}'


@pytest.mark.slow  # the default suite's budget (docs/development.md); CI runs it
def test_the_matmul_is_timed_when_asked(tmp_path, kernel_env):
    # on a CPU runtime the notebook times it only when TIME_MATMUL asks: the run top to
    # bottom does not, and this test runs the Hardware cell that does, on operands small
    # enough for a shared 2-core machine (the 1 GiB ones took 17 s of a 20 s budget there;
    # tests/test_matmul_benchmark.py runs the tool itself)
    copy = fresh_copy(tmp_path / "clone")
    tool = copy / "tools/matmul_benchmark.py"
    assert tool.read_text().count(ARTICLE_SHAPES) == 1
    tool.write_text(tool.read_text().replace(ARTICLE_SHAPES, TINY_SHAPES))
    notebook = execute(with_settings(read(), "TIME_MATMUL = True"), copy, kernel_env,
                       ["settings", "injected", "get-the-code", "runtime", "hardware"])
    assert [output for output in outputs(notebook) if output.output_type == "error"] == []
    assert "naive" in text(notebook)  # the matmul timing, the article's way beside the measured
    assert (copy / "outputs/notebook/benchmarks/matmul_cpu.json").is_file()
    [table] = [output.data["text/markdown"] for output in outputs(notebook, "text/markdown")]
    assert "| matmul_cpu.json in the runs folder |" in table


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


# --- what the notebook shows, without running it ----------------------------------------------

from pyimagesearch.notebook import listings  # noqa: E402
from pyimagesearch.notebook import records
from pyimagesearch import notebook as driver  # noqa: E402
from pyimagesearch.runtime import Host  # noqa: E402

CPU_HOST = Host("colab", 0, 0, "")
SCRIPT = '''"""A script."""
import sys  # +
from pyimagesearch import config
args = parse(sys.argv)  # + the flags, checked
# + a run resumed in mid-epoch
# + trains the rest of that epoch first
x = finish(args)  # +
y = more(x)  # +
model.fit(trainDs, epochs=config.EPOCHS)  # the article's, "# +" in a string
print("# + in a string, not a comment")
'''


def test_a_listing_is_the_script_as_it_is_now_with_its_marked_lines_grey(tmp_path):
    script = tmp_path / "train_x.py"
    script.write_text(SCRIPT)
    assert listings.marked_lines(SCRIPT) == {2, 4, 5, 6, 7, 8}
    shown = listings.listing_html(listings.script_lines(script), "train_x.py",
                                  listings.marked_lines(SCRIPT))
    assert 'import sys  # +' in shown and "from pyimagesearch import config" in shown
    # unmarked lines in plain colours (the comment green), marked ones grey, 4 in a row folded
    grey = f'<span style="{listings.DIMMED}">'
    assert f"{grey}import sys  # +</span>" in shown
    folded = shown.split("<details>")[1].split("</details>")[0]  # 4 or more in a row
    assert "lines 4-8: 5 lines marked # +</summary>" in folded
    assert f"{grey}args = parse(sys.argv)  # + the flags, checked</span>" in folded
    assert f"{grey}y = more(x)  # +</span>" in folded and "import sys" not in folded
    assert f"{grey}from pyimagesearch import config" not in shown
    assert ("model.fit(trainDs, epochs=config.EPOCHS)  <span style=\"color:#2e7d32\"># the "
            "article&#x27;s, &quot;# +&quot; in a string</span>") in shown

    script.write_text(SCRIPT.replace("epochs=config.EPOCHS", "epochs=config.EPOCHS * 2"))
    changed = listings.listing_html(listings.script_lines(script), "train_x.py")
    assert "epochs=config.EPOCHS * 2" in changed and "epochs=config.EPOCHS)" not in changed


def test_a_definition_is_shown_from_its_file_and_a_missing_one_is_one_line(tmp_path):
    module = tmp_path / "loss.py"
    module.write_text('import keras\n\n\n@keras.saving.register\nclass MSELoss:\n    pass\n\n'
                      'def other():\n    pass\n')
    assert listings.script_lines(module, "MSELoss") == [
        (4, "@keras.saving.register"), (5, "class MSELoss:"), (6, "    pass")]
    with pytest.raises(driver.NotebookStop, match="loss.py defines no get_data"):
        listings.script_lines(module, "get_data")
    assert listings.script_lines(REPO / "pyimagesearch/loss.py", "MSELoss")[0][1] \
        .startswith("@keras.saving")


def test_the_scripts_differ_in_their_strategy_lines(monkeypatch):
    shown = []
    monkeypatch.setattr("IPython.display.display", lambda data, raw=False: shown.append(data))
    listings.show_differences(repo=REPO)
    own = {data["text/html"].split("</b>")[0]: data["text/plain"] for data in shown}
    assert len(own) == 3
    tpu = next(plain for title, plain in own.items() if "train_tpu.py" in title)
    assert "TPUStrategy" in tpu
    gpu = next(plain for title, plain in own.items() if "train_gpu.py" in title)
    assert "MirroredStrategy" in gpu and "TPUStrategy" not in gpu


def test_the_project_structure_lists_the_articles_files_first(monkeypatch):
    shown = []
    monkeypatch.setattr(listings, "show_markdown", shown.append)
    listings.project_structure(REPO)
    rows = shown[0].splitlines()
    names = [row.split("`")[1] for row in rows[2:] if row.startswith("| `")]
    assert names[:7] == ["train_cpu.py", "train_gpu.py", "train_tpu.py",
                         "pyimagesearch/autoencoder.py", "pyimagesearch/config.py",
                         "pyimagesearch/data.py", "pyimagesearch/loss.py"]
    assert rows[9] == "| *beyond the article* | |" and "compare.py" in names[7:]
    assert "| `pyimagesearch/loss.py` | The article's loss:" in shown[0]


def _matmul(folder, name, naive, median, rehearsal=False):
    (folder / "benchmarks").mkdir(exist_ok=True)
    (folder / "benchmarks" / name).write_text(json.dumps(
        {"device_name": "Tesla T4", "rehearsal": rehearsal, "naive_seconds": naive,
         "seconds": {"median": median}}))


def test_the_matmul_table_puts_the_runs_records_beside_the_articles_timings(tmp_path):
    assert records.matmul_table(tmp_path, reference=None).splitlines()[2:] == [
        "| the article: CPU | 0.79 | | its listing |",
        "| the article: GPU | 0.000436 | | its listing |",
        "| the article: TPU (8 cores) | 0.06 | | its listing |"]
    _matmul(tmp_path, "matmul_gpu.json", 0.000512, 0.0123)
    (tmp_path / "benchmarks" / "matmul_cpu.json").write_text("{")
    rows = records.matmul_table(tmp_path, repo=REPO).splitlines()
    assert rows[2].startswith("| Intel(R) Xeon(R) Processor, 2 CPUs | 2.43958 | 0.489311 | "
                              "`outputs/quoted/benchmarks/matmul_cpu.json`, this repository")
    assert rows[3] == "| matmul_cpu.json | | | unreadable: skipped |"
    assert rows[4] == "| Tesla T4 | 0.000512 | 0.0123 | matmul_gpu.json in the runs folder |"
    assert len(rows) == 8


@pytest.mark.parametrize("host, device, setting, timed", [
    (CPU_HOST, "auto", "auto", False),  # the first Run all's budget on a CPU runtime
    (CPU_HOST, "auto", True, True),
    (Host("colab", 1, 0, ""), "auto", "auto", True),
    (Host("colab", 0, 1, "v5e"), "auto", "auto", True),
    (Host("colab", 0, 1, "v5e"), "auto", False, False),
    (Host("colab", 1, 0, ""), "cpu", "auto", False),
])
def test_the_matmul_is_timed_on_a_gpu_or_tpu_and_on_a_cpu_when_asked(host, device, setting,
                                                                      timed):
    tensorflow_tpu = {"tensorflow-tpu": "2.19.1", "jax": "0.7.2"}.get  # TensorFlow's TPU route
    assert driver.matmul_wanted(host, device, setting, tensorflow_tpu) is timed


@pytest.mark.parametrize("setting", ["auto", True])
def test_on_a_jax_tpu_image_the_matmul_is_timed_with_jax_and_one_line_says_so(setting, capsys):
    jax_image = {"jax": "0.7.2"}.get  # Colab's: TensorFlow there is tensorflow-cpu
    tpu = Host("colab", 0, 1, "v5e")
    assert driver.matmul_wanted(tpu, "auto", setting, jax_image) is True
    assert capsys.readouterr().out.startswith("[INFO] the matmul is timed with JAX's jax.numpy")
    # its row is named apart from a TensorFlow TPU's, as its runs are (tpu_jax)
    assert driver.matmul_record("tpu", "runs", tpu, jax_image) == os.path.join(
        "runs", "benchmarks", "matmul_tpu_jax.json")
    tensorflow_tpu = {"jax": "0.7.2", "tensorflow-tpu": "2.19.1"}.get
    assert driver.matmul_record("tpu", "runs", tpu, tensorflow_tpu) == os.path.join(
        "runs", "benchmarks", "matmul_tpu.json")
    assert driver.matmul_wanted(tpu, "auto", False, jax_image) is False  # TIME_MATMUL = False
    # the tool chooses JAX there itself: an image's KERAS_BACKEND is left to its rule
    assert "KERAS_BACKEND" not in driver.script_environment("tools/matmul_benchmark.py")


def test_the_matmul_table_says_which_rows_jax_timed(tmp_path):
    _matmul(tmp_path, "matmul_tpu_jax.json", 0.25, 0.0012)
    record = json.loads((tmp_path / "benchmarks" / "matmul_tpu_jax.json").read_text())
    record.update(device_name="8 x TPU v5 lite", framework="jax")
    (tmp_path / "benchmarks" / "matmul_tpu_jax.json").write_text(json.dumps(record))
    _matmul(tmp_path, "matmul_gpu.json", 0.000512, 0.0123)
    rows = records.matmul_table(tmp_path, reference=None).splitlines()
    assert rows[2] == "| Tesla T4 | 0.000512 | 0.0123 | matmul_gpu.json in the runs folder |"
    assert rows[3] == ("| 8 x TPU v5 lite, JAX | 0.25 | 0.0012 | matmul_tpu_jax.json in the "
                       "runs folder |")


def test_the_losses_numbers_come_from_the_committed_record(tmp_path):
    table = records.loss_scaling_rows(repo=REPO)
    assert "| one SGD step with `MSELoss(scale=1)`, N=2, over the step on 1 device | 2.000 | " \
           "1.000 |" in table
    assert "over that with `scale=8`, N=8 | 8.000 |" in table
    assert "over the true mean squared error, N=8 | 1.000 |" in table
    (tmp_path / "listings.json").write_text(json.dumps(
        {"keras_version": "3", "tensorflow_version": "2", "listings": {}}))
    assert table.count("not measured") == 2  # tf.keras 2 was measured on 2 replicas only
    assert records.loss_scaling_rows(tmp_path / "listings.json").count("not measured") == 10
    assert "| `MSELoss(scale=1)`, N=8 | 1.000 |" in table  # on JAX: the article's scale
    assert "| `MSELoss(scale=8)`, N=8 | 0.125 |" in table
    assert records.jax_loss_rows(tmp_path) == "\n\nOn Keras' JAX backend: not measured."


@pytest.mark.parametrize("host, said", [
    (Host("colab", 0, 1, "v5e"), "this TPU has 1 core(s), the article's had 8"),
    (Host("kaggle", 0, 2, "v2"), "this TPU has 4 core(s), the article's had 8"),
    (Host("kaggle", 0, 4, "v3"), ""),  # a v3-8: 8 cores
    (Host("kaggle", 0, 8, "v5e"), ""),
    (CPU_HOST, ""),
])
def test_a_tpu_with_fewer_than_8_cores_gets_one_line(host, said, capsys):
    driver.say_tpu_cores(host)
    out = capsys.readouterr().out
    assert out.startswith("[INFO] " + said) if said else out == ""
    if said:
        assert out.count("\n") == 1 and "not run here" in out


def test_rehearse_names_the_configurations_to_rehearse():
    assert [run.name for run in driver.plan_runs(CPU_HOST, "auto", ["tpu"])] == [
        "cpu", "tpu_rehearsal"]
    assert [run.name for run in driver.plan_runs(CPU_HOST, "auto", ("tpu", "gpu"))] == [
        "cpu", "gpu_rehearsal", "tpu_rehearsal"]
    assert [run.name for run in driver.plan_runs(CPU_HOST, "auto", [])] == ["cpu"]
    with pytest.raises(driver.NotebookStop, match=r"REHEARSE holds 'xpu'; it takes True"):
        driver.plan_runs(CPU_HOST, "auto", ["xpu"])


def test_an_estimate_scales_the_one_core_time_to_the_epochs_and_colab(tmp_path):
    record = tmp_path / records.ESTIMATES_RECORD
    record.parent.mkdir(parents=True)
    record.write_text(json.dumps({"factor": 1.5, "runs": {"cpu": {
        "seconds": 100, "epoch_seconds": [30, 20, 20]}}}))
    cpu = driver.Run("cpu", ("train_cpu.py", "--epochs", "5"))
    # 100 s for 3 epochs, 60 of them before the later epochs: 60 + 4 x 20 = 140, x 1.5
    assert records.estimate(cpu, tmp_path).startswith(
        "cpu: about 3.5 min on Colab's free CPU for 5 epoch(s) (timed on one core here, "
        "100 s for 3 epoch(s), x 1.50")
    one = driver.Run("cpu", ("train_cpu.py", "--epochs=1", "--batch-size", "64"))
    assert records.estimate(one, tmp_path).startswith("cpu: about 1.5 min")
    assert records.estimate(one, tmp_path).endswith("its other flags may change that")
    # TRAIN_FLAGS come after the notebook's --epochs: the script trains the last one given
    again = driver.Run("cpu", ("train_cpu.py", "--epochs", "5", "--epochs=1"))
    assert records.estimate(again, tmp_path).startswith("cpu: about 1.5 min")
    rehearsal = driver.Run("tpu_rehearsal", ("train_tpu.py", "--rehearse", "8"))
    assert "no measurement of it" in records.estimate(rehearsal, tmp_path)
    tpu = driver.Run("tpu", ("train_tpu.py", "--epochs", "2"))
    assert records.estimate(tpu, tmp_path).startswith(
        "tpu: the article's 8 TPU cores trained 2 epoch(s) of this in about 10 s")


def test_the_committed_timing_is_of_the_notebook_as_committed_and_within_five_minutes():
    """The record of tools/time_notebook.py (docs/notebook.md): its runs are today's defaults."""
    record = json.loads((REPO / records.TIMING_RECORD).read_text())
    settings = {}
    exec(next(cell.source for cell in read().cells if cell.get("id") == "settings"), settings)
    names = [run.name for run in driver.plan_runs(CPU_HOST, "auto", settings["REHEARSE"])]
    assert list(record["runs"]) == names
    for run in record["runs"].values():
        assert len(run["epoch_seconds"]) == settings["EPOCHS"]
    assert record["colab_free_cpu_estimate_seconds"] == pytest.approx(
        record["notebook_seconds"] * 57 / statistics.mean(record["article_style_epoch_seconds"]),
        abs=0.1)
    assert record["colab_free_cpu_estimate_seconds"] <= 300
