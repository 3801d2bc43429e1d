"""Preemption and exact resume: real SIGTERM and SIGKILL to real training processes.

A 4-epoch run of 60 steps an epoch (4 executions of 15) is stopped in its
second or third epoch and run again with the same command; it must end
with the very weights an uninterrupted run ends with. A signal that comes
while a run that has ended exits, or that the exit hook finds blocked, is
one line and status 143 too.
"""
import json
import os
import re
import signal
import subprocess
import sys

import keras
import numpy as np
import pytest

import train_cpu
from conftest import output_files, outputs_name

from pyimagesearch.errors import Preempted
from pyimagesearch import exits

SHORT = ["--steps-per-epoch", "60", "--batch-size", "64", "--data-source", "sample",
         "--epochs", "4"]


def _weights(path):
    return [w.numpy() for w in keras.saving.load_model(path).weights]


class Uninterrupted(dict):
    """{loop: weights} of the 4-epoch run that nothing stopped, trained when first asked for."""

    def __init__(self, folder):
        super().__init__()
        self.folder = folder

    def __missing__(self, loop):
        args = SHORT + ["--loop", loop, "--output-dir", str(self.folder / loop)]
        train_cpu.main(args)
        self[loop] = _weights(self.folder / loop / f"{outputs_name('cpu', args)}.keras")
        return self[loop]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """The weights of uninterrupted runs, by loop (only the loops a test asks for are run)."""
    return Uninterrupted(tmp_path_factory.mktemp("uninterrupted"))


def _stopped_at(repo, args, line, sig):
    """Start train_cpu.py with `args`, send `sig` once it prints `line`; its status and output."""
    process = subprocess.Popen([sys.executable, "train_cpu.py", *args], cwd=repo,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               start_new_session=True)
    lines = []
    try:
        for text in process.stdout:
            lines.append(text)
            if text.startswith(line):
                os.kill(process.pid, sig)
                break
        lines.extend(process.stdout)  # what it says on its way out
        process.wait(timeout=30)  # a preempted machine has about 30 s of grace
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    return process.returncode, "".join(lines)


def _assert_same_weights(resumed, uninterrupted):
    for a, b in zip(resumed, uninterrupted):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-7)


@pytest.mark.tf_versions
@pytest.mark.slow  # the default suite's budget (docs/development.md); CI runs it
@pytest.mark.parametrize("loop", ["fit", "custom"])
def test_sigterm_saves_mid_epoch_and_the_rerun_ends_where_an_uninterrupted_run_does(
        repo, tmp_path, uninterrupted, in_process, loop):
    args = SHORT + ["--loop", loop, "--backup-dir", str(tmp_path / "backup"),
                    "--output-dir", str(tmp_path / "out")]
    status, output = _stopped_at(repo, args, "Epoch 2/4", signal.SIGTERM)
    assert status == Preempted.exit_status == 143, output
    errors = [line for line in output.splitlines() if "error" in line]
    assert len(errors) == 1 and "stopped by SIGTERM after" in errors[0], output
    assert "Traceback" not in output
    assert not list((tmp_path / "out").iterdir())  # nothing written but the backup

    again = in_process("train_cpu.py", *args)  # the same command, here: no signal now
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-2000:]
    name = outputs_name("cpu", args)
    record = json.loads((tmp_path / "out" / f"{name}.json").read_text())
    saved = int(re.search(r"after (\d+) steps", errors[0]).group(1))
    assert record["resumed_from_step"] == saved and saved > 60  # past epoch 1's end
    assert record["resumed_from_epoch"] == saved // 60
    assert len(record["loss"]) == len(record["val_loss"]) == 4
    _assert_same_weights(_weights(tmp_path / "out" / f"{name}.keras"), uninterrupted[loop])


@pytest.mark.tf_versions
@pytest.mark.slow  # the kill itself is in tests/test_backup_and_logs.py's default run
@pytest.mark.parametrize("loop", ["fit", "custom"])
def test_a_run_killed_in_epoch_3_resumes_to_the_uninterrupted_weights(
        repo, tmp_path, uninterrupted, in_process, loop):
    args = SHORT + ["--loop", loop, "--backup-dir", str(tmp_path / "backup"),
                    "--output-dir", str(tmp_path / "out")]
    status, output = _stopped_at(repo, args, "Epoch 3/4", signal.SIGKILL)
    assert status == -signal.SIGKILL, output
    again = in_process("train_cpu.py", *args)
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-2000:]
    name = outputs_name("cpu", args)
    record = json.loads((tmp_path / "out" / f"{name}.json").read_text())
    assert (record["resumed_from_epoch"], record["resumed_from_step"]) == (2, 120)
    _assert_same_weights(_weights(tmp_path / "out" / f"{name}.keras"), uninterrupted[loop])


