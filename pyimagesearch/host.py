"""This machine, read without TensorFlow: its notebook service, GPUs and TPU chips, its network.

TensorFlow must not be imported to find out: on a TPU its import can take the
chips, and a TPU v5e or v6e needs its runtime chosen before the import
(tpu.py). So this module reads files and environment variables, as Google's
and NVIDIA's own tools do; `root` stands in for / in tests (a process started
with PYIMAGESEARCH_HOST_ROOT=FOLDER reads its machine from FOLDER).

`prepare_tensorflow` is the first call of train_cpu.py, train_gpu.py and the
tools: what the process sets before TensorFlow loads.
"""
import dataclasses
import glob
import importlib.metadata
import importlib.util
import os
import socket
import sys
import threading
import time
import urllib.error
import urllib.request


GOOGLE_PCI_VENDOR = "0x1ae0"
# PCI device id -> TPU generation, as JAX's jax/_src/hardware_utils.py has them
TPU_GENERATIONS = {"0x0027": "v2/v3", "0x005e": "v4", "0x0062": "v5p", "0x0063": "v5e",
                   "0x006f": "v6e", "0x0076": "7x"}
VFIO_GENERATION = "v5e or later"  # chips seen only as /dev/vfio/N (a container)
# generations TensorFlow reaches only through its PJRT runtime (tpu.py)
PJRT_ONLY = frozenset({"v5p", "v5e", "v6e", "7x", VFIO_GENERATION})
ROOT_ENV = "PYIMAGESEARCH_HOST_ROOT"
JAX_TPU_SERVICES = ("colab", "kaggle")  # TPU images of JAX: jax[tpu], no tensorflow-tpu
# each TensorFlow build installs the same `tensorflow` folder: two of them overwrite each other
TENSORFLOW_BUILDS = ("tensorflow", "tensorflow-cpu", "tensorflow-gpu", "tensorflow-tpu")


@dataclasses.dataclass(frozen=True)
class Host:
    """This machine as a notebook or a training script needs to know it."""

    service: str          # "colab", "kaggle" or "local"
    gpus: int             # NVIDIA GPUs the driver shows
    tpu_chips: int        # TPU chips on this machine
    tpu_generation: str   # "v5e", "v4", ...; "" without a TPU

    @property
    def accelerator(self):
        """"tpu", "gpu" or "cpu": what this runtime trains on."""
        return "tpu" if self.tpu_chips else "gpu" if self.gpus else "cpu"

    @property
    def needs_pjrt(self):
        """True if TensorFlow reaches this machine's TPU only through its PJRT runtime."""
        return bool(self.tpu_chips) and self.tpu_generation in PJRT_ONLY

    @property
    def jax_tpu_image(self):
        """True on a Colab or Kaggle TPU, where Keras on JAX is the route to the chips."""
        return bool(self.tpu_chips) and self.service in JAX_TPU_SERVICES

    def describe(self):
        """One phrase: 'Colab, 1 TPU v5e chip', 'this machine, no GPU or TPU'."""
        place = {"colab": "Colab", "kaggle": "Kaggle", "local": "this machine"}[self.service]
        if self.tpu_chips:
            return (f"{place}, {self.tpu_chips} TPU {self.tpu_generation} "
                    f"chip{'s' if self.tpu_chips > 1 else ''}")
        if self.gpus:
            return f"{place}, {self.gpus} GPU{'s' if self.gpus > 1 else ''}"
        return f"{place}, no GPU or TPU"


def _read(path):
    """A small text file's content, stripped; '' if it cannot be read."""
    try:
        with open(path, encoding="ascii", errors="replace") as handle:
            return handle.read(64).strip()
    except OSError:
        return ""


