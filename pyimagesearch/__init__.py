"""Companion package for "Fast Neural Network Training with Distributed Training and Google TPUs".

The article's four modules are at the top, and three that the training
scripts call by name; everything else is one level down:

    config, data (get_data), autoencoder, loss    the article's modules
    cli          the flags, what they ask of a run (plan, callbacks), one-line exits
    strategies   what stands behind the scripts' strategy calls
    outputs      the run record; figure, record and model written all or none
    datasets/    the sources (tfds, the sample, TFRecords), pipelines, TFRecord format
    training/    the plan, callbacks, backup and preemption, custom loop,
                 precision, clusters, and the errors, files and TensorFlow
                 workarounds they share

Imports run downwards only: the scripts, then cli, strategies and outputs,
then data, then datasets/ and training/ (datasets/ uses training's errors,
files and workarounds; training/ never imports datasets/), and config,
autoencoder and loss, which import nothing of the package.

Importing the package registers `AutoEncoder` and `MSELoss` with Keras, so a
saved `outputs/cpu.keras` loads back with `keras.saving.load_model`.
"""
import os

from pyimagesearch.training.workarounds import VERBOSE_ENV, native_stderr_quiet

if not os.environ.get(VERBOSE_ENV):
    # TensorFlow's C++ INFO lines ("Memory patch applied ..." each time a
    # strategy feeds its devices) are not for readers; warnings and errors
    # still show. A TF_CPP_MIN_LOG_LEVEL of the user's own wins.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")

with native_stderr_quiet():
    import tensorflow  # noqa: F401  (its C++ start-up notices are not for readers)

from pyimagesearch.autoencoder import AutoEncoder  # noqa: E402,F401  (registers it)
from pyimagesearch.loss import MSELoss  # noqa: E402,F401  (registers it)
from pyimagesearch.training.precision import ReplicasAgreeLossScaleOptimizer  # noqa: E402,F401
