"""Redraw a saved run's figure from its record and model, as today's scripts draw it.

    python tools/redraw_figure.py outputs/quoted/cpu.json
    python tools/redraw_figure.py outputs/cpu.json --model outputs/cpu.keras --out /tmp/cpu.png

For a committed run whose figure is older than the scripts' figure code: the
run is not repeated (its record's seconds stay the ones quoted), only its
picture is. The digits are figure_digits of the validation split of the data
the run read (its record's `data_source`; a tfds, stand-in or TFRecord run also
needs the `--data-dir` its command gave, taken from the record or from
--data-dir here), the reconstructions the saved model's, the title
outputs.figure_title of the record, drawn in the train_*.py scripts' lines (a
test holds the two to the same bytes). The PNG (default: RECORD.png) replaces
an earlier one whole, or not at all.
"""
import argparse
import io
import os
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # the repository's root
from pyimagesearch import host  # noqa: E402
host.prepare_tensorflow()  # Keras on TensorFlow (KERAS_BACKEND set aside in one line)

from pyimagesearch import config, exits, files, outputs  # noqa: E402
from pyimagesearch.errors import OneLineParser, UserError, first_line  # noqa: E402

NEEDED = ("name", "data_source", "global_batch_size", "steps_per_epoch", "learning_rate",
          "val_loss")


def read_record(path):
    """A run record with what the figure needs, or a UserError naming what is wrong."""
    record = files.read_json(path, "give the .json a train_*.py run wrote")
    if record is None:
        raise UserError(f"{path} not found; give the .json a train_*.py run wrote")
    missing = [key for key in NEEDED if not isinstance(record, dict) or key not in record]
    if missing or not record["val_loss"]:
        raise UserError(f"{path} is not a run record (no {', '.join(missing) or 'val_loss'})")
    return record


def run_source(record, data_dir=None):
    """The data the run read, checked to be what its record calls it."""
    from pyimagesearch.sources import resolve_source

    label = record["data_source"]
    command = record.get("command") or []
    if data_dir is None and "--data-dir" in command[:-1]:
        data_dir = command[command.index("--data-dir") + 1]
    kind = ("sample" if label == "sample" else "tfrecord" if label.startswith("tfrecord")
            else "tfds")
    source = resolve_source(kind, config.DATA_NAME, data_dir)
    if source.label != label:
        raise UserError(f"the run read {label!r} data, {data_dir or 'the data dir'} "
                        f"holds {source.label!r}; give the run's folder with --data-dir")
    return source


def load(path):
    """The saved model, or a UserError in one line."""
    import tensorflow as tf

    if not tf.io.gfile.exists(path):
        raise UserError(f"model {path} not found; give the .keras the run saved (--model)")
    try:
        return outputs.load_model(path)
    except Exception as error:  # a zip, a config or weights Keras cannot read
        raise UserError(f"cannot load {path} as a Keras model ({first_line(error)})") from error


def draw(record, testIm, predIm):
    """The PNG bytes of the train_*.py scripts' figure (their own lines, as they draw it)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(4, 16), layout="constrained", dpi=80)
    axes = fig.subplots(nrows=8, ncols=2, subplot_kw={"xticks": [], "yticks": []})
    fig.suptitle(outputs.figure_title(record), fontsize="medium")
    for ax, real, pred in zip(axes, testIm[:8], predIm[:8]):
        ax[0].imshow(real[..., 0], cmap="gray", vmin=0, vmax=1)
        ax[0].set_title("Input Image")
        ax[1].imshow(pred[..., 0], cmap="gray", vmin=0, vmax=1)
        ax[1].set_title("Predicted Image")
    image = io.BytesIO()
    fig.savefig(image, format="png")
    return image.getvalue()


def main(argv=None):
    parser = OneLineParser(description=__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("record", help="the run record, RUN.json")
    parser.add_argument("--model", default=None, help="the run's model (default: RUN.keras)")
    parser.add_argument("--out", default=None, help="the PNG to write (default: RUN.png)")
    parser.add_argument("--data-dir", default=None,
                        help="the data the run read, if not the record's --data-dir")
    args = parser.parse_args(argv)
    stem = os.path.splitext(args.record)[0]
    out = args.out or f"{stem}.png"
    files.check_output_file(out)  # before the work, not after it
    record = read_record(args.record)
    from pyimagesearch import strategies
    from pyimagesearch.data import figure_digits

    strategies.cpu_only()  # a few predictions: the CPU's
    model = load(args.model or f"{stem}.keras")
    images = figure_digits(run_source(record, args.data_dir))
    predicted = model(images, training=False).numpy()  # as plan.predict, off a TPU
    files.write_bytes(out, draw(record, images, predicted))
    print(f"[INFO] {out}: the figure of {record['name']}, redrawn")


if __name__ == "__main__":
    exits.run_main(main)
