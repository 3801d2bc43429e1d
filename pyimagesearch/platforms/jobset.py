"""TF_CONFIG for a pod of a Kubernetes JobSet, built from the pod's own index.

Kubeflow's TFJob wrote TF_CONFIG into every pod; its Training Operator v1
(up to 1.9) is the last to ship TFJob, and Kubeflow Trainer v2 has none
(docs/fault-tolerance-and-tensorboard.md). A JobSet (jobset.x-k8s.io/v1alpha2)
runs the same pods on a current cluster but sets no TF_CONFIG. What it does
give each pod is enough to build one:

- JOB_COMPLETION_INDEX: the pod's index in its Indexed Job (Kubernetes sets it);
- the labels jobset.sigs.k8s.io/jobset-name, .../replicatedjob-name and
  .../job-index, which the manifest passes in as JOBSET_NAME,
  REPLICATED_JOB_NAME and JOB_INDEX (the downward API);
- a stable name per pod, <jobset>-<replicated job>-<job index>-<pod index>
  under the headless service <subdomain> (the JobSet's name unless
  spec.network.subdomain says otherwise: set JOBSET_SUBDOMAIN then).

WORKERS (the Job's parallelism) and TF_PORT (default 2222) come from the
manifest. Worker 0 is the chief, as with any cluster of workers only.
"""
import json

from pyimagesearch.training.errors import UserError

NEEDED = ("JOBSET_NAME", "REPLICATED_JOB_NAME", "JOB_INDEX", "JOB_COMPLETION_INDEX", "WORKERS")
DEFAULT_PORT = 2222  # the port Kubeflow's TFJob used, and the manifest's containerPort
MAX_WORKERS = 10_000  # far beyond any real cluster; a typo past it is refused


def is_jobset_pod(environ):
    """True if this process runs in a JobSet pod that the manifest describes to us."""
    return bool(environ.get("JOBSET_NAME")) and "JOB_COMPLETION_INDEX" in environ


def tf_config(environ):
    """The TF_CONFIG (a JSON string) of this pod; a UserError naming what is wrong."""
    missing = [name for name in NEEDED if not environ.get(name, "").strip()]
    if missing:
        raise UserError(f"this JobSet pod lacks {', '.join(missing)}; set them in the "
                        "manifest (see docs/fault-tolerance-and-tensorboard.md), or set "
                        "TF_CONFIG")
    workers = _number(environ, "WORKERS", 1, MAX_WORKERS)
    index = _number(environ, "JOB_COMPLETION_INDEX", 0, workers - 1)
    job = _number(environ, "JOB_INDEX", 0, MAX_WORKERS)
    port = _number(environ, "TF_PORT", 1, 65535, DEFAULT_PORT)
    name, replicated = environ["JOBSET_NAME"].strip(), environ["REPLICATED_JOB_NAME"].strip()
    subdomain = environ.get("JOBSET_SUBDOMAIN", "").strip() or name
    hosts = [f"{name}-{replicated}-{job}-{pod}.{subdomain}:{port}" for pod in range(workers)]
    return json.dumps({"cluster": {"worker": hosts}, "task": {"type": "worker", "index": index}})


def _number(environ, key, low, high, default=None):
    """environ[key] as a whole number from `low` to `high`; one line if it is not."""
    text = environ.get(key, "").strip() or (None if default is None else str(default))
    if text is None or not text.isascii() or not text.isdigit() or not low <= int(text) <= high:
        raise UserError(f"{key} must be a whole number from {low} to {high} in this JobSet "
                        f"pod, got {environ.get(key)!r}")
    return int(text)
