"""Where the scripts run, read without TensorFlow: none of these modules imports it.

- `host`: the notebook service (Colab, Kaggle, neither), the GPUs and the
  TPU chips of this machine, from files and environment variables;
- `tpu_runtime`: the runtime TensorFlow must reach a TPU v5e or v6e
  through, set up before TensorFlow is imported;
- `startup`: what every script and tool sets up before TensorFlow loads, in
  its first call (importing the package sets nothing);
- `backend`: Keras' backend for each script, TensorFlow or (train_tpu.py on a
  JAX TPU image) JAX, chosen before Keras is imported;
- `jobset`: the TF_CONFIG of a pod of a Kubernetes JobSet, from its index;
- `notebook`: what notebook.ipynb's cells cannot hold: the runtime and the
  runs it gets, a folder that a change of runtime leaves, a script run as a
  process with its output shown as it comes;
- `install`: the notebook's install of what the runtime lacks;
- `listings`: the scripts as the notebook shows them, their `# +` lines grey
  (the one reader of that marker);
- `records`: what the notebook shows from the records on disk: a run's
  epochs and figure, the matmul and loss tables, a run's time estimate.

Nothing here imports TensorFlow, Keras or a module that does: a notebook's
kernel and a script's first lines use it before TensorFlow may load.
"""
