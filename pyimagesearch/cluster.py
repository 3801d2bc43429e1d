"""More than one machine: read TF_CONFIG, wait for the peers, agree with them, name a lost one.

Every process of a cluster gets a `TF_CONFIG` environment variable, set by
hand, by `tools/launch_workers.py`, or by the platform (Vertex AI custom training,
Kubeflow's TFJob), or built here from a Kubernetes JobSet pod's index:

    {"cluster": {"worker": ["host-a:12345", "host-b:12345"]},
     "task": {"type": "worker", "index": 0}}

`read_tf_config` turns it into a `Cluster`, from which `strategies.py` builds a
MultiWorkerMirroredStrategy. That keeps a copy of the model on every worker
(on each of its GPUs, or on one CPU device) and all-reduces the gradients
between the processes with TensorFlow's collective ops (their default, AUTO,
communication). Worker 0, or the chief if the cluster names one, is the one
that writes outputs.

Keras 3's `model.fit` does not run under this strategy (keras-team/keras#20585,
open: "Attempt to convert a value (PerReplica:...)"; still so in Keras 3.15.1,
tests/test_workarounds.py), so the training scripts use the custom loop
(`loop.py`) there.

Also here:
- TF_CONFIG for a pod of a Kubernetes JobSet, built from the pod's own indices.
"""
import dataclasses
import ipaddress
import json
import math
import os
import re
import socket
import time

import tensorflow as tf

from pyimagesearch.errors import PeerLost, UserError, first_line


# --- TF_CONFIG for a pod of a Kubernetes JobSet, built from the pod's own indices -------------
# Kubeflow's TFJob wrote TF_CONFIG into every pod; its Training Operator v1
# (up to 1.9) is the last to ship TFJob, and Kubeflow Trainer v2 has none
# (docs/fault-tolerance-and-tensorboard.md). A JobSet (jobset.x-k8s.io/v1alpha2)
# runs the same pods on a current cluster but sets no TF_CONFIG. What it does
# give each pod is enough to build one:
#
# - JOB_COMPLETION_INDEX: the pod's index in its Indexed Job (Kubernetes sets it);
# - the labels jobset.sigs.k8s.io/jobset-name, .../replicatedjob-name,
#   .../replicatedjob-replicas and .../job-index, which the manifest passes in
#   as JOBSET_NAME, REPLICATED_JOB_NAME, REPLICAS and JOB_INDEX (the downward API);
# - a stable name per pod, <jobset>-<replicated job>-<job index>-<pod index>
#   under the headless service <subdomain> (the JobSet's name unless
#   spec.network.subdomain says otherwise: set JOBSET_SUBDOMAIN then).
#
# A replicated job of REPLICAS Jobs, each of WORKERS pods (its parallelism,
# from the manifest), is one cluster of REPLICAS x WORKERS workers: every pod
# lists every pod of every Job, in the order job index, then pod index, so pod
# p of Job j is worker j x WORKERS + p and the first pod of Job 0 is the chief.
# (The JobSet runs this one replicated job: the pods of another would not be
# listed.) TF_PORT (default 2222) comes from the manifest too.
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


ROLES = ("chief", "worker")  # the task types that train; no parameter servers here
# a task that is in the cluster but does not train: Vertex AI's worker pool 3
EVALUATOR = "evaluator"
AGREEMENT_TIMEOUT_S = 120  # how long a worker waits for the others' run settings


@dataclasses.dataclass(frozen=True)
class Cluster:
    """What TF_CONFIG says about the cluster and this process's place in it."""

    workers: int      # processes that train: the chief, if any, plus the workers
    task_type: str    # "chief", "worker" or "evaluator"
    task_index: int
    has_chief: bool   # the cluster names a chief
    peers: tuple = () # (task name, "host:port") of every other training task
    address: str = "" # this task's "host:port"

    @property
    def is_chief(self):
        """True for the one process that writes: the chief, else worker 0."""
        if self.has_chief:
            return self.task_type == "chief"
        return self.task_type == "worker" and self.task_index == 0

    @property
    def tasks(self):
        """Every training task, as "type:index"."""
        chief = ["chief:0"] if self.has_chief else []
        return chief + [f"worker:{i}" for i in range(self.workers - len(chief))]

    @property
    def name(self):
        return f"{self.task_type} {self.task_index}"

    # what cli, backup and exits ask of a cluster; a JAX slice answers alike (jax_slice.Slice)
    def agree(self, facts, topic="run"):
        check_workers_agree(self, facts, topic)

    def decide(self, topic, decide):
        return shared_decision(self, topic, decide)

    def lost(self, error):
        return peer_lost(self, error)


