"""The notebook's install, runtime by runtime, with stand-in package lists.

No Colab, Kaggle or TPU VM is here. Each runtime is a Host and a map of
the distributions its image carries. What matters is which TensorFlow
build an image carries, and whether it has JAX: a TPU image with JAX and no
tensorflow-tpu takes the JAX route (requirements-jax-tpu.txt), which
installs only what the image lacks. Colab's TPU image is its published
package list (tests/data/runtimes/colab_tpu.txt); the other versions are
stand-ins. The tests hold what is uninstalled, what is kept
and what is installed, and in which order, against the repo's own
requirements files; pip itself never runs here.
"""
import os
import shlex
import sys

import pytest

from pyimagesearch.notebook import install
from pyimagesearch import notebook
from pyimagesearch.runtime import Host
from pyimagesearch.runtime import ANSWERS, REFUSED, SILENT

COLAB_CPU, COLAB_GPU, COLAB_TPU = Host("colab", 0, 0, ""), Host("colab", 1, 0, ""), \
    Host("colab", 0, 1, "v5e")
KAGGLE_CPU, KAGGLE_GPU, KAGGLE_TPU = Host("kaggle", 0, 0, ""), Host("kaggle", 2, 0, ""), \
    Host("kaggle", 0, 8, "v5e")
CLOUD_TPU_VM, PLAIN = Host("local", 0, 4, "v4"), Host("local", 0, 0, "")

# what requirements.txt asks for, met: a runtime with these installs nothing
EVERYTHING = {"tensorflow": "2.21.0", "keras": "3.15.1", "tensorflow-datasets": "4.9.9",
              "tensorflow-metadata": "1.17.3",
              "importlib-resources": "6.5.2", "mlxtend": "0.23.4", "matplotlib": "3.10.0",
              "tensorboard": "2.21.0", "numpy": "2.1.0"}
# a notebook image: all but TensorFlow and TensorBoard fit (theirs are 2.18)
IMAGE = dict(EVERYTHING, tensorflow="2.18.0", tensorboard="2.18.0", jax="0.5.2",
             jaxlib="0.5.2")
COLAB_TPU_IMAGE = dict(IMAGE, jax="0.7.1", jaxlib="0.7.1", libtpu="0.0.21.1")
# an image on TensorFlow's TPU route: tensorflow-tpu beside JAX and a CPU build
TF_TPU_IMAGE = dict(COLAB_TPU_IMAGE, **{"tensorflow-tpu": "2.20.0"})


def published(name):
    """A runtime's published package list (tests/data/runtimes): {name: version}."""
    import pathlib

    versions = {}
    for line in (pathlib.Path(__file__).parent / "data" / "runtimes" / name).read_text(
            ).splitlines():
        if "==" in line and not line.startswith("#"):
            package, version = line.split("==", 1)
            versions[package.strip().lower().replace("_", "-")] = version.split(";")[0].strip()
    return versions


COLAB_TPU_PUBLISHED = published("colab_tpu.txt")
JAX_TPU_INSTALL = ["tensorflow-cpu==2.20.0", "mlxtend==0.23.4", "importlib_resources"]


def _swap(installed, name, other):
    """`installed` with distribution `name` replaced by `other`, at the same version."""
    installed = dict(installed)
    installed[other] = installed.pop(name)
    return installed


KAGGLE_TPU_IMAGE = _swap(dict(IMAGE, jax="0.6.2", jaxlib="0.6.2", libtpu="0.0.17",
                              tensorflow="2.18.0"), "tensorflow", "tensorflow-cpu")
UPGRADES = ["tensorflow>=2.19,<2.22", "tensorboard>=2.19,<2.22"]
CUDA_UPGRADES = ["tensorflow[and-cuda]>=2.19,<2.22", "tensorboard>=2.19,<2.22"]
TPU = ["-r", "requirements-tpu.txt"]
NEVER_UNINSTALLED = {"jax", "jaxlib", "libtpu", "keras", "numpy", "tensorboard"}


