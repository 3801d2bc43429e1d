"""What notebook.ipynb's cells cannot say in a few lines: the runtime, what it lacks, where runs
are kept. The kernel never imports TensorFlow (a GPU's memory and a TPU's chips stay free for
the scripts, which run as `!python ...` cells); a failure stops Run all in one line.
"""
import glob
import os
import shlex
import subprocess
import sys

from packaging.requirements import Requirement  # matplotlib's and Keras' dependency
from packaging.utils import canonicalize_name

from pyimagesearch import host as hosts

SCRIPTS = {"cpu": "train_cpu.py", "gpu": "train_gpu.py", "tpu": "train_tpu.py"}
PYPI, INDEX_TIMEOUT_S = "https://pypi.org/simple/", 10
DRIVE, DRIVE_RUNS = "/content/drive", "MyDrive/fast-training-runs"
INTERNET = {"kaggle": " (on Kaggle, switch Internet on in the notebook's settings)"}


class Stop(Exception):
    """Stops Run all with one line: IPython shows `_render_traceback_`, not a traceback."""

    def _render_traceback_(self):
        return [f"stopped: {self}"]


def runtime():
    """This runtime (host.Host), said in one line; the kernel's environment readied for the
    scripts: TensorFlow's import leaves a TPU alone, and each script picks its own backend."""
    host = hosts.detect()
    hosts.leave_the_tpu_alone(os.environ)  # %tensorboard imports TensorFlow and outlives cells
    if os.environ.pop("KERAS_BACKEND", None):  # a TPU image's: train_tpu.py chooses it itself
        print("[INFO] KERAS_BACKEND unset for the scripts: train_tpu.py takes JAX on a TPU "
              "image by itself, the others run on TensorFlow")
    print(f"[INFO] this runtime: {host.describe()}; it trains with "
          f"{SCRIPTS[host.accelerator]}")
    return host


def route(host, version_of=hosts.installed_version):
    """"jax" or "tensorflow": the route train_tpu.py takes here (tpu.choose_route's rule)."""
    jax_image = version_of("jax") and not version_of("tensorflow-tpu")
    return "jax" if host.tpu_chips and jax_image else "tensorflow"


def requirements(path):
    """The requirement lines of a requirements file: no comments, options or -r lines."""
    with open(path) as handle:
        lines = [line.split("#", 1)[0].strip() for line in handle]
    return [line for line in lines if line and not line.startswith("-")]


def _unmet(specs, version_of):
    unmet = []
    for spec in specs:
        wanted = Requirement(spec)
        have = version_of(canonicalize_name(wanted.name))
        if have is None or not wanted.specifier.contains(have, prereleases=True):
            unmet.append(spec)
    return unmet


def install_commands(host, repo=".", version_of=hosts.installed_version):
    """The pip commands that bring what this runtime lacks, in order; [] if nothing.

    Colab's and Kaggle's TPU images (Keras on JAX) get only what requirements-jax-tpu.txt
    lists and they lack, nothing removed or replaced. Elsewhere the route's file; a GPU
    whose own TensorFlow does not fit gets tensorflow[and-cuda] (TensorFlow's pip guide,
    Linux); where another TensorFlow build sits beside or in place of the one needed,
    every build goes first and the one needed comes afresh.
    """
    path = os.path.join(repo, hosts.requirements_file(host, route(host, version_of)))
    specs = requirements(path)
    unmet = _unmet(specs, version_of)
    pip = ("python", "-m", "pip")
    builds = [name for name in hosts.TENSORFLOW_BUILDS if version_of(name)]
    if route(host, version_of) == "jax":
        unmet = [spec for spec in unmet if not (builds and Requirement(spec).name in
                                                hosts.TENSORFLOW_BUILDS)]
        return [pip + ("install", *unmet)] if unmet else []
    needed = "tensorflow-tpu" if host.tpu_chips else "tensorflow"
    if any(name != needed for name in builds):
        unmet = [spec for spec in specs if spec in unmet or Requirement(spec).name == needed]
    if not unmet:
        return []
    if host.accelerator == "gpu":
        unmet = [spec.replace("tensorflow", "tensorflow[and-cuda]", 1)
                 if Requirement(spec).name == "tensorflow" else spec for spec in unmet]
    removed = [pip + ("uninstall", "-y", *builds)] if any(n != needed for n in builds) else []
    return removed + [pip + ("install", *unmet)]


