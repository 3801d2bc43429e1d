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
import signal
import subprocess
import sys
import threading

from pyimagesearch.platforms.host import detect

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
    """The Host, after checking `device`: what the notebook will train on."""
    if device not in DEVICES:
        raise NotebookStop(f"DEVICE is {device!r}; choose one of {', '.join(DEVICES)}")
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


def install_commands(host, repo=".", version_of=_installed_version):
    """The pip commands that bring what this runtime lacks; [] if nothing is missing.

    A TPU gets requirements-tpu.txt (tensorflow-tpu, after removing another
    TensorFlow build that would share its files: Kaggle's TPU image has
    tensorflow-cpu). A GPU keeps the runtime's own TensorFlow when it fits
    requirements.txt; otherwise it gets tensorflow[and-cuda], as TensorFlow's
    install guide says for Linux, so that it finds the GPU.
    """
    pip = (sys.executable, "-m", "pip", "install", "-q")
    if host.accelerator == "tpu":
        path = os.path.join(repo, "requirements-tpu.txt")
        unmet = _unmet(_requirements(path), version_of)
        if not unmet:
            return []
        commands = []
        others = [name for name in ("tensorflow", "tensorflow-cpu")
                  if version_of(name) is not None]
        if any(spec.startswith("tensorflow-tpu") for spec in unmet) and others:
            commands.append((sys.executable, "-m", "pip", "uninstall", "-q", "-y", *others))
        return commands + [pip + ("-r", path)]
    unmet = _unmet(_requirements(os.path.join(repo, "requirements.txt")), version_of)
    if host.accelerator == "gpu":
        unmet = [TENSORFLOW.replace("tensorflow", "tensorflow[and-cuda]", 1)
                 if spec == TENSORFLOW else spec for spec in unmet]
    return [pip + tuple(unmet)] if unmet else []


def install_missing(host, repo="."):
    """Run install_commands(host); one line if pip fails (no network, most often)."""
    commands = install_commands(host, repo)
    if not commands:
        print("[INFO] this runtime has every package the scripts need")
        return
    for command in commands:
        print("[INFO] $ " + " ".join(command[1:]))
        result = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
        if result.returncode:
            last = _last_line(result.stderr) or f"exit status {result.returncode}"
            internet = (" (on Kaggle, switch Internet on in the notebook's settings)"
                        if host.service == "kaggle" else "")
            raise NotebookStop(f"pip could not install what this runtime lacks: {last}; "
                               f"is there a network{internet}?")


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
    """The environment a script runs in: TensorFlow's Keras, output as it comes."""
    environ = dict(os.environ)
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