@pytest.mark.parametrize("how", ["raised", "wrapped", "dropped"])
def test_sigterm_whose_exception_a_library_wraps_or_drops_still_stops_with_143(
        monkeypatch, capsys, how):
    # tf.function's input binding catches any Exception and raises a TypeError from
    # it; in a finalizer (a __del__, a weakref callback) Python prints the exception
    # and drops it: either way the run must still end as a preemption
    from pyimagesearch import cli

    def raised(argv):
        os.kill(os.getpid(), signal.SIGTERM)  # the handler raises in this frame
        raise AssertionError("the handler did not raise")

    def wrapped(argv):
        try:
            raised(argv)
        except Exception as error:
            raise TypeError(f"Binding inputs to tf.function failed due to `{error}`") from error

    class Finalized:
        def __del__(self):
            os.kill(os.getpid(), signal.SIGTERM)

    def dropped(argv):
        Finalized()  # gone at once: the handler raises inside __del__

    def exit_now(status):
        raise SystemExit(status)

    monkeypatch.setattr(os, "_exit", exit_now)
    previous = signal.getsignal(signal.SIGTERM)
    try:
        with pytest.raises(SystemExit) as stopped:
            cli.run_main({"raised": raised, "wrapped": wrapped, "dropped": dropped}[how], [])
    finally:
        signal.signal(signal.SIGTERM, previous)
    said = capsys.readouterr().err.strip().splitlines()
    assert stopped.value.code == 143
    assert len(said) == 1 and "stopped by SIGTERM" in said[0], said


def test_a_later_run_in_the_same_interpreter_forgets_an_earlier_sigterm(monkeypatch, capsys):
    from pyimagesearch import cli
    from pyimagesearch import exits as preemption

    previous = signal.getsignal(signal.SIGTERM)
    try:
        preemption.watch()  # an earlier run in this interpreter was stopped by SIGTERM
        preemption.saving(False)
        with pytest.raises(Preempted):
            os.kill(os.getpid(), signal.SIGTERM)
            sum(range(1000))  # the handler runs here
        assert preemption.terminated()
        with pytest.raises(ValueError, match="a bug of its own"):
            cli.run_main(lambda argv: (_ for _ in ()).throw(ValueError("a bug of its own")), [])
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert not preemption.terminated()


@pytest.mark.slow  # the default suite's budget (docs/development.md); CI runs it
def test_sigterm_without_a_backup_stops_in_one_line_and_keeps_earlier_outputs(
        repo, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    earlier = output_files(outputs_name("cpu", SHORT))  # what the run would replace
    for name in earlier:
        (out / name).write_text(f"earlier {name}")
    status, output = _stopped_at(repo, SHORT + ["--output-dir", str(out)], "Epoch 2/4",
                                 signal.SIGTERM)
    assert status == 143, output
    errors = [line for line in output.splitlines() if "error" in line]
    assert len(errors) == 1 and "stopped by SIGTERM" in errors[0], output
    assert "Traceback" not in output
    for name in earlier:
        assert (out / name).read_text() == f"earlier {name}"
    assert sorted(os.listdir(out)) == earlier


# a run that has ended well, and a signal while its process ends: as the scripts
# end (`cli.run_main(main)` is their last line), with a main() that writes nothing
ENDED_RUN = r"""
import os, signal, sys
from pyimagesearch import runtime as backend
backend.tensorflow()  # as every script's first call does
from pyimagesearch import cli
sys.argv = ["train_cpu.py"]
def main(argv):
    print("trained", flush=True)
how = os.environ["HOW"]
cli.run_main(main, [])
if how == "after":
    os.kill(os.getpid(), getattr(signal, os.environ["SIG"]))
    sum(range(1000))  # the handler runs here
"""


@pytest.mark.slow  # the default suite's budget (docs/development.md); CI runs it
@pytest.mark.parametrize("how, sig, status", [("after", "SIGTERM", 143), ("none", None, 0)])
def test_a_signal_while_an_ended_run_exits_is_one_line_and_its_status(repo, how, sig, status):
    done = subprocess.run([sys.executable, "-c", ENDED_RUN], cwd=repo, capture_output=True,
                          text=True, timeout=120, env={**os.environ, "HOW": how,
                                                       "SIG": sig or ""})
    assert done.returncode == status, done.stderr
    assert done.stdout == "trained\n"
    if sig:
        assert done.stderr.splitlines() == [
            f"train_cpu.py: error: stopped by {sig} after the run had ended; earlier "
            "outputs are untouched"]
    else:
        assert done.stderr == ""


def test_a_signal_blocked_at_the_very_end_is_said_not_lost(monkeypatch, capsys):
    # the exit hook blocks both signals; one that came before it looked is said
    exited = []
    # no public way (both lines): a run that ends well (cli.run_main) would leave this
    # process's SIGTERM exiting it
    monkeypatch.setattr(exits._process, "over", True)
    monkeypatch.setattr(exits._process, "main", object())
    monkeypatch.setattr(exits.os, "_exit", exited.append)
    monkeypatch.setattr(exits.signal, "pthread_sigmask", lambda how, mask: set())
    monkeypatch.setattr(exits.signal, "sigpending", lambda: {signal.SIGTERM})
    exits.at_the_very_end()
    assert exited == [143]
    assert "stopped by SIGTERM after the run had ended" in capsys.readouterr().err
