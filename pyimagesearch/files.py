"""Paths and small files that may live in a bucket (gs://...), through tf.io.gfile.

Also `check_output_dir` and `check_output_file`: a folder or file proven
writable before any work, for the scripts and every tool. Importing it pulls
in nothing of Matplotlib or Keras.

Also here:
- Ctrl-C and SIGTERM held back for a few steps that must not be cut in two.
- Several files into one folder, all of them or none, whatever stops the process on the way.
"""
import contextlib
import errno
import glob
import json
import os
import re
import shutil
import signal
import socket
import stat
import tempfile
import threading

import tensorflow as tf

from pyimagesearch.errors import UserError, first_line
from pyimagesearch.runtime import this_process
from pyimagesearch.terminal import native_stderr_quiet


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


# --- Ctrl-C and SIGTERM held back for a few steps that must not be cut in two -----------------


@contextlib.contextmanager
def deferred():
    """Ctrl-C and SIGTERM wait until the block ends: for a few steps that must not be cut.

    Their handlers are swapped for ones that only take note, so a signal
    arriving in any thread cannot raise inside the block; each one noted is
    raised again, to the usual handler, when the block ends. Main thread
    only (signal handlers can be set nowhere else); elsewhere it does nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    noted = []
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    for sig in previous:
        signal.signal(sig, lambda signum, frame: noted.append(signum))
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        for sig in dict.fromkeys(noted):
            signal.raise_signal(sig)


# --- Several files into one folder, all of them or none, whatever stops the process on the way ---
# `StagedOutputs` is how the scripts and tools use it: files written to a
# local scratch folder, then published together (`publish_json` for one).
#
# `publish` copies each staged file beside its destination under a temporary
# name, writes a journal of what it is about to do (`.publish-PID.json`), sets
# the old files aside, renames the new ones into place, and only then marks the
# journal done: that mark is the moment the new set replaces the old. Every
# step goes through `tf.io.gfile`, so the folder may be a bucket.
#
# - An error on the way (a full disk, a permission, a bucket gone) puts the
#   old files back, and the one line says so.
# - Ctrl-C and SIGTERM wait for the swap to end (`signals.deferred`).
# - A SIGKILL, or a machine that dies, leaves the journal: the next run's
#   `recover` finishes the swap (marked done: the new set is whole) or undoes
#   it (the old set comes back), and says which in one line. It also removes
#   the temporary copies of a publish that was killed before its journal.


_JOURNAL = re.compile(r"^\.publish-(\d+)\.json$")
# a copy, an old file set aside, a journal half written
_SPARE = re.compile(r"^\.(?:(?P<name>.+)\.(?P<pid>\d+)\.(?:tmp|old)|publish-(?P<writer>\d+)"
                    r"\.json\.tmp)$")
_FAILURES = (OSError, tf.errors.OpError)  # and write_json's own UserError


def publish(folder, staged):
    """Put every `staged` file ({name: local path}) into `folder`: the new set, or the old."""
    pid = os.getpid()
    moves = [{"name": name, "tmp": f".{name}.{pid}.tmp", "old": f".{name}.{pid}.old",
              "had": tf.io.gfile.exists(join(folder, name))} for name in staged]
    for move in moves:
        kind = not_a_file(join(folder, move["name"]))
        if kind:  # a rename over it would replace the link, the pipe or the device
            raise UserError(f"cannot write {join(folder, move['name'])}: {kind} has that "
                            "name; move it away (earlier outputs are untouched)")
    journal = join(folder, f".publish-{pid}.json")
    entry = {"host": socket.gethostname(), "pid": pid, "state": "swapping", "moves": moves}
    with deferred():  # Ctrl-C and SIGTERM act once the swap is over
        try:
            for move in moves:
                tf.io.gfile.copy(staged[move["name"]], join(folder, move["tmp"]),
                                 overwrite=True)
            write_json(journal, entry)
            for move in moves:
                if move["had"]:
                    tf.io.gfile.rename(join(folder, move["name"]), join(folder, move["old"]),
                                       overwrite=True)
            for move in moves:
                tf.io.gfile.rename(join(folder, move["tmp"]), join(folder, move["name"]),
                                   overwrite=True)
            write_json(journal, {**entry, "state": "done"})  # the new set replaces the old
        except (UserError, *_FAILURES) as error:
            _undo(folder, moves)
            _remove(journal)
            raise UserError(f"cannot replace the outputs in {folder} "
                            f"({first_line(error)}); earlier outputs are untouched") from error
        this_process.published.append(folder)  # what exits.py's last line names
        _finish(folder, moves)
        _remove(journal)


class StagedOutputs:
    """Collect files in a scratch folder, then move them all into place at once.

    with StagedOutputs(folder) as staged:
        figure.savefig(staged.path("cpu.png"), format="png")
    # only here, on success, does cpu.png replace the old one
    """

    def __init__(self, folder):
        self.folder = folder
        self._names = []

    def path(self, name):
        """A local scratch path for the output called `name` (keeps its suffix)."""
        self._names.append(name)
        return os.path.join(self._scratch, name)

    def __enter__(self):
        self._scratch = scratch_folder("outputs")
        return self

    def __exit__(self, kind, value, traceback):
        try:
            if kind is None:
                self._publish()
            elif kind is UserError or issubclass(kind, _FAILURES):
                # Matplotlib or Keras could not write the scratch copy: a full
                # TMPDIR, say; the one line names where
                raise UserError(f"cannot write the outputs in the scratch folder "
                                f"{self._scratch} ({first_line(value)}); free some space "
                                "there or set TMPDIR to another folder; earlier outputs "
                                "are untouched") from value
        finally:
            shutil.rmtree(self._scratch, ignore_errors=True)
        return False

    def _publish(self):
        """Swap the staged files in: the folder then holds the new set, or the old one."""
        publish(self.folder, {name: os.path.join(self._scratch, name) for name in self._names})


def publish_json(path, content):
    """Write one JSON file (a benchmark's --json) as a set of one: the old file or the new.

    A symbolic link is followed: its target gets the file and the link stays.
    """
    path = file_to_write(path)
    folder, name = path.rsplit("/", 1) if "/" in path else (".", path)
    with StagedOutputs(folder or "/") as staged:
        write_json(staged.path(name), content)


def _undo(folder, moves):
    """Put the old files back and take the new ones away, as far as the swap had come."""
    for move in moves:
        final, old = join(folder, move["name"]), join(folder, move["old"])
        if move["had"] and tf.io.gfile.exists(old):
            tf.io.gfile.rename(old, final, overwrite=True)  # over a new one, if placed
        elif not move["had"] and tf.io.gfile.exists(final):
            tf.io.gfile.remove(final)  # a new file where there was none
        _remove(join(folder, move["tmp"]))


def _finish(folder, moves):
    """The new set is in place: remove the old files and any copy left."""
    for move in moves:
        _remove(join(folder, move["old"]))
        _remove(join(folder, move["tmp"]))


def _remove(path):
    if tf.io.gfile.exists(path):
        tf.io.gfile.remove(path)


def recover(folder):
    """Finish or undo what a publish that was killed left in `folder`; one line per publish.

    Only this machine's dead processes count: a journal of a process still
    running, or of another machine sharing the bucket, is left alone.
    """
    try:
        names = tf.io.gfile.listdir(folder) if tf.io.gfile.isdir(folder) else []
    except tf.errors.OpError:
        return  # the folder's own check says what is wrong with it
    host, spares, recovered = socket.gethostname(), set(), False
    for name in names:
        found = _JOURNAL.match(name.rstrip("/"))
        if found and not running(int(found[1])):
            entry = read_json(join(folder, name), advice=f"delete {join(folder, name)}")
            if not isinstance(entry, dict) or entry.get("host", host) != host:
                continue
            moves = entry.get("moves", [])
            if entry.get("state") == "done":
                _finish(folder, moves)
                print(f"[INFO] a run was stopped while it replaced the outputs in {folder}: "
                      "its new outputs were all in place, and stay", flush=True)
            else:
                _undo(folder, moves)
                print(f"[INFO] a run was stopped while it replaced the outputs in {folder}: "
                      "the outputs it had set aside are back in place", flush=True)
            _remove(join(folder, name))
            recovered = True
        spare = _SPARE.match(name)
        if spare and not running(int(spare["pid"] or spare["writer"])):
            spares.add(name)
    leftover = [name for name in spares if tf.io.gfile.exists(join(folder, name))]
    for name in leftover:  # copies of a publish killed before it wrote its journal
        _remove(join(folder, name))
    if leftover and not recovered:  # (a recovered publish's line says enough)
        print(f"[INFO] removed {len(leftover)} temporary file(s) a stopped run left in "
              f"{folder}", flush=True)
