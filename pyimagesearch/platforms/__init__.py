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
- `notebook`: what notebook.ipynb's cells call: install what the runtime
  lacks, keep the runs where a change of runtime leaves them, run the
  scripts as processes, show their figures and records.

Nothing here imports TensorFlow, Keras or a module that does: a notebook's
kernel and a script's first lines use it before TensorFlow may load.
"""
