"""Which Keras backend a script runs on, chosen before Keras is imported.

Keras 3 reads KERAS_BACKEND once, at its first import. train_cpu.py,
train_gpu.py and the tools are TensorFlow's (tf.distribute strategies, its
device set-up): `tensorflow()` sets the variable for them, and says so in one
line when the environment asked for another backend (JAX-first TPU images
set KERAS_BACKEND=jax); it first makes the process's set-up (startup.py).
train_tpu.py has two routes, and `tpu_runtime.prepare` picks one with
`tpu_route`:

- "jax": Keras on JAX, `keras.distribution.DataParallel` over the TPU's
  chips; what Colab's and Kaggle's TPU images are built for (they ship
  jax[tpu] and no TensorFlow that can reach the TPU);
- "tensorflow": the article's TPUStrategy (tensorflow-tpu 2.19.1 on a Cloud
  TPU VM: docs/tpus.md).

KERAS_BACKEND=jax or tensorflow chooses; unset, a TPU machine where JAX is
installed and tensorflow-tpu is not takes "jax", anything else "tensorflow".
Nothing here imports Keras, JAX or TensorFlow.
"""
import importlib.util
import os
import sys

from pyimagesearch.platforms import startup

ENV = "KERAS_BACKEND"
ROUTES = ("tensorflow", "jax")
JAX_DEVICES_ENV = "JAX_NUM_CPU_DEVICES"  # N CPU devices; read by jax 0.5.1 and later
JAX_PLATFORMS_ENV = "JAX_PLATFORMS"


def tensorflow(environ=None):
    """This process's set-up (startup.process), and KERAS_BACKEND=tensorflow, said in one
    line if another backend was asked for: the first call of every script and tool but
    train_tpu.py. `environ`: a stand-in for tests, which then gets the variable only."""
    if environ is None:
        startup.process()
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
    from pyimagesearch.platforms.host import installed_version

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
        from pyimagesearch.base.errors import UserError
        raise UserError(f"train_tpu.py runs Keras on TensorFlow or on JAX, not {ENV}={asked}; "
                        f"set {ENV}=jax or {ENV}=tensorflow")
    if asked == "jax" or ENV in environ:  # unset, Keras' own default is TensorFlow
        environ[ENV] = asked
    _check_keras_not_loaded(asked, environ)
    return asked


def rehearse_on_jax(environ, devices):
    """N JAX CPU devices for a rehearsal, set before JAX starts: JAX_NUM_CPU_DEVICES."""
    environ[JAX_PLATFORMS_ENV] = "cpu"
    environ[JAX_DEVICES_ENV] = str(devices)


def _check_keras_not_loaded(backend, environ):
    """Keras imported already on another backend: one line (only for this process's environ)."""
    keras = sys.modules.get("keras") if environ is os.environ else None
    loaded = getattr(getattr(keras, "backend", None), "backend", None)
    if loaded and loaded() != backend:
        from pyimagesearch.base.errors import UserError
        raise UserError(f"Keras was imported on {loaded()} before {ENV}={backend} could "
                        "be set: start a new process")
