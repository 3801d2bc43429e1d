"""What this machine is, read without TensorFlow: the notebook service, the GPUs, the TPU chips.

TensorFlow must not be imported to find out: on a TPU, loading it can
claim the chips before the training script does, and a TPU v5e or v6e
needs TensorFlow's runtime chosen before the import (tpu_runtime.py). So
everything here reads files and environment variables, the way Google's
and NVIDIA's own tools do:

- TPU chips are PCI devices of Google (vendor 0x1ae0); the device id says
  the generation (the table JAX keeps in jax/_src/hardware_utils.py). Where
  /sys is not readable, the chips' device files stand in: /dev/accelN on
  v2 to v4, /dev/vfio/N on v5e and later (tpu-info's device.py).
- A GPU is an NVIDIA driver that is loaded (/proc/driver/nvidia/version,
  what Kaggle's image tests check) or its device file /dev/nvidia0.
- Kaggle first (KAGGLE_KERNEL_RUN_TYPE, /kaggle/working), then Colab
  (google.colab imported by the kernel): Kaggle's images are built on
  Colab's, so Colab's variables show up on Kaggle too.

Every function takes `root` and `environ`, so tests can describe a v5e or
a Kaggle GPU runtime with a folder of stand-in files; a process started
with PYIMAGESEARCH_HOST_ROOT=FOLDER reads its machine from that folder
instead of / (how the tests start train_tpu.py on a stand-in v5e).

Also here: whether a host on the internet answers (no TensorFlow); what a
process sets up before TensorFlow loads; which Keras backend a script runs on.
"""
import base64
import dataclasses
import glob
import importlib.metadata
import importlib.util
import os
import re
import socket
import ssl
import sys
import threading
import urllib.parse
import urllib.request

from pyimagesearch.errors import UserError
from pyimagesearch.terminal import (TENSORFLOW_BUILDS, VERBOSE_ENV, open_closed_standard_streams,
                                    quiet_tensorflow_import)


GOOGLE_PCI_VENDOR = "0x1ae0"
# PCI device id -> TPU generation (jax/_src/hardware_utils.py)
TPU_GENERATIONS = {"0x0027": "v2/v3", "0x005e": "v4", "0x0062": "v5p", "0x0063": "v5e",
                   "0x006f": "v6e", "0x0076": "7x"}
# generations whose chips TensorFlow reaches only through its PJRT runtime
# (see tpu_runtime.py); the older ones use the runtime TensorFlow loads itself
ROOT_ENV = "PYIMAGESEARCH_HOST_ROOT"  # stand-in files in place of /, for tests
PJRT_ONLY = {"v5p", "v5e", "v6e", "7x", "v5e or later"}
VFIO_GENERATION = "v5e or later"  # chips seen only as /dev/vfio/N
ACCEL_GENERATION = "v2-v4"        # chips seen only as /dev/accelN


@dataclasses.dataclass(frozen=True)
class Host:
    """This machine as a notebook or a training script needs to know it."""

    service: str          # "colab", "kaggle" or "local"
    gpus: int             # NVIDIA GPUs the driver shows (0: none, or not known)
    tpu_chips: int        # TPU chips on this machine
    tpu_generation: str   # "v5e", "v4", ..., or VFIO_GENERATION; "" without a TPU

    @property
    def accelerator(self):
        """"tpu", "gpu" or "cpu": what this runtime trains on."""
        if self.tpu_chips:
            return "tpu"
        return "gpu" if self.gpus else "cpu"

    @property
    def needs_pjrt(self):
        """True if TensorFlow can reach this machine's TPU only through its PJRT runtime."""
        return bool(self.tpu_chips) and self.tpu_generation in PJRT_ONLY

    def describe(self):
        """One phrase: 'Colab, 1 TPU v5e chip', 'local, no GPU or TPU'."""
        place = {"colab": "Colab", "kaggle": "Kaggle", "local": "this machine"}[self.service]
        if self.tpu_chips:
            chips = "chip" if self.tpu_chips == 1 else "chips"
            return f"{place}, {self.tpu_chips} TPU {self.tpu_generation} {chips}"
        if self.gpus:
            return f"{place}, {self.gpus} GPU{'s' if self.gpus > 1 else ''}"
        return f"{place}, no GPU or TPU"


