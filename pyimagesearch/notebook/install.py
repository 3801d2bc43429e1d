"""What notebook.ipynb installs: the packages the scripts need that this runtime lacks.

A TPU gets requirements-tpu.txt (or, on a JAX TPU image, only what
requirements-jax-tpu.txt lists and the image lacks), other runtimes what
requirements.txt lists and they lack. pip's index is asked first, so that
nothing is uninstalled where nothing can be installed; a failure is one
line (NotebookStop).
"""
import ast
import importlib.metadata
import os
import pathlib
import shlex
import signal
import subprocess
import sys
import urllib.parse

from packaging.requirements import Requirement  # matplotlib's dependency: always there
from packaging.utils import canonicalize_name

from pyimagesearch import runtime
from pyimagesearch.runtime import ANSWERS, ROOT_ENV, SILENT, installed_version
from pyimagesearch.notebook import NotebookStop, jax_route

TENSORFLOW = "tensorflow>=2.19,<2.22"  # requirements.txt's; the GPU form adds [and-cuda]

# TensorFlow's builds: each installs the same `tensorflow` package folder, so
# two of them overwrite each other's files, and uninstalling one breaks the other
TENSORFLOW_BUILDS = ("tensorflow", "tensorflow-cpu", "tensorflow-gpu", "tensorflow-tpu")
PIP_INDEX = "https://pypi.org/simple"  # pip's own default, where its configuration names none
INDEX_TIMEOUT_SECONDS = 10  # how long the index may take to answer before nothing is touched
INTERNET = {"kaggle": " (on Kaggle, switch Internet on in the notebook's settings)"}


def _requirements(path):
    """The requirement lines of a requirements file, without comments, options or -r lines."""
    lines = []
    for line in pathlib.Path(path).read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line and not line.startswith("-"):
            lines.append(line)
    return lines


def _unmet(specs, version_of):
    """The specs in `specs` that the installed distributions do not satisfy."""
    unmet = []
    for spec in specs:
        requirement = Requirement(spec)
        installed = version_of(requirement.name)
        if installed is None or not requirement.specifier.contains(installed, prereleases=True):
            unmet.append(spec)
    return unmet


def _installed_requires(name):
    """The Requires-Dist lines of installed distribution `name`; [] if it is not installed."""
    try:
        return importlib.metadata.requires(name) or []
    except importlib.metadata.PackageNotFoundError:
        return []


def _requirements_file(host, repo, version_of=installed_version):
    """requirements-jax-tpu.txt on a JAX TPU image, requirements-tpu.txt on another TPU,
    requirements.txt elsewhere: the route's `requirements` in runtime.HARDWARE."""
    backend = "jax" if jax_route(host, version_of) else "tensorflow"  # jax only on a TPU
    return os.path.join(repo, runtime.hardware(host.accelerator, backend).requirements)


def install_commands(host, repo=".", version_of=installed_version):
    """The pip commands that bring what this runtime lacks; [] if nothing is missing.

    Colab's and Kaggle's JAX TPU images get what requirements-jax-tpu.txt
    lists and they lack, another TPU requirements-tpu.txt (tensorflow-tpu),
    other runtimes what requirements.txt lists and they lack; a GPU whose own TensorFlow does not
    fit gets tensorflow[and-cuda], as TensorFlow's install guide says for
    Linux, so that it finds the GPU. Where another TensorFlow build sits in
    place of this runtime's or beside it, every build installed is
    uninstalled first and this runtime's installed afresh: a tensorflow or
    tensorflow-cpu beside tensorflow-tpu would share its files. (Colab's TPU
    image has no TensorFlow and Kaggle's has tensorflow-cpu 2.20.0: both take
    the JAX route, where nothing is uninstalled; tests/data/runtimes.)
    """
    path = _requirements_file(host, repo, version_of)
    specs = _requirements(path)
    unmet = _unmet(specs, version_of)
    pip = (sys.executable, "-m", "pip")
    if jax_route(host, version_of):  # only what the image lacks: nothing is removed or replaced
        has_tensorflow = any(version_of(name) for name in TENSORFLOW_BUILDS)
        unmet = [spec for spec in unmet if not (has_tensorflow and requirement_name(spec) in
                                                TENSORFLOW_BUILDS)]
        return [pip + ("install", *unmet)] if unmet else []
    build = "tensorflow-tpu" if host.accelerator == "tpu" else "tensorflow"
    installed = [name for name in TENSORFLOW_BUILDS if version_of(name) is not None]
    others = [name for name in installed if name != build]
    if others:  # every build goes, and this runtime's is installed afresh
        unmet = [spec for spec in specs if spec in unmet or requirement_name(spec) == build]
    if not unmet:
        return []
    commands = [pip + ("uninstall", "-y", *installed)] if others else []
    if host.accelerator == "tpu":
        return commands + [pip + ("install", "-r", path)]
    if host.accelerator == "gpu":
        unmet = [TENSORFLOW.replace("tensorflow", "tensorflow[and-cuda]", 1)
                 if spec == TENSORFLOW else spec for spec in unmet]
    return commands + [pip + ("install", *unmet)]


def requirement_name(spec):
    """The distribution a requirement line names, as pip compares names."""
    return canonicalize_name(Requirement(spec).name)