def tpu_chips(root="/"):
    """(chips, generation) of this machine's TPU: Google's PCI devices, else the device files."""
    found = [TPU_GENERATIONS[_read(os.path.join(os.path.dirname(vendor), "device"))]
             for vendor in glob.glob(os.path.join(root, "sys/bus/pci/devices/*/vendor"))
             if _read(vendor) == GOOGLE_PCI_VENDOR
             and _read(os.path.join(os.path.dirname(vendor), "device")) in TPU_GENERATIONS]
    if found:
        return len(found), found[0]
    vfio = glob.glob(os.path.join(root, "dev/vfio/[0-9]*"))  # v5e and later in a container
    if vfio:
        return len(vfio), VFIO_GENERATION
    accel = glob.glob(os.path.join(root, "dev/accel[0-9]*"))  # v2 to v4
    return (len(accel), "v2-v4") if accel else (0, "")


def gpu_count(root="/"):
    """NVIDIA GPUs: their device files, or 1 if only the driver shows."""
    devices = glob.glob(os.path.join(root, "dev/nvidia[0-9]*"))
    if devices:
        return len(devices)
    return 1 if os.path.exists(os.path.join(root, "proc/driver/nvidia/version")) else 0


def service(root="/", environ=None, modules=None):
    """"kaggle", "colab" or "local"; Kaggle first, since its images are built on Colab's."""
    environ = os.environ if environ is None else environ
    if environ.get("KAGGLE_KERNEL_RUN_TYPE") or os.path.isdir(os.path.join(root, "kaggle/working")):
        return "kaggle"
    return "colab" if "google.colab" in (sys.modules if modules is None else modules) else "local"


def detect(root=None, environ=None, modules=None):
    """The Host this process runs on (root None: / or $PYIMAGESEARCH_HOST_ROOT)."""
    environ = os.environ if environ is None else environ
    root = root or environ.get(ROOT_ENV) or "/"
    chips, generation = tpu_chips(root)
    return Host(service(root, environ, modules), gpu_count(root), chips, generation)


def installed(module):
    """True if `module` can be imported (found, not imported)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def installed_version(distribution):
    """The installed version of `distribution`, or None."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def tensorflow_builds():
    """'tensorflow-cpu 2.20.0': each TensorFlow build installed, or 'tensorflow not installed'."""
    return ", ".join(f"{name} {installed_version(name)}" for name in TENSORFLOW_BUILDS
                     if installed_version(name)) or "tensorflow not installed"


def requirements_file(host, route="tensorflow"):
    """The requirements file that brings what a run on `host` by `route` needs: Colab's and
    Kaggle's TPU images lack little, a Cloud TPU VM's Python 3.10 everything."""
    if host.jax_tpu_image:  # its TensorFlow route is refused: JAX is the way there
        return "requirements-jax-tpu.txt"
    if host.tpu_chips:
        return "requirements-tpu-vm.txt" if route == "jax" else "requirements-tpu.txt"
    return "requirements.txt"


def missing(route, host=None, found=installed):
    """One line naming what a run by `route` lacks and the install that brings it; '' if none.

    `route` is "tensorflow" or "jax" (tf.data reads the digits on both).
    """
    names = ["tensorflow", "keras", "matplotlib"]
    lacking = [name for name in names + (["jax"] if route == "jax" else []) if not found(name)]
    if not lacking:
        return ""
    host = detect() if host is None else host
    wanted = requirements_file(host, route)
    with_jax = wanted == "requirements-tpu-vm.txt"  # the one file that installs jax
    installs = [f"pip install -r {wanted}"] if lacking != ["jax"] or with_jax else []
    if "jax" in lacking and not with_jax:
        installs.append('pip install "jax[tpu]"' if host.tpu_chips else "pip install jax")
    why = (" (tf.data reads the digits, on Keras' JAX backend too)"
           if route == "jax" and "tensorflow" in lacking else "")
    names = ", ".join(lacking[:-1]) + " and " * (len(lacking) > 1) + lacking[-1]
    return (f"{names} {'is' if len(lacking) == 1 else 'are'} not installed{why}: "
            f"{' and '.join(installs)}")


