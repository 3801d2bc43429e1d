"""Paths and small files that may live in a bucket (gs://...), through tf.io.gfile.

Also `check_output_dir` and `check_output_file`: a folder or file proven
writable before any work, for the scripts and every tool. Importing it pulls
in nothing of Matplotlib or Keras.
"""
import errno
import glob
import json
import os
import shutil
import stat
import tempfile

import tensorflow as tf

from pyimagesearch.base.errors import UserError, first_line
from pyimagesearch.base.terminal import native_stderr_quiet


def join(folder, name):
    """`folder`/`name` for a local path or a URL such as gs://bucket/out."""
    return f"{folder.rstrip('/')}/{name}" if "://" in folder else os.path.join(folder, name)


_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISLNK, "a symbolic link"),
          (stat.S_ISFIFO, "a named pipe"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def not_a_file(path, follow=False):
    """What stands at `path` if it is neither a regular file nor nothing ("a named pipe").

    A file is replaced by renaming a new one over it; a link, a pipe or a device
    (`/dev/full`) must not be. `follow` looks through symbolic links. A bucket
    holds only files and folders.
    """
    if "://" in path:
        return "a folder" if tf.io.gfile.isdir(path) else None
    try:
        mode = os.lstat(path).st_mode
        if follow and stat.S_ISLNK(mode):
            mode = os.stat(path).st_mode
    except OSError as error:  # nothing there, or a dangling link (when followed)
        return "a loop of symbolic links" if error.errno == errno.ELOOP else None
    return next((kind for test, kind in _KINDS if test(mode)), None)


def file_to_write(path):
    """`path` as a file to replace: through a symbolic link (the link stays); a UserError
    if a folder, a pipe or a device (`--json /dev/full`) stands there."""
    kind = not_a_file(path, follow=True)
    if kind:
        raise UserError(f"cannot write {path}: it is {kind}, not a file; give a file name")
    return path if "://" in path else os.path.realpath(path)


def write_json(path, content):
    """Write `content` as indented JSON, atomically: a temporary name, then a rename.

    A crash never leaves half a file; a failure is a UserError naming the file.
    """
    temporary = f"{path}.tmp"
    try:
        with tf.io.gfile.GFile(temporary, "w") as handle:
            handle.write(json.dumps(content, indent=2) + "\n")
        tf.io.gfile.rename(temporary, path, overwrite=True)
    except (OSError, tf.errors.OpError) as error:
        if tf.io.gfile.exists(temporary):
            tf.io.gfile.remove(temporary)
        raise UserError(f"cannot write {path}: {first_line(error)}") from error


def read_json(path, advice):
    """A JSON file through tf.io.gfile; None if it is not there.

    An unreadable or broken file is a UserError naming it and ending in `advice`.
    """
    if not tf.io.gfile.exists(path):
        return None
    kind = None if "://" in path else not_a_file(path, follow=True)  # (a bucket: no pipes)
    if kind:  # a named pipe would keep the read waiting for ever
        raise UserError(f"cannot read {path} (it is {kind}, not a file); {advice}")
    try:
        with tf.io.gfile.GFile(path) as handle:
            return json.load(handle)
    except (ValueError, tf.errors.OpError) as error:
        raise UserError(f"cannot read {path} ({first_line(error)}); {advice}") from error


LOCK = ".lock"  # in a backup folder: host and pid of the run that uses it


def take_lock(folder):
    """Make this process the one that uses `folder`; one line if another live one does.

    The lock is a file naming the host and process. One of a process that is
    gone (killed, crashed) is taken over; one of this process is its own
    (a second run in the same interpreter). On a local disk the file is
    created exclusively, so two runs starting together cannot both take it.
    """
    import socket

    path = join(folder, LOCK)
    mine = {"host": socket.gethostname(), "pid": os.getpid()}
    held = read_json(path, advice=f"delete {path} if no run uses {folder}")
    if isinstance(held, dict) and held != mine:
        if held.get("host") != mine["host"]:
            raise UserError(f"{folder} is in use by process {held.get('pid')} on "
                            f"{held.get('host')} ({path}); wait for that run, or delete "
                            "the lock if it is gone")
        if isinstance(held.get("pid"), int) and running(held["pid"]):
            raise UserError(f"{folder} is in use by the run of process {held['pid']}; wait "
                            "for it to end, or give another --backup-dir")
    if held is not None:
        tf.io.gfile.remove(path)  # a dead run's, or a broken one: taken over
    if "://" in folder:
        write_json(path, mine)
        return
    try:
        handle = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        raise UserError(f"{folder} was just taken by another run; wait for it to end, "
                        "or give another --backup-dir") from None
    except OSError as error:
        raise UserError(f"cannot write {path}: {first_line(error)}") from error
    with os.fdopen(handle, "w") as file:
        file.write(json.dumps(mine) + "\n")


def scratch_folder(kind):
    """A new local temporary folder, pyimagesearch-KIND-PID-...; the caller removes it.

    A process killed with SIGKILL cannot remove its own, so the folders of
    this kind whose process is gone are removed first.
    """
    pattern = os.path.join(tempfile.gettempdir(), f"pyimagesearch-{kind}-*-*")
    for path in glob.glob(pattern):
        pid = path.rsplit(f"pyimagesearch-{kind}-", 1)[1].split("-", 1)[0]
        if pid.isdigit() and not running(int(pid)):
            shutil.rmtree(path, ignore_errors=True)
    return tempfile.mkdtemp(prefix=f"pyimagesearch-{kind}-{os.getpid()}-")


def running(pid):
    """Whether a process `pid` exists (one of another user counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def check_output_file(path):
    """Prove that `path` can be written (its folder is created if needed).

    A symbolic link is followed, as publish_json follows it; a folder, a pipe
    or a device (`/dev/full`) is refused.
    """
    path = file_to_write(path)  # a dangling link: where its target would be
    check_output_dir(os.path.dirname(path) or ".")


def check_output_dir(path, kind="output folder"):
    """Create `path` if needed and prove it is writable, before any training.

    Through tf.io.gfile, so a bucket (gs://...) is checked as what it is and
    never becomes a local folder called "gs:".
    """
    if os.path.islink(path) and not os.path.lexists(os.path.realpath(path)):
        raise UserError(f"cannot write to {kind} {path}: it is a symbolic link to "
                        f"{os.readlink(path)}, which does not exist; create that folder or "
                        "give another")
    expected = (OSError, tf.errors.OpError)
    try:
        # a bucket that cannot be reached also logs failed credential look-ups
        with native_stderr_quiet(expected):
            tf.io.gfile.makedirs(path)
            probe = join(path, f".write-test-{os.getpid()}")
            with tf.io.gfile.GFile(probe, "w") as handle:
                handle.write("")
            tf.io.gfile.remove(probe)
    except expected as error:
        hint = ("; is the bucket reachable, and are Google Cloud credentials set?"
                if "://" in path else "")
        raise UserError(f"cannot write to {kind} {path}: "
                        f"{first_line(error)}{hint}") from error
