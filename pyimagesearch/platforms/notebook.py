"""What notebook.ipynb does in its cells: a thin driver around the training scripts.

The notebook never imports TensorFlow in its own kernel: on a GPU TensorFlow
would hold the card's memory, and on a TPU it would hold the chips, that the
training scripts need. So the kernel only reads the machine (host.py),
installs what the runtime lacks, picks a folder that outlives the runtime,
runs the scripts as processes and shows what they wrote.

Before each run it shows the lines the run executes, read from the script
at that moment (`show_listing`: the lines marked `# +` grey or folded), and
how long the run will take here (`estimate`). A failure stops the notebook
with one line (`NotebookStop`): the script's own line where a script failed.
Rerunning a cell is safe: every step checks what is already done, and the
scripts write their outputs whole.
"""
import ast
import dataclasses
import html
import importlib.metadata
import io
import json
import os
import pathlib
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
import tokenize

from pyimagesearch.platforms import backend, startup, tpu_runtime
from pyimagesearch.platforms.host import ROOT_ENV, detect, installed_version

DEVICES = ("auto", "cpu", "gpu", "tpu")
REHEARSALS = {"gpu": 2, "tpu": 8}  # the article's 8 TPU cores; 2 GPUs, the smallest mirror
DRIVE_MOUNT = "/content/drive"
DRIVE_FOLDER = "MyDrive/fast-training-runs"  # under the mount: survives a change of runtime
KAGGLE_FOLDER = "/kaggle/working/fast-training-runs"
LOCAL_FOLDER = "outputs/notebook"
TENSORFLOW = "tensorflow>=2.19,<2.22"  # requirements.txt's; the GPU form adds [and-cuda]
CHANGE_RUNTIME = {
    "colab": "Runtime > Change runtime type, then pick {kind}",
    "kaggle": "Settings > Accelerator, then pick {kind}",
    "local": "run it on a machine with {kind}",
}
KINDS = {"gpu": "a GPU (T4)", "tpu": "a TPU (v5e)"}


class NotebookStop(Exception):
    """Stops a notebook's run in one line: IPython shows `_render_traceback_`, not a traceback."""

    def _render_traceback_(self):
        return [f"stopped: {self}"]


@dataclasses.dataclass(frozen=True)
class Run:
    """One training script to run: its label, its command, and why it was chosen."""

    name: str        # the run record's name: cpu, gpu, tpu, gpu_rehearsal, ...
    argv: tuple      # the script and its flags
    reason: str = ""


def runtime(device="auto", root=None, environ=None, modules=None):
    """The Host, after checking `device`: what the notebook will train on.

    The kernel's environment (`environ`, os.environ) gets TPU_LOAD_LIBRARY=0,
    unless the user set it: what the kernel starts itself, TensorBoard's
    %tensorboard above all, then imports TensorFlow without taking the TPU,
    and a second Run all still finds it free. The scripts do not inherit it
    (script_environment).
    """
    if device not in DEVICES:
        raise NotebookStop(f"DEVICE is {device!r}; choose one of {', '.join(DEVICES)}")
    startup.leave_the_tpu_alone(environ)
    host = detect(root, environ, modules)
    print(f"[INFO] runtime: {host.describe()}")
    return host


def plan_runs(host, device="auto", rehearse=True, flags=()):
    """The runs for this runtime: its own device's script, or rehearsals where it has none.

    - a TPU runtime: train_tpu.py; a GPU runtime: train_gpu.py;
    - no accelerator: train_cpu.py, and the configurations `rehearse` names
      ("gpu", "tpu"; True: both, False: none) on logical CPU devices;
    - `device` "gpu" or "tpu" on a runtime without one: that device's
      rehearsal, with a line that says how to get the real one.
    """
    flags = tuple(flags)
    wanted = host.accelerator if device == "auto" else device
    if wanted == "cpu":
        runs = [Run("cpu", ("train_cpu.py",) + flags)]
        if host.accelerator == "cpu":
            runs += [_rehearsal(kind, flags, "offered on a runtime without GPU or TPU")
                     for kind in _rehearsed(rehearse)]
        return runs
    if wanted == host.accelerator:
        return [Run(wanted, (f"train_{wanted}.py",) + flags)]
    how = CHANGE_RUNTIME[host.service].format(kind=KINDS[wanted])
    print(f"[INFO] this notebook was set to train on {KINDS[wanted]}, but this runtime "
          f"({host.describe()}) has none: {how}, and run it again. Rehearsing the "
          f"{wanted.upper()} configuration on the CPU meanwhile.")
    return [_rehearsal(wanted, flags, f"no {wanted.upper()} on this runtime")]


