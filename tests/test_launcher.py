"""tools/launch_workers.py on its own: whatever ends the launcher ends its workers.

The workers here are stand-ins (a few lines of Python each, no TensorFlow), so
that every way the launcher can end is tried in the default run: its signals,
its terminal closing, SIGKILL, and its output closed early. The training
workers' side of it is in tests/test_multi_worker.py. What it cannot start (a worker
count out of range, a folder or a missing script) is one line and exit status 2.
"""
import fcntl
import os
import pty
import select
import signal
import subprocess
import sys
import termios
import time

import pytest

from conftest import one_line, run

# a stand-in worker: says it is ready, then prints a line every 50 ms for
# `lines` lines (for ever when 0), then leaves a file saying it finished. As
# the training scripts do, it goes on when its output is closed.
STAND_IN = """
import os, sys, time
lines = int(sys.argv[1]); folder = sys.argv[2]
print("ready", os.getpid(), flush=True)
n = 0
while not lines or n < lines:
    try:
        print("line", n, flush=True)
    except OSError:
        sys.stdout = open(os.devnull, "w")
    n += 1; time.sleep(0.05)
open(os.path.join(folder, f"finished-{os.getpid()}"), "w").close()
"""


def _launcher(tmp_path, lines=0):
    return [sys.executable, "tools/launch_workers.py", "--workers", "2", "--",
            sys.executable, "-c", STAND_IN, str(lines), str(tmp_path)]


def _wait_gone(pids, bound=60):
    """Wait (at most `bound` seconds in all) until every pid has ended; those still running.

    A pidfd becomes readable when its process ends, zombie or reaped: no polling.
    """
    deadline, running = time.monotonic() + bound, []
    for pid in pids:
        try:
            handle = os.pidfd_open(pid)
        except ProcessLookupError:
            continue
        ended, _, _ = select.select([handle], [], [], max(0.0, deadline - time.monotonic()))
        os.close(handle)
        running += [] if ended else [pid]
    return running


def _ready_pids(read_line):
    """The two workers' pids, read from their "ready" lines."""
    pids = {}
    while len(pids) < 2:
        line = read_line()
        assert line, f"the launcher's output ended before both workers were ready: {pids}"
        if "] ready " in line:
            worker, pid = line.split("] ready ")
            pids[worker] = int(pid.split()[0])
    return sorted(pids.values())


@pytest.fixture
def reap():
    """Pids to SIGKILL at the end of the test, whatever happened in it."""
    pids = []
    yield pids
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.mark.parametrize("args, complaint", [
    (["--workers", "100", "--", "train_gpu.py"], "from 2 to 16, got 100"),
    (["--workers", "1", "--", "train_gpu.py"], "from 2 to 16, got 1"),
    (["--", "tools"], "tools is a folder; give the training script"),
    (["--", "no_such.py"], "no_such.py not found")])
def test_launch_workers_refuses_what_it_cannot_start(args, complaint):
    line = one_line(run("tools/launch_workers.py", *args, timeout=60))
    assert line.startswith("launch_workers.py: error: ") and complaint in line, line


@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGTERM, signal.SIGINT, signal.SIGQUIT])
def test_a_signal_to_the_launcher_ends_every_worker(repo, tmp_path, reap, sig):
    launcher = subprocess.Popen(_launcher(tmp_path), cwd=repo, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, start_new_session=True)
    reap.append(launcher.pid)
    workers = _ready_pids(launcher.stdout.readline)
    reap.extend(workers)
    launcher.send_signal(sig)
    _, err = launcher.communicate(timeout=120)
    assert launcher.returncode == 128 + sig
    assert err.splitlines() == [f"launch_workers.py: error: stopped by "
                                f"{signal.Signals(sig).name}; all workers stopped"]
    assert _wait_gone(workers) == []
    assert not list(tmp_path.glob("finished-*"))  # stopped, not run to their end


def test_the_launchers_terminal_closing_ends_every_worker(repo, tmp_path, reap):
    # the launcher runs on a terminal of its own (a pseudo-terminal); closing its
    # other end is what closing the terminal window does: the kernel sends SIGHUP
    controller, terminal = pty.openpty()

    def take_the_terminal():
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    launcher = subprocess.Popen(_launcher(tmp_path), cwd=repo, stdin=terminal,
                                stdout=terminal, stderr=terminal, start_new_session=True,
                                preexec_fn=take_the_terminal)
    reap.append(launcher.pid)
    os.close(terminal)
    reader = os.fdopen(controller, "r", errors="replace")
    workers = _ready_pids(reader.readline)
    reap.extend(workers)
    reader.close()  # the terminal closes
    assert launcher.wait(timeout=120) == 128 + signal.SIGHUP
    assert _wait_gone(workers) == []


def test_a_launcher_killed_outright_still_ends_its_workers(repo, tmp_path, reap):
    # SIGKILL cannot be caught: the kernel tells each worker (Linux's parent-death signal)
    launcher = subprocess.Popen(_launcher(tmp_path), cwd=repo, stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, text=True,
                                start_new_session=True)
    reap.append(launcher.pid)
    workers = _ready_pids(launcher.stdout.readline)
    reap.extend(workers)
    launcher.kill()
    assert launcher.wait(timeout=60) == -signal.SIGKILL
    assert _wait_gone(workers) == []


def test_a_closed_output_drops_the_lines_and_the_run_goes_on(repo, tmp_path, reap):
    # `launch_workers.py ... | head -n 3`: the reader leaves, the workers finish
    launcher = subprocess.Popen(_launcher(tmp_path, lines=60), cwd=repo,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                start_new_session=True)
    reap.append(launcher.pid)
    workers = _ready_pids(lambda: launcher.stdout.readline().decode())
    reap.extend(workers)
    launcher.stdout.close()
    err = launcher.stderr.read().decode()
    assert launcher.wait(timeout=120) == 0, err
    assert err == ""  # no BrokenPipeError, no line about it
    assert sorted(tmp_path.glob("finished-*")) == sorted(
        tmp_path / f"finished-{pid}" for pid in workers)


# a stand-in worker that tells its place in TF_CONFIG, and fails as worker 1
FAILING = """
import json, os, sys
index = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
print("index", index, flush=True)
sys.exit(3 if index == 1 else 0)
"""


def test_a_failed_worker_is_one_line_and_the_launchers_status():
    done = run("tools/launch_workers.py", "--workers", "2", "--network", "host", "--",
               sys.executable, "-c", FAILING, timeout=120)
    assert done.returncode == 3, done.stderr
    assert done.stderr.splitlines() == [
        "launch_workers.py: error: worker 1 exited with status 3; stopped the other 1"]
    for index in (0, 1):
        assert f"[worker {index}] index {index}" in done.stdout
        assert f"[launch] worker {index}: pid " in done.stdout
