"""The one exception type that the command-line scripts turn into a one-line message."""


class UserError(Exception):
    """A problem the user can fix (a flag, a path, missing data or hardware).

    The scripts print its message as a single line on stderr and exit with
    status 2; anything else is a bug and keeps its traceback.
    """


class PeerLost(UserError):
    """Another process of a multi-worker cluster died or stopped answering.

    The scripts print it as one line and leave at once (os._exit), since
    TensorFlow's orderly shutdown would wait on the dead peer.
    """


def first_line(error):
    """The first line of an exception's message (an OSError's or TensorFlow's own text)."""
    text = str(getattr(error, "strerror", None) or getattr(error, "message", None)
               or error).strip()
    return text.splitlines()[0] if text else type(error).__name__
