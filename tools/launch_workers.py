"""Rehearse a multi-worker cluster on this machine: N training processes on loopback.

    python tools/launch_workers.py --workers 2 -- train_gpu.py --rehearse 1
    python tools/launch_workers.py --workers 2 -- train_gpu.py --rehearse 1 --epochs 1

Each worker gets its own TF_CONFIG naming 127.0.0.1 ports picked free, as a
real cluster's machines get theirs (see the README); under KERAS_BACKEND=jax,
Keras' KERAS_DISTRIBUTION_* variables instead, worker 0's port as JAX's
coordinator: the hosts of a TPU slice (`KERAS_BACKEND=jax python
tools/launch_workers.py --workers 2 -- train_tpu.py --rehearse 4`, docs/tpus.md).
Their lines are prefixed with the worker's index. When a worker fails, the
others get PEER_GRACE_SECONDS to notice the lost peer and stop by themselves,
as a real cluster's survivors do, then SIGTERM, then SIGKILL after
STOP_GRACE_SECONDS; the launcher exits with the failed worker's status (128 + N
for a signal N) after one line naming it. Whatever ends the launcher ends its
workers too: Ctrl-C, SIGTERM, SIGHUP (its terminal closing) or SIGQUIT (exit
128 + the signal), and on Linux even SIGKILL (the kernel sends each worker
SIGTERM). When its own output is closed (`| head`), the workers' lines are
dropped and the run goes on, as the training scripts do.

TensorFlow's gRPC servers listen on every interface of the machine, not only
on the address in TF_CONFIG, so on Linux the launcher first moves itself into
a network namespace of its own whose only interface is loopback (the
`unshare` command; `--network host` skips that): the rehearsal's servers
cannot be reached from anywhere else.
"""
import argparse
import ctypes
import errno
import fcntl
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the root
# the scripts' one-line errors (they load no TensorFlow, as this launcher must not)
from pyimagesearch import exits  # noqa: E402
from pyimagesearch.errors import OneLineParser, UserError  # noqa: E402

PEER_GRACE_SECONDS = 30  # how long the others get to notice a failed worker themselves
STOP_GRACE_SECONDS = 20  # how long stopped workers get to exit before SIGKILL
_IN_NAMESPACE = "PYIMAGESEARCH_LAUNCHER_NETNS"  # set once we are inside our namespace
MAX_WORKERS = 16  # TensorFlow processes on one machine, each about 1 GB


def fail(message, status):
    """One line on stderr (where it can still be written), then exit with `status`."""
    exits.say(message)
    raise SystemExit(status)


def enter_private_network(argv):
    """Re-run this launcher inside a new network namespace (same process, via exec).

    Returns only when that is not possible (no `unshare`, or namespaces not
    permitted, as in many containers), after saying so in one line.
    """
    command = ["unshare", "--net"] + ([] if os.geteuid() == 0 else ["--map-root-user"])
    try:  # a dry run first: exec would leave nothing to fall back to
        probe = subprocess.run(command + ["true"], capture_output=True, text=True,
                               timeout=30)
        reason = probe.stderr.strip().splitlines()[-1] if probe.returncode else None
    except (OSError, subprocess.TimeoutExpired) as error:
        reason = getattr(error, "strerror", None) or str(error)
    if reason is None:
        env = {**os.environ, _IN_NAMESPACE: "1"}
        os.execvpe(command[0], command + [sys.executable, os.path.abspath(__file__), *argv],
                   env)
    print(f"[launch] no private network namespace ({reason}); the workers' servers "
          "listen on every interface (--network host skips this attempt)",
          file=sys.stderr, flush=True)


def bring_up_loopback():
    """Switch on `lo`, the only interface of a new network namespace (it starts down)."""
    get_flags, set_flags, up = 0x8913, 0x8914, 0x1  # SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as handle:
        request = struct.pack("16sh", b"lo", 0)
        flags = struct.unpack("16sh", fcntl.ioctl(handle, get_flags, request))[1]
        fcntl.ioctl(handle, set_flags, struct.pack("16sh", b"lo", flags | up))


def free_ports(count):
    """`count` distinct free TCP ports on 127.0.0.1 (held open together while picked)."""
    sockets = []
    try:
        for _ in range(count):
            handle = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            handle.bind(("127.0.0.1", 0))
            sockets.append(handle)
        return [handle.getsockname()[1] for handle in sockets]
    finally:
        for handle in sockets:
            handle.close()


def tf_config(ports, index):
    """The TF_CONFIG of worker `index` in a cluster on `ports` of 127.0.0.1."""
    return json.dumps({"cluster": {"worker": [f"127.0.0.1:{port}" for port in ports]},
                       "task": {"type": "worker", "index": index}})