def _rehearsed(rehearse):
    """The configurations REHEARSE names, in the article's order (GPU, then TPU)."""
    if rehearse is True or rehearse is False or rehearse is None:
        return tuple(REHEARSALS) if rehearse else ()
    named = {rehearse} if isinstance(rehearse, str) else set(rehearse)
    unknown = sorted(map(repr, named - set(REHEARSALS)))
    if unknown:
        raise NotebookStop(f"REHEARSE holds {', '.join(unknown)}; it takes True, False or a "
                           f"list of {', '.join(map(repr, REHEARSALS))}")
    return tuple(kind for kind in REHEARSALS if kind in named)


def _rehearsal(kind, flags, reason):
    """The rehearsal of train_<kind>.py on logical CPU devices."""
    return Run(f"{kind}_rehearsal",
               (f"train_{kind}.py", "--rehearse", str(REHEARSALS[kind])) + tuple(flags), reason)


# --- installing what the runtime lacks -------------------------------------------------

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
    from packaging.requirements import Requirement  # matplotlib's dependency: always there

    unmet = []
    for spec in specs:
        requirement = Requirement(spec)
        installed = version_of(requirement.name)
        if installed is None or not requirement.specifier.contains(installed, prereleases=True):
            unmet.append(spec)
    return unmet


_installed_version = installed_version  # what this runtime has (host.py); tests pass stand-ins


def _installed_requires(name):
    """The Requires-Dist lines of installed distribution `name`; [] if it is not installed."""
    try:
        return importlib.metadata.requires(name) or []
    except importlib.metadata.PackageNotFoundError:
        return []


def jax_route(host, version_of=_installed_version):
    """True where train_tpu.py runs Keras on JAX by itself: backend.tpu_route's rule, on what
    this image has installed (a TPU with JAX and no tensorflow-tpu: Colab's and Kaggle's)."""
    return backend.tpu_route({}, host, version_of("jax") is not None,
                             version_of("tensorflow-tpu") is not None) == "jax"


def _requirements_file(host, repo, version_of=_installed_version):
    """requirements-jax-tpu.txt on a JAX TPU image, requirements-tpu.txt on another TPU,
    requirements.txt elsewhere."""
    if host.accelerator != "tpu":
        return os.path.join(repo, "requirements.txt")
    return os.path.join(repo, "requirements-jax-tpu.txt" if jax_route(host, version_of)
                        else "requirements-tpu.txt")


def install_commands(host, repo=".", version_of=_installed_version):
    """The pip commands that bring what this runtime lacks; [] if nothing is missing.

    A TPU gets requirements-tpu.txt (tensorflow-tpu), other runtimes what
    requirements.txt lists and they lack; a GPU whose own TensorFlow does not
    fit gets tensorflow[and-cuda], as TensorFlow's install guide says for
    Linux, so that it finds the GPU. Where another TensorFlow build sits in
    place of this runtime's or beside it, every build installed is
    uninstalled first and this runtime's installed afresh: Colab's TPU image
    carries tensorflow, Kaggle's tensorflow-cpu, and either would share
    tensorflow-tpu's files.
    """
    path = _requirements_file(host, repo, version_of)
    specs = _requirements(path)
    unmet = _unmet(specs, version_of)
    pip = (sys.executable, "-m", "pip")
    if jax_route(host, version_of):  # only what the image lacks: nothing is removed or replaced
        has_tensorflow = any(version_of(name) for name in TENSORFLOW_BUILDS)
        unmet = [spec for spec in unmet if not (has_tensorflow and _name(spec) in
                                                TENSORFLOW_BUILDS)]
        return [pip + ("install", *unmet)] if unmet else []
    build = "tensorflow-tpu" if host.accelerator == "tpu" else "tensorflow"
    installed = [name for name in TENSORFLOW_BUILDS if version_of(name) is not None]
    others = [name for name in installed if name != build]
    if others:  # every build goes, and this runtime's is installed afresh
        unmet = [spec for spec in specs if spec in unmet or _name(spec) == build]
    if not unmet:
        return []
    commands = [pip + ("uninstall", "-y", *installed)] if others else []
    if host.accelerator == "tpu":
        return commands + [pip + ("install", "-r", path)]
    if host.accelerator == "gpu":
        unmet = [TENSORFLOW.replace("tensorflow", "tensorflow[and-cuda]", 1)
                 if spec == TENSORFLOW else spec for spec in unmet]
    return commands + [pip + ("install", *unmet)]


