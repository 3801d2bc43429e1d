"""Companion package for "Fast Neural Network Training with Distributed Training and Google TPUs".

The article's four modules are at the top, and three that the training
scripts call by name; everything else is one level down:

    config, data (get_data), autoencoder, loss    the article's modules
    cli          the flags, set into config's values (configure), what they ask of a
                 run (plan, callbacks), one-line exits
    strategies   what stands behind the scripts' strategy calls
    outputs      the run record; figure, record and model written all or none
    datasets/    the sources (tfds, the sample, TFRecords), pipelines, TFRecord format
    training/    the plan, callbacks, backup and preemption, custom loop,
                 precision, clusters, and the errors, files and TensorFlow
                 workarounds they share
    platforms/   where the scripts run: a TPU's runtime, Colab and Kaggle,
                 the notebook's driver; none of it imports TensorFlow

Imports run downwards only: the scripts, then cli, strategies and outputs,
then data, then datasets/ and training/ (datasets/ uses training's errors,
files, workarounds and network probe; training/ never imports datasets/),
and config, autoencoder and loss, which import nothing of the package.
platforms/ imports only training's errors and network probe, and nothing
that loads TensorFlow.

Importing the package does not import TensorFlow: a TPU v5e or v6e needs
TensorFlow's runtime chosen first (platforms/tpu_runtime.py), and the
notebook's kernel never loads it. It does set TPU_LOAD_LIBRARY=0 (unless
set already), so that tensorflow-tpu's import leaves a TPU's chips alone in
every process of this repository but the TPU run, whose first line takes
it back out (tpu_runtime.prepare). The first module that needs TensorFlow
imports it, quietly. `outputs.load_model` loads a saved `outputs/cpu.keras`
with this package's classes registered.
"""
import os

from pyimagesearch.platforms.tpu_runtime import leave_the_tpu_alone
from pyimagesearch.training.workarounds import (VERBOSE_ENV, open_closed_standard_streams,
                                                quiet_tensorflow_import)

open_closed_standard_streams()  # `>&-`: no file opened later may take fd 1 or 2

if not os.environ.get(VERBOSE_ENV):
    # TensorFlow's C++ INFO lines ("Memory patch applied ..." each time a
    # strategy feeds its devices) are not for readers; warnings and errors
    # still show. A TF_CPP_MIN_LOG_LEVEL of the user's own wins.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")

# tensorflow-tpu's import loads libtpu, takes the TPU's lock and initialises
# it, in any process, unless TPU_LOAD_LIBRARY=0: a rehearsal, train_cpu.py,
# compare.py or TensorBoard would hold the chips the TPU run needs (and wait
# minutes for a metadata server off Google Cloud). The TPU run alone undoes it.
leave_the_tpu_alone()

quiet_tensorflow_import()  # its C++ start-up notices are not for readers