def read_tf_config(environ=os.environ):
    """The Cluster described by $TF_CONFIG, or None when this process trains alone.

    Platforms set TF_CONFIG in their own forms, and TensorFlow reads it
    again, so what it reads is put right here, in `environ`:

    - unset or empty: None (an empty one is removed; TensorFlow would fail
      to parse it);
    - a cluster of one task, as Vertex AI sets on single-machine jobs: None,
      and TF_CONFIG is removed, so the run is exactly a single machine's;
    - "master", the legacy name of the chief: renamed "chief";
    - an "evaluator" task: a Cluster whose task type is "evaluator", which
      the scripts end at once (validation runs inside training).

    Anything else malformed (not JSON, a task outside the cluster, parameter
    servers) raises UserError. In a pod of a Kubernetes JobSet, which sets no
    TF_CONFIG, it is built from the pod's index (platforms/py).
    """
    text = environ.get("TF_CONFIG", "").strip()
    if not text and is_jobset_pod(environ):
        text = environ["TF_CONFIG"] = tf_config(environ)
        print(f"[INFO] TF_CONFIG built from this JobSet pod's index: {text}", flush=True)
    cluster, renamed = parse_tf_config(text) if text else (None, None)
    return rewrite_tf_config(environ, cluster, renamed)


def parse_tf_config(text):
    """TF_CONFIG's text read: (its Cluster, its dict with "master" renamed "chief" or None)."""
    try:
        spec = json.loads(text)
    except ValueError as error:
        raise UserError(f"TF_CONFIG is not valid JSON ({error})") from error
    if not isinstance(spec, dict) or not isinstance(spec.get("cluster"), dict):
        raise UserError('TF_CONFIG needs a "cluster" object, e.g. {"cluster": '
                        '{"worker": ["host-a:12345", "host-b:12345"]}, "task": '
                        '{"type": "worker", "index": 0}}')
    cluster = {("chief" if role == "master" else role): hosts
               for role, hosts in spec["cluster"].items()}
    tasks = _cluster_tasks(cluster)
    task = spec.get("task")
    task_type, index = _task_place(task)
    workers = len(tasks["chief"]) + len(tasks["worker"])
    if task_type == EVALUATOR:  # TensorFlow's evaluator need not be in the cluster
        return Cluster(workers, task_type, index, has_chief=bool(tasks["chief"])), None
    if not isinstance(index, int) or isinstance(index, bool) or not (
            0 <= index < len(tasks[task_type])):
        raise UserError(f"TF_CONFIG's task index {index!r} is outside the cluster's "
                        f"{len(tasks[task_type])} {task_type} task(s)")
    renamed = None
    if "master" in spec["cluster"] or task.get("type") == "master":
        renamed = {**spec, "cluster": cluster, "task": {**task, "type": task_type}}
    peers = tuple((f"{role} {i}", host) for role in ROLES
                  for i, host in enumerate(tasks[role]) if (role, i) != (task_type, index))
    return Cluster(workers, task_type, index, has_chief=bool(tasks["chief"]), peers=peers,
                   address=tasks[task_type][index]), renamed


