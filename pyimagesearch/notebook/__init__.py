"""What notebook.ipynb's cells cannot hold: the runtime, the runs, the folder, a script's run.

The notebook never imports TensorFlow in its own kernel: on a GPU TensorFlow
would hold the card's memory, and on a TPU it would hold the chips, that the
training scripts need. So the kernel only reads the machine (runtime.py),
installs what the runtime lacks (install.py), picks a folder that outlives
the runtime, runs the scripts as processes (`run_script`) and shows what
they wrote (records.py), and the code they run (listings.py).

A failure stops the notebook with one line (`NotebookStop`): the script's
own line where a script failed. Rerunning a cell is safe: every step checks
what is already done, and the scripts write their outputs whole.
"""
import dataclasses
import os
import signal
import subprocess
import sys
import threading

from pyimagesearch import runtime
from pyimagesearch.runtime import (chooses_backend, detect, hardware, installed_version,
                                   leave_the_tpu_alone, runtime_suffix, tpu_route,
                                   without_our_hold)

DEVICES = ("auto",) + runtime.DEVICES
# {"gpu": 2, "tpu": 8} (runtime.HARDWARE): the article's 8 TPU cores; 2 GPUs, the smallest mirror
REHEARSALS = {device: hardware(device).rehearse for device in runtime.DEVICES
              if hardware(device).rehearse}
DRIVE_MOUNT = "/content/drive"
DRIVE_FOLDER = "MyDrive/fast-training-runs"  # under the mount: survives a change of runtime
KAGGLE_FOLDER = "/kaggle/working/fast-training-runs"
LOCAL_FOLDER = "outputs/notebook"
CHANGE_RUNTIME = {
    "colab": "Runtime > Change runtime type, then pick {kind}",
    "kaggle": "Settings > Accelerator, then pick {kind}",
    "local": "run it on a machine with {kind}",
}
KINDS = {"gpu": "a GPU (T4)", "tpu": "a TPU (v5e)"}
# times the matmul with JAX where train_tpu.py would train on JAX (its choose_framework)
CHOOSES_ITS_FRAMEWORK = "matmul_benchmark.py"


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
    leave_the_tpu_alone(environ)
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
        runs = [Run("cpu", (hardware("cpu").script,) + flags)]
        if host.accelerator == "cpu":
            runs += [_rehearsal(kind, flags, "offered on a runtime without GPU or TPU")
                     for kind in _rehearsed(rehearse)]
        return runs
    if wanted == host.accelerator:
        return [Run(wanted, (hardware(wanted).script,) + flags)]
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
               (hardware(kind).script, "--rehearse", str(REHEARSALS[kind])) + tuple(flags),
               reason)


def jax_route(host, version_of=installed_version):
    """True where train_tpu.py runs Keras on JAX by itself: tpu_route's rule, on what
    this image has installed (a TPU with JAX and no tensorflow-tpu: Colab's and Kaggle's)."""
    return tpu_route({}, host, version_of("jax") is not None,
                     version_of("tensorflow-tpu") is not None) == "jax"


def ipython_display():
    """IPython.display, which shows what the cells show."""
    import IPython.display  # lazy: only a notebook's kernel has IPython

    return IPython.display