def _name(spec):
    """The distribution a requirement line names, as pip compares names."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    return canonicalize_name(Requirement(spec).name)


def jax_note(host, repo=".", version_of=_installed_version, requires_of=_installed_requires):
    """One line if the libtpu requirements-tpu.txt pins is not one this image's JAX runs with.

    JAX-first TPU images (Colab's) carry the libtpu their JAX was built for,
    and JAX's `tpu` extra names it (jax 0.7.2: libtpu==0.0.23). TensorFlow
    2.20 needs libtpu 0.0.18, one libtpu per environment: installing it
    leaves JAX without a TPU runtime until the runtime starts afresh. Where
    JAX's metadata names no libtpu, the line says JAX may not work.
    '' where JAX is not installed, or libtpu is already the pinned one.
    """
    from packaging.requirements import Requirement

    pinned = [Requirement(spec) for spec in _requirements(
        _requirements_file(host, repo, version_of)) if _name(spec) == "libtpu"]
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
    import ast
    import urllib.parse

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


def _probe_index():
    """How pip's package index answers (base/network.py's probe); ANSWERS if it is local."""
    from pyimagesearch.base import network

    listing = subprocess.run((sys.executable, "-m", "pip", "config", "list"),
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True).stdout
    index = pip_index(listing)
    if index is None:
        return {"verdict": network.ANSWERS, "via": "a local index"}
    host, port, proxy = index
    environ = dict(os.environ, HTTPS_PROXY=proxy) if proxy else os.environ
    return network.probe((host, port), INDEX_TIMEOUT_SECONDS, environ)


def install_missing(host, repo=".", version_of=_installed_version,
                    requires_of=_installed_requires, network=_probe_index):
    """Run install_commands(host), pip's output shown as it comes; one line if it cannot.

    The package index is asked first: with no network (Kaggle with Internet
    off) nothing is uninstalled, and the stop says so. On a stand-in machine
    ($PYIMAGESEARCH_HOST_ROOT, the tests' TPU) the commands are only shown:
    they would uninstall the TensorFlow of the environment the tests run in.
    """
    from pyimagesearch.base.network import ANSWERS, SILENT

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
        status, last = _run_pip(command)
        if status:
            raise NotebookStop(f"pip could not install what this runtime lacks: "
                               f"{last or f'exit status {status}'}; is there a network"
                               f"{internet}?{removed}")
        if command[3] == "uninstall":
            removed = (f" ({', '.join(command[5:])} uninstalled: run this cell again once "
                       "pip can reach its index)")


def _run_pip(command):
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


def _last_line(text):
    """The last non-empty line of `text`, stripped; '' if none."""
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    return lines[-1] if lines else ""


# --- where the runs are kept ---------------------------------------------------------

def keep_runs_in(host, where="auto", mount=None):
    """The folder for the runs' records, figures, models and logs; created.

    On Colab, Google Drive (if the reader allows it), so a change of runtime
    keeps every earlier run; on Kaggle, /kaggle/working; elsewhere, or where
    Drive is refused, outputs/notebook.
    """
    if where != "auto":
        folder = where
    elif host.service == "colab":
        folder = _drive_folder(mount)
    elif host.service == "kaggle":
        folder = KAGGLE_FOLDER
        print("[INFO] Kaggle keeps /kaggle/working from one session to the next only with "
              "Settings > Persistence > Files only; without it a change of accelerator "
              "starts with an empty folder")
    else:
        folder = LOCAL_FOLDER
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as error:
        raise NotebookStop(f"cannot create {folder}: {error.strerror or error}") from None
    print(f"[INFO] runs are kept in {folder}")
    return folder


def _drive_folder(mount):
    """Drive's folder for the runs, or LOCAL_FOLDER with one line if Drive is not mounted."""
    try:
        if mount is None:
            from google.colab import drive  # only on Colab
            mount = drive.mount
        mount(DRIVE_MOUNT)
    except Exception as error:  # a refusal is google.colab's MessageError
        reason = _last_line(str(error)) or type(error).__name__
        print(f"[INFO] Google Drive is not mounted ({reason}): the runs stay in "
              f"{LOCAL_FOLDER}, which a change of runtime empties")
        return LOCAL_FOLDER
    return os.path.join(DRIVE_MOUNT, DRIVE_FOLDER)


# --- running the scripts ----------------------------------------------------------------

def script_environment(script=None):
    """The environment `script` runs in: its Keras backend, output as it comes.

    Without the kernel's TPU_LOAD_LIBRARY=0 (runtime): each script decides
    for itself, and only the TPU run lets TensorFlow load libtpu.
    train_tpu.py chooses its own backend (JAX on a JAX TPU image:
    platforms/backend.py); the others are TensorFlow's.
    """
    environ = startup.without_our_hold(dict(os.environ))
    if script and os.path.basename(script) == "train_tpu.py":
        environ.pop("KERAS_BACKEND", None)  # an image's KERAS_BACKEND=jax is not a choice
    else:  # JAX-first TPU images set KERAS_BACKEND=jax; these scripts are TensorFlow's
        environ["KERAS_BACKEND"] = "tensorflow"
    environ["PYTHONUNBUFFERED"] = "1"
    return environ


def run_script(argv, repo="."):
    """`python ARGV` in `repo`, its output shown as it comes; NotebookStop with its last line.

    stderr is shown a line late, so that the line a script ends with on a
    failure becomes the stop's one line instead of being shown twice.
    Interrupting the kernel (the stop button) interrupts the script, which
    then says what it left on disk.
    """
    print("[INFO] $ python " + " ".join(argv), flush=True)
    process = subprocess.Popen((sys.executable, *argv), cwd=repo,
                               env=script_environment(argv[0]), stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, errors="replace")
    held = []  # stderr's latest line, not shown yet

    def relay_stderr():
        for line in process.stderr:
            if held:
                print(held.pop(), end="", file=sys.stderr, flush=True)
            held.append(line)

    relay = threading.Thread(target=relay_stderr, daemon=True)
    relay.start()
    try:
        for line in process.stdout:
            print(line, end="", flush=True)
        status = process.wait()
    except KeyboardInterrupt:
        process.send_signal(signal.SIGINT)
        try:
            status = process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            status = process.wait()
    relay.join(timeout=10)
    last = held.pop().strip() if held else ""
    if status == 0:
        if last:
            print(last, file=sys.stderr)
        return
    raise NotebookStop(last or f"python {' '.join(argv)} ended with exit status {status}")


def train(runs, folder, repo=".", host=None):
    """Each run in `runs`: its code, how long it will take, the run itself, what it wrote.

    Before a run, the listing of its script (`show_listing`) and an estimate
    of its time on this runtime (`estimate`); while it runs, Keras' lines as
    the script prints them (one an epoch, as into a log: its output is a
    pipe); after, its figure and losses (`show_written`).
    Its outputs go to `folder`, its TensorBoard logs beneath.
    """
    for run in runs:
        _display_markdown(f"### {run.name}: `python {' '.join(run.argv)}`"
                          + (f" ({run.reason})" if run.reason else ""))
        show_listing(run.argv[0], repo)
        if host is not None:
            print("[INFO] " + estimate(run, host, repo), flush=True)
        before = _run_records(folder)
        start = time.monotonic()
        run_script(run.argv + ("--output-dir", folder,
                               # the script logs into logs/<its run's name>/<its start>
                               "--logdir", os.path.join(folder, "logs")), repo)
        print(f"[INFO] {run.name} took {time.monotonic() - start:.0f} s here", flush=True)
        show_written(run, folder, before)


def _run_records(folder):
    """{path: modification time} of the run records in `folder`."""
    return {path: path.stat().st_mtime_ns for path in pathlib.Path(folder).glob("*.json")}


def _display_markdown(text):
    from IPython.display import Markdown, display

    display(Markdown(text))


# tools/time_notebook.py's records: the notebook as committed, and the one its estimates
# use, taken while the machine's load stayed level (docs/notebook.md)
TIMING_RECORD = "outputs/quoted/notebook/first_run.json"
ESTIMATES_RECORD = "outputs/quoted/notebook/first_run_epochs_2.json"
ARTICLE_EPOCHS = {"gpu": ("Tesla T4", 24, 4), "tpu": ("8 TPU cores", 8, 2)}  # its logs' seconds


def _epochs(argv):
    """The epochs that `argv` asks for: its last --epochs, as argparse reads it, else the
    scripts' default."""
    value = tpu_runtime.flag_value(list(argv), "--epochs")
    if value is not None:
        return int(value)
    from pyimagesearch import config  # imports nothing of TensorFlow

    return config.EPOCHS


def _duration(seconds):
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.1f} min"