# --- The hardware table: each device and route, its script and what stands behind it ----------
@dataclasses.dataclass(frozen=True)
class Hardware:
    """One route to train: a device on one Keras backend, and the facts the package reads of it."""

    device: str         # "cpu", "gpu" or "tpu": the plan's and the record's device
    backend: str        # Keras' backend: "tensorflow" or "jax"
    script: str         # the script that trains on it
    strategy: str       # what builds the strategy (strategies.py's functions, TensorFlow's)
    figure: str         # config's name of the figure path; its file's stem starts run names
    requirements: str   # the file a notebook runtime with this device installs from
    rehearse: object    # logical CPU devices of the notebook's rehearsal; None: not rehearsed
    checks: str         # what the run checks before training
    tag: str = ""       # the run name's part for this backend ("jax": runs named apart)
    # config's names of the batch and the steps per epoch the script's listing reads;
    # whole_epochs: the TPU's way, a global batch (--batch-size), a whole epoch per call
    # into the device and validation in full batches of a fixed count; else the batch
    # is per replica and the global batch grows with the replicas
    batch: str = "BATCH_SIZE"
    steps: str = "STEPS_PER_EPOCH"
    whole_epochs: bool = False


HARDWARE = {  # the article's order: CPU, GPU, TPU; TensorFlow's route of a device first
    "cpu": Hardware("cpu", "tensorflow", "train_cpu.py",
                    "cpu_only, then TensorFlow's default strategy", "CPU_IMG_PATH",
                    "requirements.txt", None, "any GPU hidden (cpu_only)"),
    "gpu": Hardware("gpu", "tensorflow", "train_gpu.py",
                    "check_gpus, then MirroredStrategy; multi_worker under TF_CONFIG",
                    "GPU_IMG_PATH", "requirements.txt", 2,
                    "a GPU TensorFlow can use (check_gpus); a cluster's peers (multi_worker)"),
    "tpu": Hardware("tpu", "tensorflow", "train_tpu.py",
                    "TPUClusterResolver and TPUStrategy inside tpu_errors", "TPU_IMG_PATH",
                    "requirements-tpu.txt", 8,
                    "the TPU's runtime chosen (tpu_runtime.prepare), the TPU found (tpu_errors)",
                    batch="TPU_BATCH_SIZE", steps="TPU_STEPS_PER_EPOCH", whole_epochs=True),
    "tpu_jax": Hardware("tpu", "jax", "train_tpu.py", "data_parallel (Keras' DataParallel)",
                        "TPU_IMG_PATH", "requirements-jax-tpu.txt", 8,
                        "the route (tpu_route), JAX's devices are TPUs (jax_route.strategy)",
                        tag="jax", batch="TPU_BATCH_SIZE", steps="TPU_STEPS_PER_EPOCH",
                        whole_epochs=True),
}
DEVICES = tuple(dict.fromkeys(row.device for row in HARDWARE.values()))  # cpu, gpu, tpu
SCRIPTS = tuple(dict.fromkeys(row.script for row in HARDWARE.values()))


def hardware(device, backend="tensorflow"):
    """The row of HARDWARE for `device` ("cpu", "gpu", "tpu") on Keras' `backend`."""
    for row in HARDWARE.values():
        if (row.device, row.backend) == (device, backend):
            return row
    raise KeyError(f"no route for {device!r} on {backend!r}")


def chooses_backend(script):
    """True if `script` has routes on more than one Keras backend (train_tpu.py)."""
    return len({row.backend for row in HARDWARE.values() if row.script == script}) > 1


def _read(path):
    """A small text file's content, stripped; '' if it cannot be read."""
    try:
        with open(path, encoding="ascii", errors="replace") as handle:
            return handle.read(64).strip()
    except OSError:
        return ""


