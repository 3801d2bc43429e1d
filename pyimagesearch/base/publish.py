"""Several files into one folder, all of them or none, whatever stops the process on the way.

`StagedOutputs` is how the scripts and tools use it: files written to a
local scratch folder, then published together (`publish_json` for one).

`publish` copies each staged file beside its destination under a temporary
name, writes a journal of what it is about to do (`.publish-PID.json`), sets
the old files aside, renames the new ones into place, and only then marks the
journal done: that mark is the moment the new set replaces the old. Every
step goes through `tf.io.gfile`, so the folder may be a bucket.

- An error on the way (a full disk, a permission, a bucket gone) puts the
  old files back, and the one line says so.
- Ctrl-C and SIGTERM wait for the swap to end (`signals.deferred`).
- A SIGKILL, or a machine that dies, leaves the journal: the next run's
  `recover` finishes the swap (marked done: the new set is whole) or undoes
  it (the old set comes back), and says which in one line. It also removes
  the temporary copies of a publish that was killed before its journal.
"""
import os
import re
import shutil
import socket

import tensorflow as tf

from pyimagesearch.base import signals
from pyimagesearch.base.errors import UserError, first_line
from pyimagesearch.base.files import (file_to_write, join, not_a_file, read_json,
                                      running, scratch_folder, write_json)

_JOURNAL = re.compile(r"^\.publish-(\d+)\.json$")
# a copy, an old file set aside, a journal half written
_SPARE = re.compile(r"^\.(?:(?P<name>.+)\.(?P<pid>\d+)\.(?:tmp|old)|publish-(?P<writer>\d+)"
                    r"\.json\.tmp)$")
_FAILURES = (OSError, tf.errors.OpError)  # and write_json's own UserError

published = []  # folders whose new outputs this process has put in place


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
    with signals.deferred():  # Ctrl-C and SIGTERM act once the swap is over
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
        published.append(folder)
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
