"""Finding the article's TPU, and its set-up's failures in one line (strategies.tpu_errors).

The article's four TPU calls (find the TPU, connect, initialise, build
TPUStrategy) run inside `tpu_errors`: a TPU that is not there, nothing at
its address, no TPU device, or a TPU held by another process is one line
that gives TensorFlow's own cause. The lookup it hands them is bounded in
time and checks the devices before anything initialises them. Loaded only
by train_tpu.py's TPU run and the tools' TPU benchmarks.
"""
import contextlib
import os
import re
import threading

import tensorflow as tf

from pyimagesearch import tpu_runtime
from pyimagesearch.errors import UserError, first_line
from pyimagesearch.terminal import native_stderr_quiet
from pyimagesearch.runtime import detect
from pyimagesearch.cluster import answers

TPU_LOOKUP_TIMEOUT_S = 60  # s; how long the TPU lookup may wait on Google Cloud
_REHEARSE_TPU = "use --rehearse 8 to rehearse on 8 logical CPU devices"
# OSError: a resolver that asks Google Cloud's metadata server off Cloud
_TPU_ERRORS = (ValueError, RuntimeError, OSError, tf.errors.OpError)


def _tpu_label(tpu):
    """How a message names the TPU: the name TPUClusterResolver was given or reads."""
    name = (tpu or os.environ.get("KUBE_GOOGLE_CLOUD_TPU_ENDPOINTS")
            or os.environ.get("TPU_NAME"))
    if name == "local":
        return "the TPU on this machine"
    return f"TPU {name!r}" if name else "the TPU"


def tpu_resolver(resolver, tpu):
    """`resolver` (TPUClusterResolver) for `tpu`; without one, this TPU VM's chips, or what the
    environment names.

    Where this machine has TPU chips (any device file or PCI id runtime.py
    counts), it is a TPU VM, and TensorFlow reaches its chips as local
    devices: tpu="local", as Google's recipes pass. Colab's and Kaggle's
    TPU VMs set nothing TPUClusterResolver() reads: it raises "Please
    provide a TPU Name" there (googlecolab/colabtools#4699, #5717).
    """
    if tpu:
        return resolver(tpu=tpu)
    if detect().tpu_chips:
        return resolver(tpu="local")
    return resolver()  # TPU_NAME, TPU_CONFIG or GKE's endpoints name a TPU elsewhere


def find_tpu(resolver, tpu):
    """tpu_resolver(resolver, tpu), given at most TPU_LOOKUP_TIMEOUT_S seconds.

    Given a TPU name (--tpu or $TPU_NAME) but no project and zone,
    TPUClusterResolver asks Google Cloud's metadata server for them with no
    time limit; off Google Cloud that can hang for good. So it runs in a
    daemon thread, which an exiting process does not wait for. Something
    must answer at the address it finds: TensorFlow would wait for one for
    ever, deaf to SIGTERM and Ctrl-C. A TPU on this machine must be among
    TensorFlow's devices.

    The IPv6 refusal: TPUClusterResolver cuts grpc://[::1]:8470 at its first
    colon; upstream none filed; still so in TensorFlow 2.19.1 and 2.21.0
    (tests/test_workarounds.py).
    """
    if tpu and tpu.startswith("grpc://["):
        # TPUClusterResolver splits the address at its first colon
        # (grpc://[::1]:8470 becomes grpc://[:), so it would dial nothing
        raise UserError(f"TensorFlow's TPUClusterResolver cannot take the IPv6 address {tpu}; "
                        "give the TPU's name or its IPv4 address, or " + _REHEARSE_TPU)
    outcome = {}

    def look_up():
        try:
            outcome["resolver"] = tpu_resolver(resolver, tpu)
        except BaseException as error:  # handed over to the waiting thread
            outcome["error"] = error

    lookup = threading.Thread(target=look_up, name="tpu-lookup", daemon=True)
    try:
        with native_stderr_quiet(_TPU_ERRORS):
            lookup.start()
            lookup.join(TPU_LOOKUP_TIMEOUT_S)
            if "error" in outcome:
                raise outcome["error"]  # here, so a bug's captured lines replay
    except _TPU_ERRORS as error:
        raise UserError(f"no TPU found ({tensorflow_cause(error)}); pass --tpu NAME, "
                        f"or {_REHEARSE_TPU}") from error
    if lookup.is_alive():
        raise UserError(
            f"gave up looking for {_tpu_label(tpu)} after {TPU_LOOKUP_TIMEOUT_S:g} s "
            "waiting for Google Cloud's metadata server (TPUClusterResolver asks it "
            "for the project and zone); off Google Cloud pass --tpu grpc://ADDRESS:8470, "
            f"or {_REHEARSE_TPU}")
    found = outcome["resolver"]
    address = found.master()
    if address.startswith("grpc://") and not answers(address[len("grpc://"):], timeout_s=10):
        # a TPU_NAME that names a TPU VM itself resolves to its own :8470, where
        # only a TPU Node listens: on the VM, its chips are local devices
        here = "this machine has TPU chips: " if detect().tpu_chips else ""
        raise UserError(f"nothing answers at {address}, where the TPU should be; "
                        f"{here}on a TPU VM pass --tpu local, else check its address, "
                        f"or {_REHEARSE_TPU}")
    if address in ("", "local"):
        _check_local_tpu_devices()
    return found


