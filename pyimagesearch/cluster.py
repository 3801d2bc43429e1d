"""Several machines on TensorFlow: TF_CONFIG read, the peers waited for, agreed with, built on.

Every process of a cluster gets a TF_CONFIG, set by hand, by
tools/launch_workers.py, by Vertex AI or Kubeflow, or built here from a
Kubernetes JobSet pod's indices:

    {"cluster": {"worker": ["host-a:12345", "host-b:12345"]},
     "task": {"type": "worker", "index": 0}}

TensorFlow's TFConfigClusterResolver reads it; `read_tf_config` says in one line
what TensorFlow would not accept. MultiWorkerMirroredStrategy
(strategies.multi_worker) then keeps a copy of the model on every worker and
all-reduces the gradients between them; the chief (worker 0 if none is named)
alone writes. Keras 3's fit does not run under it (keras-team/keras#20585, open
in Keras 3.15.1): the scripts train with the custom loop (loop.py) there.
Loaded for clusters only.
"""
import dataclasses
import json
import math
import os
import socket

import tensorflow as tf

from pyimagesearch.errors import NothingToDo, PeerLost, UserError, first_line
from pyimagesearch.host import silent_after

AGREEMENT_TIMEOUT_S = 120  # how long a worker waits for the others' settings
JOBSET = ("JOBSET_NAME", "REPLICATED_JOB_NAME", "REPLICAS", "JOB_INDEX",
          "JOB_COMPLETION_INDEX", "WORKERS")
MAX_WORKERS = 10_000


def jobset_tf_config(environ):
    """The TF_CONFIG of a JobSet pod, from the indices the manifest passes in.

    A JobSet sets no TF_CONFIG (Kubeflow's TFJob did), but names each pod
    <jobset>-<replicated job>-<job index>-<pod index>.<subdomain>: pod p of Job j
    is worker j x WORKERS + p, and the first pod of Job 0 is the chief.
    """
    lacking = [name for name in JOBSET if not environ.get(name, "").strip()]
    if lacking:
        raise UserError(f"this JobSet pod lacks {', '.join(lacking)}; set them in the manifest "
                        "(docs/distributed-training.md), or set TF_CONFIG")

    def number(key, low, high, default=None):
        text = environ.get(key, "").strip() or default
        if not (text and text.isascii() and text.isdigit() and low <= int(text) <= high):
            raise UserError(f"{key} must be a whole number from {low} to {high} in this "
                            f"JobSet pod, got {environ.get(key)!r}")
        return int(text)

    replicas, workers = number("REPLICAS", 1, MAX_WORKERS), number("WORKERS", 1, MAX_WORKERS)
    if replicas * workers > MAX_WORKERS:
        raise UserError(f"REPLICAS x WORKERS must be at most {MAX_WORKERS} in this JobSet "
                        f"pod, got {replicas} x {workers}")
    job, pod = number("JOB_INDEX", 0, replicas - 1), number("JOB_COMPLETION_INDEX", 0, workers - 1)
    port = number("TF_PORT", 1, 65535, "2222")  # Kubeflow's TFJob port
    name, replicated = environ["JOBSET_NAME"].strip(), environ["REPLICATED_JOB_NAME"].strip()
    subdomain = environ.get("JOBSET_SUBDOMAIN", "").strip() or name
    hosts = [f"{name}-{replicated}-{j}-{p}.{subdomain}:{port}"
             for j in range(replicas) for p in range(workers)]
    return json.dumps({"cluster": {"worker": hosts},
                       "task": {"type": "worker", "index": job * workers + pod}})