def estimate(run, host, repo="."):
    """One line: about how long `run` will take on this runtime, and what the figure rests on.

    On a CPU: the committed one-core measurement (tools/time_notebook.py),
    scaled to Colab's free CPU by the article's 57 s CPU epoch over an
    article-style epoch timed on that same core, and to `run`'s epochs. On
    a GPU or TPU: the article's own epochs; nothing here has timed one.
    """
    try:
        epochs = _epochs(run.argv)
    except ValueError:  # the script will say what is wrong with it
        return f"{run.name}: no estimate, its --epochs is not a number"
    if run.name in ARTICLE_EPOCHS:  # a real GPU or TPU, not a rehearsal
        where, first, later = ARTICLE_EPOCHS[run.name]
        return (f"{run.name}: the article's {where} trained {epochs} epoch(s) of this in about "
                f"{first + later * (epochs - 1)} s (its log); start-up (TensorFlow, the data, "
                f"compiling) comes on top, and has not been timed on a real {run.name.upper()}")
    try:
        measured = json.loads(pathlib.Path(repo, ESTIMATES_RECORD).read_text())
        entry = measured["runs"][run.name]
        times = entry["epoch_seconds"]
        later = times[1:] or times
        one_core = entry["seconds"] - sum(times[1:]) + (epochs - 1) * sum(later) / len(later)
        factor = measured["factor"]
    except (OSError, ValueError, KeyError, TypeError, ZeroDivisionError):
        return (f"{run.name}: no measurement of it in {ESTIMATES_RECORD} to estimate its "
                "time from")
    return (f"{run.name}: about {_duration(one_core * factor)} on Colab's free CPU for "
            f"{epochs} epoch(s) (timed on one core here, {entry['seconds']:.0f} s for "
            f"{len(times)} epoch(s), x {factor:.2f}: docs/notebook.md)"
            + ("; its other flags may change that" if _more_flags(run.argv) else ""))


