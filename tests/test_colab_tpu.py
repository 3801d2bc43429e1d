"""What a reader on Colab's or Kaggle's TPU meets: one line for a missing piece, refusals that
point to something that works there, and a venv with Colab's TPU versions (slow).

Colab's TPU image ships jax 0.7.2 and Keras 3.13.2 on Python 3.13, and no
TensorFlow (tests/data/runtimes/colab_tpu.txt); the notebook installs
requirements-jax-tpu.txt. The decisions are tested with stand-in hosts and
package lists; the scripts run in processes of their own, with a package
hidden from them (HIDE) or, in the slow test, in that venv.
"""
import json
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest
from conftest import one_line

from pyimagesearch import jax_route, runtime, tpu_runtime
from pyimagesearch.errors import UserError
from pyimagesearch.plan import Settings
from pyimagesearch.runtime import Host

COLAB_TPU, KAGGLE_TPU = Host("colab", 0, 1, "v5e"), Host("kaggle", 0, 8, "v5e")
CLOUD_TPU_VM, PLAIN, COLAB_GPU = Host("local", 0, 4, "v4"), Host("local", 0, 0, ""), \
    Host("colab", 1, 0, "")
JAX_TPU = "pip install -r requirements-jax-tpu.txt"
# the Python of the slow test's venv: Colab's is 3.13 (.ci/run passes python3.13 if it has one)
COLAB_PYTHON = pathlib.Path(os.environ.get("PYIMAGESEARCH_COLAB_PYTHON")
                            or "~/.pyenv/versions/3.13.0/bin/python").expanduser()
# what Colab's TPU image ships that a run reads (pinned to its versions by its published list)
COLAB_IMAGE = ("jax", "jaxlib", "keras", "numpy", "matplotlib", "scipy", "pandas", "scikit-learn")
# runs SCRIPT ARGS as `python SCRIPT ARGS` would, with the packages named in argv[1] missing:
# importlib.util.find_spec and import both fail on them, as where they are not installed
HIDE = textwrap.dedent("""
    import runpy, sys

    HIDDEN = set(sys.argv[1].split(","))

    class Hide:
        def find_spec(self, name, path=None, target=None):
            if name.partition(".")[0] in HIDDEN:
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)

    sys.meta_path.insert(0, Hide())
    sys.argv = sys.argv[2:]
    sys.path.insert(0, ".")
    runpy.run_path(sys.argv[0], run_name="__main__")
""")


def _without(repo, hidden, script, *args, **env):
    """`python SCRIPT ARGS` in `repo` with the packages `hidden` (a,b) missing; its result."""
    environ = {key: value for key, value in os.environ.items()
               if key not in ("KERAS_BACKEND", "JAX_NUM_CPU_DEVICES", "JAX_PLATFORMS")}
    return subprocess.run([sys.executable, "-c", HIDE, hidden, script, *args], cwd=repo,
                          env={**environ, **env}, capture_output=True, text=True, timeout=120,
                          check=False)


def _tpu_root(folder, chips=8):
    """Stand-in files of a TPU v5e machine (runtime.py reads them through ROOT_ENV)."""
    for chip in range(chips):
        pci = folder / f"sys/bus/pci/devices/0000:00:0{chip}.0"
        pci.mkdir(parents=True)
        (pci / "vendor").write_text("0x1ae0\n")
        (pci / "device").write_text("0x0063\n")
    return str(folder)


# --- a missing piece: the decision ----------------------------------------------------------

