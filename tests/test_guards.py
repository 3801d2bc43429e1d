"""Guards that only slow tests, or none, held: each is broken on purpose in issue 34's mutation run.

- what runs before argparse (tpu_runtime.py) reads the flags as
  argparse will, in every form argparse takes ('--device=tpu', a flag given
  twice), and argparse takes no abbreviation that the pre-parse would miss;
- KERAS_BACKEND=jax is set aside for TensorFlow, not only said to be;
- a SIGTERM after the outputs are written names them, with no advice to
  resume with --backup-dir (there is nothing left to resume);
- a signalled tools/launch_workers.py ends its workers' children too;
- a standard stream the caller closed gets a /dev/null that can be written.

All run without TensorFlow in the processes they start, or in this one.
"""
import contextlib
import copy
import io
import json
import os
import signal
import subprocess
import sys

import pytest

import launch_workers
import matmul_benchmark

from pyimagesearch import cli, exits, tpu_runtime
from pyimagesearch.runtime import this_process

from test_launcher import _wait_gone, reap  # noqa: F401  (reap: a fixture)
from test_platforms import HELD_OFF, _at_tensorflow_import, _pjrt, _stand_ins

# --- the pre-parse reads what argparse reads ------------------------------------------------

PJRT_SET, PJRT_UNSET = "set", "unset"


@pytest.mark.parametrize("script, args, expected", [
    ("tools/matmul_benchmark.py", ["--device=tpu"], PJRT_SET),
    ("tools/matmul_benchmark.py", ["--device", "cpu", "--device=tpu"], PJRT_SET),
    ("tools/matmul_benchmark.py", ["--device=tpu", "--device", "cpu"], PJRT_UNSET),
    ("tools/matmul_benchmark.py", ["--device=tpu", "--rehearse=8"], PJRT_UNSET),
    ("train_tpu.py", ["--rehearse=8"], PJRT_UNSET),
])
def test_the_tpu_runtime_is_set_up_on_a_v5e_for_each_form_of_the_flags(
        repo, tmp_path, script, args, expected):
    # a stand-in v5e and libtpu; the process ends where TensorFlow would be imported
    env, record, library = _stand_ins(tmp_path)
    found = _at_tensorflow_import(repo, env, record, *args, script=script)
    # PJRT's variables and libtpu loaded for the TPU run; neither for the others
    assert found == (_pjrt(library) if expected == PJRT_SET else HELD_OFF)


def _matmul_flags(monkeypatch, argv):
    """The flags matmul_benchmark.main(argv) runs with (its argparse's reading)."""
    class Parsed(Exception):
        pass

    def stand_in(device, dtype, repeats, warmup, rehearse, tpu):
        raise Parsed(device, rehearse)

    monkeypatch.setattr(matmul_benchmark, "run_benchmark", stand_in)
    with pytest.raises(Parsed) as parsed:
        matmul_benchmark.main(argv)
    return parsed.value.args


@pytest.mark.parametrize("argv", [
    [], ["--device", "tpu"], ["--device=tpu"], ["--device=gpu"], ["--device", "cpu"],
    ["--device", "cpu", "--device", "tpu"], ["--device=tpu", "--device=cpu"],
    ["--rehearse", "8", "--device=tpu"], ["--device", "tpu", "--rehearse=2"],
    ["--tpu=--device", "--device", "tpu"], ["--tpu=local", "--device=tpu"],
    ["--tpu=--device=tpu"], ["--tpu=--rehearse"],  # values, not flags
])
def test_the_pre_parse_reads_the_device_and_rehearsal_as_argparse_does(monkeypatch, argv):
    device, rehearse = _matmul_flags(monkeypatch, argv)
    assert (tpu_runtime.flag_value(argv, "--device") or "cpu") == device
    assert tpu_runtime.rehearses(argv) is (rehearse is not None)


@pytest.mark.parametrize("argv", [
    [], ["--rehearse", "8"], ["--rehearse=8"], ["--epochs", "1", "--rehearse=2"],
    ["--tpu=local"], ["--tpu", "local", "--epochs=1"], ["--tpu=--rehearse"],
])
def test_the_pre_parse_reads_a_rehearsal_of_train_tpu_as_argparse_does(argv):
    args = cli.build_parser("tpu", "").parse_args(argv)
    assert tpu_runtime.rehearses(argv) is (args.rehearse is not None)


def _refused(capsys, call, argv):
    """The status and the stderr lines of call(argv), which must end the process."""
    with pytest.raises(SystemExit) as stopped:
        call(argv)
    return stopped.value.code, capsys.readouterr().err.splitlines()


