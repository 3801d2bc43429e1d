"""Keras on JAX past one host: the JAX processes of a TPU slice (one per host), or a rehearsal.

`join` makes the processes one system with `jax.distributed.initialize()`. On a
Cloud TPU VM and on GKE, JAX finds the slice by itself (its cloud_tpu_cluster
reads the TPU's metadata, or GKE's TPU_WORKER_HOSTNAMES and TPU_WORKER_ID): a
single host is a slice of one. tools/launch_workers.py rehearses a slice on this
machine with Keras' KERAS_DISTRIBUTION_* variables, each process holding JAX CPU
devices whose collectives travel over gloo. JAX is called directly, not through
`keras.distribution.initialize`, which passes no time limit (a host that never
starts would hold the others for JAX's 300 s); Keras' random generators agree
across processes anyway, since every process sets the same --seed.

Once joined, one DataParallel spans every process's devices, Keras' fit gives
each process its share of each global batch, and process 0 alone writes. The
`Slice` answers what a TensorFlow cluster.Cluster does: agree, decide, end.
"""
import atexit
import dataclasses
import inspect
import itertools
import math
import json
import os
import threading
import time
import warnings

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from pyimagesearch import exits
from pyimagesearch.errors import PeerLost, UserError, first_line
from pyimagesearch.host import detect, silent_after

KERAS_ENV = ("KERAS_DISTRIBUTION_JOB_ADDRESSES", "KERAS_DISTRIBUTION_NUM_PROCESSES",
             "KERAS_DISTRIBUTION_PROCESS_ID")
AGREEMENT_TIMEOUT_S = 120
BEAT_S, PEER_SILENT_S = 1, 10  # a peer whose beat stands still this long is lost: 138
END_TIMEOUT_S = 600            # how long a process waits at the end for process 0 to write


def join(timeout_s, rehearsal=False, environ=os.environ):
    """Join the slice's processes within `timeout_s` (--startup-timeout); this one's Slice,
    or None alone (a rehearsal on one process, Colab's or Kaggle's single TPU host)."""
    explicit = any(environ.get(name) for name in KERAS_ENV)
    if not explicit and (rehearsal or not detect().tpu_chips or detect().jax_tpu_image):
        return None
    limits = {"initialization_timeout": max(1, math.ceil(timeout_s))}
    if explicit:  # the launcher's rehearsal: Keras' variables, the coordinator listed first
        count, index = _number(environ, KERAS_ENV[1], 1, 4096), None
        if environ.get(KERAS_ENV[2]):
            index = _number(environ, KERAS_ENV[2], 0, count - 1)
        limits.update(coordinator_address=environ.get(KERAS_ENV[0], "").split(",")[0] or None,
                      num_processes=count, process_id=index)
    if rehearsal:  # JAX CPU devices across processes: gloo carries their collectives
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        with_recovery(limits)
    # Keras shards a validation set by process with tf.data's `rebatch`, whose length it
    # cannot know, and warns at each validation's end that it "ran out of data": the set's
    # end (keras/src/distribution/distribution_lib.py, 3.15.1; no upstream report)
    warnings.filterwarnings("ignore", "Your input ran out of data", UserWarning)
    print(f"[INFO] joining the slice's JAX processes (up to {timeout_s:g} s)", flush=True)
    _wait_for_the_coordinator(environ, limits, timeout_s)
    try:
        jax.distributed.initialize(**limits)
    except (ValueError, RuntimeError) as error:
        raise UserError(f"cannot tell whether this host is one of several: JAX found no slice "
                        f"to join ({first_line(error)}); on a Cloud TPU VM or GKE run the same "
                        "command on every host of the slice, or raise --startup-timeout"
                        ) from error
    if jax.process_count() == 1:
        return None
    here = Slice(jax.process_count(), jax.process_index(), jax.local_device_count())
    threading.Thread(target=_watch_peers, args=(here,), daemon=True).start()
    atexit.register(here.leave)  # before JAX's own shutdown: atexit runs the last first
    return here


def _wait_for_the_coordinator(environ, limits, timeout_s):
    """Wait, where signals act, until the coordinator answers (where its address is known):
    JAX ends a process that cannot register in time itself, with status 1 and its own lines."""
    hosts = [name for name in environ.get("TPU_WORKER_HOSTNAMES", "").split(",") if name]
    index = limits.get("process_id", environ.get("TPU_WORKER_ID"))
    address = limits.get("coordinator_address") or (hosts and f"{hosts[0]}:8476")  # JAX's port
    if not address or str(index) in ("0", "None"):
        return
    if silent_after({"process 0": address}, timeout_s):
        raise PeerLost(f"process {index} gave up after {timeout_s:g} s waiting for the "
                       f"coordinator, process 0, at {address} (--startup-timeout); start "
                       "every host's process with the same command")


def with_recovery(limits):
    """A rehearsal's options, where this jax has them: a lost peer is ours to say (status 138),
    not JAX's to end us for. `jax_enable_recoverability` is experimental and "currently only
    works fully on GPUs" (JAX's fault_tolerance page, jax 0.7.1 on): never set on a TPU."""
    if "heartbeat_timeout_seconds" in inspect.signature(jax.distributed.initialize).parameters:
        limits["heartbeat_timeout_seconds"] = 6 * PEER_SILENT_S
    try:
        jax.config.update("jax_enable_recoverability", True)
    except AttributeError:  # jax 0.6.2, the last for Python 3.10: no such option
        pass


def _number(environ, name, low, high):
    text = environ.get(name, "").strip()
    if not (text.isascii() and text.isdigit() and low <= int(text) <= high):
        raise UserError(f"{name}={environ.get(name)!r}: give a whole number from {low} to {high}")
    return int(text)


