"""Files in a folder or a bucket (gs://...), through tf.io.gfile: each one replaced whole.

A file is written under a temporary name beside its destination and renamed
over it, so whatever stops the process, the destination holds the old file or
the new one, never half of either. Folders are proven writable before a run.
"""
import errno
import json
import os
import stat
import tempfile

import tensorflow as tf

from pyimagesearch.errors import UserError, first_line

_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a named pipe"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISSOCK, "a socket"))


def join(folder, name):
    """`folder`/`name` for a local path or a URL such as gs://bucket/out."""
    return f"{folder.rstrip('/')}/{name}" if "://" in folder else os.path.join(folder, name)


def not_a_file(path):
    """What stands at `path` (links followed) if it is neither a file nor nothing: 'a folder'."""
    if "://" in path:
        return "a folder" if tf.io.gfile.isdir(path) else None
    try:
        mode = os.stat(path).st_mode
    except OSError as error:  # nothing there, or a dangling link
        return "a loop of symbolic links" if error.errno == errno.ELOOP else None
    return next((kind for test, kind in _KINDS if test(mode)), None)


def file_to_write(path):
    """`path` as a file to replace: a symbolic link's target (the link stays); one line if a
    folder, a pipe or a device stands there (`--json /dev/full`)."""
    kind = not_a_file(path)
    if kind:
        raise UserError(f"cannot write {path}: it is {kind}, not a file; give a file name")
    return path if "://" in path else os.path.realpath(path)


def replace_file(path, write, what=None):
    """Write `path` whole: `write(local_path)` makes the file, which is then renamed into place.

    A failure is a UserError naming the file and `what` is then on disk
    (default: the earlier file is untouched).
    """
    path = file_to_write(path)
    folder, name = path.rsplit("/", 1) if "/" in path else (".", path)
    temporary = f"{folder}/.tmp-{os.getpid()}-{name}"  # the suffix kept: Keras reads it
    scratch = None
    try:
        if "://" in path:  # the writers (Keras, Matplotlib, h5py) write local files
            scratch = tempfile.NamedTemporaryFile(suffix=os.path.basename(path), delete=False)
            scratch.close()
            write(scratch.name)
            tf.io.gfile.copy(scratch.name, temporary, overwrite=True)
        else:
            write(temporary)
        tf.io.gfile.rename(temporary, path, overwrite=True)
    except (OSError, ValueError, tf.errors.OpError) as error:
        if tf.io.gfile.exists(temporary):
            tf.io.gfile.remove(temporary)
        raise UserError(f"cannot write {path} ({first_line(error)}); "
                        f"{what or 'the earlier file is untouched'}") from error
    finally:
        if scratch is not None:
            os.unlink(scratch.name)


def dump(local, content):
    """Write `content` (bytes) to the file `local`."""
    with tf.io.gfile.GFile(local, "wb") as handle:
        handle.write(content)


def write_bytes(path, content, what=None):
    """Replace `path` with `content` (bytes) whole."""
    replace_file(path, lambda local: dump(local, content), what)


def write_json(path, content, what=None):
    """Replace `path` with `content` as indented JSON, whole."""
    write_bytes(path, (json.dumps(content, indent=2) + "\n").encode(), what)


def read_json(path, advice):
    """A JSON file through tf.io.gfile; None if it is not there; one line if it is broken."""
    if not tf.io.gfile.exists(path):
        return None
    kind = not_a_file(path)
    if kind:  # a named pipe would keep the read waiting for ever
        raise UserError(f"cannot read {path} (it is {kind}, not a file); {advice}")
    try:
        with tf.io.gfile.GFile(path) as handle:
            return json.load(handle)
    except (ValueError, tf.errors.OpError) as error:
        raise UserError(f"cannot read {path} ({first_line(error)}); {advice}") from error


def check_output_dir(path, kind="output folder"):
    """Create `path` if needed and prove it writable, before any work; a bucket stays a bucket."""
    if os.path.islink(path) and not os.path.exists(path):
        raise UserError(f"cannot write to {kind} {path}: it is a symbolic link to "
                        f"{os.readlink(path)}, which does not exist")
    probe = join(path, f".write-test-{os.getpid()}")
    try:
        tf.io.gfile.makedirs(path)
        with tf.io.gfile.GFile(probe, "w") as handle:
            handle.write("")
        tf.io.gfile.remove(probe)
    except (OSError, tf.errors.OpError) as error:
        hint = ("; is the bucket reachable, and are Google Cloud credentials set?"
                if "://" in path else "")
        raise UserError(f"cannot write to {kind} {path}: {first_line(error)}{hint}") from error


def check_output_file(path):
    """Prove that the file `path` can be written (its folder is created if need be)."""
    path = file_to_write(path)
    check_output_dir(os.path.dirname(path) or ".")
