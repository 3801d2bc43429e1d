"""TensorFlow's TPU runtime, chosen before TensorFlow is imported: who loads libtpu, and how.

Two things about a TPU machine are decided when TensorFlow is imported, so
this module decides them first (docs/tpus.md has the sources):

- **Whether this process takes the TPU at all.** tensorflow-tpu's import
  opens libtpu, takes its lock (/tmp/libtpu_lockfile) and initialises it,
  unless TPU_LOAD_LIBRARY=0. `runtime.leave_the_tpu_alone` sets that; every
  script's and tool's first call (runtime.process) and the notebook's kernel
  make it, so they leave the chips alone. `prepare` takes it back out for the one process
  that trains on the TPU (train_tpu.py, tools/matmul_benchmark.py --device
  tpu), and never for a rehearsal. A TPU_LOAD_LIBRARY of the user's own
  stays as it is everywhere.
- **Which runtime reaches the chips.** From v5e on, TensorFlow reaches them
  only through PJRT, as a pluggable device: `import tensorflow` loads the
  library named by TF_PLUGGABLE_DEVICE_LIBRARY_PATH (libtpu's libtpu.so),
  and libtpu reads NEXT_PLUGGABLE_DEVICE_USE_C_API=true to talk to it
  through PJRT's C API. On v2-v4, TensorFlow's older "stream executor"
  runtime serves without them, and PJRT is offered with
  PYIMAGESEARCH_TPU_RUNTIME=pjrt (what Google's own release tests run).
  Set after the import, the variables do nothing.

`prepare`, for the TPU run:
- a PJRT host (runtime.py), or PYIMAGESEARCH_TPU_RUNTIME=pjrt on any TPU: both
  variables are set, the library path from libtpu's own `get_library_path()`,
  and TPU_LIBRARY_PATH (what TensorFlow's own loader opens) names the same
  file, so one process never holds two libtpu builds;
- a value the user set for either variable keeps both as the user left
  them;
- a rehearsal (`--rehearse`), a host without TPU, or a v2-v4 TPU: nothing
  is set.

Before any of that, one line and status 2 (never a traceback) for what the
chosen route lacks (runtime.missing), and, on Colab's and Kaggle's JAX TPU
images, for what only works elsewhere: TensorFlow's TPU run, `--tpu NAME` on
JAX, a JAX_NUM_CPU_DEVICES of the reader's own that `--rehearse N` cannot
use. Each line says what works there instead (`instead_of_jax`).
"""
import os
import sys

from pyimagesearch import runtime
from pyimagesearch.errors import UserError
from pyimagesearch.runtime import LOAD_LIBRARY, OURS, leave_the_tpu_alone, without_our_hold  # noqa: F401
from pyimagesearch.runtime import detect, installed_version

USE_C_API = "NEXT_PLUGGABLE_DEVICE_USE_C_API"
LIBRARY_PATH = "TF_PLUGGABLE_DEVICE_LIBRARY_PATH"
TPU_LIBRARY_PATH = "TPU_LIBRARY_PATH"  # the libtpu TensorFlow's own loader opens at import
RUNTIME_ENV = "PYIMAGESEARCH_TPU_RUNTIME"  # "auto" (the default) or "pjrt": PJRT on v2-v4 too
RUNTIMES = ("auto", "pjrt")
REHEARSE_FLAG = "--rehearse"
TPU_FLAG = "--tpu"
SYSTEM_LIBTPU = "/lib/libtpu.so"  # where Cloud TPU VM images put it
_HELD = f"; your {LOAD_LIBRARY}=0 keeps TensorFlow from loading libtpu"


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
        import libtpu  # lazy: only TPU hosts have it, and its import sets TPU_LIBRARY_PATH
        path = libtpu.get_library_path()
    except (ImportError, AttributeError):
        path = None
    for candidate in (path, SYSTEM_LIBTPU):
        if candidate and os.path.isfile(candidate):
            return candidate
    return None


def libtpu_version():
    """The installed libtpu's version, or 'not installed'."""
    return installed_version("libtpu") or "not installed"


