"""Keras on JAX past one host: one process per host of a TPU slice, or the launcher's rehearsal.

A TPU slice of several hosts (a v5e-16 is 4 hosts of 4 chips) runs one JAX
process per host, every host the same command. `join` makes them one
system with `jax.distributed.initialize`: on a Cloud TPU VM or a GKE TPU
slice JAX reads the hosts and this one's index from the TPU's metadata or
`TPU_WORKER_HOSTNAMES`; elsewhere they come from Keras' own variables,
KERAS_DISTRIBUTION_JOB_ADDRESSES (the coordinator first),
KERAS_DISTRIBUTION_NUM_PROCESSES and KERAS_DISTRIBUTION_PROCESS_ID, which
`tools/launch_workers.py` sets for a rehearsal on this machine (each process
then holds JAX CPU devices, and their collectives travel over gloo on loopback).

Once joined, jax_route.strategy spans every device of every process, Keras'
`fit` gives each process its share of each global batch (`DataParallel`'s
`distribute_dataset`), and one jitted step trains the mean over the whole
global batch. The `Slice` stands where TensorFlow's cluster.Cluster does: its
process 0 is the chief, the only one that writes; the processes agree on
their settings before training (`check_workers_agree`), and a lost one is one
line (`_watch_peers`). Loaded for runs of several JAX processes only.
"""
import atexit
import dataclasses
import inspect
import itertools
import math
import os
import sys
import threading
import time
import warnings

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from pyimagesearch.cluster import AGREEMENT_TIMEOUT_S, KeyValueStore
from pyimagesearch.cluster import check_workers_agree as agree
from pyimagesearch.cluster import shared_decision as decided_once
from pyimagesearch.errors import PeerLost, UserError, first_line
from pyimagesearch.runtime import this_process
from pyimagesearch.terminal import filter_collective_noise

# Keras' names for a multi-process run's settings (keras.distribution.initialize reads them)
ADDRESSES_ENV = "KERAS_DISTRIBUTION_JOB_ADDRESSES"
PROCESSES_ENV = "KERAS_DISTRIBUTION_NUM_PROCESSES"
PROCESS_ID_ENV = "KERAS_DISTRIBUTION_PROCESS_ID"
GKE_HOSTS_ENV = "TPU_WORKER_HOSTNAMES"  # GKE's, in every pod of a multi-host TPU slice
MAX_PROCESSES = 4096  # beyond any TPU slice: a whole v5p pod, 8,960 chips, is 2,240 hosts
# A lost peer: every process counts up its own beat in the coordination service's key-value
# store each BEAT_S, and stops with PeerLost's one line and status 138 once another's beat
# has not moved for PEER_SILENT_S (or the store is gone: process 0 is). JAX's own heartbeat
# check is the backstop, later: it ends a process with status 1, which a restart policy
# reads as a bug (the filter on stderr, started in join, turns its record into one line)
BEAT_S = 1
PEER_SILENT_S = 10
HEARTBEAT_TIMEOUT_S = 60
END_TIMEOUT_S = 600  # how long a process waits at the end for process 0 to write (a bucket)


def processes(environ=os.environ):
    """How many JAX processes this run spans: KERAS_DISTRIBUTION_NUM_PROCESSES if set,
    else the hosts GKE names in TPU_WORKER_HOSTNAMES, else 1 (this host alone)."""
    text = environ.get(PROCESSES_ENV)
    if text is None:
        hosts = [name for name in environ.get(GKE_HOSTS_ENV, "").split(",") if name.strip()]
        return max(1, len(hosts))
    if not (text.strip().isascii() and text.strip().isdigit()
            and 1 <= int(text) <= MAX_PROCESSES):
        raise UserError(f"{PROCESSES_ENV}={text!r}: give the number of processes, "
                        f"one per host, from 1 to {MAX_PROCESSES}")
    return int(text)


@dataclasses.dataclass(frozen=True)
class Slice:
    """This process's place among the JAX processes of a slice (or of a rehearsal)."""

    workers: int           # processes: one per host
    task_index: int        # this one's: jax.process_index()
    devices_per_host: int  # jax.local_device_count()
    # set once the run has ended here as it should (end_together): a silent peer is no loss
    ended: threading.Event = dataclasses.field(default_factory=threading.Event, repr=False,
                                               compare=False)
    task_type = "process"

    @property
    def is_chief(self):
        """Process 0 writes the figure, the record, the model and the backups."""
        return self.task_index == 0

    @property
    def name(self):
        return f"process {self.task_index}"

    @property
    def tasks(self):
        return [f"process:{index}" for index in range(self.workers)]

    # what cli, backup, outputs and exits ask of it, as of TensorFlow's cluster.Cluster
    def agree(self, facts, topic="run"):
        check_workers_agree(self, facts, topic)

    def decide(self, topic, decide):
        return shared_decision(self, topic, decide)

    def lost(self, error):
        return peer_lost(self, error)

    def end_together(self):
        end_together(self)


