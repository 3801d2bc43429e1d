"""notebook.ipynb: its cells as a reader reads them, run in a real kernel, and the few helpers
they call (pyimagesearch/notebook.py) with stand-in runtimes.

The notebook runs as a reader on a CPU runtime runs it: in a fresh copy of the repository
(the files git would commit), offline, through nbclient and an IPython kernel. The default
suite runs the cells that train nothing; the slow suite runs it top to bottom, once with few
steps and once as committed. No Colab, Kaggle, GPU or TPU is here: their branches are the
helpers', held below with stand-in hosts and package lists; pip never runs.
"""
import os
import pathlib
import re
import signal
import sys

import pytest

from pyimagesearch import host as hosts
from pyimagesearch import notebook as nb

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

from conftest import outputs_name  # noqa: E402
from time_notebook import fresh_copy  # noqa: E402  (tools/: the files git would commit, copied)

REPO = pathlib.Path(__file__).resolve().parents[1]
NOTEBOOK = REPO / "notebook.ipynb"
QUICK = 'EPOCHS = 1\nTRAIN_FLAGS = "--steps-per-epoch 4"'
CELL_TIMEOUT_S = 2400  # a bound for a hang, not a speed
ARTICLE_SECTIONS = ["Configuring your environment", "Project structure", "Hardware",
                    "Distribute the training", "Data", "Losses", "A tale of comparison",
                    "Summary"]
TRAINS_NOTHING = ["settings", "get-the-code", "runtime", "project-structure", "differences",
                  "data-code", "losses-code", "model", "benchmark", "train-gpu"]


def read():
    return nbformat.read(NOTEBOOK, as_version=4)


def cell(notebook, name):
    return next(cell for cell in notebook.cells if cell.get("id") == name)


# --- the cells, as a reader reads them -----------------------------------------------------------

def test_the_notebook_is_valid_nbformat_4_without_outputs():
    notebook = read()
    nbformat.validate(notebook)
    for each in notebook.cells:
        if each.cell_type == "code":
            assert each.outputs == [] and each.execution_count is None, each.source[:60]


def test_the_readme_and_the_notebook_open_the_same_repository():
    address = re.search(r'^REPOSITORY = "([^"]+)"', cell(read(), "settings").source, re.M)[1]
    path = address.removeprefix("https://github.com/")
    colab = f"https://colab.research.google.com/github/{path}/blob/main/notebook.ipynb"
    kaggle = f"https://kaggle.com/kernels/welcome?src={address}/blob/main/notebook.ipynb"
    for text in ((REPO / "README.md").read_text(), read().cells[0].source):
        assert colab in text and kaggle in text


def test_the_notebook_follows_the_articles_sections():
    titles = [line[3:] for each in read().cells if each.cell_type == "markdown"
              for line in each.source.splitlines() if line.startswith("## ")]
    assert titles == ARTICLE_SECTIONS


@pytest.mark.parametrize("name, script, flags", [
    ("train-cpu", "train_cpu.py", ""), ("train-gpu", "train_gpu.py", ""),
    ("train-tpu", "train_tpu.py", ""), ("train-tpu", "train_tpu.py", "--rehearse 8 ")])
def test_each_run_is_a_command_the_reader_sees_and_can_edit(name, script, flags):
    source = cell(read(), name).source
    assert f"!python {script} {flags}--epochs {{EPOCHS}} {{TRAIN_FLAGS}} --output-dir {{RUNS}}" \
        in source
    assert "notebook.check(_exit_code" in source  # a failed run stops Run all


def test_the_articles_matmul_is_a_cell_of_its_own_beside_the_benchmark():
    notebook = read()
    timed = cell(notebook, "matmul-once").source
    assert timed.startswith("%%writefile {RUNS}/matmul_once.py")
    assert "y = tf.matmul(w, x) + b" in timed and "tf.random.uniform((1024, 512, 16))" in timed
    assert cell(notebook, "matmul-run").source.startswith("!python {RUNS}/matmul_once.py")
    assert "!python tools/matmul_benchmark.py" in cell(notebook, "benchmark").source


