"""Keep TensorFlow's native start-up log lines off the terminal.

Importing TensorFlow and discovering devices print C++ log lines (oneDNN
notices, "could not find cuda drivers", a failed cuInit on a machine without
a GPU) straight to file descriptor 2, where no Python setting reaches them.
They bury the one line a user needs when something is wrong, so those two
moments run with fd 2 pointed at a temporary file; if they fail, what was
captured is written back before the exception travels on.
"""
import contextlib
import os
import sys
import tempfile


@contextlib.contextmanager
def native_stderr_quiet(expected=()):
    """Send fd 2 to a temporary file for the duration; replay it on error.

    An exception of a type in `expected` is one the caller turns into its own
    message, so the captured lines are dropped then, not replayed.
    """
    if os.environ.get("PYIMAGESEARCH_VERBOSE_TF"):  # escape hatch for debugging
        yield
        return
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as capture:
        os.dup2(capture.fileno(), 2)
        try:
            yield
        except BaseException as error:
            if not isinstance(error, expected):
                os.dup2(saved, 2)
                capture.seek(0)
                os.write(2, capture.read())
            raise
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