def jax_note(host, repo=".", version_of=installed_version, requires_of=_installed_requires):
    """One line if the libtpu requirements-tpu.txt pins is not one this image's JAX runs with.

    JAX-first TPU images carry the libtpu their JAX was built for (Colab's
    jax 0.7.2 with libtpu 0.0.21.1, Kaggle's libtpu 0.0.17: tests/data/runtimes),
    and JAX's `tpu` extra names it. requirements-tpu.txt pins the libtpu
    tensorflow-tpu 2.19.1 pins itself (0.0.10), one libtpu per environment:
    installing it leaves JAX without a TPU runtime until the runtime starts
    afresh. Those images take the JAX route and never get requirements-tpu.txt;
    this line is for another TPU with JAX installed. Where JAX's metadata names
    no libtpu, the line says JAX may not work.
    '' where JAX is not installed, or libtpu is already the pinned one.
    """
    pinned = [Requirement(spec) for spec in _requirements(
        _requirements_file(host, repo, version_of)) if requirement_name(spec) == "libtpu"]
    jax, current = version_of("jax"), version_of("libtpu")
    if host.accelerator != "tpu" or not pinned or jax is None or current is None:
        return ""
    (version,) = [item.version for item in pinned[0].specifier]  # libtpu==X: one version
    if current == version:
        return ""
    needs = [requirement.specifier for requirement in map(Requirement, requires_of("jax"))
             if requirement.name.lower() == "libtpu" and requirement.marker is not None
             and requirement.marker.evaluate({"extra": "tpu"})]
    if needs and needs[0].contains(version, prereleases=True):
        return ""
    verdict, why = ("will not", f"needs libtpu{needs[0]}") if needs else (
        "may not", f"came with libtpu {current}")
    return (f"[INFO] JAX {verdict} work on the TPU in this session: this image's JAX {jax} "
            f"{why}, and requirements-tpu.txt puts libtpu {version} in its place for "
            "TensorFlow; a new runtime gets the image's libtpu back")


def pip_index(listing):
    """(host, port, proxy) of pip's index, from `pip config list`; None if it is local.

    An index URL that PIP_INDEX_URL or a pip.conf sets wins over PyPI, the
    last one listed winning, as pip reads them; a file:// index or
    --no-index needs no network.
    """
    settings = {}
    for line in listing.splitlines():
        key, _, value = line.partition("=")
        section, _, name = key.strip().rpartition(".")
        if section in ("global", "install", ":env:") and value:
            settings[name] = ast.literal_eval(value.strip())
    if str(settings.get("no-index", "")).lower() in ("1", "true", "yes", "on"):
        return None
    url = urllib.parse.urlsplit(settings.get("index-url", PIP_INDEX))
    if url.scheme not in ("http", "https") or not url.hostname:
        return None
    return url.hostname, url.port or (443 if url.scheme == "https" else 80), settings.get("proxy")


def probe_index():
    """How pip's package index answers (runtime.py's probe); ANSWERS if it is local."""
    listing = subprocess.run((sys.executable, "-m", "pip", "config", "list"),
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True).stdout
    index = pip_index(listing)
    if index is None:
        return {"verdict": ANSWERS, "via": "a local index"}
    host, port, proxy = index
    environ = dict(os.environ, HTTPS_PROXY=proxy) if proxy else os.environ
    return runtime.probe((host, port), INDEX_TIMEOUT_SECONDS, environ)


def install_missing(host, repo=".", version_of=installed_version,
                    requires_of=_installed_requires, network=probe_index):
    """Run install_commands(host), pip's output shown as it comes; one line if it cannot.

    The package index is asked first: with no network (Kaggle with Internet
    off) nothing is uninstalled, and the stop says so. On a stand-in machine
    ($PYIMAGESEARCH_HOST_ROOT, the tests' TPU) the commands are only shown:
    they would uninstall the TensorFlow of the environment the tests run in.
    """
    commands = install_commands(host, repo, version_of)
    if not commands:
        print("[INFO] this runtime has every package the scripts need")
        return
    if os.environ.get(ROOT_ENV):
        for command in commands:
            print("[INFO] not run on this stand-in machine ($" + ROOT_ENV + "): "
                  + shlex.join(("python",) + tuple(command[1:])))
        return
    internet = INTERNET.get(host.service, "")
    answer = network()
    if answer["verdict"] != ANSWERS:
        how = (f"did not answer within {INDEX_TIMEOUT_SECONDS} s"
               if answer["verdict"] == SILENT else "cannot be reached")
        raise NotebookStop(f"pip's package index ({answer['via']}) {how}: nothing was "
                           f"uninstalled or installed; is there a network{internet}?")
    note = jax_note(host, repo, version_of, requires_of)
    if note:
        print(note)
    removed = ""  # said in the stop if the install after an uninstall fails
    for command in commands:
        print("[INFO] $ " + shlex.join(("python",) + tuple(command[1:])), flush=True)
        status, last = run_pip(command)
        if status:
            raise NotebookStop(f"pip could not install what this runtime lacks: "
                               f"{last or f'exit status {status}'}; is there a network"
                               f"{internet}?{removed}")
        if command[3] == "uninstall":
            removed = (f" ({', '.join(command[5:])} uninstalled: run this cell again once "
                       "pip can reach its index)")


def run_pip(command):
    """Run `command`, its output shown as it comes; (exit status, its last ERROR or other line)."""
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, errors="replace")
    last = error = ""
    try:
        for line in process.stdout:
            print(line, end="", flush=True)
            last = line.strip() or last
            error = last if last.startswith("ERROR") else error
    except KeyboardInterrupt:  # the stop button: pip gets its Ctrl-C and ends its own way
        process.send_signal(signal.SIGINT)
        process.wait()
        raise
    return process.wait(), error or last