def test_the_listings_are_the_files_shown_as_they_are():
    code = "\n".join(each.source for each in read().cells if each.cell_type == "code")
    for path in ("train_tpu.py", "pyimagesearch/data.py", "pyimagesearch/loss.py",
                 "pyimagesearch/autoencoder.py"):
        assert f'display(Code(filename="{path}", language="python"))' in code
        assert (REPO / path).is_file()


def test_no_cell_calls_into_the_package_past_its_few_helpers():
    called = set()
    for each in read().cells:
        if each.cell_type == "code":
            called |= set(re.findall(r"notebook\.(\w+)\(", each.source))
    assert called == {"runtime", "install_missing", "keep_runs_in", "check", "newest"}


def test_the_drive_consent_is_announced_before_the_cell_that_asks():
    cells = read().cells
    index = next(i for i, each in enumerate(cells) if "notebook.keep_runs_in(" in each.source)
    said = " ".join(cells[index - 1].source.split())
    assert "asks for access to your Google Drive" in said and "outlive this runtime" in said


# --- running it ----------------------------------------------------------------------------------

@pytest.fixture
def kernel_env(tmp_path):
    """The kernel's environment: this Python's tools on PATH, a TMPDIR of its own."""
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    env = dict(os.environ, TMPDIR=str(scratch),
               PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    env.pop("KERAS_BACKEND", None)
    yield env
    for info in (scratch / ".tensorboard-info").glob("pid-*.info"):  # %tensorboard's server
        try:
            os.kill(int(info.stem.split("-")[1]), signal.SIGTERM)
        except (ProcessLookupError, ValueError):
            pass


def execute(notebook, folder, env, cells=None):
    """Run `notebook` in `folder`, all its cells or those named; the notebook, with outputs."""
    client = nbclient.NotebookClient(notebook, timeout=CELL_TIMEOUT_S, kernel_name="python3",
                                     allow_errors=cells is not None,
                                     resources={"metadata": {"path": str(folder)}})
    if cells is None:
        return client.execute(env=env)
    with client.setup_kernel(env=env):
        for name in cells:
            index = next(i for i, each in enumerate(notebook.cells) if each.get("id") == name)
            client.execute_cell(notebook.cells[index], index)
    return notebook


def with_settings(notebook, source):
    """`notebook` with a cell after its settings, as papermill injects parameters."""
    index = next(i for i, each in enumerate(notebook.cells)
                 if "parameters" in each.metadata.get("tags", []))
    notebook.cells.insert(index + 1, nbformat.v4.new_code_cell(source, id="injected"))
    return notebook


def outputs(notebook, kind=None):
    found = [output for each in notebook.cells if each.cell_type == "code"
             for output in each.outputs]
    return [output for output in found if kind is None or kind in output.get("data", {})]


def text(notebook):
    return "".join(output.get("text", "") for output in outputs(notebook))


def errors(notebook):
    return [output for output in outputs(notebook) if output.output_type == "error"]


def test_the_cells_that_train_nothing_run_in_a_kernel_that_never_loads_tensorflow(
        tmp_path, kernel_env):
    copy = fresh_copy(tmp_path / "clone")
    notebook = read()
    notebook.cells.append(nbformat.v4.new_code_cell(
        "import sys; print('tensorflow' in sys.modules)", id="tensorflow-loaded"))
    # a reader who runs the first cells twice, then the rest that trains nothing
    execute(notebook, copy, kernel_env, ["settings", "get-the-code", "runtime"]
            + TRAINS_NOTHING + ["tensorflow-loaded"])
    assert errors(notebook) == []
    said = text(notebook)
    assert "[INFO] this runtime: this machine, no GPU or TPU; it trains with train_cpu.py" in said
    assert "[INFO] this runtime has every package the scripts need" in said
    assert "[INFO] the runs are kept in outputs/notebook" in said
    assert "train_cpu.py" in said and "config.py" in said  # the project's files, listed
    assert "MirroredStrategy" in said  # the diff of the CPU and GPU scripts
    assert "the update on 2 replicas is 2.000 times" in said and "is 1.000 times the step" in said
    shown = "".join(output.data["text/plain"] for output in outputs(notebook, "text/html"))
    for line in ("numAcc = strategy.num_replicas_in_sync", "class MSELoss:",
                 "def get_data(dataName, split, batchSize", "class AutoEncoder(keras.Model):"):
        assert line in shown
    assert "no GPU here" in said and "!python tools/matmul_benchmark.py --device cpu" in said
    assert cell(notebook, "tensorflow-loaded").outputs[0].text == "False\n"


def test_opened_on_its_own_with_the_placeholder_it_stops_in_one_line(tmp_path, kernel_env):
    alone = tmp_path / "alone"
    alone.mkdir()
    notebook = execute(read(), alone, kernel_env, ["settings", "get-the-code"])
    (error,) = errors(notebook)
    assert (error.ename, error.evalue) == (
        "SystemExit", "set REPOSITORY in the settings cell to this repository's address")


@pytest.mark.slow
def test_a_clone_that_fails_stops_and_one_that_works_is_used(tmp_path, kernel_env):
    import subprocess
    alone = tmp_path / "alone"
    alone.mkdir()
    missing = (tmp_path / "no-such-repo").as_uri()
    notebook = execute(with_settings(read(), f"REPOSITORY = {missing!r}"), alone, kernel_env,
                       ["settings", "injected", "get-the-code"])
    (error,) = errors(notebook)
    assert error.evalue == f"git could not clone {missing} (its line is above); is there a " \
                           "network?"
    source = fresh_copy(tmp_path / "published")
    for command in (["init", "-q"], ["add", "-A"],
                    ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "x"]):
        subprocess.run(["git", *command], cwd=source, check=True, capture_output=True)
    notebook = execute(with_settings(read(), f"REPOSITORY = {source.as_uri()!r}"), alone,
                       kernel_env, ["settings", "injected", "get-the-code", "runtime"])
    assert errors(notebook) == []
    assert (alone / "fast-training" / "train_tpu.py").is_file()
    assert "[INFO] the runs are kept in outputs/notebook" in text(notebook)


