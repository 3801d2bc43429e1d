"""train_tpu.py's TPU: its route and runtime chosen before TensorFlow loads, then found.

Before TensorFlow's import (`prepare`, the script's first call):
- **the route**: KERAS_BACKEND chooses; unset, a TPU machine with JAX and
  without tensorflow-tpu (Colab's and Kaggle's images) takes Keras on JAX,
  anything else TensorFlow's TPUStrategy (tensorflow-tpu 2.19.1, docs/tpus.md);
- **whether this process takes the TPU**: tensorflow-tpu's import opens libtpu
  and takes its lock unless TPU_LOAD_LIBRARY=0, which host.leave_the_tpu_alone
  sets for every other process; the TPU run takes it back out, a rehearsal not;
- **the runtime**: from v5e on TensorFlow reaches the chips only through PJRT
  (NEXT_PLUGGABLE_DEVICE_USE_C_API=true and TF_PLUGGABLE_DEVICE_LIBRARY_PATH
  naming libtpu, read at import); on v2-v4 PYIMAGESEARCH_TPU_RUNTIME=pjrt asks.
Values the user set stay as set. Then `find_tpu` and `tpu_errors` stand around
the article's TPU calls, so that each failure is one line.
"""
import argparse
import contextlib
import os
import re
import sys
import threading

from pyimagesearch import host as hosts
from pyimagesearch.errors import UserError, first_line

USE_C_API, LIBRARY_PATH = "NEXT_PLUGGABLE_DEVICE_USE_C_API", "TF_PLUGGABLE_DEVICE_LIBRARY_PATH"
RUNTIME_ENV = "PYIMAGESEARCH_TPU_RUNTIME"  # "auto" (default) or "pjrt": PJRT on v2-v4 too
SYSTEM_LIBTPU = "/lib/libtpu.so"           # where Cloud TPU VM images put it
LOOKUP_TIMEOUT_S = 60                       # how long the TPU lookup may wait on Google Cloud
REHEARSE = "use --rehearse 8 to rehearse on 8 logical CPU devices"


def prepare(argv, environ=None, host=None, library_path=None):
    """The TPU run's set-up before TensorFlow's import; what was done, in words.

    `argv` gives --rehearse and --tpu (the flags are parsed for good later);
    `environ`, `host` and `library_path` stand in for tests. A route that cannot
    run here ends the process in one line, status 2.
    """
    this_process = environ is None
    environ = os.environ if this_process else environ
    early = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    early.add_argument("--rehearse", type=lambda text: text)
    early.add_argument("--tpu")
    flags, _ = early.parse_known_args(argv)
    try:
        host = hosts.detect() if host is None else host
        route = choose_route(environ, host)
        if this_process:  # what every script's first call does (host.prepare_tensorflow)
            hosts.open_closed_streams()
            environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
            hosts.leave_the_tpu_alone(environ)
        lacking = hosts.missing(route, host)
        if lacking:
            raise UserError(lacking)
        if "tensorflow" in sys.modules:
            return "too late: TensorFlow is imported already"
        if route == "jax":
            return _jax(flags, environ, host)
        if flags.rehearse:
            return "a rehearsal: no TPU runtime"
        if host.tpu_chips and not hosts.installed_version("tensorflow-tpu"):
            # no build that surely reaches the chips (a TPU VM image's `tensorflow` may)
            if host.jax_tpu_image:
                raise UserError("KERAS_BACKEND=tensorflow: " + instead_of_jax(
                    host, "train_tpu.py without KERAS_BACKEND takes Keras on JAX",
                    "add --rehearse 8"))
            cpu_build = hosts.installed_version("tensorflow-cpu")
            if cpu_build and not hosts.installed_version("tensorflow"):
                raise UserError(f"tensorflow-cpu {cpu_build} cannot reach a TPU: for Keras on "
                                "JAX, pip install -r requirements-tpu-vm.txt; for TensorFlow's "
                                "TPUStrategy, pip install -r requirements-tpu.txt; or add "
                                "--rehearse 8")
        _take_the_tpu(environ)
        return _pjrt(environ, host, library_path or libtpu_path)
    except UserError as error:
        hosts.stop(error)


def choose_route(environ, host):
    """"jax" or "tensorflow", and KERAS_BACKEND set to match; another backend is one line."""
    asked = environ.get("KERAS_BACKEND")
    if asked is None:
        jax_image = hosts.installed("jax") and not hosts.installed_version("tensorflow-tpu")
        asked = "jax" if host.tpu_chips and jax_image else "tensorflow"
    if asked not in ("tensorflow", "jax"):
        raise UserError(f"train_tpu.py runs Keras on TensorFlow or on JAX, not "
                        f"KERAS_BACKEND={asked}; set KERAS_BACKEND=jax"
                        + ("" if host.jax_tpu_image else " or KERAS_BACKEND=tensorflow"))
    if asked == "jax" or "KERAS_BACKEND" in environ:  # unset, Keras' default is TensorFlow
        environ["KERAS_BACKEND"] = asked
    keras = sys.modules.get("keras")
    if keras is not None and environ is os.environ and keras.backend.backend() != asked:
        raise UserError(f"Keras was imported on {keras.backend.backend()} before "
                        f"KERAS_BACKEND={asked} could be set: start a new process")
    return asked