def _more_flags(argv):
    """Whether `argv` holds flags beyond --rehearse N and --epochs N."""
    rest, skip = [], False
    for flag in argv[1:]:
        if skip:
            skip = False
        elif flag in ("--rehearse", "--epochs"):
            skip = True
        elif not flag.startswith("--epochs="):
            rest.append(flag)
    return bool(rest)


def matmul_device(host, device="auto"):
    """The device the matmul is timed on: the runtime's, unless the notebook trains elsewhere."""
    return host.accelerator if device in ("auto", host.accelerator) else "cpu"


def matmul_wanted(host, device="auto", setting="auto", version_of=_installed_version):
    """Whether to time the matmul here: TIME_MATMUL, "auto" on a GPU or TPU only.

    On a CPU runtime it is the first Run all's dearest minute after the
    training (TensorFlow's start and a 1 GiB operand), and the table shows
    this repository's CPU record beside the article's instead.
    """
    if setting and matmul_device(host, device) == "tpu" and jax_route(host, version_of):
        # the benchmark is TensorFlow's, and on a JAX image TensorFlow has no TPU
        print("[INFO] the matmul is not timed on this TPU: tools/matmul_benchmark.py is "
              "TensorFlow's, and this image's TPU is JAX's (tensorflow-cpu reads the data)")
        return False
    if setting == "auto":
        return matmul_device(host, device) != "cpu"
    return bool(setting)


def time_matmul(device, folder, repo="."):
    """The article's matmul on `device`, timed the article's way and properly.

    Its record is matmul_<device>.json, with the runtime where a GPU or TPU
    runtime's CPU was timed (matmul_cpu_gpu-runtime.json): not the CPU runtime's.
    """
    from pyimagesearch.platforms.host import runtime_suffix  # no TensorFlow

    name = f"matmul_{device}{runtime_suffix(device == 'cpu')}.json"
    run_script(("tools/matmul_benchmark.py", "--device", device, "--warmup", "1",
                "--repeats", "5", "--json", os.path.join(folder, "benchmarks", name)), repo)


def compare(folder, repo="."):
    """Table 1 (the article's rows below the reader's) and comparison.png, from `folder`."""
    run_script(("compare.py", folder, "--output-dir", folder, "--with-article"), repo)


# --- showing the code a run executes --------------------------------------------------

# a "# +" comment marks a line that goes beyond the article (the scripts' docstrings say so)
MARKED = re.compile(r"#\s?\+(\s|$)")
FOLD_FROM = 4  # so many marked lines in a row are folded into one line that opens them
DIMMED = "color:#9e9e9e"
COMMENT = "color:#2e7d32"  # the article's comments, and the reasons of its departures


def is_marked(line):
    """Whether a script's line goes beyond the article: it holds a `# +` comment."""
    return MARKED.search(line) is not None


def script_lines(path, name=None):
    """[(number, line)] of the file at `path` as it is now: all, or definition `name`'s.

    Read when called, so the notebook shows what the script holds when it
    runs, never a copy. `name` is a top-level function or class (with its
    decorators), found with `ast`.
    """
    text = pathlib.Path(path).read_text()
    lines = text.splitlines()
    if name is None:
        return list(enumerate(lines, start=1))
    for node in ast.parse(text).body:
        if getattr(node, "name", None) == name:
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            return [(n, lines[n - 1]) for n in range(first, node.end_lineno + 1)]
    raise NotebookStop(f"{path} defines no {name}; is the repository whole?")


def _html_line(number, line, dimmed):
    """One line of a listing, numbered; its comment green, or all of it grey where marked."""
    if dimmed:
        body = f'<span style="{DIMMED}">{html.escape(line)}</span>'
    else:
        code, comment = _split_comment(line)
        body = html.escape(code) + (f'<span style="{COMMENT}">{html.escape(comment)}</span>'
                                    if comment else "")
    return f'<span style="{DIMMED}">{number:4d}</span>  {body}'


