"""The exceptions that the command-line scripts turn into one line and an exit status.

The statuses follow the convention schedulers read (Kubeflow's
`restartPolicy: ExitCode`): 1, 2, 126-128 and 139 mean "do not restart",
130, 137, 138 and 143 mean "restart" (138 is its "the user asks for a retry").
`OneLineParser` gives a wrong flag the same one line; nothing here imports
TensorFlow, so a launcher (tools/launch_workers.py) parses its flags as the
scripts do without loading it.
"""
import argparse


class UserError(Exception):
    """A problem the user can fix (a flag, a path, missing data or hardware).

    The scripts print its message as a single line on stderr and exit with
    status 2, which a scheduler does not retry; anything else is a bug and
    keeps its traceback.
    """

    exit_status = 2


EXIT_USER_ERROR = UserError.exit_status


class PeerLost(UserError):
    """Another process of a multi-worker cluster died or stopped answering.

    The scripts print it as one line and leave at once (os._exit), since
    TensorFlow's orderly shutdown would wait on the dead peer. Status 138: a
    restart of the cluster resumes from its backup.
    """

    exit_status = 138


class Preempted(UserError):
    """SIGTERM, the way a machine is taken away: status 143, 128 + SIGTERM, retried."""

    exit_status = 143


class NothingToDo(Exception):
    """This process has no part in the run (an evaluator task): one line, exit status 0."""


def first_line(error):
    """The first line of an exception's message (an OSError's or TensorFlow's own text)."""
    text = str(getattr(error, "strerror", None) or getattr(error, "message", None)
               or error).strip()
    return text.splitlines()[0] if text else type(error).__name__


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a bad flag is reported in one line instead of usage + error.

    Abbreviated flags (`--dev tpu`) are refused: what runs before argparse
    (tpu_runtime.py) reads each flag by its whole name only.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, allow_abbrev=False, **kwargs)

    def error(self, message):
        self.exit(EXIT_USER_ERROR, f"{self.prog}: error: {message} (see --help)\n")
