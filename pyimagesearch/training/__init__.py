"""How a run trains beyond the article's `model.fit`, beneath the scripts and `pyimagesearch.cli`.

- `settings`: `Settings` (from the flags) and the name a run's outputs take;
- `flags`: the flag types and the one-line parser the scripts and tools share;
- `exits`: how a script's process ends: one line, an exit status, what is on disk;
- `plan`: `RunPlan`, the numbers a run trains with;
- `callbacks`: the timer, TensorBoard and the profiler, as Keras callbacks;
- `backup`, `preemption`: --backup-dir, an exact resume, and SIGTERM;
- `loop`: the custom training loop (`--loop custom`);
- `precision`: mixed precision and XLA;
- `tpu_lookup`: the article's TPU found, bounded in time, its failures in one line;
- `data_parallel`: Keras on JAX, `keras.distribution.DataParallel` for train_tpu.py;
- `cluster`: TF_CONFIG, the peers, what every worker must agree on;
- `workarounds`: TensorFlow's private hooks, each naming what it works around.

It stands on `pyimagesearch.base` and `pyimagesearch.platforms`; nothing here
imports `pyimagesearch.datasets`, `pyimagesearch.data`, the command line or
the scripts.
"""