def _split_comment(line):
    """(code, comment) of one line of Python; the comment found by tokenize, not by '#'."""
    try:
        for token in tokenize.generate_tokens(io.StringIO(line.strip() + "\n").readline):
            if token.type == tokenize.COMMENT:
                at = line.index(token.string)
                return line[:at], line[at:]
    except (tokenize.TokenError, IndentationError, SyntaxError, ValueError):
        pass  # a line of a longer statement or string: '#' is a comment if it starts one
    stripped = line.lstrip()
    return (line, "") if not stripped.startswith("#") else (line[:len(line) - len(stripped)],
                                                            stripped)


def listing_html(numbered, title):
    """The lines as HTML: marked lines grey, long runs of them folded in a <details>."""
    pre = '<pre style="margin:0;line-height:1.35;font-size:90%">'
    parts = [f"<p><b>{html.escape(title)}</b> "
             f'<span style="{DIMMED}">(grey: the lines marked <code># +</code>, beyond the '
             "article; click a folded group to open it)</span></p>", pre]
    index = 0
    while index < len(numbered):
        end = index
        while end < len(numbered) and is_marked(numbered[end][1]):
            end += 1
        group = numbered[index:end]
        if len(group) >= FOLD_FROM:
            parts.append("</pre><details><summary style=\"" + DIMMED + "\">"
                         f"lines {group[0][0]}-{group[-1][0]}: {len(group)} lines marked # +"
                         f"</summary>{pre}"
                         + "\n".join(_html_line(n, line, True) for n, line in group)
                         + "</pre></details>" + pre)
            index = end
        elif group:
            parts.append("\n".join(_html_line(n, line, True) for n, line in group) + "\n")
            index = end
        else:
            number, line = numbered[index]
            parts.append(_html_line(number, line, False) + "\n")
            index += 1
    parts.append("</pre>")
    return "".join(parts).replace(pre + "</pre>", "")


def show_listing(path, repo=".", name=None):
    """Show the lines of `path` (a script, or definition `name` in it) as they are on disk now."""
    from IPython.display import display

    numbered = script_lines(os.path.join(repo, path), name)
    title = f"{path}" + (f": {name}" if name else "") + f", as it is now ({len(numbered)} lines)"
    display({"text/html": listing_html(numbered, title),
             "text/plain": "\n".join(f"{n:4d}  {line}" for n, line in numbered)}, raw=True)


def _code_lines(path):
    """{code: (number, line)} of the unmarked code lines of a script, comments dropped."""
    text = pathlib.Path(path).read_text()
    lines = text.splitlines()
    skip = set()
    for node in ast.walk(ast.parse(text)):  # docstrings are prose, not code
        if isinstance(node, ast.Expr) and isinstance(getattr(node, "value", None),
                                                     ast.Constant) \
                and isinstance(node.value.value, str):
            skip.update(range(node.lineno, node.end_lineno + 1))
    found = {}
    for number, line in enumerate(lines, start=1):
        if number in skip or is_marked(line):
            continue
        code = _split_comment(line)[0].strip()
        if code:
            found.setdefault(code, (number, line))
    return found


def show_differences(scripts=("train_cpu.py", "train_gpu.py", "train_tpu.py"), repo="."):
    """Each script's unmarked code lines that the other scripts do not have: the strategy."""
    codes = {script: _code_lines(os.path.join(repo, script)) for script in scripts}
    for script, lines in codes.items():
        others = set().union(*(set(codes[other]) for other in scripts if other != script))
        own = sorted(lines[code] for code in set(lines) - others)
        from IPython.display import display

        title = f"{script}: its {len(own)} lines of code that the other scripts lack"
        display({"text/html": listing_html(own, title),
                 "text/plain": "\n".join(f"{n:4d}  {line}" for n, line in own)}, raw=True)


def project_structure(repo="."):
    """The article's files, then what the repository adds, each with its docstring's first line."""
    root = pathlib.Path(repo)
    article = ["train_cpu.py", "train_gpu.py", "train_tpu.py", "pyimagesearch/autoencoder.py",
               "pyimagesearch/config.py", "pyimagesearch/data.py", "pyimagesearch/loss.py"]
    added = sorted({str(path.relative_to(root)) for pattern in ("*.py", "pyimagesearch/*.py",
                                                                "tools/*.py")
                    for path in root.glob(pattern)} - set(article)
                   - {"pyimagesearch/__init__.py"})
    rows = ["| file | what it holds (its docstring's first line) |", "| --- | --- |"]
    rows += [f"| `{name}` | {_first_line(root / name)} |" for name in article]
    rows.append("| *beyond the article* | |")
    rows += [f"| `{name}` | {_first_line(root / name)} |" for name in added]
    folders = sorted(path.name + "/" for path in (root / "pyimagesearch").iterdir()
                     if (path / "__init__.py").is_file())
    rows.append(f"| `pyimagesearch/{{{','.join(folders)}}}` | "
                "the data sources, training machinery and platforms the scripts call |")
    _display_markdown("\n".join(rows))


