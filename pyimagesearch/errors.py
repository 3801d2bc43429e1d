"""The one exception type that the command-line scripts turn into a one-line message."""


class UserError(Exception):
    """A problem the user can fix (a flag, a path, missing data or hardware).

    The scripts print its message as a single line on stderr and exit with
    status 2; anything else is a bug and keeps its traceback.
    """
