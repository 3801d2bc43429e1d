"""SIGTERM and Ctrl-C at every moment of a run: one line that says what is on disk, a status.

Before the outputs: "earlier outputs are untouched", 143 (130 for Ctrl-C). While
they are written the signal waits until all three are; after, it says where
they are. A signal whose exception a library wraps, or Python drops in a
finalizer, still ends the run with 143. Each case is a real process.
"""
import os
import signal
import subprocess
import sys

import pytest

from conftest import ENV, REPO, output_files, outputs_name

TINY = ["--epochs", "1", "--steps-per-epoch", "2", "--batch-size", "32", "--data-source",
        "sample"]
NAME = outputs_name("cpu", TINY)

# train_cpu.py's run in a process of its own, with a signal sent at the moment HOW says
MOMENT = r"""
import os, signal, sys
sys.path.insert(0, ".")
from pyimagesearch import host
host.prepare_tensorflow()
import train_cpu
from pyimagesearch import exits, files, outputs
how = os.environ["HOW"]
real = files.replace_file
def replace_file(path, write, what=None):
    if how == "while writing" and path.endswith(".png"):
        os.kill(os.getpid(), signal.SIGTERM)  # held until the three are written
    return real(path, write, what)
outputs.replace_file = replace_file
class Finalizer:
    def __del__(self):
        os.kill(os.getpid(), signal.SIGTERM)  # raised in __del__: Python drops it
def main(argv):
    if how == "dropped":
        Finalizer()
    if how == "wrapped":
        try:
            os.kill(os.getpid(), signal.SIGTERM)
        except BaseException as error:  # a library that turns it into its own error
            raise TypeError("a library's own error") from error
    if how == "ctrl-c":
        os.kill(os.getpid(), signal.SIGINT)
    train_cpu.main(argv)
exits.run_main(main, sys.argv[1:])
if how == "after":
    os.kill(os.getpid(), signal.SIGTERM)
    signal.pause()
"""


def _at(tmp_path, how, **popen):
    out = tmp_path / "out"
    out.mkdir()
    for name in output_files(NAME):
        (out / name).write_text(f"earlier {name}")
    done = subprocess.run([sys.executable, "-c", MOMENT, *TINY, "--output-dir", str(out)],
                          cwd=REPO, env={**ENV, "HOW": how}, capture_output=True, text=True,
                          timeout=120, **popen)
    new = [name for name in output_files(NAME)
           if (out / name).read_bytes() != f"earlier {name}".encode()]
    return done, new


@pytest.mark.parametrize("how, status, said, new", [
    ("while writing", 143, "stopped by SIGTERM after the run had ended; its outputs were "
                           "written to {out}", 3),
    pytest.param("after", 143, "stopped by SIGTERM after the run had ended; its outputs were "
                 "written to {out}", 3, marks=pytest.mark.slow),  # 7 s each
    pytest.param("dropped", 143, "stopped by SIGTERM at the end of the run", 3,
                 marks=pytest.mark.slow),
    ("wrapped", 143, "stopped by SIGTERM; earlier outputs are untouched", 0),
    ("ctrl-c", 130, "interrupted; earlier outputs are untouched", 0),
])
def test_a_signal_at_any_moment_is_one_line_that_says_what_is_on_disk(tmp_path, how, status,
                                                                     said, new):
    done, written = _at(tmp_path, how)
    assert done.returncode == status, done.stderr[-2000:]
    assert done.stderr.strip().splitlines()[-1] == (
        "-c: error: " + said.format(out=tmp_path / "out")), done.stderr[-2000:]
    # where Python drops the exception it says so itself ("Exception ignored in ..."): our
    # line is the last, as with TensorFlow's own lines
    assert how == "dropped" or "Traceback" not in done.stderr
    assert len(written) == new  # the three new outputs, or the earlier ones untouched


@pytest.mark.slow  # 9 s
def test_an_ignored_ctrl_c_stays_ignored_as_in_a_background_job(tmp_path):
    # `python train_cpu.py &` in a script: the shell has the job ignore SIGINT
    done, written = _at(tmp_path, "ctrl-c", preexec_fn=lambda: signal.signal(
        signal.SIGINT, signal.SIG_IGN))
    assert done.returncode == 0, done.stderr[-2000:]
    assert len(written) == 3


def test_a_later_run_in_the_same_process_forgets_an_earlier_sigterm(in_process, tmp_path):
    from pyimagesearch import exits
    handler = exits.watch()
    handler.terminated = handler.requested = True  # what an earlier run's SIGTERM left
    done = in_process("train_cpu.py", *TINY, "--output-dir", tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert sorted(os.listdir(tmp_path)) == output_files(NAME)
