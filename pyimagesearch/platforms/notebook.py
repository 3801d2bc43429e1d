"""What notebook.ipynb does in its cells: a thin driver around the training scripts.

The notebook never imports TensorFlow in its own kernel: on a GPU TensorFlow
would hold the card's memory, and on a TPU it would hold the chips, that the
training scripts need. So the kernel only reads the machine (host.py),
installs what the runtime lacks, picks a folder that outlives the runtime,
runs the scripts as processes and shows what they wrote.

A failure stops the notebook with one line (`NotebookStop`): the script's
own line where a script failed. Rerunning a cell is safe: every step
checks what is already done, and the scripts write their outputs whole.
"""
import dataclasses
import importlib.metadata
import json
import os
import pathlib
import shlex
import signal
import subprocess
import sys
import threading

from pyimagesearch.platforms import tpu_runtime
from pyimagesearch.platforms.host import ROOT_ENV, detect

DEVICES = ("auto", "cpu", "gpu", "tpu")
REHEARSALS = {"gpu": 2, "tpu": 8}  # the article's 8 TPU cores; 2 GPUs, the smallest mirror
DRIVE_MOUNT = "/content/drive"
DRIVE_FOLDER = "MyDrive/fast-training-runs"  # under the mount: survives a change of runtime
KAGGLE_FOLDER = "/kaggle/working/fast-training-runs"
LOCAL_FOLDER = "outputs/notebook"
TENSORFLOW = "tensorflow>=2.20,<2.22"  # requirements.txt's; the GPU form adds [and-cuda]
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
    tpu_runtime.leave_the_tpu_alone(environ)
    host = detect(root, environ, modules)
    print(f"[INFO] runtime: {host.describe()}")
    return host


def plan_runs(host, device="auto", rehearse=True, flags=()):
    """The runs for this runtime: its own device's script, or rehearsals where it has none.

    - a TPU runtime: train_tpu.py; a GPU runtime: train_gpu.py;
    - no accelerator: train_cpu.py, and with `rehearse` the GPU and TPU
      configurations on logical CPU devices;
    - `device` "gpu" or "tpu" on a runtime without one: that device's
      rehearsal, with a line that says how to get the real one.
    """
    flags = tuple(flags)
    wanted = host.accelerator if device == "auto" else device
    if wanted == "cpu":
        runs = [Run("cpu", ("train_cpu.py",) + flags)]
        if rehearse and host.accelerator == "cpu":
            runs += [_rehearsal(kind, flags, "offered on a runtime without GPU or TPU")
                     for kind in ("gpu", "tpu")]
        return runs
    if wanted == host.accelerator:
        return [Run(wanted, (f"train_{wanted}.py",) + flags)]
    how = CHANGE_RUNTIME[host.service].format(kind=KINDS[wanted])
    print(f"[INFO] this notebook was set to train on {KINDS[wanted]}, but this runtime "
          f"({host.describe()}) has none: {how}, and run it again. Rehearsing the "
          f"{wanted.upper()} configuration on the CPU meanwhile.")
    return [_rehearsal(wanted, flags, f"no {wanted.upper()} on this runtime")]


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


def _installed_version(name):
    """The installed version of distribution `name`, or None."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _installed_requires(name):
    """The Requires-Dist lines of installed distribution `name`; [] if it is not installed."""
    try:
        return importlib.metadata.requires(name) or []
    except importlib.metadata.PackageNotFoundError:
        return []


def _requirements_file(host, repo):
    """requirements-tpu.txt on a TPU runtime, requirements.txt elsewhere."""
    return os.path.join(repo, "requirements-tpu.txt" if host.accelerator == "tpu"
                        else "requirements.txt")


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
    path = _requirements_file(host, repo)
    build = "tensorflow-tpu" if host.accelerator == "tpu" else "tensorflow"
    specs = _requirements(path)
    unmet = _unmet(specs, version_of)
    installed = [name for name in TENSORFLOW_BUILDS if version_of(name) is not None]
    others = [name for name in installed if name != build]
    if others:  # every build goes, and this runtime's is installed afresh
        unmet = [spec for spec in specs if spec in unmet or _name(spec) == build]
    if not unmet:
        return []
    pip = (sys.executable, "-m", "pip")
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

    pinned = [Requirement(spec) for spec in _requirements(_requirements_file(host, repo))
              if _name(spec) == "libtpu"]
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
    """How pip's package index answers (training/network.py's probe); ANSWERS if it is local."""
    from pyimagesearch.training import network

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
    from pyimagesearch.training.network import ANSWERS, SILENT

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

def script_environment():
    """The environment a script runs in: TensorFlow's Keras, output as it comes.

    Without the kernel's TPU_LOAD_LIBRARY=0 (runtime): each script decides
    for itself, and only the TPU run lets TensorFlow load libtpu.
    """
    environ = tpu_runtime.without_our_hold(dict(os.environ))
    # JAX-first TPU images set KERAS_BACKEND=jax; the scripts are TensorFlow's
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
    process = subprocess.Popen((sys.executable, *argv), cwd=repo, env=script_environment(),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               errors="replace")
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


def train(runs, folder, repo="."):
    """Each run in `runs`, writing its outputs to `folder` and its TensorBoard logs beneath."""
    for run in runs:
        if run.reason:
            print(f"[INFO] {run.name}: {run.reason}")
        # the script logs into logs/<its run's name>/<its start>
        run_script(run.argv + ("--output-dir", folder,
                               "--logdir", os.path.join(folder, "logs")), repo)


def matmul_device(host, device="auto"):
    """The device the matmul is timed on: the runtime's, unless the notebook trains elsewhere."""
    return host.accelerator if device in ("auto", host.accelerator) else "cpu"