def pip_index():
    """The index pip installs from: its configuration's last index-url, else PyPI; None for
    --no-index or a local one."""
    listed = subprocess.run([sys.executable, "-m", "pip", "config", "list"], text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL).stdout
    settings = dict(line.split("=", 1) for line in listed.splitlines() if "=" in line)
    settings = {key.rpartition(".")[2]: value.strip("'\" ") for key, value in settings.items()}
    if settings.get("no-index", "").lower() in ("1", "true", "yes", "on"):
        return None
    url = settings.get("index-url", PYPI)
    return url if url.startswith(("http://", "https://")) else None


def install_missing(host, repo=".", version_of=hosts.installed_version, index=pip_index,
                    run=None):
    """Run install_commands(host), each shown as a shell would take it, pip's output as it
    comes. pip's index is asked first: unanswered, nothing is uninstalled or installed. On a
    stand-in machine (the tests' PYIMAGESEARCH_HOST_ROOT) the commands are only shown."""
    commands = install_commands(host, repo, version_of)
    if not commands:
        print("[INFO] this runtime has every package the scripts need")
        return
    if os.environ.get(hosts.ROOT_ENV):
        for command in commands:
            print(f"[INFO] not run on this stand-in machine: {shlex.join(command)}")
        return
    internet = INTERNET.get(host.service, "")
    url = index()
    if url and hosts.probe(url, INDEX_TIMEOUT_S) != "answers":
        raise Stop(f"pip's package index ({url}) does not answer: nothing was uninstalled or "
                   f"installed; is there a network{internet}?")
    removed = ""
    for command in commands:
        print(f"[INFO] $ {shlex.join(command)}", flush=True)
        status, last = (run or run_pip)([sys.executable, *command[1:]])
        if status:
            raise Stop(f"pip could not install what this runtime lacks: {last or status}; "
                       f"is there a network{internet}?{removed}")
        if "uninstall" in command:
            removed = (f" ({', '.join(command[5:])} uninstalled: run this cell again once pip "
                       "reaches its index)")


def run_pip(command):
    """Run `command`, its lines shown as they come: (exit status, its last ERROR line, else
    its last line)."""
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, errors="replace")
    last = error = ""
    for line in process.stdout:
        print(line, end="", flush=True)
        last = line.strip() or last
        error = last if last.startswith("ERROR") else error
    return process.wait(), error or last


def keep_runs_in(host, where="auto", mount=None):
    """The folder the runs go to, made: Google Drive on Colab (asked for; refused, the
    runs stay in outputs/notebook, which a new runtime empties), /kaggle/working on Kaggle."""
    if where == "auto" and host.service == "colab":
        try:
            if mount is None:
                from google.colab import drive
                mount = drive.mount
            mount(DRIVE)
            where = os.path.join(DRIVE, DRIVE_RUNS)
        except Exception as error:  # a refusal, a timeout: Colab's own exceptions
            print(f"[INFO] Google Drive is not mounted ({str(error).strip() or 'refused'}): "
                  "the runs stay in outputs/notebook, which a new runtime empties")
            where = "outputs/notebook"
    elif where == "auto":
        where = "/kaggle/working/runs" if host.service == "kaggle" else "outputs/notebook"
    try:
        os.makedirs(where, exist_ok=True)
    except OSError as error:
        raise Stop(f"cannot make the runs' folder {where}: {error.strerror}") from None
    print(f"[INFO] the runs are kept in {where}")
    return where


def check(status, what="the script"):
    """Stop Run all if a `!python ...` cell's command failed (IPython's and Colab's
    `_exit_code`); its own one line is above."""
    if status:
        raise Stop(f"{what} ended with status {status}: its last line above says why")


def newest(folder, pattern):
    """The newest file in `folder` matching `pattern` ("cpu*.png"): the run just made."""
    found = glob.glob(os.path.join(glob.escape(folder), pattern))
    if not found:
        raise Stop(f"no {pattern} in {folder}")
    return max(found, key=os.path.getmtime)