def _versions(installed):
    return lambda name: installed.get(name.lower().replace("_", "-"))


def _pip(commands, repo):
    """The commands as `pip ...` argument lists, paths relative to the repo."""
    for command in commands:
        assert command[:3] == (sys.executable, "-m", "pip")
    return [[os.path.relpath(arg, repo) if os.path.isabs(arg) else arg for arg in command[3:]]
            for command in commands]


@pytest.mark.parametrize("host, installed, uninstalled, installs", [
    (COLAB_CPU, IMAGE, None, UPGRADES),
    (COLAB_GPU, IMAGE, None, CUDA_UPGRADES),
    (COLAB_TPU, COLAB_TPU_PUBLISHED, None, JAX_TPU_INSTALL),  # the JAX route: only what lacks
    (KAGGLE_CPU, dict(IMAGE, tensorflow="2.18.0"), None, UPGRADES),
    (KAGGLE_GPU, dict(IMAGE, tensorflow="2.18.0"), None, CUDA_UPGRADES),
    (KAGGLE_TPU, {k: v for k, v in KAGGLE_TPU_IMAGE.items() if k != "mlxtend"}, None,
     ["mlxtend==0.23.4"]),  # its tensorflow-cpu serves tf.data as it is
    (CLOUD_TPU_VM, {}, None, TPU),  # a fresh Python: nothing to remove
    (PLAIN, {}, None, ["tensorflow>=2.19,<2.22", "keras>=3.10", "tensorflow-datasets>=4.9.9,<5",
                       "tensorflow-metadata!=1.21.0", "importlib_resources", "mlxtend>=0.23", "matplotlib>=3.8",
                       "tensorboard>=2.19,<2.22", "numpy"]),
    # TensorFlow's TPU route with both CPU builds beside tensorflow-tpu, and one where
    # tensorflow came after tensorflow-tpu
    (COLAB_TPU, dict(TF_TPU_IMAGE, **{"tensorflow-cpu": "2.19.0"}),
     ["tensorflow", "tensorflow-cpu", "tensorflow-tpu"], TPU),
    (CLOUD_TPU_VM, dict(EVERYTHING, **{"tensorflow-tpu": "2.20.0", "libtpu": "0.0.18"}),
     ["tensorflow", "tensorflow-tpu"], TPU),
    # a GPU that carries the CPU-only build: it goes, the CUDA build comes
    (KAGGLE_GPU, _swap(EVERYTHING, "tensorflow", "tensorflow-cpu"), ["tensorflow-cpu"],
     ["tensorflow[and-cuda]>=2.19,<2.22"]),
], ids=["colab-cpu", "colab-gpu", "colab-tpu", "kaggle-cpu", "kaggle-gpu", "kaggle-tpu",
        "cloud-tpu-vm", "plain", "tpu-with-tensorflow-and-tensorflow-cpu",
        "tpu-with-tensorflow-beside-tensorflow-tpu", "gpu-with-tensorflow-cpu"])
def test_what_each_runtime_uninstalls_keeps_and_installs(repo, host, installed, uninstalled,
                                                         installs):
    commands = _pip(install.install_commands(host, repo, _versions(installed)), repo)
    expected = ([["uninstall", "-y", *uninstalled]] if uninstalled else []) + [
        ["install", *installs]]
    assert commands == expected  # uninstalled first, then installed; nothing else removed
    kept = set(installed) - set(uninstalled or ())
    assert NEVER_UNINSTALLED & set(installed) <= kept


