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
                 precision, clusters, TensorFlow's private hooks
    platforms/   where the scripts run: a TPU's runtime, Colab and Kaggle,
                 the notebook's driver; none of it imports TensorFlow
    base/        what all of them stand on: one-line errors, files and
                 outputs written all or none, signals, the network probe,
                 TensorFlow's native lines off the terminal

Imports run downwards only: the scripts, then cli, strategies and outputs,
then data, then datasets/ and training/ (neither imports the other), then
platforms/, then base/, which imports nothing of the package; config,
autoencoder and loss import only config. Only outputs (to load a saved
model) and the scripts import the model.

Importing the package changes nothing: no environment variable, no import
hook, no file descriptor, and no TensorFlow (a TPU v5e or v6e needs
TensorFlow's runtime chosen first, and the notebook's kernel never loads
it). What a process needs before TensorFlow loads, each script and tool
asks for in one marked call in its first lines (platforms/startup.py):
`backend.tensorflow()`, or train_tpu.py's `tpu_runtime.prepare(argv)`.
`outputs.load_model` loads a saved `outputs/cpu.keras` with this package's
classes registered.
"""
