"""Write a run's outputs so that a failed run never leaves a broken or missing file.

The outputs are written into a local scratch folder first (Matplotlib and
Keras write local files), then copied next to their destination under
temporary names and renamed over the old ones, all through `tf.io.gfile`, so
the destination may be a local folder or a bucket (`gs://...`, or `ram://` in
tests). Nothing is renamed until every file is written and copied: a failure
leaves the old outputs as they were. A local rename is atomic; on a bucket a
rename is a copy, which can fail half-way only between files.
"""
import os
import shutil
import tempfile

import matplotlib
import tensorflow as tf

from pyimagesearch.files import join

matplotlib.use("Agg")  # no display needed; must precede any pyplot import
from matplotlib.figure import Figure  # noqa: E402


def figure_path(device):
    """config.CPU_IMG_PATH, GPU_IMG_PATH or TPU_IMG_PATH: where `device`'s figure goes."""
    from pyimagesearch import config

    return getattr(config, f"{device.upper()}_IMG_PATH")


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
        self._scratch = tempfile.mkdtemp(prefix="pyimagesearch-outputs-")
        return self

    def __exit__(self, kind, value, traceback):
        try:
            if kind is None:
                self._publish()
        finally:
            shutil.rmtree(self._scratch, ignore_errors=True)
        return False

    def _publish(self):
        """Copy every staged file beside its destination, then rename them all."""
        pid = os.getpid()
        moves = [(join(self.folder, f".{name}.{pid}.tmp"), join(self.folder, name))
                 for name in self._names]
        try:
            for name, (temporary, _) in zip(self._names, moves):
                tf.io.gfile.copy(os.path.join(self._scratch, name), temporary,
                                 overwrite=True)
            for temporary, final in moves:
                tf.io.gfile.rename(temporary, final, overwrite=True)
        finally:
            # nothing temporary stays behind, whether a copy or a rename failed
            for temporary, _ in moves:
                if tf.io.gfile.exists(temporary):
                    tf.io.gfile.remove(temporary)


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
