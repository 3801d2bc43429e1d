"""What a process of this repository sets up before TensorFlow loads: one explicit call.

Importing `pyimagesearch` changes nothing. Each script and tool makes one
marked call in its first lines instead, before anything imports TensorFlow
or Keras: `backend.tensorflow()` (train_cpu.py, train_gpu.py, compare.py,
the tools) or `tpu_runtime.prepare(argv)` (train_tpu.py). Both start with
`process()`:

- a closed stdin, stdout or stderr (`>&-`) gets /dev/null, so that no file
  opened later takes its number and receives what is printed;
- TensorFlow's C++ INFO lines ("Memory patch applied ..." each time a
  strategy feeds its devices) are left out: TF_CPP_MIN_LOG_LEVEL=1, unless
  set, or unless PYIMAGESEARCH_VERBOSE_TF asks for everything;
- TensorFlow's first import, whichever module makes it, keeps its C++
  start-up notices off the terminal (an import hook: base/terminal.py);
- TPU_LOAD_LIBRARY=0, unless set (`leave_the_tpu_alone`): tensorflow-tpu's
  import loads libtpu, takes the TPU's lock and initialises it in any
  process, so a rehearsal, train_cpu.py, compare.py or TensorBoard would hold
  the chips the TPU run needs. The TPU run takes it back out
  (tpu_runtime.prepare), and so does a run of Keras on JAX, whose own libtpu
  reads it too. The processes a script starts inherit it.
"""
import os

from pyimagesearch.base.terminal import (VERBOSE_ENV, open_closed_standard_streams,
                                         quiet_tensorflow_import)

# "0": TensorFlow's loader (and libtpu's, under PJRT) refuses to load libtpu,
# so the import takes no lock and initialises nothing; "1": loads it without
# the lock. Read by TryAcquireTpuLock (xla/stream_executor/tpu/tpu_initialize_util.cc),
# which tensorflow-tpu's import calls (tensorflow/core/tpu/tpu_api_dlsym_initializer.cc)
LOAD_LIBRARY = "TPU_LOAD_LIBRARY"
OURS = "PYIMAGESEARCH_TPU_LOAD_LIBRARY"  # "0": the TPU_LOAD_LIBRARY=0 beside it is this package's


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