def tpu_chips(root="/"):
    """(chips, generation) of the TPU on this machine; (0, '') without one."""
    found = []
    for vendor in glob.glob(os.path.join(root, "sys/bus/pci/devices/*/vendor")):
        if _read(vendor) == GOOGLE_PCI_VENDOR:
            device = _read(os.path.join(os.path.dirname(vendor), "device"))
            if device in TPU_GENERATIONS:
                found.append(TPU_GENERATIONS[device])
    if found:
        return len(found), found[0]
    # no readable /sys (a container): the chips' device files
    vfio = glob.glob(os.path.join(root, "dev/vfio/[0-9]*"))
    if vfio:
        return len(vfio), VFIO_GENERATION
    accel = glob.glob(os.path.join(root, "dev/accel[0-9]*"))
    if accel:
        return len(accel), ACCEL_GENERATION
    return 0, ""


def gpu_count(root="/"):
    """NVIDIA GPUs on this machine: their device files, or 1 if only the driver shows."""
    devices = glob.glob(os.path.join(root, "dev/nvidia[0-9]*"))
    if devices:
        return len(devices)
    return 1 if os.path.exists(os.path.join(root, "proc/driver/nvidia/version")) else 0


def service(root="/", environ=None, modules=None):
    """"kaggle", "colab" or "local": which notebook service this process runs in."""
    environ = os.environ if environ is None else environ
    modules = sys.modules if modules is None else modules
    if environ.get("KAGGLE_KERNEL_RUN_TYPE") or os.path.isdir(os.path.join(root, "kaggle/working")):
        return "kaggle"
    if "google.colab" in modules:
        return "colab"
    return "local"


def detect(root=None, environ=None, modules=None):
    """The Host this process runs on (root None: / or $PYIMAGESEARCH_HOST_ROOT)."""
    if root is None:
        root = (os.environ if environ is None else environ).get(ROOT_ENV) or "/"
    chips, generation = tpu_chips(root)
    return Host(service=service(root, environ, modules), gpus=gpu_count(root),
                tpu_chips=chips, tpu_generation=generation)


def installed_version(package):
    """The version of distribution `package` installed here, or None."""
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def tensorflow_builds(version_of=installed_version):
    """'tensorflow-cpu 2.20.0': each TensorFlow build installed; 'tensorflow not installed'."""
    return ", ".join(f"{name} {version_of(name)}" for name in TENSORFLOW_BUILDS
                     if version_of(name)) or "tensorflow not installed"


def runtime_suffix(on_cpu, runtime=None):
    """"_gpu-runtime" for work done on the CPU of a GPU (or TPU) runtime; "" elsewhere.

    Such a CPU is not the CPU runtime's: its run, or its matmul timing, must
    not replace theirs.
    """
    runtime = runtime or this_runtime()
    return f"_{runtime}-runtime" if on_cpu and runtime != "cpu" else ""


def this_runtime():
    """What this machine trains on, "cpu", "gpu" or "tpu", read without TensorFlow."""
    return detect().accelerator


# --- Whether a host on the internet answers, asked as a download would ask it; no TensorFlow ---
# `pyimagesearch.datasets.sources` asks before `auto` picks tfds (its host is
# Google's bucket); the notebook asks before it uninstalls anything for pip
# (the package index's host).


ANSWERS, REFUSED, SILENT = "answers", "refused", "silent"  # what the probe can find