def cluster_environment(ports, index, backend):
    """What worker `index` is told of the others: TF_CONFIG for TensorFlow; for Keras on JAX
    (KERAS_BACKEND=jax) Keras' KERAS_DISTRIBUTION_* variables, with worker 0's port for JAX's
    coordinator, as `train_tpu.py` reads them on a TPU slice's hosts (jax_slice.py)."""
    if backend == "jax":
        return {"KERAS_DISTRIBUTION_JOB_ADDRESSES": f"127.0.0.1:{ports[0]}",
                "KERAS_DISTRIBUTION_NUM_PROCESSES": str(len(ports)),
                "KERAS_DISTRIBUTION_PROCESS_ID": str(index)}
    return {"TF_CONFIG": tf_config(ports, index)}


# the signals that end the launcher, and so its workers: SIGHUP is what the
# launcher's terminal sends when it closes
STOPPING_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)


class Stopped(Exception):
    """The launcher got one of STOPPING_SIGNALS."""

    def __init__(self, signum):
        super().__init__(signum)
        self.signum = signum


_stopping = []  # the first stopping signal: a second one must not cut the stop short


def _stop_on_signal(signum, frame):
    if not _stopping:
        _stopping.append(signum)
        raise Stopped(signum)


def _end_with_parent():
    """In a worker, before exec (Linux): SIGTERM when the launcher dies, even of SIGKILL."""
    if _LIBC is None:
        return
    _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != _LAUNCHER_PID:  # the launcher died before prctl took effect
        os.kill(os.getpid(), signal.SIGTERM)


_PR_SET_PDEATHSIG = 1
_LAUNCHER_PID = os.getpid()
_LIBC = ctypes.CDLL(None) if sys.platform.startswith("linux") else None  # prctl()


def _stdout_to_nowhere():
    """Point fd 1 at /dev/null, so that Python's last flush at exit finds nowhere to fail."""
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, sys.stdout.fileno())
        os.close(null)
    except (OSError, ValueError):
        pass


def describe(status):
    """An exit status in words: 'status 2' or 'killed by SIGKILL'."""
    if status < 0:
        return f"killed by {signal.Signals(-status).name}"
    return f"status {status}"