def show_markdown(text):
    """Display `text` as Markdown in the notebook."""
    shown = ipython_display()
    shown.display(shown.Markdown(text))


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
            from google.colab import drive  # lazy: only Colab's kernel has it
            mount = drive.mount
        mount(DRIVE_MOUNT)
    except Exception as error:  # a refusal is google.colab's MessageError
        said = [line.strip() for line in str(error).splitlines() if line.strip()]
        reason = said[-1] if said else type(error).__name__
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
    runtime.py), and tools/matmul_benchmark.py its framework the same way;
    the others are TensorFlow's.
    """
    environ = without_our_hold(dict(os.environ))
    if script and (chooses_backend(os.path.basename(script))  # train_tpu.py
                   or os.path.basename(script) == CHOOSES_ITS_FRAMEWORK):
        environ.pop("KERAS_BACKEND", None)  # an image's KERAS_BACKEND=jax is not a choice
    else:  # JAX-first TPU images set KERAS_BACKEND=jax; these scripts are TensorFlow's
        environ["KERAS_BACKEND"] = "tensorflow"
    environ["PYTHONUNBUFFERED"] = "1"
    return environ


def run_script(argv, repo=".", show=None):
    """`python ARGV` in `repo`, its output shown as it comes; NotebookStop with its last line.

    Its lines are written without a flush each: the kernel then sends the
    lines that come together as one message, as a terminal shows them. A
    flush a line made every line an output of its own, which a viewer that
    draws each output as a block showed followed by a blank line. `show`, a
    test on a line of stdout, leaves out the lines it refuses. stderr is
    shown a line late, so that the line a script ends with on a failure
    becomes the stop's one line instead of being shown twice.
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
                print(held.pop(), end="", file=sys.stderr)
            held.append(line)

    relay = threading.Thread(target=relay_stderr, daemon=True)
    relay.start()
    try:
        for line in process.stdout:
            if show is None or show(line):
                print(line, end="")
        status = process.wait()
    except KeyboardInterrupt:
        process.send_signal(signal.SIGINT)
        try:
            status = process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            status = process.wait()
    relay.join(timeout=10)
    sys.stdout.flush()
    last = held.pop().strip() if held else ""
    if status == 0:
        if last:
            print(last, file=sys.stderr)
        sys.stderr.flush()
        return
    sys.stderr.flush()
    raise NotebookStop(last or f"python {' '.join(argv)} ended with exit status {status}")


def matmul_device(host, device="auto"):
    """The device the matmul is timed on: the runtime's, unless the notebook trains elsewhere."""
    return host.accelerator if device in ("auto", host.accelerator) else "cpu"


def matmul_wanted(host, device="auto", setting="auto", version_of=installed_version):
    """Whether to time the matmul here: TIME_MATMUL, "auto" on a GPU or TPU only.

    On a CPU runtime it is the first Run all's dearest minute after the
    training (TensorFlow's start and a 1 GiB operand), and the table shows
    this repository's CPU record beside the article's instead.
    """
    if setting and matmul_device(host, device) == "tpu" and jax_route(host, version_of):
        # tools/matmul_benchmark.py chooses JAX here itself, as train_tpu.py does
        print("[INFO] the matmul is timed with JAX's jax.numpy on this TPU: this image's TPU "
              "is JAX's (tensorflow-cpu, which reads the data, cannot reach it)")
    if setting == "auto":
        return matmul_device(host, device) != "cpu"
    return bool(setting)


def matmul_record(device, folder, host=None, version_of=installed_version):
    """Where the matmul timing on `device` goes: `folder`/benchmarks/matmul_<device>.json.

    A GPU or TPU runtime's CPU gets the runtime in its name
    (matmul_cpu_gpu-runtime.json): its timing is not the CPU runtime's. A TPU
    timed with JAX (`host` a JAX TPU image) gets `_jax`, as its runs do
    (matmul_tpu_jax.json beside a TensorFlow TPU's matmul_tpu.json).
    """
    jax = device == "tpu" and host is not None and jax_route(host, version_of)
    return os.path.join(folder, "benchmarks", f"matmul_{device}{'_jax' if jax else ''}"
                                              f"{runtime_suffix(device == 'cpu')}.json")


def say_tpu_cores(host):
    """Print tpu_line(host), where there is one."""
    line = tpu_line(host)
    if line:
        print(line)


def tpu_line(host, article_cores=8):
    """One line where this TPU has fewer cores than the article's; '' otherwise.

    TensorFlow makes a replica of each core: 2 a chip on v2 and v3, 1 on later chips.
    """
    cores = host.tpu_chips * (2 if host.tpu_generation in ("v2", "v3") else 1)
    if host.accelerator != "tpu" or cores >= article_cores:
        return ""
    return (f"[INFO] this TPU has {cores} core(s), the article's had {article_cores}: "
            f"train_tpu.py runs {cores} replica(s), so the global batch of 1024 is split "
            f"{cores} way(s), not {article_cores}; the article's {article_cores}-way data "
            "parallelism (each core a 128-image share, the gradients summed across cores) is "
            "not run here. The 58 steps per epoch and their blur are the same.")