def probe(address, timeout, environ=os.environ):
    """How `address` (host, port) answers: {"verdict": ANSWERS | REFUSED | SILENT, "via": ...}.

    "via" says what was asked: host:port, or the proxy.

    As `requests` does (tfds' downloads, pip), it goes through the proxy that
    HTTPS_PROXY names unless NO_PROXY exempts the host: a CONNECT there that
    the proxy must accept. REFUSED is a definite no (no route, no name, a
    refused connection, a proxy that says no); SILENT is no answer within
    `timeout` seconds, which a slow link can give too. Runs in a daemon
    thread so that a hanging DNS lookup cannot hold us past the timeout either.
    """
    host, port = address
    proxy = environ.get("https_proxy") or environ.get("HTTPS_PROXY")
    exempt = environ.get("no_proxy") or environ.get("NO_PROXY")
    if proxy and exempt and urllib.request.proxy_bypass_environment(host, {"no": exempt}):
        proxy = None
    via = f"the proxy {_without_password(proxy)}" if proxy else f"{host}:{port}"
    result = []

    def ask():
        try:
            if proxy:
                result.append(_through_proxy(proxy, host, port, timeout))
            else:
                socket.create_connection(address, timeout=timeout).close()
                result.append(ANSWERS)
        except socket.timeout:
            result.append(SILENT)
        except (OSError, ValueError):  # no name, no route, refused; a proxy URL we cannot read
            result.append(REFUSED)

    thread = threading.Thread(target=ask, daemon=True)
    thread.start()
    thread.join(timeout)
    return {"verdict": result[0] if result else SILENT, "via": via}


def _without_password(url):
    """A proxy URL fit to print: user:password@ taken out."""
    return re.sub(r"//[^/@]*@", "//", url)


def _through_proxy(proxy, host, port, timeout):
    """ANSWERS if the HTTP proxy at `proxy` opens a tunnel to host:port, else REFUSED."""
    parts = urllib.parse.urlsplit(proxy if "://" in proxy else f"http://{proxy}")
    tunnel = socket.create_connection(
        (parts.hostname, parts.port or (443 if parts.scheme == "https" else 80)),
        timeout=timeout)
    with tunnel:
        if parts.scheme == "https":
            tunnel = ssl.create_default_context().wrap_socket(tunnel,
                                                              server_hostname=parts.hostname)
        ask = f"CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\n"
        if parts.username:
            secret = f"{urllib.parse.unquote(parts.username)}:" \
                     f"{urllib.parse.unquote(parts.password or '')}"
            ask += f"Proxy-Authorization: Basic {base64.b64encode(secret.encode()).decode()}\r\n"
        tunnel.sendall((ask + "\r\n").encode())
        status = tunnel.recv(1024).split(b"\r\n", 1)[0].split()
    return ANSWERS if len(status) > 1 and status[1] == b"200" else REFUSED


# "0": TensorFlow's loader (and libtpu's, under PJRT) refuses to load libtpu,
# so the import takes no lock and initialises nothing; "1": loads it without
# the lock. Read by TryAcquireTpuLock (xla/stream_executor/tpu/tpu_initialize_util.cc),
# which tensorflow-tpu's import calls (tensorflow/core/tpu/tpu_api_dlsym_initializer.cc)

# --- What a process of this repository sets up before TensorFlow loads: one explicit call -----
# Importing `pyimagesearch` changes nothing. Each script and tool makes one marked call
# first, before TensorFlow or Keras loads: `runtime.tensorflow()` (train_cpu.py,
# train_gpu.py, compare.py, the tools) or `tpu_runtime.prepare(argv)` (train_tpu.py).
# Both start with `process()`: a closed stdin, stdout or stderr gets /dev/null (no file
# opened later takes its number); TF_CPP_MIN_LOG_LEVEL=1 unless set (TensorFlow's C++
# INFO lines left out; PYIMAGESEARCH_VERBOSE_TF keeps everything); TensorFlow's first
# import keeps its start-up notices off the terminal (terminal.py's import hook); and
# TPU_LOAD_LIBRARY=0 unless set (`leave_the_tpu_alone`): tensorflow-tpu's import takes
# the TPU's lock in any process, so a rehearsal, compare.py or TensorBoard would hold the
# chips the TPU run needs; the TPU run and Keras on JAX take it back out (prepare).
LOAD_LIBRARY = "TPU_LOAD_LIBRARY"
OURS = "PYIMAGESEARCH_TPU_LOAD_LIBRARY"  # "0": the TPU_LOAD_LIBRARY=0 beside it is this package's


@dataclasses.dataclass
class ProcessRecord:
    """What this process did that a later step must know: the module's one state."""

    tpu_runtime: str | None = None  # what tpu_runtime.prepare did, in words; None: not called
    # the folders files.publish put new outputs in (exits.py's last line says so)
    published: list = dataclasses.field(default_factory=list)
    noise_filter: object = None  # the collective-noise filter: strategies.py to exits.py


