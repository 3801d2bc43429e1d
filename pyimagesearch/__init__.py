"""Companion package for "Fast Neural Network Training with Distributed Training and Google TPUs".

The article's four modules, then what the scripts call beside them, one concern each
(docs/development.md draws the whole):

    config, data, autoencoder, loss    the article's (get_data, AutoEncoder, MSELoss)
    cli, plan                          the flags; the run they ask for (Plan)
    strategies, tpu, cluster,          the strategy lines' helpers: CPU, GPU, rehearsals;
    jax_slice                          the TPU; TF_CONFIG clusters; Keras on JAX's slices
    sources, pipeline, tfrecords       where the digits come from; how they become batches
    callbacks, backup, loop, jax_loop  timer, TensorBoard, profiler; --backup-dir; --loop custom
    outputs, files, exits, errors,     the run record and files written whole; how a run
    host                               ends; this machine, read without TensorFlow

Importing the package changes nothing: each script's first, marked call
(`host.prepare_tensorflow()`, or train_tpu.py's `tpu.prepare(argv)`) sets up the
process before TensorFlow loads.
"""