def _cluster_tasks(cluster):
    """TF_CONFIG's cluster checked: {role: ["host:port", ...]} for every role; UserError else."""
    unknown = sorted(set(cluster) - set(ROLES) - {EVALUATOR})
    if unknown:
        raise UserError(f"TF_CONFIG's cluster has {', '.join(unknown)} tasks; only "
                        "chief, worker and evaluator are supported (no parameter servers)")
    tasks = {}
    for role in (*ROLES, EVALUATOR):
        hosts = cluster.get(role, [])
        if not isinstance(hosts, list) or not all(
                isinstance(h, str) and _host_port(h)[1] for h in hosts):
            raise UserError(f'TF_CONFIG\'s cluster "{role}" must be a list of '
                            f'"host:port" strings (port 1 to 65535), got {hosts!r}')
        tasks[role] = hosts
    training = tasks["chief"] + tasks["worker"]
    twice = sorted({address for address in training if training.count(address) > 1})
    if twice:
        raise UserError(f"TF_CONFIG's cluster names {', '.join(twice)} more than once; "
                        "every task needs a host:port of its own")
    if len(tasks["chief"]) > 1:
        raise UserError("TF_CONFIG's cluster may name one chief at most")
    return tasks


def _task_place(task):
    """TF_CONFIG's task checked: (type, index), "master" read as "chief"; UserError else."""
    if not isinstance(task, dict):
        raise UserError('TF_CONFIG needs a "task" object, e.g. '
                        '{"type": "worker", "index": 0}')
    task_type, index = task.get("type"), task.get("index")
    task_type = "chief" if task_type == "master" else task_type
    if task_type not in (*ROLES, EVALUATOR):
        raise UserError(f"TF_CONFIG's task type is {task_type!r}; this script "
                        "runs as chief, worker or evaluator")
    return task_type, index


def rewrite_tf_config(environ, cluster, renamed):
    """TF_CONFIG put right in `environ` as parse_tf_config read it; the Cluster, None alone."""
    if cluster is None:  # unset or empty; TensorFlow would fail to parse an empty one
        environ.pop("TF_CONFIG", None)
        return None
    if cluster.task_type == EVALUATOR:  # the scripts end it at once, before TensorFlow reads it
        return cluster
    if cluster.workers < 2:
        environ.pop("TF_CONFIG", None)
        print(f"[INFO] TF_CONFIG names a cluster of {cluster.workers} task (as Vertex AI sets "
              "for a single machine): training as a single machine", flush=True)
        return None
    if renamed:
        environ["TF_CONFIG"] = json.dumps(renamed)
    return cluster


def _host_port(address):
    """(host, port) of "host:port", an IPv6 host without its brackets.

    The port is None unless it is 1 to 65535 in ASCII digits (str.isdigit
    would let "²" through).
    """
    host, _, port = address.rpartition(":")
    valid = host and re.fullmatch(r"[0-9]{1,5}", port) and 1 <= int(port) <= 65535
    return host.strip("[]"), int(port) if valid else None


def wait_for_peers(cluster, timeout_s, poll_s=0.5):
    """Wait, where signals still act, until every peer has started; PeerLost after `timeout_s`.

    MultiWorkerMirroredStrategy waits for the other workers inside C++,
    holding Python's lock and with TensorFlow's own SIGTERM handler in place:
    neither Ctrl-C nor a scheduler's SIGTERM stops it there. So the wait is
    done here first. Each worker listens on its own TF_CONFIG port, as
    TensorFlow's server will (on every interface), and polls every peer's
    until all answer; then it lets the port go and builds the strategy,
    which finds the others up. A peer seen once may have let its port go
    for its own server already: it counts as started.
    """
    host, port = _host_port(cluster.address)
    try:
        if _is_loopback(host):  # a cluster on one machine: reachable from it alone
            # TensorFlow's server will listen on every address: a process that
            # holds the port on another one (127.0.0.2) would stop it, so try
            # that first, and let it go at once
            _listen_everywhere(port).close()
            family = socket.AF_INET6 if ":" in host else socket.AF_INET
            here = socket.create_server((host, port), family=family)
        else:
            here = _listen_everywhere(port)
    except OSError as error:
        why = os.strerror(error.errno) if error.errno else error  # create_server adds more
        raise UserError(f"{cluster.name} cannot listen on port {port}, its TF_CONFIG "
                        f"address {cluster.address} ({why}); another "
                        "process uses it: stop that one, or give this task another port")
    deadline = time.monotonic() + timeout_s
    waiting, told = dict(cluster.peers), False
    try:
        while True:
            waiting = {name: address for name, address in waiting.items()
                       if not answers(address)}
            if not waiting:
                return
            if time.monotonic() >= deadline:
                raise gave_up_waiting(cluster, timeout_s, [
                    f"{name} ({address})" for name, address in waiting.items()])
            if not told:
                print(f"[INFO] {cluster.name} is waiting for " + ", ".join(waiting)
                      + " to start" + (f" (up to {timeout_s:g} s)" if timeout_s < math.inf
                                       else ""), flush=True)
                told = True
            time.sleep(poll_s)  # SIGTERM and Ctrl-C act here
    finally:
        here.close()


