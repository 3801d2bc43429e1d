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
"""
import dataclasses
import glob
import importlib.metadata
import os
import sys

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