def _take_the_tpu(environ):
    """The hold of host.leave_the_tpu_alone taken out; the user's own TPU_LOAD_LIBRARY stays."""
    if environ.pop("PYIMAGESEARCH_TPU_HOLD", None) is not None:
        environ.pop("TPU_LOAD_LIBRARY", None)


def _jax(flags, environ, host):
    """Keras on JAX: N JAX CPU devices for a rehearsal; else JAX's own libtpu, unheld."""
    if flags.tpu and flags.tpu != "local":  # JAX finds this machine's chips by itself
        raise UserError(f"--tpu {flags.tpu}: Keras on JAX trains on this machine's own TPU, "
                        "which JAX finds by itself, and cannot reach one by name; leave --tpu "
                        "out" + ("" if host.jax_tpu_image else
                                 ", or run with KERAS_BACKEND=tensorflow for TPUClusterResolver"))
    if flags.rehearse:
        own = environ.get("JAX_NUM_CPU_DEVICES")
        wanted = flags.rehearse
        if own is not None and wanted.isdigit() and not (own.strip().isdigit()
                                                          and int(own) >= int(wanted)):
            raise UserError(f"JAX_NUM_CPU_DEVICES={own} in your environment and --rehearse "
                            f"{wanted} disagree: unset JAX_NUM_CPU_DEVICES, or set it to {wanted}")
        environ["JAX_PLATFORMS"] = "cpu"
        if wanted.isdigit():  # anything else the flags' parser refuses in one line
            environ.setdefault("JAX_NUM_CPU_DEVICES", wanted)
        return f"Keras on JAX: a rehearsal on {wanted} JAX CPU devices"
    _take_the_tpu(environ)
    return "Keras on JAX: JAX's libtpu reaches the TPU; TensorFlow only reads the data"


def libtpu_path():
    """libtpu's library, from libtpu's own get_library_path(), else a TPU VM image's; or None."""
    try:
        import libtpu  # only TPU hosts have it
        path = libtpu.get_library_path()
    except (ImportError, AttributeError):
        path = None
    return next((p for p in (path, SYSTEM_LIBTPU) if p and os.path.isfile(p)), None)


def _pjrt(environ, host, library_path):
    """PJRT's variables where this TPU needs them or the user asks; what was done, in words."""
    wanted = environ.get(RUNTIME_ENV) or "auto"
    if wanted not in ("auto", "pjrt"):
        print(f"[INFO] {RUNTIME_ENV}={wanted} is neither auto nor pjrt: auto is used",
              file=sys.stderr)
    path = None
    if not (host.needs_pjrt or (wanted == "pjrt" and host.tpu_chips)):
        said = "no TPU that needs PJRT"
    elif USE_C_API in environ or LIBRARY_PATH in environ:
        said, path = "PJRT as you set it", environ.get(LIBRARY_PATH)
    elif (path := library_path()) is None:
        said = "libtpu is not installed: pip install -r requirements-tpu.txt"
    else:
        environ[USE_C_API], environ[LIBRARY_PATH] = "true", path
        said = f"PJRT through {path} (libtpu {hosts.installed_version('libtpu')})"
    if path and os.path.isfile(path):  # tensorflow-tpu's import opens TPU_LIBRARY_PATH too:
        other = environ.setdefault("TPU_LIBRARY_PATH", path)  # one libtpu build, not two
        if os.path.realpath(other) != os.path.realpath(path):
            said += f"; TPU_LIBRARY_PATH names another libtpu ({other})"
    if environ.get("TPU_LOAD_LIBRARY") == "0":  # the user's own: it stays
        said += "; your TPU_LOAD_LIBRARY=0 keeps TensorFlow from loading libtpu"
    return said


def instead_of_jax(host, drop="leave the flag out",
                   rehearse="KERAS_BACKEND=tensorflow python train_tpu.py --rehearse 8"):
    """What works on `host` where Keras on JAX refuses something, in words."""
    if not host.jax_tpu_image:
        return "run with KERAS_BACKEND=tensorflow"
    place = {"colab": "Colab", "kaggle": "Kaggle"}[host.service]
    return (f"on {place}'s TPU only Keras on JAX reaches the chips (TensorFlow's TPU route "
            f"needs tensorflow-tpu, which would replace JAX's libtpu): {drop}, or rehearse "
            f"on TensorFlow's route: {rehearse}")