def prepare(argv, environ=None, host=None, library_path=libtpu_path):
    """For the TPU run: choose its Keras backend (runtime.tpu_route); on TensorFlow, let it
    load libtpu and set PJRT's variables if this TPU needs them; what was done, in words.

    `argv`: the command line's arguments (a rehearsal sets no TPU runtime);
    `environ`, `host`, `library_path`: stand-ins for tests. A KERAS_BACKEND
    neither route takes ends the process in one line, status 2.
    """
    try:
        host = detect() if host is None else host
        route = runtime.tpu_route(os.environ if environ is None else environ, host)
        # what is missing, asked before process(): its quiet import's finder answers the
        # first lookup of tensorflow only (terminal.py), and that must be the import's
        lacking = runtime.missing(route, host)
        if environ is None:  # this process: its set-up before TensorFlow's import first
            runtime.process()
        if lacking:  # before anything imports them: one line, not a traceback
            raise UserError(lacking)
        prepared = _prepare(argv, os.environ if environ is None else environ, host, route,
                            library_path)
        runtime.this_process.tpu_runtime = prepared
    except UserError as error:
        runtime.stop(error, error.exit_status)
    return prepared


def _prepare(argv, environ, host, route, library_path):
    """prepare's work on `route`; what it did, in words."""
    if "tensorflow" in sys.modules:
        return "too late: TensorFlow is imported already"
    if route == "jax":
        return _jax_route(argv, environ, host)
    if rehearses(argv):
        return "a rehearsal: no TPU runtime"
    # TensorFlow's TPU run (train_tpu.py's, or tools/matmul_benchmark.py --device tpu) on a
    # JAX image: tensorflow-cpu has no TPU runtime, so no TPU would be found
    if runtime.jax_tpu_image(host) and not runtime.tensorflow_tpu_installed():
        raise UserError(f"{runtime.ENV}=tensorflow: " + instead_of_jax(
            host, f"train_tpu.py without {runtime.ENV} takes Keras on JAX", "add --rehearse 8"))
    without_our_hold(environ)
    held = _HELD if environ.get(LOAD_LIBRARY) == "0" else ""  # the user's own: it stays
    return _choose_runtime(environ, host, library_path) + held


def _jax_route(argv, environ, host):
    """Keras on JAX: N JAX CPU devices for a rehearsal; else JAX's own libtpu, unheld.

    --tpu NAME is refused: JAX reaches only this machine's chips, found by
    itself (jax 0.7.2: jax/_src/cloud_tpu_init.py counts the local PCI chips,
    and jax/tools/colab_tpu.py's setup_tpu, the old way to a remote TPU, now
    raises); "local", TensorFlow's name for this machine's TPU, is that.
    """
    name = flag_value(argv, TPU_FLAG)
    if name and name != "local":
        raise UserError(f"--tpu {name}: Keras on JAX trains on this machine's own TPU, which "
                        "JAX finds by itself, and cannot reach one by name; leave --tpu out"
                        + ("" if runtime.jax_tpu_image(host) else
                           f", or run with {runtime.ENV}=tensorflow for TPUClusterResolver"))
    if rehearses(argv):
        devices = flag_value(argv, REHEARSE_FLAG)
        if devices and devices.isdigit() and int(devices) >= 1:
            runtime.rehearse_on_jax(environ, int(devices))
        return f"Keras on JAX: a rehearsal on {devices} JAX CPU devices"
    # JAX loads its own libtpu (jax[tpu]), which reads TPU_LOAD_LIBRARY too;
    # TensorFlow (tensorflow-cpu, for tf.data) has no TPU loader to take it
    without_our_hold(environ)
    return "Keras on JAX: JAX's libtpu reaches the TPU; TensorFlow only reads the data"


