"""Companion package for "Fast Neural Network Training with Distributed
Training and Google TPUs": config, data pipeline, model, loss, strategies and
the training routine that train_cpu.py, train_gpu.py and train_tpu.py share.

Importing the package registers `AutoEncoder` and `MSELoss` with Keras, so a
saved `outputs/cpu.keras` loads back with `keras.saving.load_model`.
"""
import os

from pyimagesearch.workarounds import VERBOSE_ENV, native_stderr_quiet

if not os.environ.get(VERBOSE_ENV):
    # TensorFlow's C++ INFO lines ("Memory patch applied ..." each time a
    # strategy feeds its devices) are not for readers; warnings and errors
    # still show. A TF_CPP_MIN_LOG_LEVEL of the user's own wins.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")

with native_stderr_quiet():
    import tensorflow  # noqa: F401  (its C++ start-up notices are not for readers)

from pyimagesearch.autoencoder import AutoEncoder  # noqa: E402,F401  (registers it)
from pyimagesearch.loss import MSELoss  # noqa: E402,F401  (registers it)
from pyimagesearch.precision import ReplicasAgreeLossScaleOptimizer  # noqa: E402,F401