def check_a_full_run(notebook, copy, runs):
    """No error; the matmul timed; each run's figure; Table 1 with every run and the article's."""
    assert errors(notebook) == [], errors(notebook)
    said = text(notebook)
    assert re.search(r"one call of tf.matmul\(w, x\) \+ b: [0-9.]+ s on .*CPU:0", said)
    assert "Traceback" not in said
    (table,) = [output.data["text/markdown"] for output in outputs(notebook, "text/markdown")]
    for name in runs:
        assert f"| {name} |" in table
        assert (copy / "outputs/notebook" / f"{name}.png").is_file()
        assert any((copy / "outputs/notebook/logs" / name).rglob("*tfevents*"))
    assert "| article: TPU (8 cores) |" in table
    assert len(outputs(notebook, "image/png")) == len(runs) + 1  # the figures, the plot


@pytest.mark.slow
def test_the_notebook_runs_top_to_bottom_on_a_cpu_with_few_steps(tmp_path, kernel_env):
    copy = fresh_copy(tmp_path / "clone")
    notebook = with_settings(read(), QUICK)
    execute(notebook, copy, kernel_env, [each.id for each in notebook.cells
                                         if each.cell_type == "code"])
    flags = ["--epochs", "1", "--steps-per-epoch", "4"]
    check_a_full_run(notebook, copy, [outputs_name("cpu", flags),
                                      outputs_name("tpu", ["--rehearse", "8", *flags])])
    board = cell(notebook, "tensorboard")
    assert any("text/html" in output.get("data", {}) for output in board.outputs), board.outputs


@pytest.mark.slow
def test_the_notebook_as_committed_runs_on_a_cpu(tmp_path, kernel_env):
    copy = fresh_copy(tmp_path / "clone")
    notebook = execute(read(), copy, kernel_env)
    check_a_full_run(notebook, copy, [outputs_name("cpu", ["--epochs", "1"]),
                                      outputs_name("tpu", ["--rehearse", "8", "--epochs", "1"])])


# --- the helpers: the runtime, its install, the runs' folder -------------------------------------

COLAB_CPU, COLAB_GPU, COLAB_TPU = (hosts.Host("colab", 0, 0, ""), hosts.Host("colab", 1, 0, ""),
                                   hosts.Host("colab", 0, 1, "v5e"))