@dataclasses.dataclass(frozen=True)
class Cluster:
    """This process's place in the cluster TF_CONFIG describes."""

    workers: int          # processes that train: the chief, if any, and the workers
    task_type: str        # "chief" or "worker"
    task_index: int
    has_chief: bool
    address: str          # this task's "host:port"
    peers: tuple          # (name, "host:port") of every other training task

    @property
    def is_chief(self):
        return self.task_type == "chief" if self.has_chief else self.task_index == 0

    @property
    def name(self):
        return f"{self.task_type} {self.task_index}"

    def agree(self, facts, topic="run"):
        """Stop every worker in one line unless all have the same `facts` (see `agree`)."""
        store = _store()

        def read(other):
            try:
                return store.get_config_key_value(f"pyimagesearch/{topic}/{other}",
                                                  timeout_in_ms=AGREEMENT_TIMEOUT_S * 1000)
            except tf.errors.OpError as error:
                raise UserError(f"{self.name} could not read the {topic} settings of {other} "
                                f"({first_line(error)})") from error

        store.set_config_key_value(f"pyimagesearch/{topic}/{self.name}", json.dumps(facts))
        agree(self.name, [other for other, _ in self.peers], facts, read, "worker", "workers")

    def decide(self, topic, decide):
        """`decide()` taken once, by the chief, and handed to every worker (a JSON value):
        a slow worker would otherwise answer "is the network up?" differently."""
        store, key = _store(), f"pyimagesearch/decided/{topic}"
        if self.is_chief:
            value = decide()
            store.set_config_key_value(key, json.dumps(value))
            return value
        try:
            return json.loads(store.get_config_key_value(
                key, timeout_in_ms=AGREEMENT_TIMEOUT_S * 1000))
        except tf.errors.OpError as error:
            raise UserError(f"{self.name} did not get the chief's answer on the {topic} within "
                            f"{AGREEMENT_TIMEOUT_S} s ({first_line(error)})") from error


def agree(me, others, facts, read, member, members):
    """Stop every process in one line unless `facts` ({name: JSON value}) are every other's
    (`read(other)` gives theirs, as JSON text). An "error" among them, a user's error one
    process met, ends every process with that same line, whichever process met it."""
    theirs = {other: json.loads(read(other)) for other in others}
    errors = sorted(filter(None, [facts.get("error")] + [t.get("error") for t in theirs.values()]))
    if errors:
        raise UserError(errors[0])
    for other, their in theirs.items():
        for key, value in facts.items():
            if their.get(key) != value:
                raise UserError(f"the {members} disagree: {key} is {value!r} on {me} but "
                                f"{their.get(key)!r} on {other}; start every {member} with the "
                                "same flags, data and number of devices")


def _store():
    """The coordination service's key-value store, which the strategy connects every worker
    to (tensorflow.python.eager.context: private, and where it is gone one line)."""
    try:
        from tensorflow.python.eager import context
        return context.context()
    except ImportError as error:
        raise UserError(f"TensorFlow {tf.__version__} lacks the coordination service's "
                        "key-value store, which clusters use; install TensorFlow 2.19 to "
                        "2.21") from error