def local_devices():
    """The logical devices TensorFlow sees in this process (it starts its runtime)."""
    return tf.config.list_logical_devices()


def _check_local_tpu_devices():
    """Stop with one line unless TensorFlow lists a TPU device on this machine.

    Said before initialize_tpu_system runs: where libtpu found no chip, that
    can die of SIGSEGV without a word. TensorFlow lists a TPU VM's chips
    before initialising them (its TPU:N devices, tensorflow/tensorflow#61293);
    a TPU reached at a grpc:// address is checked by answering there instead.
    """
    seen = [device.device_type for device in local_devices()]
    if "TPU" not in seen:
        types = ", ".join(sorted(set(seen))) or "none"
        raise UserError(f"TensorFlow lists no TPU device on this machine (only {types}), so "
                        f"its TPU cannot be initialised; likely causes: "
                        f"{_likely_causes()}; or {_REHEARSE_TPU}")


# Lines of TensorFlow's error text that are not its cause: the frame of a
# failed tf.function (tensorflow/python/eager/polymorphic_function/
# atomic_function.py, framework/error_interpolation.py) and its stack
_NOT_THE_CAUSE = ("Graph execution error", "Detected at node", "<stack traces unavailable>",
                  "Node: ", "[[")


def tensorflow_cause(error):
    """The first line of `error`'s message that says what went wrong, not where.

    A TPU that fails in initialize_tpu_system raises "Graph execution
    error:", then the node and its stack, and only then the cause (a
    RET_CHECK, "No TPU platform found"). Lines that start with white space
    are stack frames.
    """
    text = str(getattr(error, "strerror", None) or getattr(error, "message", None) or error)
    for line in text.splitlines():
        if line.strip() and not line[0].isspace() and not line.startswith(_NOT_THE_CAUSE):
            return line.strip()
    return first_line(error)


@contextlib.contextmanager
def tpu_errors(tpu=None):
    """Around the article's TPU set-up: whatever fails ends the run in one line.

    with tpu_errors(args.tpu) as find:
        tpu = find(tf.distribute.cluster_resolver.TPUClusterResolver)
        tf.config.experimental_connect_to_cluster(tpu)
        tf.tpu.experimental.initialize_tpu_system(tpu)

    `find(TPUClusterResolver)` resolves `tpu` (a name or a grpc:// address;
    None: what Colab, Kaggle or a TPU VM provide) within
    TPU_LOOKUP_TIMEOUT_S, and checks that something answers at its address.
    A TPU found is not a TPU usable: one held by another process (a second
    notebook, a stale run) fails to initialise, and the line says so.
    """
    try:
        # TensorFlow's lines on the way go unseen: ours says what failed
        with native_stderr_quiet(_TPU_ERRORS + (UserError,)):
            yield lambda resolver: find_tpu(resolver, tpu)
    except _TPU_ERRORS as error:
        detail = tensorflow_cause(error)
        hint = _REHEARSE_TPU
        if re.search(r"in use|busy|lockfile", detail, re.IGNORECASE):
            hint = f"end the process that holds it, or {hint}"
        if "initialize_tpu_system" in _calls(error):
            problem = f"{_tpu_label(tpu)} was found but could not be initialised"
            if hint == _REHEARSE_TPU:
                hint = f"likely causes: {_likely_causes()}; or {hint}"
        else:
            problem = f"could not connect to {_tpu_label(tpu)}"
        raise UserError(f"{problem} (TensorFlow said: {detail}); {hint}") from error


def _likely_causes():
    """Why this machine's TPU runtime may have failed (tpu_runtime.py)."""
    return tpu_runtime.likely_causes()


def _calls(error):
    """The names of the functions `error` passed through, outermost first."""
    names, trace = [], error.__traceback__
    while trace is not None:
        names.append(trace.tb_frame.f_code.co_name)
        trace = trace.tb_next
    return names