def _first_line(path):
    """The first line of a Python file's docstring, Markdown-safe; '' if it has none."""
    try:
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    except (OSError, SyntaxError):
        return ""
    return doc.strip().splitlines()[0].replace("|", "\\|") if doc.strip() else ""


# --- the article's numbers beside the reader's -------------------------------------------

ARTICLE_MATMUL = {"CPU": 0.79, "GPU": 0.000436, "TPU (8 cores)": 0.06}  # naive, its listings
LISTINGS_RECORD = "outputs/quoted/listings/tf221.json"  # tools/check_listings.py's record
JAX_LOSS_RECORD = "outputs/quoted/listings/jax_loss_step.json"  # tools/jax_loss_step.py's
MATMUL_RECORD = "outputs/quoted/benchmarks/matmul_cpu.json"  # tools/matmul_benchmark.py's


def matmul_table(folder, article=ARTICLE_MATMUL, reference=MATMUL_RECORD, repo="."):
    """The matmul records in `folder`/benchmarks beside the article's three timings.

    `reference`, this repository's CPU record, comes first: a row of figures
    measured the same way on a known machine.
    """
    rows = ["| where | naive: one call, timed as the article does (s) | measured: median, "
            "warmed up, each call waited for (s) | from |", "| --- | --- | --- | --- |"]
    paths = [(path, f"{path.name} in the runs folder")
             for path in sorted(pathlib.Path(folder, "benchmarks").glob("matmul_*.json"))]
    if reference:
        paths.insert(0, (pathlib.Path(repo, reference),
                         f"`{reference}`, this repository's machine"))
    for path, source in paths:
        try:
            record = json.loads(path.read_text())
            naive, median = record["naive_seconds"], record["seconds"]["median"]
            where = record["device_name"] + (" (a rehearsal)" if record.get("rehearsal")
                                             else "")
        except (OSError, ValueError, KeyError, TypeError):
            rows.append(f"| {path.name} | | | unreadable: skipped |")
            continue
        rows.append(f"| {where.replace('|', '/')} | {naive:.6g} | {median:.6g} | {source} |")
    for where, seconds in article.items():
        rows.append(f"| the article: {where} | {seconds:g} | | its listing |")
    return "\n".join(rows)


def show_matmul(folder, repo="."):
    _display_markdown(matmul_table(folder, repo=repo))


def say_tpu_cores(host):
    """Print tpu_line(host), where there is one."""
    line = tpu_line(host)
    if line:
        print(line)


def tpu_cores(host):
    """The TPU cores TensorFlow makes replicas of: 2 a chip on v2 and v3, 1 on later chips."""
    return host.tpu_chips * (2 if host.tpu_generation in ("v2", "v3") else 1)


def tpu_line(host, article_cores=8):
    """One line where this TPU has fewer cores than the article's; '' otherwise."""
    cores = tpu_cores(host)
    if host.accelerator != "tpu" or cores >= article_cores:
        return ""
    return (f"[INFO] this TPU has {cores} core(s), the article's had {article_cores}: "
            f"train_tpu.py runs {cores} replica(s), so the global batch of 1024 is split "
            f"{cores} way(s), not {article_cores}; the article's {article_cores}-way data "
            "parallelism (each core a 128-image share, the gradients summed across cores) is "
            "not run here. The 58 steps per epoch and their blur are the same.")


_RATIO = re.compile(r"(?:is|prints) ([0-9.]+) times")