def _client():
    """JAX's coordination client and its key-value store (jax._src.distributed: private, and
    where it is gone one line)."""
    try:
        from jax._src.distributed import global_state
        client = global_state.client
        client.key_value_set, client.blocking_key_value_get  # noqa: B018
    except (ImportError, AttributeError) as error:
        raise UserError(f"jax {jax.__version__} lacks the coordination service's key-value "
                        "store, which runs of several processes use; install jax 0.6.2 to "
                        "0.7.2") from error
    return client


@dataclasses.dataclass(frozen=True)
class Slice:
    """This process's place among the JAX processes of a slice (or of a rehearsal)."""

    workers: int           # processes, one per host
    task_index: int        # jax.process_index()
    devices_per_host: int  # jax.local_device_count()
    ended: threading.Event = dataclasses.field(default_factory=threading.Event, compare=False)

    @property
    def is_chief(self):
        return self.task_index == 0

    @property
    def name(self):
        return f"process {self.task_index}"

    def agree(self, facts, topic="run"):
        """Stop every process in one line unless all have the same `facts` (cluster.agree)."""
        from pyimagesearch.cluster import agree
        client = _client()
        client.key_value_set(f"pyimagesearch/{topic}/{self.name}", json.dumps(facts))
        others = [f"process {index}" for index in range(self.workers) if index != self.task_index]
        agree(self.name, others, facts, lambda other: client.blocking_key_value_get(
            f"pyimagesearch/{topic}/{other}", AGREEMENT_TIMEOUT_S * 1000), "process", "processes")

    def decide(self, topic, decide):
        """`decide()` taken once, by process 0, and handed to every process."""
        client, key = _client(), f"pyimagesearch/decided/{topic}"
        if self.is_chief:
            client.key_value_set(key, json.dumps(decide()))
        return json.loads(client.blocking_key_value_get(key, AGREEMENT_TIMEOUT_S * 1000))

    def any_asked(self, topic, asked):
        """Whether any process `asked` at this point of the run, which every process reaches:
        SIGTERM at an epoch's end, so that all stop there or none."""
        client = _client()
        client.key_value_set(f"pyimagesearch/{topic}/{self.task_index}", "1" if asked else "")
        return any([client.blocking_key_value_get(f"pyimagesearch/{topic}/{index}",
                                                  AGREEMENT_TIMEOUT_S * 1000)
                    for index in range(self.workers)])

    def end_together(self):
        """Every process has ended its run (process 0 has written): leave as one."""
        try:
            _client().wait_at_barrier("pyimagesearch/end", END_TIMEOUT_S * 1000)
        except RuntimeError as error:
            raise PeerLost(f"{self.name} of {self.workers} ended its run, but not all the others "
                           f"did within {END_TIMEOUT_S} s ({first_line(error)})") from error
        self.leave()

    def leave(self):
        """The others disconnect first and process 0, which holds JAX's coordinator, last:
        a process still connected when it goes is ended by JAX, after a good run too. Every
        process shuts down its client (jax 0.6.2 holds the others in a shutdown barrier
        until process 0 reaches it too)."""
        self.ended.set()
        from jax._src.distributed import global_state
        if global_state.client is None:  # left already
            return
        if self.is_chief:  # JAX's "alive tasks" call returns once the others have disconnected
            waiting = threading.Thread(target=global_state.client.get_live_nodes,
                                       args=(list(range(self.workers)),), daemon=True)
            waiting.start()
            waiting.join(PEER_SILENT_S)
        jax.distributed.shutdown()


def _watch_peers(here, clock=time.monotonic):
    """Beat, and end this process in one line (status 138) when a peer stops beating."""
    client, moved = _client(), {}
    for beat in itertools.count():
        try:
            client.key_value_set(f"pyimagesearch/beat/{here.task_index}", str(beat),
                                 allow_overwrite=True)
            for index in set(range(here.workers)) - {here.task_index}:
                try:
                    seen = client.key_value_try_get(f"pyimagesearch/beat/{index}")
                except RuntimeError as error:
                    if "NOT_FOUND" not in str(error):
                        raise
                    seen = None
                if moved.get(index, (None,))[0] != seen:
                    moved[index] = (seen, clock())
        except RuntimeError as error:  # the store is process 0's: it is gone (JAX's own
            # client mostly ends this process first, with its fatal line and SIGABRT)
            if here.ended.is_set():
                return
            _end(f"{here.name} of {here.workers} lost process 0, the coordinator "
                 f"({first_line(error)}); restart every process together")
        silent = [index for index, (_, since) in moved.items() if clock() - since > PEER_SILENT_S]
        if silent and not here.ended.is_set():
            _end(f"{here.name} of {here.workers} lost process {silent[0]}: no beat from it for "
                 f"{PEER_SILENT_S} s; restart every process together")
        time.sleep(BEAT_S)


def _end(line):
    """A lost peer, from the watching thread: one line, status 138, at once."""
    exits.say(line)
    exits.leave(PeerLost.exit_status)


def predict(model, strategy, images):
    """`model`'s output for `images` on every process, as one NumPy array.

    Keras' predict would give each process its share of the batch and cannot
    gather the result; here every device computes the whole, small batch from
    replicated weights, so every process runs the same computation.
    """
    everywhere = NamedSharding(strategy.device_mesh.backend_mesh, PartitionSpec())
    inputs = jax.make_array_from_process_local_data(everywhere, np.asarray(images))

    def forward(trainable, non_trainable, batch):
        return model.stateless_call(trainable, non_trainable, batch)[0]

    output = jax.jit(forward, out_shardings=everywhere)(
        [v.value for v in model.trainable_variables],
        [v.value for v in model.non_trainable_variables], inputs)
    return np.asarray(output)