@pytest.mark.parametrize("route, host, lacking, said", [
    ("jax", COLAB_TPU, {"tensorflow"}, ("tensorflow is not installed (tf.data reads the digits, "
     f"on Keras' JAX backend too): {JAX_TPU}")),
    ("jax", KAGGLE_TPU, {"tensorflow"}, (f"(tf.data reads the digits, on Keras' JAX backend "
     f"too): {JAX_TPU}")),
    ("tensorflow", COLAB_TPU, {"tensorflow"}, f"tensorflow is not installed: {JAX_TPU}"),
    ("tensorflow", CLOUD_TPU_VM, {"tensorflow"}, ("not installed: pip install -r "
     "requirements-tpu.txt")),
    ("jax", CLOUD_TPU_VM, {"tensorflow"}, f"{JAX_TPU}"),
    ("tensorflow", PLAIN, {"tensorflow", "keras"}, ("tensorflow and keras are not installed: "
     "pip install -r requirements.txt")),
    ("tensorflow", COLAB_GPU, {"tensorflow"}, "pip install -r requirements.txt"),
    ("jax", PLAIN, {"jax"}, "jax is not installed: pip install jax"),
    ("jax", COLAB_TPU, {"jax"}, 'jax is not installed: pip install "jax[tpu]"'),
    ("jax", PLAIN, {"tensorflow", "jax"}, ("tensorflow and jax are not installed (tf.data "
     "reads the digits, on Keras' JAX backend too): pip install -r requirements.txt and "
     "pip install jax")),
])
def test_a_missing_piece_is_named_with_the_install_for_this_runtime(route, host, lacking, said):
    line = runtime.missing(route, host, lambda module: module not in lacking)
    assert line.endswith(said) and "\n" not in line
    assert line.startswith(" and ".join(name for name in ("tensorflow", "keras", "jax")
                                        if name in lacking))


@pytest.mark.parametrize("route", ["tensorflow", "jax"])
def test_nothing_missing_says_nothing(route):
    assert runtime.missing(route, COLAB_TPU, lambda module: True) == ""
    # the TensorFlow route never asks for jax
    assert runtime.missing("tensorflow", PLAIN, lambda module: module != "jax") == ""


# --- a missing piece: the scripts, one line and status 2, before anything else ----------------

@pytest.mark.parametrize("script, args", [
    ("train_tpu.py", ["--rehearse", "8"]), ("train_cpu.py", []), ("train_gpu.py", []),
    ("compare.py", []),
])
def test_without_tensorflow_each_script_says_one_line(repo, tmp_path, script, args):
    done = _without(repo, "tensorflow", script, *args, "--output-dir", str(tmp_path))
    assert one_line(done) == f"{script}: error: tensorflow is not installed: pip install -r " \
                             "requirements.txt"
    assert done.stdout == "" and not list(tmp_path.iterdir())


@pytest.mark.parametrize("backend", [{}, {"KERAS_BACKEND": "jax"}])
def test_on_a_kaggle_tpu_without_tensorflow_train_tpu_names_the_jax_install(repo, tmp_path,
                                                                              backend):
    # a stand-in TPU v5e on Kaggle: its route is JAX's, with or without KERAS_BACKEND
    done = _without(repo, "tensorflow", "train_tpu.py", KAGGLE_KERNEL_RUN_TYPE="Batch",
                    PYIMAGESEARCH_HOST_ROOT=_tpu_root(tmp_path / "root"), **backend)
    assert one_line(done) == ("train_tpu.py: error: tensorflow is not installed (tf.data reads "
                              f"the digits, on Keras' JAX backend too): {JAX_TPU}")


def test_without_jax_the_jax_route_says_one_line(repo):
    done = _without(repo, "jax", "train_tpu.py", "--rehearse", "8", KERAS_BACKEND="jax")
    assert one_line(done) == "train_tpu.py: error: jax is not installed: pip install jax"


# --- the version lines name the TensorFlow build installed ---------------------------------

@pytest.mark.parametrize("installed, said", [
    ({"tensorflow-cpu": "2.20.0"}, "tensorflow-cpu 2.20.0"),
    ({"tensorflow-tpu": "2.19.1"}, "tensorflow-tpu 2.19.1"),
    ({"tensorflow": "2.21.0"}, "tensorflow 2.21.0"),
    ({"tensorflow": "2.18.0", "tensorflow-cpu": "2.20.0"}, ("tensorflow 2.18.0, tensorflow-cpu "
     "2.20.0")),
    ({}, "tensorflow not installed"),
])
def test_the_version_line_names_the_tensorflow_build_installed(installed, said):
    assert runtime.tensorflow_builds(installed.get) == said