def _train_flags(device):
    """The training scripts' argparse (train_DEVICE.py), without the checks that follow it."""
    return cli.build_parser(device, "").parse_args


@pytest.mark.parametrize("call, argv", [
    (matmul_benchmark.main, ["--dev", "tpu"]),
    (matmul_benchmark.main, ["--dev=tpu"]),
    (matmul_benchmark.main, ["--device", "tpu", "--reh", "8"]),
    (_train_flags("tpu"), ["--reh", "8"]),
    (_train_flags("cpu"), ["--output", "somewhere"]),
    (launch_workers.main, ["--work", "3"]),  # taken, it would stop for the missing --
], ids=["matmul --dev", "matmul --dev=", "matmul --reh", "train_tpu --reh",
        "train_cpu --output", "launch_workers --work"])
def test_an_abbreviated_flag_is_refused_in_one_line(monkeypatch, capsys, call, argv):
    # argparse would take '--dev tpu' for --device; the pre-parse reads whole names only,
    # so on a v5e the run would have found no TPU
    monkeypatch.setattr(matmul_benchmark, "run_benchmark",
                        lambda *args: pytest.fail(f"taken, it ran: {args}"))
    status, said = _refused(capsys, call, argv)
    assert status == 2
    assert len(said) == 1 and "error: unrecognized arguments: " in said[0], said


# --- KERAS_BACKEND --------------------------------------------------------------------------

IMPORT_CHANGES = r"""
import json, os, sys
before = (dict(os.environ), len(sys.meta_path), sorted(os.listdir("/proc/self/fd")))
import pyimagesearch, pyimagesearch.notebook, pyimagesearch.notebook.install  # noqa
import pyimagesearch.notebook.listings, pyimagesearch.notebook.records  # noqa
import pyimagesearch.runtime, pyimagesearch.runtime  # noqa
after = (dict(os.environ), len(sys.meta_path), sorted(os.listdir("/proc/self/fd")))
print(json.dumps({"same": before == after, "tensorflow": "tensorflow" in sys.modules}))
"""


def test_importing_the_package_changes_nothing(repo):
    # no environment variable, no import hook, no file descriptor, no TensorFlow:
    # the scripts' first call does what a process needs (runtime.py)
    done = subprocess.run([sys.executable, "-c", IMPORT_CHANGES], cwd=repo,
                          capture_output=True, text=True, timeout=60,
                          env={k: v for k, v in os.environ.items()
                               if k not in ("TPU_LOAD_LIBRARY", "TF_CPP_MIN_LOG_LEVEL")})
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"same": True, "tensorflow": False}


def test_importing_the_package_leaves_keras_backend_as_it_is(repo):
    # the scripts choose: train_tpu.py may run on JAX, train_cpu.py sets it aside
    done = subprocess.run(
        [sys.executable, "-c", "import pyimagesearch, os; print(os.environ['KERAS_BACKEND'])"],
        cwd=repo, env={**os.environ, "KERAS_BACKEND": "jax"}, capture_output=True, text=True,
        timeout=60)
    assert done.returncode == 0, done.stderr
    assert (done.stdout, done.stderr) == ("jax\n", "")


def test_keras_backend_jax_is_set_aside_for_tensorflow_and_said_once():
    from pyimagesearch import runtime as backend

    environ = {"KERAS_BACKEND": "jax"}
    with contextlib.redirect_stderr(io.StringIO()) as said:
        backend.tensorflow(environ)
    assert environ == {"KERAS_BACKEND": "tensorflow"}  # what Keras will read at its import
    assert said.getvalue().splitlines() == [
        "[INFO] KERAS_BACKEND=jax set aside: this code runs Keras on TensorFlow"]


# --- a SIGTERM once the outputs are written ---------------------------------------------------

@pytest.fixture
def sigterm_in_process(monkeypatch):
    """cli.run_main here, its os._exit a SystemExit; this process's state as it was after."""
    # no public way: exits keeps one state per process (run_main leaves it "over"), so each
    # test's run gets a copy of its own
    monkeypatch.setattr(exits, "_process", copy.copy(exits._process))
    monkeypatch.setattr(this_process, "published", [])
    monkeypatch.setattr(sys, "argv", ["train_cpu.py"])

    def exit_now(status):
        raise SystemExit(status)

    monkeypatch.setattr(os, "_exit", exit_now)
    previous = signal.getsignal(signal.SIGTERM)
    yield
    signal.signal(signal.SIGTERM, previous)


def _training(out, write, then=None):
    """A training script's main() (its flags parsed): writes its outputs if `write`, then `then`."""
    from pyimagesearch.files import StagedOutputs

    def main(argv):
        cli.parse_args("cpu", "", ["--output-dir", str(out)])  # --backup-dir could resume it
        if write:
            with StagedOutputs(str(out)) as staged:
                with open(staged.path("cpu.json"), "w") as handle:
                    handle.write("{}")
        if then:
            then()

    return main