this_process = ProcessRecord()


def process(environ=None):
    """This process's set-up before TensorFlow's import (the module's docstring says what)."""
    environ = os.environ if environ is None else environ
    open_closed_standard_streams()
    if not environ.get(VERBOSE_ENV):
        environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    leave_the_tpu_alone(environ)
    quiet_tensorflow_import()


def leave_the_tpu_alone(environ=None):
    """TPU_LOAD_LIBRARY=0 in `environ` (os.environ), unless the user set it: TensorFlow's import
    (and every process started from here) then leaves the TPU alone; `prepare` undoes it.

    Cheap and harmless without tensorflow-tpu: only its TPU loader and
    libtpu read the variable.

    Upstream: tensorflow/tensorflow#61293 (TensorFlow cannot be told to hide
    a TPU; closed unfixed). Needed until tensorflow-tpu stops initialising
    the TPU on import; still so in 2.19.1, whose loader reads the variable.
    """
    environ = os.environ if environ is None else environ
    if LOAD_LIBRARY not in environ:
        environ[LOAD_LIBRARY] = environ[OURS] = "0"


def without_our_hold(environ):
    """`environ` without the TPU_LOAD_LIBRARY=0 of `leave_the_tpu_alone`; the user's own stays."""
    if environ.pop(OURS, None) is not None and environ.get(LOAD_LIBRARY) == "0":
        del environ[LOAD_LIBRARY]
    return environ


# --- Which Keras backend a script runs on, chosen before Keras is imported --------------------
# Keras 3 reads KERAS_BACKEND once, at its first import. train_cpu.py, train_gpu.py and
# the tools are TensorFlow's: `tensorflow()` sets the variable for them (one line when the
# environment asked for another), after `process()`. train_tpu.py has two routes, and
# `tpu_runtime.prepare` picks one with `tpu_route`: "jax", Keras on JAX (DataParallel over
# the chips: what Colab's and Kaggle's TPU images are built for), or "tensorflow", the
# article's TPUStrategy (tensorflow-tpu 2.19.1 on a Cloud TPU VM: docs/tpus.md).
# KERAS_BACKEND chooses; unset, a TPU machine with JAX and without tensorflow-tpu takes
# "jax", anything else "tensorflow". Nothing here imports Keras, JAX or TensorFlow.


ENV = "KERAS_BACKEND"
ROUTES = ("tensorflow", "jax")
JAX_DEVICES_ENV = "JAX_NUM_CPU_DEVICES"  # N CPU devices; read by jax 0.5.1 and later
JAX_PLATFORMS_ENV = "JAX_PLATFORMS"


def tensorflow(environ=None):
    """This process's set-up (process), and KERAS_BACKEND=tensorflow, said in one
    line if another backend was asked for: the first call of every script and tool but
    train_tpu.py. `environ`: a stand-in for tests, which then gets the variable only."""
    if environ is None:
        lacking = missing("tensorflow")  # asked first: process()'s quiet import answers once
        process()
        if lacking:  # before any import of them: one line, not a traceback
            stop(lacking)
    environ = os.environ if environ is None else environ
    asked = environ.get(ENV, "tensorflow")
    if asked != "tensorflow":
        print(f"[INFO] {ENV}={asked} set aside: this code runs Keras on TensorFlow",
              file=sys.stderr)
    environ[ENV] = "tensorflow"
    _check_keras_not_loaded("tensorflow", environ)