def test_the_jax_routes_lines_carry_the_build():
    assert runtime.tensorflow_builds() in jax_route.found(["cpu:0"])
    assert jax_route.versions()["tensorflow_build"] == runtime.tensorflow_builds()


# --- refusals that point to what works where they are read ----------------------------------

@pytest.mark.parametrize("host, place", [(COLAB_TPU, "Colab"), (KAGGLE_TPU, "Kaggle")])
def test_on_a_jax_tpu_image_a_refused_lever_points_to_what_works_there(host, place):
    with pytest.raises(UserError) as refused:
        jax_route.refuse_levers(Settings(jit_compile=True), host)
    said = str(refused.value)
    assert said.startswith("--jit-compile: not on Keras' JAX backend")
    assert said.endswith(f"on {place}'s TPU only Keras on JAX reaches the chips (TensorFlow's "
                         "TPU route needs tensorflow-tpu, which would replace JAX's libtpu): "
                         "leave the flag out, or rehearse on TensorFlow's route: "
                         "KERAS_BACKEND=tensorflow python train_tpu.py --rehearse 8")
    assert "requirements-tpu.txt" not in said and "\n" not in said


@pytest.mark.parametrize("host", [PLAIN, CLOUD_TPU_VM, COLAB_GPU])
def test_elsewhere_a_refused_lever_points_to_tensorflows_route(host):
    with pytest.raises(UserError, match=r"; run with KERAS_BACKEND=tensorflow$"):
        jax_route.refuse_levers(Settings(jit_compile=True), host)


def test_on_a_jax_tpu_image_tensorflows_tpu_route_is_refused_before_it_starts(monkeypatch):
    monkeypatch.delitem(sys.modules, "tensorflow")  # as at the top of train_tpu.py
    monkeypatch.setattr(runtime, "tensorflow_tpu_installed", lambda: False)
    environ = {"KERAS_BACKEND": "tensorflow"}
    with pytest.raises(SystemExit) as stopped:
        tpu_runtime.prepare([], environ, KAGGLE_TPU, lambda: "/lib/libtpu.so")
    assert stopped.value.code == 2
    # a rehearsal on TensorFlow's route works there: it is not refused
    said = tpu_runtime.prepare(["--rehearse", "8"], environ, KAGGLE_TPU, lambda: None)
    assert said == "a rehearsal: no TPU runtime"


def test_the_tensorflow_route_refusal_says_what_works(capsys, monkeypatch):
    monkeypatch.delitem(sys.modules, "tensorflow")
    monkeypatch.setattr(runtime, "tensorflow_tpu_installed", lambda: False)
    with pytest.raises(SystemExit):
        tpu_runtime.prepare([], {"KERAS_BACKEND": "tensorflow"}, COLAB_TPU, lambda: None)
    (line,) = capsys.readouterr().err.splitlines()
    assert line.endswith("error: KERAS_BACKEND=tensorflow: on Colab's TPU only Keras on JAX "
                         "reaches the chips (TensorFlow's TPU route needs tensorflow-tpu, which "
                         "would replace JAX's libtpu): train_tpu.py without KERAS_BACKEND takes "
                         "Keras on JAX, or rehearse on TensorFlow's route: add --rehearse 8")


def test_a_backend_neither_route_takes_points_to_jax_alone_on_a_jax_tpu_image():
    with pytest.raises(UserError) as refused:
        runtime.tpu_route({"KERAS_BACKEND": "torch"}, COLAB_TPU, True, False)
    assert str(refused.value).endswith("not KERAS_BACKEND=torch; set KERAS_BACKEND=jax")


# --- the reader's JAX_NUM_CPU_DEVICES and --tpu ---------------------------------------------

