"""Companion package for "Fast Neural Network Training with Distributed Training and Google TPUs".

One folder, a module per concern (docs/development.md draws the house):

    config, data, autoencoder, loss    the article's four (get_data, AutoEncoder, MSELoss)
    cli, plan                           the flags; the run they ask for (RunPlan)
    strategies                          what stands behind the scripts' strategy lines
    sources, pipeline                   where the digits come from; how they become batches
    callbacks, outputs, files           timer, TensorBoard, profiler; the run record and
                                        figure; files written all or none, local or gs://
    runtime, terminal, exits, errors    the process: its machine and first call, TensorFlow's
                                        native lines, how it ends, the one-line errors
    backup, loop, tfrecords, cluster,   opt-in, loaded where a flag or the environment asks:
    tfrecord_writer, tpu_runtime,       --backup-dir, --loop custom, TFRecords, TF_CONFIG,
    tpu_lookup, jax_route, jax_loop,    the TPU, Keras on JAX (and its custom loop's step),
    workarounds                         TensorFlow's private hooks
    notebook/                           the notebook's driver, which never loads TensorFlow

Importing the package changes nothing: each script and tool makes one
explicit, marked first call (`runtime.tensorflow()`, or train_tpu.py's
`tpu_runtime.prepare(argv)`) before TensorFlow loads.
"""
