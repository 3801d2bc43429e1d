"""TensorFlow's runtime for a TPU v5e, v5p or v6e, set up before TensorFlow is imported.

TensorFlow reaches TPUs up to v4 through the TPU runtime it loads itself
(the "stream executor" one). From v5e on it reaches them only through
PJRT, as a pluggable device: `import tensorflow` loads the library named
by TF_PLUGGABLE_DEVICE_LIBRARY_PATH (libtpu's libtpu.so), and libtpu reads
NEXT_PLUGGABLE_DEVICE_USE_C_API=true to talk to it through PJRT's C API.
Set after the import, they do nothing. So train_tpu.py (and tools/matmul_benchmark.py --device tpu)
call `prepare` before anything imports TensorFlow; where and why, with
the sources, is in docs/tpus.md.

- a host with a PJRT-only TPU (host.py): both variables are set, the
  library path from libtpu's own `get_library_path()`;
- a value the user set for either variable keeps both as the user left
  them, whatever they are;
- a rehearsal (`--rehearse`), a host without TPU, or a v2-v4 TPU: nothing
  is set, so a rehearsal on a TPU machine leaves its chips alone.
"""
import importlib.metadata
import os
import sys

from pyimagesearch.platforms.host import detect

USE_C_API = "NEXT_PLUGGABLE_DEVICE_USE_C_API"
LIBRARY_PATH = "TF_PLUGGABLE_DEVICE_LIBRARY_PATH"
REHEARSE_FLAG = "--rehearse"
SYSTEM_LIBTPU = "/lib/libtpu.so"  # where Cloud TPU VM images put it
prepared = None  # what `prepare` did in this process, in words (None: not called)


def rehearses(argv):
    """True if the command line `argv` asks for a rehearsal.

    The scripts' argparse refuses abbreviations ('--reh 8'), but a prefix of
    --rehearse still counts here: a command argparse will refuse is then
    never one that set the TPU runtime up on its way to that refusal.
    """
    for arg in argv:
        if arg == "--":
            break
        name = arg.split("=", 1)[0]
        if len(name) >= 3 and REHEARSE_FLAG.startswith(name):
            return True
    return False


def flag_value(argv, flag):
    """The value given to `flag` in `argv` ('--device tpu' or '--device=tpu'); None if absent.

    Given twice, the last one counts, as in argparse (`--device cpu --device tpu` is tpu).
    """
    value = None
    for index, arg in enumerate(argv):
        if arg == "--":
            break
        if arg == flag and index + 1 < len(argv):
            value = argv[index + 1]
        elif arg.startswith(flag + "="):
            value = arg.split("=", 1)[1]
    return value


def libtpu_path():
    """libtpu's library, from libtpu's own get_library_path(); None if there is none.

    Importing libtpu also sets TPU_LIBRARY_PATH to that file, where unset:
    the file TensorFlow's own TPU loader (v2-v4) would pick anyway. Without
    the libtpu package, a TPU VM image's /lib/libtpu.so serves. A path that
    does not exist is never returned: TensorFlow's import would fail on it.
    """
    try:
        import libtpu
        path = libtpu.get_library_path()
    except (ImportError, AttributeError):
        path = None
    for candidate in (path, SYSTEM_LIBTPU):
        if candidate and os.path.isfile(candidate):
            return candidate
    return None


def libtpu_version():
    """The installed libtpu's version, or 'not installed'."""
    try:
        return importlib.metadata.version("libtpu")
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def prepare(argv, environ=None, host=None, library_path=libtpu_path):
    """Set PJRT's two variables if this run is for a TPU that needs them; what was done, in words.

    `argv`: the command line's arguments (a rehearsal sets nothing);
    `environ`, `host`, `library_path`: stand-ins for tests.
    """
    global prepared
    prepared = _prepare(argv, os.environ if environ is None else environ, host, library_path)
    return prepared


def _prepare(argv, environ, host, library_path):
    """prepare's work; what it did, in words."""
    if "tensorflow" in sys.modules:
        return "too late: TensorFlow is imported already"
    if rehearses(argv):
        return "a rehearsal: no TPU runtime"
    host = detect() if host is None else host
    if not host.needs_pjrt:
        return "no TPU that needs PJRT"
    if USE_C_API in environ or LIBRARY_PATH in environ:
        return (f"PJRT as you set it ({USE_C_API}={environ.get(USE_C_API, '')!r}, "
                f"{LIBRARY_PATH}={environ.get(LIBRARY_PATH, '')!r})")
    path = library_path()
    if not path:
        return "libtpu is not installed: pip install -r requirements-tpu.txt"
    environ[USE_C_API] = "true"
    environ[LIBRARY_PATH] = path
    return f"PJRT through {path} (libtpu {libtpu_version()})"


def likely_causes():
    """What a user can act on when a TPU is found but TensorFlow cannot initialise it."""
    if prepared is None or prepared.startswith(("too late", "no TPU")):
        runtime = (f"on a TPU v5e, v5p or v6e, {USE_C_API}=true and {LIBRARY_PATH}=<libtpu's "
                   "library> set before TensorFlow is imported (train_tpu.py does it)")
    elif prepared.startswith("libtpu is not installed"):
        runtime = "libtpu is not installed, and this TPU needs it"
    else:
        runtime = f"TensorFlow's PJRT runtime, set up as {prepared}"
    return (f"{runtime}; a libtpu that does not match this TensorFlow "
            "(pip install -r requirements-tpu.txt installs the pair); another process "
            "holding the chips (a second notebook, an earlier run: end it or restart the "
            "runtime)")