def find_tpu(tpu=None):
    """The article's TPUClusterResolver(), found within LOOKUP_TIMEOUT_S seconds.

    `tpu`: --tpu, a name or grpc:// address. Without it, this TPU VM's chips
    (tpu="local", as Google's recipes pass: Colab's and Kaggle's TPU VMs set
    nothing TPUClusterResolver() reads, googlecolab/colabtools#4699), else what
    TPU_NAME or GKE names. Given a name but no project and zone, the resolver asks
    Google Cloud's metadata server with no time limit, so it runs in a daemon
    thread. Something must answer at the address it finds: TensorFlow would wait
    for ever, deaf to SIGTERM and Ctrl-C.
    """
    import tensorflow as tf
    if tpu and tpu.startswith("grpc://["):  # the resolver cuts grpc://[::1]:8470 at its colon
        raise UserError(f"TensorFlow's TPUClusterResolver cannot take the IPv6 address {tpu}; "
                        f"give the TPU's name or its IPv4 address, or {REHEARSE}")
    resolver = tf.distribute.cluster_resolver.TPUClusterResolver
    outcome = {}

    def look_up():
        try:
            name = tpu or ("local" if hosts.detect().tpu_chips else None)
            outcome["tpu"] = resolver(tpu=name) if name else resolver()
        except Exception as error:  # handed to the waiting thread
            outcome["error"] = error

    lookup = threading.Thread(target=look_up, daemon=True)
    lookup.start()
    lookup.join(LOOKUP_TIMEOUT_S)
    if "error" in outcome:
        raise UserError(f"no TPU found ({cause(outcome['error'])}); pass --tpu NAME, or "
                        f"{REHEARSE}") from outcome["error"]
    if lookup.is_alive():
        raise UserError(f"gave up looking for the TPU after {LOOKUP_TIMEOUT_S} s waiting for "
                        "Google Cloud's metadata server; off Google Cloud pass --tpu "
                        f"grpc://ADDRESS:8470, or {REHEARSE}")
    found = outcome["tpu"]
    address = found.master()
    if address.startswith("grpc://") and not hosts.answers(address[len("grpc://"):], 10):
        here = "this machine has TPU chips: " if hosts.detect().tpu_chips else ""
        raise UserError(f"nothing answers at {address}, where the TPU should be; {here}on a "
                        f"TPU VM pass --tpu local, else check its address, or {REHEARSE}")
    if address in ("", "local"):  # checked before initialize_tpu_system, which can crash
        seen = {device.device_type for device in tf.config.list_logical_devices()}
        if "TPU" not in seen:
            raise UserError(f"TensorFlow lists no TPU device on this machine (only "
                            f"{', '.join(sorted(seen))}), so its TPU cannot be initialised; "
                            f"likely causes: {likely_causes()}; or {REHEARSE}")
    return found


def cause(error):
    """The first line of TensorFlow's message that says what went wrong, not where."""
    text = str(getattr(error, "message", None) or error)
    skip = ("Graph execution error", "Detected at node", "<stack traces unavailable>",
            "Node: ", "[[")
    return next((line.strip() for line in text.splitlines()
                 if line.strip() and not line[0].isspace() and not line.startswith(skip)),
                first_line(error))


def likely_causes(environ=os.environ):
    """What a user can act on when a TPU is found but TensorFlow cannot initialise it."""
    causes = [f"{USE_C_API}=true and {LIBRARY_PATH}=<libtpu's library> set before TensorFlow "
              "is imported, on a TPU v5e, v5p or v6e (train_tpu.py does it)",
              "a libtpu that does not match this TensorFlow (pip install -r "
              "requirements-tpu.txt installs the pair)",
              "another process holding the chips (a second notebook, an earlier run: end it "
              "or restart the runtime)"]
    if libtpu_path() is None:
        causes.insert(0, "libtpu is not installed, and a TPU needs it")
    if environ.get("TPU_LOAD_LIBRARY") == "0":
        causes.insert(0, "TPU_LOAD_LIBRARY=0 in your environment, which keeps libtpu unloaded")
    return "; ".join(causes)


@contextlib.contextmanager
def tpu_errors():
    """Around the article's experimental_connect_to_cluster and initialize_tpu_system: a
    failure is one line with TensorFlow's cause (a TPU held by another process, say)."""
    import tensorflow as tf
    try:
        yield
    except (ValueError, RuntimeError, OSError, tf.errors.OpError) as error:
        detail = cause(error)
        hint = REHEARSE
        if re.search(r"in use|busy|lockfile", detail, re.IGNORECASE):
            hint = f"end the process that holds it, or {hint}"
        else:
            hint = f"likely causes: {likely_causes()}; or {hint}"
        raise UserError(f"the TPU was found but could not be connected or initialised "
                        f"(TensorFlow said: {detail}); {hint}") from error
