"""The errors a run ends on with one line, and the exit statuses schedulers read.

Kubeflow's `restartPolicy: ExitCode` retries 130, 137, 138 and 143 and leaves
1, 2, 126-128 and 139 alone; 138 is its "the user asks for a retry".
"""
import argparse


class UserError(Exception):
    """A problem the user can fix (a flag, a path, missing data or hardware): status 2."""

    exit_status = 2


class PeerLost(UserError):
    """Another process of the cluster or slice died or stopped answering: status 138, retried."""

    exit_status = 138


class Preempted(UserError):
    """SIGTERM, the way a machine is taken away: status 143 (128 + SIGTERM), retried."""

    exit_status = 143


class NothingToDo(Exception):
    """This process has no part in the run (an evaluator task): one line, status 0."""


def first_line(error):
    """The first line of an exception's message (an OSError's or TensorFlow's own text)."""
    text = str(getattr(error, "strerror", None) or getattr(error, "message", None)
               or error).strip()
    return text.splitlines()[0] if text else type(error).__name__


class OneLineParser(argparse.ArgumentParser):
    """argparse whose error is one line (not usage and error), status 2; no abbreviations."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, allow_abbrev=False, **kwargs)

    def error(self, message):
        self.exit(UserError.exit_status, f"{self.prog}: error: {message} (see --help)\n")