def probe(url, timeout):
    """How `url` answers, as a download would ask it: "answers", "refused" or "silent".

    urllib goes through HTTPS_PROXY unless NO_PROXY exempts the host, as tfds'
    downloads do; any HTTP status is an answer. In a daemon thread, so that a
    DNS lookup that hangs cannot hold the run past `timeout` seconds either.
    """
    verdict = []

    def ask():
        try:
            # a new opener: its ProxyHandler reads the proxy variables as they are now
            urllib.request.build_opener().open(url, timeout=timeout).close()
            verdict.append("answers")
        except urllib.error.HTTPError as error:  # a server that says no still answers
            verdict.append("refused" if error.code == 407 else "answers")  # not the proxy
        except (urllib.error.URLError, OSError, ValueError) as error:
            late = isinstance(getattr(error, "reason", error), TimeoutError)
            verdict.append("silent" if late else "refused")

    thread = threading.Thread(target=ask, daemon=True)
    thread.start()
    thread.join(timeout)
    return verdict[0] if verdict else "silent"


def answers(address, timeout_s=1.0):
    """Whether "host:port" (an IPv6 host in brackets or not) takes a TCP connection."""
    host, _, port = address.rpartition(":")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
        return True
    except (OSError, ValueError):
        return False


def silent_after(addresses, timeout_s, waiting=None, poll_s=0.5):
    """Poll {name: "host:port"} until each has answered once; those still silent after
    `timeout_s`, {} once all have. Signals act between polls; `waiting(names)` is called
    once, the first time some are silent and time is left."""
    deadline, silent, told = time.monotonic() + timeout_s, dict(addresses), False
    while silent := {name: a for name, a in silent.items() if not answers(a)}:
        if time.monotonic() >= deadline:
            return silent
        if waiting and not told:
            waiting(list(silent))
            told = True
        time.sleep(poll_s)  # SIGTERM and Ctrl-C act here
    return {}


def stop(message, status=2):
    """End this process before any training as the scripts end a user's error."""
    print(f"{os.path.basename(sys.argv[0]) or 'python'}: error: {message}", file=sys.stderr)
    raise SystemExit(status)


def open_closed_streams():
    """/dev/null on fds 0, 1 and 2 where the caller closed them (`python train_cpu.py >&-`).

    A closed fd is the lowest free number: the next file opened (a checkpoint,
    a record) would take it and receive whatever is printed into it.
    """
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, os.O_RDWR)
            if null != fd:
                os.dup2(null, fd)
                os.close(null)


def leave_the_tpu_alone(environ):
    """TPU_LOAD_LIBRARY=0 unless the user set it: tensorflow-tpu's import then takes no TPU.

    tensorflow-tpu opens libtpu and takes its lock at import, in any process; a
    rehearsal, compare.py or TensorBoard would hold the chips the TPU run needs
    (tensorflow/tensorflow#61293, closed unfixed; still so in 2.19.1).
    PYIMAGESEARCH_TPU_HOLD says the 0 is ours, which tpu.prepare takes out again.
    """
    if "TPU_LOAD_LIBRARY" not in environ:
        environ["TPU_LOAD_LIBRARY"] = environ["PYIMAGESEARCH_TPU_HOLD"] = "0"


def prepare_tensorflow(environ=None):
    """The first call of train_cpu.py, train_gpu.py and the tools, before TensorFlow loads.

    Closed standard streams get /dev/null; TF_CPP_MIN_LOG_LEVEL=1 unless set
    (TensorFlow's C++ INFO lines left out); the TPU left alone; Keras on
    TensorFlow (one line if the environment asked for another backend); a
    missing package is one line and status 2.
    """
    environ = os.environ if environ is None else environ
    open_closed_streams()
    environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    leave_the_tpu_alone(environ)
    asked = environ.get("KERAS_BACKEND", "tensorflow")
    if asked != "tensorflow":
        print(f"[INFO] KERAS_BACKEND={asked} set aside: this code runs Keras on TensorFlow",
              file=sys.stderr)
    environ["KERAS_BACKEND"] = "tensorflow"
    keras = sys.modules.get("keras")
    if keras is not None and keras.backend.backend() != "tensorflow":
        stop(f"Keras was imported on {keras.backend.backend()} already: start a new process")
    lacking = missing("tensorflow")
    if lacking:
        stop(lacking)