def _sigterm():
    os.kill(os.getpid(), signal.SIGTERM)  # its handler runs before the next line
    sum(range(1000))


@pytest.mark.parametrize("written", [True, False])
def test_a_sigterm_after_the_outputs_are_written_names_them_and_no_resume(
        sigterm_in_process, capsys, tmp_path, written):
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as stopped:
        cli.run_main(_training(out, written, then=_sigterm), [])
    said = capsys.readouterr().err.splitlines()
    assert stopped.value.code == 143
    if written:
        assert said == [f"train_cpu.py: error: stopped by SIGTERM; its new outputs were all "
                        f"written to {out}"]
        assert json.loads((out / "cpu.json").read_text()) == {}
    else:  # the run can be resumed: the line says how
        assert said == ["train_cpu.py: error: stopped by SIGTERM; earlier outputs are untouched "
                        "(with --backup-dir the run saves its state first and resumes after)"]


def test_a_sigterm_after_a_run_that_wrote_its_outputs_has_ended_names_them(
        sigterm_in_process, capsys, tmp_path):
    out = tmp_path / "out"
    cli.run_main(_training(out, write=True), [])
    with pytest.raises(SystemExit) as stopped:
        _sigterm()
    assert stopped.value.code == 143
    assert capsys.readouterr().err.splitlines() == [
        f"train_cpu.py: error: stopped by SIGTERM after the run had ended; its new outputs "
        f"were all written to {out}"]


# --- a signalled launcher ends its workers' children ---------------------------------------

# a stand-in worker that starts a child of its own (as TensorFlow's workers can: a
# compiler, a profiler's helper), says both pids, and runs until stopped
WORKER_WITH_A_CHILD = """
import os, subprocess, time
child = subprocess.Popen(["sleep", "300"], stdout=subprocess.DEVNULL)
print("ready", os.getpid(), child.pid, flush=True)
while True:
    time.sleep(0.05)
"""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signalled_launcher_ends_each_workers_children_too(repo, reap, sig):  # noqa: F811
    launcher = subprocess.Popen(
        [sys.executable, "tools/launch_workers.py", "--workers", "2", "--network", "host",
         "--", sys.executable, "-c", WORKER_WITH_A_CHILD], cwd=repo, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, start_new_session=True)
    reap.append(launcher.pid)
    pids = []
    while len(pids) < 4:  # two workers, two children
        line = launcher.stdout.readline()
        assert line, f"the launcher's output ended before both workers were ready: {pids}"
        if "] ready " in line:
            pids += [int(pid) for pid in line.split("] ready ")[1].split()]
            reap.extend(pids[-2:])
    launcher.send_signal(sig)
    _, err = launcher.communicate(timeout=120)
    assert launcher.returncode == 128 + sig, err
    assert _wait_gone(pids, bound=30) == []  # the children too, not only the workers


# --- standard streams the caller closed -------------------------------------------------------

# prints to both streams, reads stdin, and records how fds 0-2 are open
STREAMS = """
import json, os, sys
from pyimagesearch import runtime as startup
startup.process()  # as every script's first call does
modes = {}
for fd in (0, 1, 2):
    with open(f"/proc/self/fdinfo/{fd}") as info:
        flags = next(line for line in info if line.startswith("flags:"))
    modes[fd] = int(flags.split()[1], 8) & os.O_ACCMODE
print("printed", flush=True)
print("said", file=sys.stderr, flush=True)
read = sys.stdin.read()
with open(sys.argv[1], "w") as handle:
    json.dump({"modes": modes, "read": read}, handle)
"""


@pytest.mark.parametrize("closed, fd", [(">&-", 1), ("2>&-", 2), ("<&-", 0)])
def test_a_closed_standard_stream_gets_dev_null_open_its_way(repo, tmp_path, closed, fd):
    found = tmp_path / "found.json"
    done = subprocess.run(
        ["bash", "-c", f'"$0" -c "$1" "$2" {closed}', sys.executable, STREAMS, str(found)],
        cwd=repo, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr and "Exception ignored" not in done.stderr
    assert done.stdout == ("" if fd == 1 else "printed\n")
    assert done.stderr == ("" if fd == 2 else "said\n")
    record = json.loads(found.read_text())
    assert record["read"] == ""
    wanted = os.O_RDONLY if fd == 0 else os.O_WRONLY
    assert record["modes"][str(fd)] in (wanted, os.O_RDWR)  # /dev/null, open for its use