def join(count, timeout_s, environ=os.environ):
    """Join the run's `count` processes (jax.distributed.initialize) within `timeout_s`
    (--startup-timeout); this one's Slice.

    Called before anything asks JAX for its devices. Keras' own
    `keras.distribution.initialize` reads the same variables, but passes
    no timeouts: a process that never starts would hold the others for
    JAX's 300 s, a lost one for its 100 s.
    """
    coordinator = environ.get(ADDRESSES_ENV, "").split(",")[0].strip() or None
    given = environ.get(PROCESS_ID_ENV)
    if given is not None and not (given.isascii() and given.isdigit() and int(given) < count):
        raise UserError(f"{PROCESS_ID_ENV}={given!r}: give this process's index, "
                        f"from 0 to {count - 1}")
    where = coordinator or "the coordinator JAX finds on the slice"
    # JAX ends a process itself (status 1) when it cannot join, or loses the coordinator:
    # the record it writes (several lines of C++) becomes one line of ours
    me = f"process {given}" if given is not None else "this process"
    filter_collective_noise(this_process, (
        f"{_prog()}: error: {me} of {count} lost a peer (JAX's distributed service ended "
        "it, status 1); restart every process together",
        f"{_prog()}: error: {me} could not join the other {count - 1} through {where} "
        f"(--startup-timeout {timeout_s:g} s; JAX ended it, status 1); start every host's process "
        "with the same command, or raise --startup-timeout"))
    # Keras shards a tf.data validation set by process with `rebatch`, whose length tf.data
    # does not know, and warns at the end of every validation that it "ran out of data":
    # it is the set's end. Upstream: none filed; still so in Keras 3.15.1
    # (keras/src/distribution/distribution_lib.py, distribute_tf_dataset)
    warnings.filterwarnings("ignore", "Your input ran out of data", UserWarning)
    # CPU arrays across processes (a rehearsal's devices) need a collectives backend
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    limits = {"initialization_timeout": max(1, math.ceil(timeout_s))}
    if "heartbeat_timeout_seconds" in inspect.signature(jax.distributed.initialize).parameters:
        # a lost peer is _watch_peers' to say (status 138), not JAX's to end us for (status
        # 1). jax 0.6.2, the last for Python 3.10 (Cloud TPU VMs), has neither setting: its
        # processes wait for each other at exit, and its own heartbeat check takes 100 s
        limits["heartbeat_timeout_seconds"] = HEARTBEAT_TIMEOUT_S
    try:
        jax.config.update("jax_enable_recoverability", True)
    except AttributeError:  # "Unrecognized config option" (jax 0.6.2)
        pass
    print(f"[INFO] joining {count} JAX processes through {where} "
          f"(up to {timeout_s:g} s)", flush=True)
    jax.distributed.initialize(coordinator, count, int(given) if given is not None else None,
                               **limits)
    here = Slice(workers=jax.process_count(), task_index=jax.process_index(),
                 devices_per_host=jax.local_device_count())
    threading.Thread(target=_watch_peers, args=(here,), daemon=True,
                     name="peer watch").start()
    atexit.register(_leave, here)  # before JAX's own shutdown (atexit runs the last first)
    return here


def _leave(here):
    """As this process ends, however it ends: the others first, process 0 last.

    Process 0 holds JAX's coordinator: a process still connected when it
    goes is ended by JAX (status 1, and a line saying a peer was lost),
    even after a run that ended well or a refusal that all made alike. So
    the others disconnect (jax.distributed.shutdown), and process 0 waits
    until they have, or PEER_SILENT_S: JAX's "alive tasks" call returns once
    every other process has called it too or has disconnected.
    """
    here.ended.set()
    from jax._src.distributed import global_state  # private, as _client's

    if global_state.client is None:  # left already
        return
    if not here.is_chief:
        jax.distributed.shutdown()
        return
    waiting = threading.Thread(target=global_state.client.get_live_nodes,
                               args=(list(range(here.workers)),), daemon=True)
    waiting.start()
    waiting.join(PEER_SILENT_S)


def end_together(cluster, timeout_s=END_TIMEOUT_S):
    """Wait until every process has ended its run (process 0 has written), then leave as one.

    With JAX's recoverable tasks (join) nothing else holds a process at its
    end, and the others would take its silence for a loss; then `_leave`.
    """
    try:
        _client().wait_at_barrier("pyimagesearch/end", int(timeout_s * 1000))
        _leave(cluster)  # here too: a preempted run leaves through os._exit, not atexit
    except RuntimeError as error:
        raise PeerLost(f"{cluster.name} of {cluster.workers} ended its run, but not all the "
                       f"others did within {timeout_s:g} s ({first_line(error)})") from error