def _listen_everywhere(port):
    """A socket listening on `port` of every address, IPv6 too where it can, as TensorFlow's."""
    if socket.has_dualstack_ipv6():
        return socket.create_server(("", port), family=socket.AF_INET6, dualstack_ipv6=True)
    return socket.create_server(("", port))


def _is_loopback(host):
    """Whether `host` names this machine's loopback interface."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a name
        return False


def gave_up_waiting(cluster, timeout_s, missing, detail=None):
    """The PeerLost of a worker that waited `timeout_s` for `missing` peers to start."""
    return PeerLost(f"{cluster.name} gave up after {timeout_s:g} s waiting for "
                    + (", ".join(missing) or "its peers") + " to start (--startup-timeout"
                    + (f"; TensorFlow said: {detail}" if detail else "") + ")")


def answers(address, timeout_s=1.0):
    """Whether `address` ("host:port") takes a TCP connection now."""
    host, port = _host_port(address)
    if port is None:
        return False
    try:
        socket.create_connection((host, port), timeout=timeout_s).close()
        return True
    except OSError:  # refused, no route, or a name that does not resolve yet
        return False


def missing_peers(cluster, timeout_s=2.0):
    """The peers whose address takes no TCP connection now (their server is not up)."""
    return [f"{name} ({address})" for name, address in cluster.peers
            if not answers(address, timeout_s)]


@dataclasses.dataclass(frozen=True)
class KeyValueStore:
    """A coordination service's key-value store: TensorFlow's here, JAX's (jax_slice.py)."""

    post: object    # post(key, text)
    read: object    # read(key, timeout_ms): the text, once posted
    errors: tuple   # what `read` raises when the wait fails


def _tensorflow_store():
    """TensorFlow's (its runtime context's): a private API; where it is gone, one line."""
    from pyimagesearch.workarounds import private_api

    with private_api("the coordination service's key-value store"):
        from tensorflow.python.eager import context

        runtime = context.context()
        get = runtime.get_config_key_value
        return KeyValueStore(runtime.set_config_key_value,
                             lambda key, ms: get(key, timeout_in_ms=ms), (tf.errors.OpError,))


def check_workers_agree(cluster, facts, topic="run", timeout_s=AGREEMENT_TIMEOUT_S,
                        store=None):
    """Stop every worker, with one line naming the difference, unless all run alike.

    `facts` ({name: JSON value}) are this worker's settings, data and
    devices (or what it found in the backup: `topic` names the exchange).
    Each worker posts them to the coordination service's key-value
    store, which MultiWorkerMirroredStrategy has just connected every worker
    to, and reads every other's back. Not an all-reduce: workers with a
    different number of devices would not even agree on the all-reduce's
    group size. Private TensorFlow API (tests check it exists). `store`: a
    JAX slice's (jax_slice.py), whose processes agree the same way.
    """
    if cluster is None:
        return
    me = f"{cluster.task_type}:{cluster.task_index}"
    store = store or _tensorflow_store()
    store.post(f"pyimagesearch/{topic}/{me}", json.dumps(facts))
    member, members = (("process", "processes") if cluster.task_type == "process"
                       else ("worker", "workers"))
    for other in cluster.tasks:
        if other == me:
            continue
        try:
            theirs = json.loads(store.read(f"pyimagesearch/{topic}/{other}",
                                           int(timeout_s * 1000)))
        except store.errors as error:
            raise UserError(f"{cluster.name} could not read the {topic} settings of "
                            f"{other.replace(':', ' ')} ({first_line(error)})") from error
        for name, value in facts.items():
            if theirs.get(name) != value:
                raise UserError(
                    f"the {members} disagree: {name} is {value!r} on {cluster.name} but "
                    f"{theirs.get(name)!r} on {other.replace(':', ' ')}; start every "
                    f"{member} with the same flags, data and number of devices")