def _choose_runtime(environ, host, library_path):
    """The PJRT variables for `host`, where it needs them or the user asks; what was done."""
    wanted = environ.get(RUNTIME_ENV) or "auto"
    if wanted not in RUNTIMES:
        print(f"[INFO] {RUNTIME_ENV}={wanted} is neither auto nor pjrt: auto is used",
              file=sys.stderr)
        wanted = "auto"
    if not (host.needs_pjrt or (wanted == "pjrt" and host.tpu_chips)):
        return "no TPU that needs PJRT"
    if USE_C_API in environ or LIBRARY_PATH in environ:
        return (f"PJRT as you set it ({USE_C_API}={environ.get(USE_C_API, '')!r}, "
                f"{LIBRARY_PATH}={environ.get(LIBRARY_PATH, '')!r})"
                + _one_libtpu(environ, environ.get(LIBRARY_PATH, '')))
    path = library_path()
    if not path:
        return "libtpu is not installed: pip install -r requirements-tpu.txt"
    environ[USE_C_API] = "true"
    environ[LIBRARY_PATH] = path
    return f"PJRT through {path} (libtpu {libtpu_version()})" + _one_libtpu(environ, path)


def _one_libtpu(environ, path):
    """TPU_LIBRARY_PATH set to `path`, the PJRT plugin's libtpu, where unset; '' or a warning.

    tensorflow-tpu's import opens TPU_LIBRARY_PATH (else site-packages'
    libtpu/libtpu.so) by itself, and the PJRT plugin is loaded beside it: a
    plugin path naming another file would put two libtpu builds in one
    process.
    """
    if not os.path.isfile(path):
        return ""  # a folder of plugins, or nothing: TensorFlow's import says what is wrong
    other = environ.get(TPU_LIBRARY_PATH)
    if not other:
        environ[TPU_LIBRARY_PATH] = path
        return ""
    if os.path.realpath(other) == os.path.realpath(path):
        return ""
    print(f"[INFO] {TPU_LIBRARY_PATH}={other} and {LIBRARY_PATH}={path} name two libtpu "
          f"builds, and TensorFlow loads both: set {TPU_LIBRARY_PATH} to the same file",
          file=sys.stderr)
    return f"; {TPU_LIBRARY_PATH} names another libtpu ({other})"


def instead_of_jax(host, drop="leave the flag out",
                   rehearse=f"{runtime.ENV}=tensorflow python train_tpu.py --rehearse 8"):
    """What works on `host` where Keras on JAX refuses something, in words.

    Elsewhere TensorFlow's route; on Colab's and Kaggle's TPUs, `drop` or a
    rehearsal on TensorFlow: tensorflow-tpu 2.19.1 has no build for Colab's
    Python 3.13 and pins libtpu 0.0.10 in place of JAX's (requirements-tpu.txt).
    """
    if not runtime.jax_tpu_image(host):
        return f"run with {runtime.ENV}=tensorflow"
    place = {"colab": "Colab", "kaggle": "Kaggle"}[host.service]
    return (f"on {place}'s TPU only Keras on JAX reaches the chips (TensorFlow's TPU route "
            f"needs tensorflow-tpu, which would replace JAX's libtpu): {drop}, or rehearse "
            f"on TensorFlow's route: {rehearse}")



def likely_causes():
    """What a user can act on when a TPU is found but TensorFlow cannot initialise it."""
    prepared = runtime.this_process.tpu_runtime
    said, held, _ = (prepared or "").partition(_HELD)
    if prepared is None or said.startswith(("too late", "no TPU")):
        cause = (f"on a TPU v5e, v5p or v6e, {USE_C_API}=true and {LIBRARY_PATH}=<libtpu's "
                 "library> set before TensorFlow is imported (train_tpu.py does it; on "
                 f"v2-v4 {RUNTIME_ENV}=pjrt asks for it)")
    elif said.startswith("libtpu is not installed"):
        cause = "libtpu is not installed, and this TPU needs it"
    else:
        cause = f"TensorFlow's PJRT runtime, set up as {said}"
    if held:
        cause = f"{LOAD_LIBRARY}=0 in your environment, which keeps libtpu unloaded; {cause}"
    return (f"{cause}; a libtpu that does not match this TensorFlow "
            "(pip install -r requirements-tpu.txt installs the pair); another process "
            "holding the chips (a second notebook, an earlier run: end it or restart the "
            "runtime)")