KAGGLE_TPU, CLOUD_TPU_VM = hosts.Host("kaggle", 0, 8, "v5e"), hosts.Host("local", 0, 4, "v4")
# what requirements.txt asks for, met
EVERYTHING = {"tensorflow": "2.21.0", "keras": "3.15.1", "tensorflow-datasets": "4.9.9",
              "tensorflow-metadata": "1.17.3", "importlib-resources": "6.5.2",
              "mlxtend": "0.23.4", "matplotlib": "3.10.0", "tensorboard": "2.21.0",
              "numpy": "2.1.0"}
OLD_TF = dict(EVERYTHING, tensorflow="2.18.0", tensorboard="2.18.0")
COLAB_TPU_IMAGE = {"jax": "0.7.2", "jaxlib": "0.7.2", "libtpu": "0.0.21.1", "keras": "3.13.2",
                   "numpy": "2.1.3", "matplotlib": "3.10.0"}  # no TensorFlow
KAGGLE_TPU_IMAGE = dict(COLAB_TPU_IMAGE, **{"tensorflow-cpu": "2.20.0",
                                            "importlib-resources": "6.5.2"})


def _commands(host, installed):
    return [" ".join(command[3:]) for command in nb.install_commands(host, REPO, installed.get)]


@pytest.mark.parametrize("host, installed, commands", [
    (COLAB_CPU, EVERYTHING, []),
    (COLAB_CPU, dict(EVERYTHING, mlxtend=None), ["install mlxtend>=0.23"]),
    (COLAB_CPU, OLD_TF, ["install tensorflow>=2.19,<2.22 tensorboard>=2.19,<2.22"]),
    (COLAB_GPU, OLD_TF, ["install tensorflow[and-cuda]>=2.19,<2.22 tensorboard>=2.19,<2.22"]),
    (COLAB_GPU, EVERYTHING, []),  # its own TensorFlow fits: kept
    # another build beside the one needed: every build goes, the one needed comes afresh
    (COLAB_CPU, dict(EVERYTHING, **{"tensorflow-cpu": "2.21.0"}),
     ["uninstall -y tensorflow tensorflow-cpu", "install tensorflow>=2.19,<2.22"]),
    # Colab's TPU image: only what it lacks, nothing removed or replaced
    (COLAB_TPU, COLAB_TPU_IMAGE, ["install tensorflow-cpu==2.20.0 mlxtend==0.23.4 "
                                  "importlib_resources"]),
    (KAGGLE_TPU, KAGGLE_TPU_IMAGE, ["install mlxtend==0.23.4"]),
    (KAGGLE_TPU, dict(KAGGLE_TPU_IMAGE, **{"tensorflow-cpu": None, "tensorflow": "2.18.0"}),
     ["install mlxtend==0.23.4"]),  # a TensorFlow of its own, even older: kept
    # a Cloud TPU VM: JAX installed, Keras on JAX's pinned file; without JAX, tensorflow-tpu
    (CLOUD_TPU_VM, {"jax": "0.7.2"}, ["install jax[tpu]==0.6.2 keras==3.12.4 "
                                      "tensorflow-cpu==2.20.0 tensorflow-datasets==4.9.10 "
                                      "tensorflow-metadata==1.17.3 tensorboard==2.20.0 "
                                      "numpy==2.2.6 matplotlib==3.10.9 mlxtend==0.23.4 "
                                      "importlib_resources==7.1.0"]),
    (CLOUD_TPU_VM, {"tensorflow": "2.21.0"}, [
        "uninstall -y tensorflow", "install tensorflow-tpu==2.19.1 libtpu==0.0.10 keras>=3.10 "
        "tensorflow-datasets>=4.9.9,<5 tensorflow-metadata!=1.21.0 importlib_resources "
        "mlxtend>=0.23 matplotlib>=3.8 numpy tensorboard>=2.19,<2.20"]),
])
def test_what_each_runtime_installs(host, installed, commands):
    assert _commands(host, installed) == commands