def loss_scaling_rows(path=LISTINGS_RECORD, repo="."):
    """The Losses section's numbers, from tools/check_listings.py's record: a Markdown table."""
    record = json.loads(pathlib.Path(repo, path).read_text())
    listings = record["listings"]

    def ratios(name):
        line = listings.get(name, {}).get("last_line", "")
        return _RATIO.findall(line)

    keras3 = f"Keras {record['keras_version']} (TF {record['tensorflow_version']})"
    rows = [f"| with N replicas | {keras3} | tf.keras 2 (`TF_USE_LEGACY_KERAS=1`) |",
            "| --- | --- | --- |"]
    step, step2 = (ratios("MSELoss_scale_1_update_on_2_replicas"),
                   ratios("MSELoss_scale_1_update_on_2_replicas_tf_keras"))
    rows.append("| one SGD step with `MSELoss(scale=1)`, N=2, over the step on 1 device | "
                f"{_first(step)} | {_first(step2)} |")
    for replicas in (2, 8):
        new = ratios(f"MSELoss_printed_loss_on_{replicas}_replicas")
        old = ratios(f"MSELoss_printed_loss_on_{replicas}_replicas_tf_keras")
        rows.append(f"| `loss` fit prints with `scale=1` over that with `scale={replicas}`, "
                    f"N={replicas} | {_first(new)} | {_first(old)} |")
        rows.append(f"| `loss` fit prints with `scale={replicas}` over the true mean squared "
                    f"error, N={replicas} | {_last(new)} | {_last(old)} |")
    rows.append(f"\n*From `{path}`: `tools/check_listings.py` ran these listings as "
                "processes, on logical CPU devices.*")
    return "\n".join(rows) + jax_loss_rows(repo)


def jax_loss_rows(repo=".", path=JAX_LOSS_RECORD):
    """The Losses section's JAX numbers, from tools/jax_loss_step.py's record: Markdown."""
    try:
        record = json.loads(pathlib.Path(repo, path).read_text())
        steps = record["steps"]
    except (OSError, ValueError, KeyError):
        return "\n\nOn Keras' JAX backend: not measured."
    rows = [f"\n\n| on Keras' JAX backend (JAX {record['jax_version']}), N devices | "
            "one SGD step over the step on 1 device |", "| --- | --- |"]
    rows += [f"| `MSELoss(scale={case.split(':')[1]})`, N={case.split(':')[0]} | "
             f"{step['ratio']:.3f} |" for case, step in steps.items()]
    rows.append(f"\n*From `{path}`: `tools/jax_loss_step.py` on JAX CPU devices: on JAX the "
                "article's `scale=1` is right, as one jitted step sees the global batch.*")
    return "\n".join(rows)


def _first(found):
    return found[0] if found else "not measured"


def _last(found):
    return found[-1] if len(found) > 1 else "not measured"


def show_loss_scaling(folder, repo=".", check=False):
    """The Losses table: from the committed record, or (`check`) measured now, in processes.

    Measured now, the record goes to `folder`/benchmarks/listings.json (about
    a minute on a CPU: three listings, each a fresh Python with TensorFlow).
    """
    path = LISTINGS_RECORD
    if check:
        path = os.path.join(folder, "benchmarks", "listings.json")
        run_script(("tools/check_listings.py", "--json", path, "--only",
                    "MSELoss_scale_1_update_on_2_replicas",
                    "MSELoss_printed_loss_on_2_replicas", "MSELoss_printed_loss_on_8_replicas"),
                   repo)
    _display_markdown(loss_scaling_rows(path, repo))


# --- showing what the scripts wrote ------------------------------------------------------

def record_table(record):
    """A run record's numbers, epoch by epoch, as a Markdown table."""
    rows = ["| epoch | loss | val_loss | seconds (with validation) |", "| --- | --- | --- | --- |"]
    for epoch, (loss, val_loss, seconds) in enumerate(
            zip(record["loss"], record["val_loss"], record["epoch_seconds"]), start=1):
        rows.append(f"| {epoch} | {loss:.4f} | {val_loss:.4f} | {seconds:.1f} |")
    return "\n".join(rows)


def show_written(run, folder, before=None):
    """The figure and numbers of the record(s) `run` wrote in `folder` (new since `before`).

    The record's name is the script's choice (device, rehearsal, flags):
    whatever the run wrote is shown, and its own name where it wrote none new.
    """
    from IPython.display import Image, display

    written = [] if before is None else sorted(
        path for path, stamp in _run_records(folder).items() if before.get(path) != stamp)
    for path in written or [pathlib.Path(folder, run.name + ".json")]:
        with open(path) as handle:
            record = json.load(handle)
        _display_markdown(
            f"**{path.stem}**: {record['replicas']} replica(s), global batch "
            f"{record['global_batch_size']}, {record['steps_per_epoch']} steps per epoch, "
            f"data: {record['data_source']}"
            + (" (a rehearsal on CPU devices)" if record["rehearsal"] else ""))
        _display_markdown(record_table(record))
        figure = path.with_suffix(".png")
        if figure.is_file():
            display(Image(filename=str(figure), width=320))


def show_comparison(folder):
    """Table 1 and comparison.png, as compare.py wrote them."""
    from IPython.display import Image, Markdown, display

    with open(os.path.join(folder, "comparison.md")) as handle:
        display(Markdown(handle.read()))
    display(Image(filename=os.path.join(folder, "comparison.png")))
