"""Redraw a saved run's figure from its record and model, as today's scripts draw it.

    python tools/redraw_figure.py outputs/quoted/cpu.json
    python tools/redraw_figure.py outputs/cpu.json --model outputs/cpu.keras --out /tmp/cpu.png

For a committed run whose figure is older than the scripts' figure code: the
run is not repeated (its record's seconds stay the ones quoted), only its
picture is. The digits are figure_digits of the validation split of the
data the run read (its record's `data_source`; a tfds, stand-in or TFRecord
run also needs the `--data-dir` its command gave, taken from the record or
from --data-dir here), the reconstructions the saved model's predictions,
and the title outputs.figure_title of the record, drawn by outputs.figure,
the package's one figure function: the figure of the train_*.py listing
(4 x 16 inches, 8 rows of input and prediction, grey levels 0 to 1, no
ticks, 80 dpi), which the scripts draw in the article's own lines; a test
holds the two to the same pixels. The PNG (default: beside the record, RECORD.png) replaces an
earlier one whole, or not at all.
"""
import argparse
import os
import pathlib
import sys

# `python tools/NAME.py` puts tools/ on sys.path, not the repository root
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from pyimagesearch import runtime  # noqa: E402
runtime.tensorflow()  # Keras on TensorFlow, whatever KERAS_BACKEND says (one line if set aside)

from pyimagesearch import cli  # noqa: E402
from pyimagesearch import config
from pyimagesearch.files import check_output_file  # noqa: E402
from pyimagesearch.errors import UserError, first_line  # noqa: E402

NEEDED = ("name", "data_source", "global_batch_size", "steps_per_epoch", "learning_rate",
          "val_loss")


def read_record(path):
    """A run record with what the figure needs, or a UserError naming what is wrong."""
    from pyimagesearch.files import read_json

    record = read_json(path, "give the .json a train_*.py run wrote")
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
    source = resolve_source(kind, data_dir=data_dir)
    if source.label != label:
        raise UserError(f"the run read {label!r} data, {data_dir or 'the data dir'} "
                        f"holds {source.label!r}; give the run's folder with --data-dir")
    return source


def load(path):
    """The saved model, or a UserError in one line."""
    import tensorflow as tf

    from pyimagesearch import outputs

    if not tf.io.gfile.exists(path):
        raise UserError(f"model {path} not found; give the .keras the run saved (--model)")
    try:
        return outputs.load_model(path)
    except Exception as error:  # a zip, a config or weights Keras cannot read
        raise UserError(f"cannot load {path} as a Keras model ({first_line(error)})") from error


def main(argv=None):
    parser = cli.OneLineParser(description=__doc__,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("record", help="the run record, RUN.json")
    parser.add_argument("--model", default=None, help="the run's model (default: RUN.keras)")
    parser.add_argument("--out", default=None, help="the PNG to write (default: RUN.png)")
    parser.add_argument("--data-dir", default=None,
                        help="the data the run read, if not the record's --data-dir")
    args = parser.parse_args(sys.argv[1:] if argv is None else list(argv))
    stem = os.path.splitext(args.record)[0]
    out = args.out or f"{stem}.png"
    check_output_file(out)  # before the work, not after it
    record = read_record(args.record)
    from pyimagesearch import strategies

    strategies.cpu_only()  # a few predictions: the CPU's (and no cuInit line)
    model = load(args.model or f"{stem}.keras")

    from pyimagesearch.data import figure_digits
    from pyimagesearch.files import file_to_write
    from pyimagesearch.files import StagedOutputs

    images = figure_digits(run_source(record, args.data_dir).examples(config.VALIDATION_FLAG))
    from pyimagesearch import outputs

    fig = outputs.figure(outputs.figure_title(None, record), images,
                         model.predict(images, batch_size=len(images), verbose=0))
    folder, name = os.path.split(file_to_write(out))
    with StagedOutputs(folder or ".") as staged:
        fig.savefig(staged.path(name), dpi=80, format="png")
    print(f"[INFO] {out}: the figure of {record['name']}, redrawn")


if __name__ == "__main__":
    cli.run_main(main, sys.argv[1:])
