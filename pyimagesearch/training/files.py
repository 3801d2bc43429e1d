"""Paths and small files that may live in a bucket (gs://...), through tf.io.gfile.

A leaf module: importing it pulls in nothing of Matplotlib or Keras.
"""
import glob
import json
import os
import shutil
import tempfile

import tensorflow as tf

from pyimagesearch.training.errors import UserError, first_line


def join(folder, name):
    """`folder`/`name` for a local path or a URL such as gs://bucket/out."""
    return f"{folder.rstrip('/')}/{name}" if "://" in folder else os.path.join(folder, name)


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
    try:
        with tf.io.gfile.GFile(path) as handle:
            return json.load(handle)
    except (ValueError, tf.errors.OpError) as error:
        raise UserError(f"cannot read {path} ({first_line(error)}); {advice}") from error


def scratch_folder(kind):
    """A new local temporary folder, pyimagesearch-KIND-PID-...; the caller removes it.

    A process killed with SIGKILL cannot remove its own, so the folders of
    this kind whose process is gone are removed first.
    """
    pattern = os.path.join(tempfile.gettempdir(), f"pyimagesearch-{kind}-*-*")
    for path in glob.glob(pattern):
        pid = path.rsplit(f"pyimagesearch-{kind}-", 1)[1].split("-", 1)[0]
        if pid.isdigit() and not _running(int(pid)):
            shutil.rmtree(path, ignore_errors=True)
    return tempfile.mkdtemp(prefix=f"pyimagesearch-{kind}-{os.getpid()}-")


def _running(pid):
    """Whether a process `pid` exists (one of another user counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