@pytest.mark.parametrize("host, installed", [
    (PLAIN, EVERYTHING), (COLAB_GPU, EVERYTHING),
    (CLOUD_TPU_VM, dict(EVERYTHING, **{"tensorflow-tpu": "2.19.1", "libtpu": "0.0.10"},
                        tensorflow=None, tensorboard="2.19.0")),
    (COLAB_TPU, dict(COLAB_TPU_PUBLISHED, **{"tensorflow-cpu": "2.20.0", "mlxtend": "0.23.4",
                                             "importlib-resources": "6.5.2"})),
])
def test_a_runtime_with_everything_installs_nothing(repo, host, installed):
    installed = {name: version for name, version in installed.items() if version}
    assert install.install_commands(host, repo, _versions(installed)) == []


def test_only_what_is_missing_is_installed(repo):
    some = dict(EVERYTHING, keras="2.15.0")
    del some["mlxtend"]
    commands = _pip(install.install_commands(COLAB_GPU, repo, _versions(some)), repo)
    assert commands == [["install", "keras>=3.10", "mlxtend>=0.23"]]


# --- libtpu and the image's JAX -----------------------------------------------------------

def _requires(*lines):
    return lambda name: list(lines) if name == "jax" else []


def test_jax_that_needs_a_newer_libtpu_is_said_to_stop_working(repo):
    note = install.jax_note(COLAB_TPU, repo, _versions(TF_TPU_IMAGE), _requires(
        "jaxlib<=0.7.1,>=0.7.1", 'libtpu==0.0.21.*; extra == "tpu"', 'requests; extra == "tpu"'))
    assert note == ("[INFO] JAX will not work on the TPU in this session: this image's JAX 0.7.1 "
                    "needs libtpu==0.0.21.*, and requirements-tpu.txt puts libtpu 0.0.10 in its "
                    "place for TensorFlow; a new runtime gets the image's libtpu back")


def test_on_the_jax_route_no_libtpu_is_touched_and_no_line_said(repo):
    note = install.jax_note(COLAB_TPU, repo, _versions(COLAB_TPU_PUBLISHED),
                             _requires('libtpu==0.0.23; extra == "tpu"'))
    assert note == ""


@pytest.mark.parametrize("requires", [(), ("jaxlib",), ('libtpu==0.0.17.*; extra == "cuda"',)])
def test_without_jaxs_own_word_jax_may_not_work(repo, requires):
    image = dict(KAGGLE_TPU_IMAGE, **{"tensorflow-tpu": "2.19.1"})
    note = install.jax_note(KAGGLE_TPU, repo, _versions(image), _requires(*requires))
    assert note.startswith("[INFO] JAX may not work on the TPU in this session: this image's "
                           "JAX 0.6.2 came with libtpu 0.0.17, and requirements-tpu.txt puts "
                           "libtpu 0.0.10 in its place")


@pytest.mark.parametrize("host, installed, requires", [
    (COLAB_TPU, TF_TPU_IMAGE, 'libtpu>=0.0.10; extra == "tpu"'),  # 0.0.10 will do
    (COLAB_TPU, dict(TF_TPU_IMAGE, libtpu="0.0.10"), 'libtpu==0.0.21.*; extra == "tpu"'),
    (CLOUD_TPU_VM, dict(COLAB_TPU_IMAGE, jax=None), ""),  # no JAX
    (COLAB_CPU, COLAB_TPU_IMAGE, 'libtpu==0.0.21.*; extra == "tpu"'),  # nothing of libtpu
])
def test_no_jax_line_where_jax_keeps_its_libtpu_or_is_not_there(repo, host, installed,
                                                                 requires):
    installed = {name: version for name, version in installed.items() if version}
    assert install.jax_note(host, repo, _versions(installed),
                             _requires(*filter(None, [requires]))) == ""


# --- the network first, then pip, its output shown as it comes ------------------------------

def _install(monkeypatch, repo, host, installed, verdict=ANSWERS, pip_says=(0, ""), ran=None):
    """install_missing(host) with stand-in packages and network; the pip commands it ran."""
    ran = [] if ran is None else ran

    def run_pip(command):
        ran.append(command)
        return pip_says

    monkeypatch.setattr(install, "run_pip", run_pip)
    install.install_missing(host, repo, _versions(installed),
                             _requires('libtpu==0.0.21.*; extra == "tpu"'),
                             lambda: {"verdict": verdict, "via": "pypi.org:443"})
    return ran