def any_asked(cluster, topic, asked):
    """Whether any process `asked` (True or False here) at this point of the run, which every
    process reaches: SIGTERM, say, at an epoch's end, so that all stop there or none."""
    client = _client()
    client.key_value_set(f"pyimagesearch/{topic}/{cluster.task_index}", "1" if asked else "")
    return any([client.blocking_key_value_get(f"pyimagesearch/{topic}/{index}",
                                              int(AGREEMENT_TIMEOUT_S * 1000))
                for index in range(cluster.workers)])


def _watch_peers(here, clock=time.monotonic):
    """Beat, and end this process in one line (status 138) when a peer stops beating."""
    client, moved = _client(), {}
    for beat in itertools.count():
        try:
            client.key_value_set(f"pyimagesearch/beat/{here.task_index}", str(beat),
                                 allow_overwrite=True)
            for index in range(here.workers):
                if index != here.task_index:
                    seen = _beat_of(client, index)
                    if moved.get(index, (None,))[0] != seen:
                        moved[index] = (seen, clock())
        except RuntimeError as error:  # the store is process 0's: it is gone
            if here.ended.is_set():
                return
            _end(PeerLost(f"{here.name} of {here.workers} lost process 0, the coordinator "
                          f"({first_line(error)}); restart every process together"))
        silent = [index for index, (_, since) in moved.items()
                  if clock() - since > PEER_SILENT_S and not here.ended.is_set()]
        if silent:
            _end(PeerLost(f"{here.name} of {here.workers} lost process {silent[0]}: no beat "
                          f"from it for {PEER_SILENT_S} s; restart every process together"))
        time.sleep(BEAT_S)


def _beat_of(client, index):
    """Process `index`'s last beat in the store; None before its first."""
    try:
        return client.key_value_try_get(f"pyimagesearch/beat/{index}")
    except RuntimeError as error:
        if "NOT_FOUND" in str(error):
            return None
        raise


def _end(error):
    """One line, then this process ends at once with `error`'s status (the others are gone)."""
    try:
        print(f"{_prog()}: error: {error}", file=sys.stderr, flush=True)
    finally:
        os._exit(error.exit_status)


def _prog():
    return os.path.basename(sys.argv[0]) or "train"


def _client():
    """JAX's coordination client, with its key-value store (private: jax._src.distributed)."""
    try:
        from jax._src.distributed import global_state

        client = global_state.client
        client.key_value_set, client.blocking_key_value_get  # noqa: B018
    except (ImportError, AttributeError) as error:
        raise UserError(f"jax {jax.__version__} lacks the coordination service's key-value "
                        f"store ({error}), a private API that runs of several processes use; "
                        "install jax 0.7.2") from error
    return client


def _store():
    client = _client()
    return KeyValueStore(client.key_value_set, client.blocking_key_value_get, (RuntimeError,))


def check_workers_agree(cluster, facts, topic="run", timeout_s=AGREEMENT_TIMEOUT_S):
    """Stop every process, with one line naming the difference, unless all run alike: as
    TensorFlow's workers do (cluster.check_workers_agree), through JAX's key-value store."""
    agree(cluster, facts, topic, timeout_s, _store())


def shared_decision(cluster, topic, decide, timeout_s=AGREEMENT_TIMEOUT_S):
    """`decide()`, taken once by process 0 and handed to every other (a JSON value)."""
    return decided_once(cluster, topic, decide, timeout_s, _store())


def peer_lost(cluster, error):
    """The PeerLost line for a collective's error that names the coordination service; else None.

    Most lost peers never get here: JAX's service ends the survivors itself
    (join's filter); this is for a collective that fails first (gloo's
    connection to a killed process).
    """
    text = str(error)
    if not any(word in text for word in ("heartbeat", "Connection reset", "coordination",
                                         "gloo", "Gloo")):
        return None
    return PeerLost(f"{cluster.name} of {cluster.workers} lost a peer and stopped "
                    f"({type(error).__name__}: {first_line(error)})")


def predict(model, strategy, images):
    """`model`'s output for `images` on every process, as one NumPy array (`strategy`:
    the run's DataParallel, whose devices compute it).

    Keras' predict gives each process its share of a tf.data batch and
    cannot turn the result into one array (it spans other processes'
    devices), so here every device computes the whole, small batch from
    replicated weights: its result is readable on every process.
    """
    mesh = strategy.device_mesh.backend_mesh
    everywhere = NamedSharding(mesh, PartitionSpec())
    inputs = jax.make_array_from_process_local_data(everywhere, np.asarray(images))

    def forward(trainable, non_trainable, batch):
        return model.stateless_call(trainable, non_trainable, batch)[0]

    output = jax.jit(forward, out_shardings=everywhere)(
        [v.value for v in model.trainable_variables],
        [v.value for v in model.non_trainable_variables], inputs)
    return np.asarray(output)