def read_tf_config():
    """This process's Cluster from TF_CONFIG (or a JobSet pod's indices); None alone.

    Put right in os.environ, which TensorFlow reads again: an empty TF_CONFIG or
    a cluster of one task (Vertex AI's single machine) is removed; the legacy
    "master" is renamed "chief". An evaluator has nothing to do (validation runs
    inside training): NothingToDo.
    """
    environ = os.environ
    if not environ.get("TF_CONFIG", "").strip() and environ.get("JOBSET_NAME") \
            and "JOB_COMPLETION_INDEX" in environ:
        environ["TF_CONFIG"] = jobset_tf_config(environ)
        print(f"[INFO] TF_CONFIG built from this JobSet pod's index: {environ['TF_CONFIG']}")
    text = environ.get("TF_CONFIG", "").strip()
    if not text:
        environ.pop("TF_CONFIG", None)
        return None
    try:
        environ["TF_CONFIG"] = text.replace('"master"', '"chief"')  # the legacy name
        resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
        jobs = resolver.cluster_spec().as_dict()
        task_type, index = resolver.task_type, resolver.task_id
    except (ValueError, TypeError, AttributeError, KeyError) as error:
        raise UserError(f"TF_CONFIG cannot be read ({first_line(error)}); it looks like "
                        '{"cluster": {"worker": ["host-a:12345", "host-b:12345"]}, '
                        '"task": {"type": "worker", "index": 0}}') from error
    if task_type == "evaluator":
        raise NothingToDo("TF_CONFIG makes this process an evaluator task: no evaluator is "
                          "needed, validation runs inside training")
    unknown = sorted(set(jobs) - {"chief", "worker", "evaluator"})
    if unknown:
        raise UserError(f"TF_CONFIG's cluster has {', '.join(unknown)} tasks; only chief, "
                        "worker and evaluator are supported (no parameter servers)")
    tasks = [(role, i, address) for role in ("chief", "worker")
             for i, address in enumerate(_addresses(jobs.get(role, [])))]
    if task_type not in ("chief", "worker") or not isinstance(index, int) or not any(
            (role, i) == (task_type, index) for role, i, _ in tasks):
        raise UserError(f"TF_CONFIG's task {task_type} {index!r} is not one of its cluster's "
                        "chief or worker tasks")
    addresses = [address for _, _, address in tasks]
    if len(jobs.get("chief", [])) > 1 or len(set(addresses)) < len(addresses):
        raise UserError("TF_CONFIG's cluster names more than one chief, or an address twice; "
                        "every task needs a host:port of its own")
    if len(tasks) < 2:
        environ.pop("TF_CONFIG", None)
        print("[INFO] TF_CONFIG names a cluster of 1 task (as Vertex AI sets for a single "
              "machine): training as a single machine")
        return None
    return Cluster(len(tasks), task_type, index, bool(jobs.get("chief")),
                   address=next(a for r, i, a in tasks if (r, i) == (task_type, index)),
                   peers=tuple((f"{r} {i}", a) for r, i, a in tasks
                               if (r, i) != (task_type, index)))


def _addresses(hosts):
    """A role's "host:port" strings, each checked (a port of 1 to 65535)."""
    hosts = list(hosts.values()) if isinstance(hosts, dict) else hosts
    for address in hosts:
        host, _, port = str(address).rpartition(":")
        if not (host and port.isascii() and port.isdigit() and 1 <= int(port) <= 65535):
            raise UserError(f'TF_CONFIG\'s cluster lists {address!r}: every task needs '
                            '"host:port", the port from 1 to 65535')
    return hosts


def wait_for_peers(cluster, timeout_s, poll_s=0.5):
    """Wait where signals still act until every peer has started; PeerLost after `timeout_s`.

    MultiWorkerMirroredStrategy waits for the others inside C++, deaf to Ctrl-C
    and SIGTERM. So each worker first listens on its own TF_CONFIG port, as
    TensorFlow's server will, and polls every peer's until all answer; a peer
    seen once may have let its port go for its own server already.
    """
    port = cluster.address.rpartition(":")[2]
    try:  # on every address, as TensorFlow's server will: a port held on any one is taken
        dual = socket.has_dualstack_ipv6()
        here = socket.create_server(("", int(port)), dualstack_ipv6=dual,
                                    family=socket.AF_INET6 if dual else socket.AF_INET)
    except OSError as error:
        why = os.strerror(error.errno) if error.errno else error
        raise UserError(f"{cluster.name} cannot listen on port {port}, its TF_CONFIG address "
                        f"{cluster.address} ({why}); "
                        "another process uses it: stop that one, or give this task another "
                        "port") from error
    def waiting(names):
        print(f"[INFO] {cluster.name} is waiting for {', '.join(names)} to start"
              + (f" (up to {timeout_s:g} s)" if timeout_s < math.inf else ""), flush=True)

    with here:
        silent = silent_after(dict(cluster.peers), timeout_s, waiting, poll_s)
    if silent:
        raise PeerLost(f"{cluster.name} gave up after {timeout_s:g} s waiting for "
                       + ", ".join(f"{n} ({a})" for n, a in silent.items())
                       + " to start (--startup-timeout)")