@pytest.mark.parametrize("own, devices, kept", [
    (None, 8, "8"), ("8", 8, "8"), ("16", 8, "16"), ("1", 1, "1"), (" 3 ", 2, " 3 "),
])
def test_the_readers_jax_num_cpu_devices_is_used_where_it_gives_enough(own, devices, kept):
    environ = {} if own is None else {"JAX_NUM_CPU_DEVICES": own}
    runtime.rehearse_on_jax(environ, devices)
    assert environ == {"JAX_NUM_CPU_DEVICES": kept, "JAX_PLATFORMS": "cpu"}


@pytest.mark.parametrize("own, devices", [("3", 8), ("0", 1), ("7", 8), ("", 2), ("eight", 8),
                                          ("-8", 8)])
def test_a_jax_num_cpu_devices_that_disagrees_is_refused_in_one_line(own, devices):
    environ = {"JAX_NUM_CPU_DEVICES": own}
    with pytest.raises(UserError) as refused:
        runtime.rehearse_on_jax(environ, devices)
    assert str(refused.value) == (f"JAX_NUM_CPU_DEVICES={own} in your environment and "
                                  f"--rehearse {devices} disagree: unset JAX_NUM_CPU_DEVICES, "
                                  f"or set it to {devices}")
    assert environ == {"JAX_NUM_CPU_DEVICES": own}  # nothing set


@pytest.mark.parametrize("argv", [["--tpu", "my-tpu"], ["--tpu=grpc://10.0.0.2:8470"],
                                  ["--rehearse", "8", "--tpu", "node"]])
@pytest.mark.parametrize("host, advice", [
    (COLAB_TPU, ""), (PLAIN, ", or run with KERAS_BACKEND=tensorflow for TPUClusterResolver")])
def test_tpu_name_on_jax_is_refused_in_one_line(capsys, monkeypatch, argv, host, advice):
    monkeypatch.delitem(sys.modules, "tensorflow")
    environ = {"KERAS_BACKEND": "jax"}
    with pytest.raises(SystemExit) as stopped:
        tpu_runtime.prepare(argv, environ, host, lambda: None)
    assert stopped.value.code == 2
    (line,) = capsys.readouterr().err.splitlines()
    name = tpu_runtime.flag_value(argv, "--tpu")
    assert line.endswith(f"error: --tpu {name}: Keras on JAX trains on this machine's own TPU, "
                         "which JAX finds by itself, and cannot reach one by name; leave --tpu "
                         f"out{advice}")
    assert "JAX_NUM_CPU_DEVICES" not in environ  # refused before anything is set


def test_tpu_local_on_jax_is_this_machines_tpu(monkeypatch):
    monkeypatch.delitem(sys.modules, "tensorflow")
    environ = {"KERAS_BACKEND": "jax"}
    said = tpu_runtime.prepare(["--tpu", "local"], environ, KAGGLE_TPU, lambda: None)
    assert said.startswith("Keras on JAX: JAX's libtpu reaches the TPU")


def test_the_scripts_refuse_the_readers_devices_and_tpu_name_in_one_line(repo):
    jax = {"KERAS_BACKEND": "jax"}
    done = _without(repo, "", "train_tpu.py", "--rehearse", "8", JAX_NUM_CPU_DEVICES="3", **jax)
    assert one_line(done) == ("train_tpu.py: error: JAX_NUM_CPU_DEVICES=3 in your environment "
                              "and --rehearse 8 disagree: unset JAX_NUM_CPU_DEVICES, or set it "
                              "to 8")
    done = _without(repo, "", "train_tpu.py", "--tpu", "my-tpu", **jax)
    assert one_line(done) == (
        "train_tpu.py: error: --tpu my-tpu: Keras on JAX trains on this machine's own TPU, "
        "which JAX finds by itself, and cannot reach one by name; leave --tpu out, or run with "
        "KERAS_BACKEND=tensorflow for TPUClusterResolver")


