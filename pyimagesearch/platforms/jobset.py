"""TF_CONFIG for a pod of a Kubernetes JobSet, built from the pod's own indices.

Kubeflow's TFJob wrote TF_CONFIG into every pod; its Training Operator v1
(up to 1.9) is the last to ship TFJob, and Kubeflow Trainer v2 has none
(docs/fault-tolerance-and-tensorboard.md). A JobSet (jobset.x-k8s.io/v1alpha2)
runs the same pods on a current cluster but sets no TF_CONFIG. What it does
give each pod is enough to build one:

- JOB_COMPLETION_INDEX: the pod's index in its Indexed Job (Kubernetes sets it);
- the labels jobset.sigs.k8s.io/jobset-name, .../replicatedjob-name,
  .../replicatedjob-replicas and .../job-index, which the manifest passes in
  as JOBSET_NAME, REPLICATED_JOB_NAME, REPLICAS and JOB_INDEX (the downward API);
- a stable name per pod, <jobset>-<replicated job>-<job index>-<pod index>
  under the headless service <subdomain> (the JobSet's name unless
  spec.network.subdomain says otherwise: set JOBSET_SUBDOMAIN then).

A replicated job of REPLICAS Jobs, each of WORKERS pods (its parallelism,
from the manifest), is one cluster of REPLICAS x WORKERS workers: every pod
lists every pod of every Job, in the order job index, then pod index, so pod
p of Job j is worker j x WORKERS + p and the first pod of Job 0 is the chief.
(The JobSet runs this one replicated job: the pods of another would not be
listed.) TF_PORT (default 2222) comes from the manifest too.
"""
import json

from pyimagesearch.base.errors import UserError

NEEDED = ("JOBSET_NAME", "REPLICATED_JOB_NAME", "REPLICAS", "JOB_INDEX",
          "JOB_COMPLETION_INDEX", "WORKERS")
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
    replicas = _number(environ, "REPLICAS", 1, MAX_WORKERS)
    workers = _number(environ, "WORKERS", 1, MAX_WORKERS)
    if replicas * workers > MAX_WORKERS:
        raise UserError(f"REPLICAS x WORKERS must be at most {MAX_WORKERS} in this JobSet "
                        f"pod, got {replicas} x {workers}")
    job = _number(environ, "JOB_INDEX", 0, replicas - 1)
    pod = _number(environ, "JOB_COMPLETION_INDEX", 0, workers - 1)
    port = _number(environ, "TF_PORT", 1, 65535, DEFAULT_PORT)
    name, replicated = environ["JOBSET_NAME"].strip(), environ["REPLICATED_JOB_NAME"].strip()
    subdomain = environ.get("JOBSET_SUBDOMAIN", "").strip() or name
    hosts = [f"{name}-{replicated}-{j}-{p}.{subdomain}:{port}"
             for j in range(replicas) for p in range(workers)]
    return json.dumps({"cluster": {"worker": hosts},
                       "task": {"type": "worker", "index": job * workers + pod}})


def _number(environ, key, low, high, default=None):
    """environ[key] as a whole number from `low` to `high`; one line if it is not."""
    text = environ.get(key, "").strip() or (None if default is None else str(default))
    if text is None or not text.isascii() or not text.isdigit() or not low <= int(text) <= high:
        raise UserError(f"{key} must be a whole number from {low} to {high} in this JobSet "
                        f"pod, got {environ.get(key)!r}")
    return int(text)