@pytest.mark.parametrize("verdict, how", [(REFUSED, "cannot be reached"),
                                          (SILENT, "did not answer within 10 s")])
def test_without_a_network_nothing_is_uninstalled(monkeypatch, repo, verdict, how):
    ran = []
    with pytest.raises(notebook.NotebookStop) as stop:
        _install(monkeypatch, repo, KAGGLE_TPU, dict(KAGGLE_TPU_IMAGE, **{
            "tensorflow-tpu": "2.20.0"}), verdict, ran=ran)
    assert ran == []
    assert str(stop.value) == (
        f"pip's package index (pypi.org:443) {how}: nothing was uninstalled or installed; is "
        "there a network (on Kaggle, switch Internet on in the notebook's settings)?")
    assert stop.value._render_traceback_() == [f"stopped: {stop.value}"]


def test_the_commands_are_shown_as_a_shell_takes_them_and_run_in_order(monkeypatch, repo,
                                                                      capsys):
    ran = _install(monkeypatch, repo, COLAB_TPU, TF_TPU_IMAGE)
    assert [command[3] for command in ran] == ["uninstall", "install"]
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("[INFO] JAX will not work on the TPU in this session")
    shown = [line.removeprefix("[INFO] $ ") for line in lines[1:]]
    assert [shlex.split(line) for line in shown] == [["python", *command[1:]] for command in ran]
    _install(monkeypatch, repo, COLAB_GPU, IMAGE)
    shown = capsys.readouterr().out.splitlines()
    assert shown == ["[INFO] $ python -m pip install 'tensorflow[and-cuda]>=2.19,<2.22' "
                     "'tensorboard>=2.19,<2.22'"]


def test_a_stand_in_machine_runs_no_pip(monkeypatch, repo, capsys):
    # a notebook test on a stand-in TPU must not uninstall the suite's own TensorFlow
    monkeypatch.setenv(install.ROOT_ENV, str(repo))
    assert _install(monkeypatch, repo, COLAB_TPU, TF_TPU_IMAGE, REFUSED) == []
    assert capsys.readouterr().out.splitlines()[-2:] == [
        f"[INFO] not run on this stand-in machine (${install.ROOT_ENV}): {line}" for line in (
            "python -m pip uninstall -y tensorflow tensorflow-tpu",
            f"python -m pip install -r {repo / 'requirements-tpu.txt'}")]


def test_a_failed_pip_is_one_line_and_nothing_after_it_runs(monkeypatch, repo):
    ran = []
    with pytest.raises(notebook.NotebookStop) as stop:
        _install(monkeypatch, repo, KAGGLE_TPU, dict(KAGGLE_TPU_IMAGE, **{
            "tensorflow-tpu": "2.20.0"}), ran=ran,
                 pip_says=(1, "ERROR: No matching distribution found for tensorflow-tpu"))
    assert [command[3] for command in ran] == ["uninstall"]
    assert str(stop.value) == (
        "pip could not install what this runtime lacks: ERROR: No matching distribution found "
        "for tensorflow-tpu; is there a network (on Kaggle, switch Internet on in the "
        "notebook's settings)?")


def test_an_install_that_fails_after_the_uninstall_says_what_is_gone(monkeypatch, repo):
    said = iter([(0, "Successfully uninstalled tensorflow-2.19.0"),
                 (1, "ERROR: Could not install packages due to an OSError: [Errno 28] No space "
                     "left on device")])
    monkeypatch.setattr(install, "run_pip", lambda command: next(said))
    with pytest.raises(notebook.NotebookStop) as stop:
        install.install_missing(COLAB_TPU, repo, _versions(TF_TPU_IMAGE), _requires(),
                                 lambda: {"verdict": ANSWERS, "via": "pypi.org:443"})
    assert str(stop.value).endswith(
        "No space left on device; is there a network? (tensorflow, tensorflow-tpu uninstalled: "
        "run this cell again once pip can reach its index)")