class Workers:
    """The worker processes, their output relays, and how to stop them."""

    def __init__(self):
        self.lock = threading.Lock()
        self.workers, self.relays = [], []
        self.output_closed = False  # the reader of our stdout went away: drop the lines

    def start(self, command, count):
        """Start `count` workers of `command`, each with its TF_CONFIG."""
        self.ports = free_ports(count)
        self.backend = os.environ.get("KERAS_BACKEND", "tensorflow")
        for index in range(count):
            env = {**os.environ, **cluster_environment(self.ports, index, self.backend),
                   "PYTHONUNBUFFERED": "1"}
            env.pop(_IN_NAMESPACE, None)
            if self.backend == "jax":  # the processes' own settings, not a reader's TF_CONFIG
                env.pop("TF_CONFIG", None)
            # a session of its own: Ctrl-C and a closing terminal reach the launcher,
            # which stops each worker's whole process group itself. All workers
            # start before any relay thread does (a hook before exec is not safe
            # once threads run).
            worker = subprocess.Popen(command, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                      start_new_session=True, preexec_fn=_end_with_parent)
            self.workers.append(worker)
        for index, worker in enumerate(self.workers):
            where = (f"JAX process {index} of {count}, coordinator 127.0.0.1:{self.ports[0]}"
                     if self.backend == "jax" else f"127.0.0.1:{self.ports[index]}")
            self.say(f"[launch] worker {index}: pid {worker.pid}, {where}")
            relay = threading.Thread(target=self._relay, args=(index, worker), daemon=True)
            relay.start()
            self.relays.append(relay)

    def say(self, line):
        """Print one line whole, never interleaved with another worker's.

        Once our reader has gone (a closed pipe or terminal), lines are dropped:
        the workers' output is still read, so none of them blocks on a full pipe.
        """
        with self.lock:
            if self.output_closed:
                return
            try:
                print(line, flush=True)
            except OSError as error:  # EPIPE: `| head` ended; EIO: the terminal closed
                if error.errno not in (errno.EPIPE, errno.EIO):
                    raise
                self.output_closed = True
                _stdout_to_nowhere()

    def _relay(self, index, worker):
        """Copy a worker's output, line by line, with its index in front."""
        for raw in worker.stdout:
            self.say(f"[worker {index}] {raw.decode(errors='replace').rstrip()}")

    def wait(self):
        """Wait until all succeed (None) or one fails: (index, status) of the first failure."""
        while True:
            statuses = [worker.poll() for worker in self.workers]
            failed = [(i, s) for i, s in enumerate(statuses) if s not in (None, 0)]
            if failed:
                # a worker killed by a signal is the cause; the others followed it
                return min(failed, key=lambda item: (item[1] >= 0, item[0]))
            if all(status == 0 for status in statuses):
                return None
            time.sleep(0.2)

    def running(self):
        """True while any worker is alive."""
        return any(worker.poll() is None for worker in self.workers)

    def stop(self):
        """SIGTERM every live worker's process group; SIGKILL what is left after the grace."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            live = [worker for worker in self.workers if worker.poll() is None]
            for worker in live:
                try:
                    os.killpg(worker.pid, sig)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + STOP_GRACE_SECONDS
            while any(w.poll() is None for w in live) and time.monotonic() < deadline:
                time.sleep(0.2)
        for worker in self.workers:
            worker.wait()
        for relay in self.relays:
            relay.join(timeout=5)


def read_command_line(argv):
    """The launcher's flags and the training command to run, checked; one line and exit if wrong."""
    # the launcher's own flags come before --, the training command after it
    split = argv.index("--") if "--" in argv else len(argv)
    parser = OneLineParser(usage="%(prog)s [-h] [--workers N] [--network {isolated,host}] "
                                 "-- SCRIPT.py [FLAGS ...]  (SCRIPT.py: relative to the "
                                 "current folder)",
                           description=__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=2,
                        help="worker processes to start (default %(default)s)")
    parser.add_argument("--network", choices=("isolated", "host"), default="isolated",
                        help="isolated: a private network namespace with loopback only "
                             "(Linux); host: this machine's (default %(default)s)")
    args = parser.parse_args(argv[:split])  # --help answers here, before any check
    if "--" not in argv:
        raise UserError("give the training command after --, e.g. "
                        "python tools/launch_workers.py --workers 2 -- train_gpu.py --rehearse 1")
    command = argv[split + 1:]
    if not 2 <= args.workers <= MAX_WORKERS:
        # each worker is a whole TensorFlow process: more than a few take the machine down
        raise UserError(f"--workers must be from 2 to {MAX_WORKERS}, got {args.workers}")
    if not command:
        raise UserError("no training command after --")
    if os.path.isdir(command[0]):
        raise UserError(f"{command[0]} is a folder; give the training script, e.g. train_gpu.py")
    if command[0].endswith(".py"):
        if not os.path.exists(command[0]):
            raise UserError(f"{command[0]} not found")
        command = [sys.executable] + command
    return args, command


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    args, command = read_command_line(argv)
    if args.network == "isolated" and not os.environ.get(_IN_NAMESPACE):
        enter_private_network(argv)  # returns only where it cannot
    if os.environ.get(_IN_NAMESPACE):
        bring_up_loopback()

    # SIGTERM (a test's clean-up, a job scheduler), SIGHUP (the terminal closed)
    # and SIGQUIT stop the workers as Ctrl-C does
    for signum in STOPPING_SIGNALS:
        signal.signal(signum, _stop_on_signal)
    cluster = Workers()
    try:
        cluster.start(command, args.workers)
        failure = cluster.wait()
        if failure is not None:
            deadline = time.monotonic() + PEER_GRACE_SECONDS
            while cluster.running() and time.monotonic() < deadline:
                time.sleep(0.2)
        cluster.stop()  # joins the output relays; stops whatever still runs
    except Stopped as stop:
        cluster.stop()
        fail(f"stopped by {signal.Signals(stop.signum).name}; all workers stopped",
             status=128 + stop.signum)
    except OSError as error:  # a worker that could not be started at all
        cluster.stop()
        raise UserError(f"cannot start {command[0]}: {error.strerror or error}") from error
    _stopping.append(None)  # every worker has ended: a late signal changes nothing
    if failure is None:
        cluster.say(f"[launch] all {args.workers} workers finished")
        return
    index, status = failure
    # the launcher exits as its first failed worker did (a signal N as 128 + N, as a
    # shell reports it), so a scheduler reads the same status: 2 bad input, 138 a
    # lost peer, 143 SIGTERM
    ended = f"was {describe(status)}" if status < 0 else f"exited with {describe(status)}"
    fail(f"worker {index} {ended}; stopped the other "
         f"{args.workers - 1}", status=status if status > 0 else 128 - status)


if __name__ == "__main__":
    exits.run_main(main)