def time_matmul(device, folder, repo="."):
    """The article's matmul on `device`, timed the article's way and properly.

    Its record is matmul_<device>.json, with the runtime where a GPU or TPU
    runtime's CPU was timed (matmul_cpu_gpu-runtime.json): not the CPU runtime's.
    """
    from pyimagesearch.training.plan import runtime_suffix  # no TensorFlow

    name = f"matmul_{device}{runtime_suffix(device == 'cpu')}.json"
    run_script(("tools/matmul_benchmark.py", "--device", device, "--warmup", "1",
                "--repeats", "5", "--json", os.path.join(folder, "benchmarks", name)), repo)


def compare(folder, repo="."):
    """Table 1 and comparison.png from every run kept in `folder`."""
    run_script(("compare.py", folder, "--output-dir", folder), repo)


# --- showing what the scripts wrote ------------------------------------------------------

def record_table(record):
    """A run record's numbers, epoch by epoch, as a Markdown table."""
    rows = ["| epoch | loss | val_loss | seconds (with validation) |", "| --- | --- | --- | --- |"]
    for epoch, (loss, val_loss, seconds) in enumerate(
            zip(record["loss"], record["val_loss"], record["epoch_seconds"]), start=1):
        rows.append(f"| {epoch} | {loss:.4f} | {val_loss:.4f} | {seconds:.1f} |")
    return "\n".join(rows)


def written_by(run, folder):
    """(path without suffix, record) of the latest run record in `folder` that `run` wrote.

    A script names its outputs after its flags and the runtime
    (training/plan.py's run_name), so the notebook finds them by the command
    in their records rather than by `run.name`.
    """
    found = []
    for name in os.listdir(folder):
        if name.endswith(".json") and os.path.isfile(os.path.join(folder, name)):
            try:
                with open(os.path.join(folder, name)) as handle:
                    record = json.load(handle)
            except (OSError, ValueError):
                continue
            command = record.get("command") if isinstance(record, dict) else None
            command = command if isinstance(command, list) else None
            # train() appends --output-dir FOLDER to the run's own flags
            if command and command[:len(run.argv) + 2] == [*run.argv, "--output-dir", folder]:
                found.append((str(record.get("started_at", "")), name[:-5], record))
    if not found:
        raise NotebookStop(f"{run.name} left no run record in {folder}")
    _, stem, record = max(found)
    return os.path.join(folder, stem), record


def show_runs(runs, folder):
    """Each run's figure and its record's numbers, inline."""
    from IPython.display import Image, Markdown, display

    for run in runs:
        stem, record = written_by(run, folder)
        display(Markdown(f"**{os.path.basename(stem)}**: {record['replicas']} replica(s), "
                         f"global batch {record['global_batch_size']}, "
                         f"{record['steps_per_epoch']} steps "
                         f"per epoch, data: {record['data_source']}"
                         + (" (a rehearsal on CPU devices)" if record["rehearsal"] else "")))
        display(Markdown(record_table(record)))
        display(Image(filename=stem + ".png", width=320))


def show_comparison(folder):
    """Table 1 and comparison.png, as compare.py wrote them."""
    from IPython.display import Image, Markdown, display

    with open(os.path.join(folder, "comparison.md")) as handle:
        display(Markdown(handle.read()))
    display(Image(filename=os.path.join(folder, "comparison.png")))