def test_the_commands_are_the_lines_of_the_routes_requirements_file():
    for host, file in ((COLAB_CPU, "requirements.txt"), (COLAB_TPU, "requirements-jax-tpu.txt"),
                       (CLOUD_TPU_VM, "requirements-tpu-vm.txt")):
        wanted = nb.requirements(REPO / file)
        installed = {"jax": "0.7.2"} if host is not COLAB_CPU else {}
        (command,) = nb.install_commands(host, REPO, installed.get)
        assert [spec for spec in command[4:] if spec not in wanted] == [], file


def test_an_empty_requirements_file_brings_nothing(tmp_path):
    (tmp_path / "requirements.txt").write_text("# nothing\n\n")
    assert nb.requirements(tmp_path / "requirements.txt") == []
    assert nb.install_commands(COLAB_CPU, tmp_path, {}.get) == []


def _install(monkeypatch, host, installed, answer="answers", status=0, last=""):
    ran = []
    monkeypatch.delenv(hosts.ROOT_ENV, raising=False)
    monkeypatch.setattr(hosts, "probe", lambda url, timeout: answer)

    def run(command):
        ran.append(command[1:])
        return status, last
    nb.install_missing(host, REPO, installed.get, index=lambda: nb.PYPI, run=run)
    return ran


def test_the_commands_are_shown_as_a_shell_takes_them_and_run_in_order(monkeypatch, capsys):
    ran = _install(monkeypatch, COLAB_CPU, dict(EVERYTHING, **{"tensorflow-cpu": "2.21.0"}))
    assert [command[2] for command in ran] == ["uninstall", "install"]
    said = capsys.readouterr().out.splitlines()
    assert said == ["[INFO] $ python -m pip uninstall -y tensorflow tensorflow-cpu",
                    "[INFO] $ python -m pip install 'tensorflow>=2.19,<2.22'"]


@pytest.mark.parametrize("answer", ["refused", "silent"])
def test_without_an_answer_from_the_index_nothing_is_touched(monkeypatch, answer):
    with pytest.raises(nb.Stop, match=r"^pip's package index \(https://pypi.org/simple/\) does "
                                      r"not answer: nothing was uninstalled or installed; is "
                                      r"there a network \(on Kaggle, switch Internet on"):
        _install(monkeypatch, KAGGLE_TPU, KAGGLE_TPU_IMAGE, answer=answer)


def test_a_failed_pip_is_one_line_and_says_what_it_uninstalled(monkeypatch):
    with pytest.raises(nb.Stop) as stopped:
        _install(monkeypatch, COLAB_CPU, dict(EVERYTHING, **{"tensorflow-cpu": "2.21.0"}),
                 status=1, last="ERROR: No matching distribution found for tensorflow")
    assert str(stopped.value) == ("pip could not install what this runtime lacks: ERROR: No "
                                  "matching distribution found for tensorflow; is there a "
                                  "network?")
    assert stopped.value._render_traceback_() == [f"stopped: {stopped.value}"]