def test_pips_output_is_shown_line_by_line_and_its_error_kept(capfd):
    script = ("import sys; print('Collecting tensorflow-tpu', flush=True); "
              "print('ERROR: no space left', file=sys.stderr, flush=True); "
              "print('[notice] a new pip', flush=True); sys.exit(3)")
    assert install.run_pip((sys.executable, "-c", script)) == (3, "ERROR: no space left")
    assert capfd.readouterr().out == ("Collecting tensorflow-tpu\nERROR: no space left\n"
                                      "[notice] a new pip\n")


# --- which index pip would ask ----------------------------------------------------------------

@pytest.mark.parametrize("listing, index", [
    ("", ("pypi.org", 443, None)),
    ("global.cert='/etc/ssl/certs/ca.crt'\nglobal.index-url='https://mirror.example/simple'\n"
     ":env:.index-url='http://10.0.0.1:3141/root/pypi'\n:env:.proxy='http://proxy:3128'",
     ("10.0.0.1", 3141, "http://proxy:3128")),
    ("global.index-url='file:///opt/pypi/simple'", None),
    (":env:.no-index='1'", None),
    ("global.extra-index-url='https://x.example/simple'", ("pypi.org", 443, None)),
])
def test_the_index_is_the_one_pips_configuration_names(listing, index):
    assert install.pip_index(listing) == index


def test_the_probe_asks_the_index_pip_is_configured_with(monkeypatch):
    # pip's own `pip config list` reads PIP_INDEX_URL; nothing listens on port 9
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    for name in ("PIP_NO_INDEX", "PIP_PROXY", "https_proxy", "HTTPS_PROXY"):
        monkeypatch.delenv(name, raising=False)
    assert install.probe_index() == {"verdict": REFUSED, "via": "127.0.0.1:9"}


# --- the JAX route against the runtimes' published package lists ----------------------------

def test_on_colabs_tpu_image_the_install_changes_nothing_it_ships(repo):
    # Colab's TPU image as googlecolab/backend-info publishes it (tests/data/runtimes):
    # no command uninstalls, and every package named is one the image lacks, so no
    # version it ships is replaced; .ci/check_requirements resolves the same install
    # with every package of the image pinned (what it brings along changes nothing either)
    commands = _pip(install.install_commands(COLAB_TPU, repo,
                                              _versions(COLAB_TPU_PUBLISHED)), repo)
    assert [command[0] for command in commands] == ["install"]
    named = [install.requirement_name(spec) for spec in commands[0][1:]]
    assert named == ["tensorflow-cpu", "mlxtend", "importlib-resources"]
    assert not set(named) & set(COLAB_TPU_PUBLISHED)
    for kept in ("jax", "jaxlib", "libtpu", "keras", "numpy", "pandas", "protobuf"):
        assert kept in COLAB_TPU_PUBLISHED  # the fixture is the image's, not a stand-in's


def test_the_published_lists_say_where_they_come_from(repo):
    for name, source in (("colab_tpu.txt", "googlecolab/backend-info"),
                         ("kaggle_tpu.txt", "Kaggle/docker-python")):
        header = (repo / "tests/data/runtimes" / name).read_text().splitlines()[:3]
        assert header[0].startswith(f"# source: github.com/{source} ")
        assert header[1].startswith("# python: 3.1") and header[2].startswith("# fetched: 20")


def test_kaggles_tpu_image_keeps_its_tensorflow_cpu_and_gets_only_mlxtend(repo):
    image = {k: v for k, v in KAGGLE_TPU_IMAGE.items() if k != "mlxtend"}
    commands = _pip(install.install_commands(KAGGLE_TPU, repo, _versions(image)), repo)
    assert commands == [["install", "mlxtend==0.23.4"]]