# --- Colab's TPU versions in a venv, before and after the notebook's install (slow) -----------

def _run(command, cwd=None, **env):
    """`command` in `cwd` with this environment and `env`; its result (its output kept)."""
    environ = {key: value for key, value in os.environ.items()
               if key not in ("KERAS_BACKEND", "JAX_NUM_CPU_DEVICES", "JAX_PLATFORMS",
                              "PYTHONPATH")}
    return subprocess.run([str(part) for part in command], cwd=cwd, env={**environ, **env},
                          capture_output=True, text=True, timeout=1200, check=False)


def _pip(python, *args):
    """pip in the venv of `python`, its packages pinned to Colab's TPU image's; asserted to work."""
    done = _run([python, "-m", "pip", "install", "-q", "--disable-pip-version-check", *args])
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.mark.slow
def test_colabs_tpu_versions_say_one_line_before_the_install_and_train_after_it(repo, tmp_path):
    if not COLAB_PYTHON.is_file():
        pytest.skip(f"no Python for Colab's TPU versions at {COLAB_PYTHON} (Colab's is 3.13; "
                    "set PYIMAGESEARCH_COLAB_PYTHON)")
    # Colab's TPU image as googlecolab/backend-info publishes it, as pip constraints: the
    # packages it ships (no TensorFlow) at its versions: jax 0.7.2, Keras 3.13.2, ...
    published = (repo / "tests/data/runtimes/colab_tpu.txt").read_text().splitlines()
    constraints = tmp_path / "colab_tpu.txt"
    constraints.write_text("\n".join(line for line in published
                                     if "==" in line and "@" not in line) + "\n")
    assert _run([COLAB_PYTHON, "-m", "venv", tmp_path / "venv"]).returncode == 0
    python = tmp_path / "venv/bin/python"
    _pip(python, "-c", constraints, *COLAB_IMAGE)
    versions = ("import importlib.metadata as m, importlib.util as u; print(m.version('jax'), "
                "m.version('keras'), u.find_spec('tensorflow'))")
    assert _run([python, "-c", versions]).stdout.split() == ["0.7.2", "3.13.2", "None"]
    # before the install: one line, status 2, with and without KERAS_BACKEND; on this
    # machine (no TPU) requirements.txt, on a stand-in Kaggle TPU requirements-jax-tpu.txt
    kaggle_tpu = {"KAGGLE_KERNEL_RUN_TYPE": "Batch",
                  "PYIMAGESEARCH_HOST_ROOT": _tpu_root(tmp_path / "root")}
    for env, said in (({}, "tensorflow is not installed: pip install -r requirements.txt"),
                      ({"KERAS_BACKEND": "jax"}, ("tensorflow is not installed (tf.data reads "
                       "the digits, on Keras' JAX backend too): pip install -r "
                       "requirements.txt")),
                      (kaggle_tpu, (f"(tf.data reads the digits, on Keras' JAX backend too): "
                       f"{JAX_TPU}"))):
        done = _run([python, repo / "train_tpu.py", "--rehearse", "8"], **env)
        assert one_line(done).endswith(said) and "Traceback" not in done.stderr
    # the notebook's install on a JAX TPU image, then the JAX rehearsal trains
    _pip(python, "-c", constraints, "-r", repo / "requirements-jax-tpu.txt")
    outputs = tmp_path / "outputs"
    done = _run([python, "train_tpu.py", "--rehearse", "8", "--epochs", "1", "--steps-per-epoch",
                 "2", "--data-source", "sample", "--output-dir", outputs], repo,
                KERAS_BACKEND="jax")
    assert done.returncode == 0, done.stderr[-3000:]
    (record,) = [json.loads(path.read_text()) for path in outputs.glob("*.json")]
    assert (record["backend"], record["replicas"]) == ("jax", 8)
    assert (record["jax_version"], record["keras_version"]) == ("0.7.2", "3.13.2")
    assert record["tensorflow_build"] == "tensorflow-cpu 2.20.0"