def shared_decision(cluster, topic, decide, timeout_s=AGREEMENT_TIMEOUT_S, store=None):
    """`decide()`, taken once by the chief and handed to every worker (a JSON value).

    A decision that hangs on the network or the clock (is tfds' host
    answering?) would come out differently on a slow worker; the workers
    would then disagree, and stop. The chief decides and posts the answer to
    the coordination service's key-value store; the others wait for it
    there. Private TensorFlow API, as check_workers_agree's (`store` as there).
    """
    if cluster is None or cluster.task_type == EVALUATOR:
        return decide()
    key = f"pyimagesearch/decided/{topic}"
    store = store or _tensorflow_store()
    if cluster.is_chief:
        value = decide()
        store.post(key, json.dumps(value))
        return value
    try:
        return json.loads(store.read(key, int(timeout_s * 1000)))
    except store.errors as error:
        raise UserError(f"{cluster.name} did not get the chief's answer on the {topic} "
                        f"within {timeout_s:g} s ({first_line(error)})") from error


def peer_lost(cluster, error):
    """The PeerLost line for `error`, if it is a collective's failing because a peer died; else None.

    On loopback a killed worker resets its connections and the survivors'
    collectives abort within seconds (UnavailableError); a host that stops
    answering without closing its connections is noticed by the coordination
    service's heartbeats, which abort the collectives the same way (a worker
    frozen with SIGSTOP here: 8 s). Errors of those types that name no peer
    or collective (a bucket's, say) are not a lost peer: None.
    """
    if cluster is None:
        return None
    lost = (tf.errors.UnavailableError, tf.errors.DeadlineExceededError,
            tf.errors.AbortedError, tf.errors.CancelledError)
    if not isinstance(error, lost) or not _PEER.search(str(getattr(error, "message", error))):
        return None
    return PeerLost(f"{cluster.task_type} {cluster.task_index} lost a peer of its "
                    f"{cluster.workers}-worker cluster and stopped "
                    f"({type(error).__name__}: {_cause(error)})")


# what the errors of collectives and of the coordination service name: the
# peer's task, the collective, or the service's heartbeats
_PEER = re.compile(r"/job:|collective|coordination|heartbeat|peer", re.IGNORECASE)


def _cause(error):
    """The line of a collective's error that says what happened to the peer.

    A line that ends in a colon is followed by what it announces (the
    coordination service's "unhealthy (stopped sending heartbeats):" by the
    tasks it means): the two are one line here.
    """
    lines = [line.strip() for line in str(getattr(error, "message", error)).splitlines()]
    telling = re.compile(r"aborted|reset|unavailable|deadline|timed? ?out|heartbeat|"
                         r"connect|failed|lost", re.IGNORECASE)
    for at, line in enumerate(lines):
        if telling.search(line) and not line.startswith(("File ", "Detected at node")):
            following = lines[at + 1] if at + 1 < len(lines) else ""
            return f"{line} {following}" if line.endswith(":") and following else line
    return first_line(error)


def collective_communication(rehearse):
    """How MultiWorkerMirroredStrategy's all-reduces travel: NCCL between GPUs.

    AUTO, TensorFlow's default, all-reduces over gRPC rings even between the
    GPUs of one machine; NCCL uses NVLink and the GPUs' own transport. A
    rehearsal on CPUs keeps AUTO (NCCL needs GPUs).
    """
    implementation = tf.distribute.experimental.CommunicationImplementation
    return implementation.AUTO if rehearse else implementation.NCCL