def test_a_stand_in_machine_shows_the_commands_and_runs_none(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv(hosts.ROOT_ENV, str(tmp_path))
    nb.install_missing(COLAB_CPU, REPO, OLD_TF.get, index=lambda: pytest.fail("asked"),
                       run=lambda command: pytest.fail("ran"))
    assert capsys.readouterr().out.startswith("[INFO] not run on this stand-in machine: python "
                                              "-m pip install")


@pytest.mark.parametrize("listing, index", [
    ("", nb.PYPI),
    ("global.index-url='https://mirror.example/simple'\n", "https://mirror.example/simple"),
    (":env:.index-url='https://a/simple'\n", "https://a/simple"),
    ("global.no-index='true'\n", None),
    ("global.index-url='file:///wheels'\n", None),
])
def test_the_index_asked_is_the_one_pips_configuration_names(monkeypatch, listing, index):
    monkeypatch.setattr(nb.subprocess, "run", lambda *a, **k: type("Done", (), {
        "stdout": listing})())
    assert nb.pip_index() == index


def test_pips_lines_are_shown_as_they_come_and_its_error_kept(capfd):
    status, last = nb.run_pip([sys.executable, "-c", "print('Collecting x'); print('ERROR: no "
                                                     "x'); print(); raise SystemExit(1)"])
    assert (status, last) == (1, "ERROR: no x")
    assert capfd.readouterr().out == "Collecting x\nERROR: no x\n\n"


def test_the_runtime_is_said_and_the_kernel_readied_for_the_scripts(monkeypatch, capsys):
    monkeypatch.setattr(hosts, "detect", lambda: COLAB_TPU)
    monkeypatch.setenv("KERAS_BACKEND", "jax")  # a TPU image's own
    monkeypatch.delenv("TPU_LOAD_LIBRARY", raising=False)
    monkeypatch.delenv("PYIMAGESEARCH_TPU_HOLD", raising=False)
    assert nb.runtime() is COLAB_TPU
    assert "KERAS_BACKEND" not in os.environ and os.environ["TPU_LOAD_LIBRARY"] == "0"
    said = capsys.readouterr().out.splitlines()
    assert said[-1] == "[INFO] this runtime: Colab, 1 TPU v5e chip; it trains with train_tpu.py"


def test_drive_keeps_the_runs_on_colab(monkeypatch, tmp_path):
    monkeypatch.setattr(nb, "DRIVE", str(tmp_path / "drive"))
    mounted = []
    where = nb.keep_runs_in(COLAB_CPU, mount=mounted.append)
    assert mounted == [str(tmp_path / "drive")]
    assert where == str(tmp_path / "drive" / nb.DRIVE_RUNS) and os.path.isdir(where)


def test_a_refused_drive_is_one_line_and_the_runs_stay_local(monkeypatch, tmp_path, capsys):
    monkeypatch.chdir(tmp_path)

    def refuse(path):
        raise ValueError("mount failed")
    assert nb.keep_runs_in(COLAB_CPU, mount=refuse) == "outputs/notebook"
    assert capsys.readouterr().out.splitlines()[0] == (
        "[INFO] Google Drive is not mounted (mount failed): the runs stay in outputs/notebook, "
        "which a new runtime empties")


@pytest.mark.parametrize("host, where", [(KAGGLE_TPU, "/kaggle/working/runs"),
                                         (CLOUD_TPU_VM, "outputs/notebook")])
def test_elsewhere_the_runs_go_where_the_platform_keeps_them(monkeypatch, host, where):
    made = []
    monkeypatch.setattr(nb.os, "makedirs", lambda path, exist_ok: made.append(path))
    assert nb.keep_runs_in(host, mount=lambda path: pytest.fail("Drive tried")) == where
    assert made == [where]


def test_a_runs_folder_that_cannot_be_made_is_one_line(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(nb.Stop, match=r"^cannot make the runs' folder .*/file/runs: Not a "):
        nb.keep_runs_in(COLAB_CPU, str(tmp_path / "file" / "runs"))


def test_a_failed_command_stops_run_all_and_a_good_one_does_not():
    nb.check(0)
    with pytest.raises(nb.Stop, match="^train_cpu.py ended with status 2: its last line above"):
        nb.check(2, "train_cpu.py")


def test_the_newest_figure_is_the_run_just_made_and_none_is_one_line(tmp_path):
    for index, name in enumerate(["cpu.png", "cpu_epochs-1.png", "tpu.png"]):
        (tmp_path / name).write_text("")
        os.utime(tmp_path / name, (1000 + index, 1000 + index))
    assert nb.newest(str(tmp_path), "cpu*.png") == str(tmp_path / "cpu_epochs-1.png")
    with pytest.raises(nb.Stop, match=r"^no gpu\*.png in "):
        nb.newest(str(tmp_path), "gpu*.png")


@pytest.mark.parametrize("installed, route", [
    ({"jax": "0.7.2"}, "jax"), ({"jax": "0.7.2", "tensorflow-tpu": "2.19.1"}, "tensorflow"),
    ({}, "tensorflow")])
def test_the_notebook_installs_for_the_route_train_tpu_takes(monkeypatch, installed, route):
    from pyimagesearch import tpu
    assert nb.route(COLAB_TPU, installed.get) == route
    assert nb.route(COLAB_CPU, installed.get) == "tensorflow"
    monkeypatch.setattr(hosts, "installed", lambda name: name in installed)
    monkeypatch.setattr(hosts, "installed_version", installed.get)
    assert tpu.choose_route({}, COLAB_TPU) == route  # the script's own rule