def installed(module):
    """True if `module` can be imported (found without importing it)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def tensorflow_tpu_installed():
    """True if tensorflow-tpu (not tensorflow-cpu) is installed: it can load libtpu."""
    return installed_version("tensorflow-tpu") is not None


def tpu_route(environ, host, jax_installed=None, tf_tpu_installed=None):
    """"jax" or "tensorflow": the route train_tpu.py takes; KERAS_BACKEND=jax set for JAX's.

    `host`: platforms.host.Host; the two flags stand in for what is installed.
    A KERAS_BACKEND of another backend (torch, numpy) is refused in one line.
    """
    asked = environ.get(ENV)
    if asked is None:
        jax_installed = installed("jax") if jax_installed is None else jax_installed
        tf_tpu_installed = (tensorflow_tpu_installed() if tf_tpu_installed is None
                            else tf_tpu_installed)
        asked = "jax" if host.tpu_chips and jax_installed and not tf_tpu_installed \
            else "tensorflow"
    if asked not in ROUTES:
        raise UserError(f"train_tpu.py runs Keras on TensorFlow or on JAX, not {ENV}={asked}; "
                        f"set {ENV}=jax" + ("" if jax_tpu_image(host) else f" or {ENV}=tensorflow"))
    if asked == "jax" or ENV in environ:  # unset, Keras' own default is TensorFlow
        environ[ENV] = asked
    _check_keras_not_loaded(asked, environ)
    return asked


def rehearse_on_jax(environ, devices):
    """N JAX CPU devices for a rehearsal, set before JAX starts: JAX_NUM_CPU_DEVICES. The
    reader's own stays if it gives at least N (jax_route.strategy takes the first N); fewer,
    or not a count (jax 0.7.2's config.int_state fails on it at import), is refused."""
    own = environ.get(JAX_DEVICES_ENV)
    if own is not None and not (own.strip().isdigit() and int(own) >= devices):
        raise UserError(f"{JAX_DEVICES_ENV}={own} in your environment and --rehearse {devices} "
                        f"disagree: unset {JAX_DEVICES_ENV}, or set it to {devices}")
    environ[JAX_PLATFORMS_ENV] = "cpu"
    environ.setdefault(JAX_DEVICES_ENV, str(devices))


# --- What a run lacks; where Keras on JAX is the TPU's only route ------------------------------
# Colab's and Kaggle's TPU images are JAX's (jax[tpu], its libtpu; no tensorflow-tpu)
JAX_TPU_SERVICES = ("colab", "kaggle")


def jax_tpu_image(host):
    """True on a Colab or Kaggle TPU: Keras on JAX is the route that reaches its chips."""
    return bool(host.tpu_chips) and host.service in JAX_TPU_SERVICES


def requirements_file(host, route="tensorflow"):
    """The requirements file that brings what a run on `host` by `route` needs (HARDWARE's)."""
    backend = "jax" if jax_tpu_image(host) or (route == "jax" and host.tpu_chips) else "tensorflow"
    return hardware(host.accelerator, backend).requirements


def missing(route, host=None, found=installed):
    """One line: what a run by `route` lacks (found by find_spec, not imported) and the
    install that brings it on `host` (None: this machine); '' if nothing is missing."""
    lacking = [name for name in ("tensorflow", "keras") + (("jax",) if route == "jax" else ())
               if not found(name)]
    if not lacking:
        return ""
    host = detect() if host is None else host
    installs = [f"pip install -r {requirements_file(host, route)}"] if lacking != ["jax"] else []
    if "jax" in lacking:  # no requirements file but -dev's names it
        installs.append('pip install "jax[tpu]"' if host.tpu_chips else "pip install jax")
    why = " (tf.data reads the digits, on Keras' JAX backend too)" if (
        route == "jax" and "tensorflow" in lacking) else ""
    return (f"{' and '.join(lacking)} {'is' if len(lacking) == 1 else 'are'} not installed"
            f"{why}: {' and '.join(installs)}")


def stop(message, status=2):
    """End this process as the scripts end a user's error: one line on stderr, `status`."""
    print(f"{os.path.basename(sys.argv[0]) or 'python'}: error: {message}", file=sys.stderr)
    raise SystemExit(status)


def _check_keras_not_loaded(backend, environ):
    """Keras imported already on another backend: one line (only for this process's environ)."""
    keras = sys.modules.get("keras") if environ is os.environ else None
    loaded = getattr(getattr(keras, "backend", None), "backend", None)
    if loaded and loaded() != backend:
        raise UserError(f"Keras was imported on {loaded()} before {ENV}={backend} could "
                        "be set: start a new process")
