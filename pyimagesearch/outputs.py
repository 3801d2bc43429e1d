"""Write a run's outputs so that a failed run never leaves a broken or missing file.

Each output is written to a temporary file in the destination folder and
moved over the old one with os.replace, which is atomic on one filesystem.
A run stages all of its files first and replaces the old ones only when
every file has been written.
"""
import json
import os
import tempfile

import matplotlib

matplotlib.use("Agg")  # no display needed; must precede any pyplot import
from matplotlib.figure import Figure  # noqa: E402


def _umask():
    """The process umask (reading it means setting it, so set it straight back)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


class StagedOutputs:
    """Collect temporary files, then move them all into place at once.

    with StagedOutputs(folder) as staged:
        figure.savefig(staged.path("cpu.png"), format="png")
    # only here, on success, does cpu.png replace the old one
    """

    def __init__(self, folder):
        self.folder = folder
        self._staged = {}  # final path -> temporary path

    def path(self, name):
        """A temporary path in the folder for the output called `name`."""
        stem, suffix = os.path.splitext(name)
        # keep the suffix: Keras insists that a model file ends in .keras
        handle, temporary = tempfile.mkstemp(prefix=f".{stem}-", suffix=suffix,
                                             dir=self.folder)
        os.close(handle)
        os.chmod(temporary, 0o666 & ~_umask())  # mkstemp makes it owner-only
        self._staged[os.path.join(self.folder, name)] = temporary
        return temporary

    def __enter__(self):
        return self

    def __exit__(self, kind, value, traceback):
        try:
            if kind is None:
                for final, temporary in self._staged.items():
                    os.replace(temporary, final)
        finally:
            # nothing temporary stays behind, whether the run failed or a
            # replace did
            for temporary in self._staged.values():
                if os.path.exists(temporary):
                    os.remove(temporary)
        return False


def write_json(path, record):
    """Write `record` as indented JSON."""
    with open(path, "w") as handle:
        json.dump(record, handle, indent=2)
        handle.write("\n")


def reconstruction_figure(inputs, predictions, title=None):
    """The article's figure: one row per digit, input left, reconstruction right."""
    rows = len(inputs)
    figure = Figure(figsize=(4, 2 * rows), layout="constrained")
    axes = figure.subplots(nrows=rows, ncols=2, squeeze=False)
    for (left, right), real, pred in zip(axes, inputs, predictions):
        left.imshow(real.squeeze(-1), cmap="gray", vmin=0.0, vmax=1.0)
        left.set_title("Input Image")
        right.imshow(pred.squeeze(-1), cmap="gray", vmin=0.0, vmax=1.0)
        right.set_title("Predicted Image")
        for axis in (left, right):
            axis.set_axis_off()
    if title:
        figure.suptitle(title)
    return figure
