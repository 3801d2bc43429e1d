"""The article's Table 1 from your own runs, and their reconstructions side by side.

    python train_cpu.py && python train_tpu.py --rehearse 8
    python compare.py                      # reads outputs/*.json
    python compare.py outputs outputs/quoted/large_batch/*/ --output-dir /tmp/cmp

Reads every run record (cpu.json, gpu.json, tpu.json, *_rehearsal.json) in
the folders given (default: outputs), prints Table 1 as Markdown and writes
it to comparison.md in --output-dir (default: the first folder), and
draws comparison.png: the same 8 validation digits reconstructed by every
model found beside its record, with a bar chart of seconds per epoch. Runs
are named by their file (cpu, tpu_rehearsal); where two folders hold runs of
the same name, by folder and file (fixed_steps/tpu_rehearsal). The first
epoch is reported apart from the rest, since it includes tracing (and on a
TPU, compilation). A file that is not a run record is named and skipped.
"""
import argparse
import json
import os
import statistics
import sys

from pyimagesearch import cli, config
from pyimagesearch.errors import UserError

REQUIRED = ("device", "replicas", "global_batch_size", "steps_per_epoch",
            "epoch_seconds", "loss", "val_loss", "data_source")
COLUMNS = ("run", "replicas", "global batch", "steps/epoch", "epoch 1 (s)",
           "later epochs (s)", "ms/step", "images/s", "loss", "val_loss", "data",
           "rehearsal")
# the article's own figures, from its logs, for reference: Colab CPU, a Tesla T4,
# and 8 TPU cores; the article gives no images/s
ARTICLE_ROWS = [
    ("article: CPU", 1, 128, 468, 65, 57, 122, None, "0.0015", "0.0014", "MNIST", "no"),
    ("article: GPU (Tesla T4)", 1, 128, 468, 24, 4, 8, None, "0.0015", "0.0015", "MNIST", "no"),
    ("article: TPU (8 cores)", 8, 1024, 58, 8, 2, 27, None, "0.0087", "0.0072", "MNIST", "no"),
]


def load_records(folder):
    """{stem: record} for every run record in `folder`; complaints go to stderr."""
    records = {}
    for name in sorted(os.listdir(folder)):
        if not name.endswith(".json") or name.startswith("."):
            continue
        path = os.path.join(folder, name)
        try:
            with open(path) as handle:
                record = json.load(handle)
        except (OSError, ValueError) as error:
            print(f"skipping {path}: not readable JSON ({error})", file=sys.stderr)
            continue
        missing = [key for key in REQUIRED if not isinstance(record, dict) or key not in record]
        if missing:
            print(f"skipping {path}: not a run record (no {', '.join(missing)})",
                  file=sys.stderr)
            continue
        if not record["epoch_seconds"]:
            print(f"skipping {path}: the run record has no epochs", file=sys.stderr)
            continue
        records[name[:-len(".json")]] = record
    return records


def later_mean(values):
    """Mean over the epochs after the first (the first alone if there is one)."""
    return statistics.mean(values[1:] or values)


def table_row(stem, record):
    """One row of Table 1 from a run record."""
    seconds = record["epoch_seconds"]
    train = later_mean(record.get("train_seconds") or seconds)
    steps = record["steps_per_epoch"]
    ms_per_step = 1000 * train / steps
    images = steps * record["global_batch_size"] / train
    return (stem, record["replicas"], record["global_batch_size"], steps,
            round(seconds[0], 1), round(later_mean(seconds), 1), round(ms_per_step, 1),
            round(images), f"{record['loss'][-1]:.4f}", f"{record['val_loss'][-1]:.4f}",
            record["data_source"], "yes" if record.get("rehearsal") else "no")


def markdown_table(rows):
    """A Markdown table of `rows` under COLUMNS."""
    def cell(value):
        return "" if value is None else f"{value:,}" if isinstance(value, int) else str(value)

    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + " --- |" * len(COLUMNS)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def _wrap(name, width=14):
    """Break a long run name at slashes and underscores so column titles do not overlap."""
    lines = []
    pieces = name.split("/")  # folder/file where names repeat
    for index, piece in enumerate(pieces):
        current = ""
        for part in piece.split("_"):
            if current and len(current) + len(part) + 1 > width:
                lines.append(current + "_")
                current = part
            else:
                current = f"{current}_{part}" if current else part
        lines.append(current + ("/" if index < len(pieces) - 1 else ""))
    return "\n".join(lines)


def comparison_figure(runs, source):
    """Input digits and each model's reconstruction in columns, plus epoch times."""
    import keras
    import numpy as np

    import pyimagesearch  # noqa: F401  (registers the model for loading)
    from pyimagesearch.data import figure_digits, resolve_data_dir, resolve_source
    from pyimagesearch.outputs import Figure
    from pyimagesearch.strategy import cpu_strategy

    cpu_strategy()  # quiet device discovery; a comparison needs no accelerator

    records = {name: record for name, (_, _, record) in runs.items()}
    models = {}
    for name, (folder, stem, _) in runs.items():
        path = os.path.join(folder, f"{stem}.keras")
        if os.path.exists(path):
            try:
                models[name] = keras.saving.load_model(path)
            except Exception as error:  # a damaged model file is reported, not fatal
                print(f"skipping {path}: cannot load ({error})", file=sys.stderr)
    data_dir = resolve_data_dir(None) if source == "tfds" else None
    resolved = resolve_source(source, config.DATA_NAME, data_dir)  # fails fast offline
    digits = figure_digits(resolved.images(config.VALIDATION_FLAG))

    columns = 1 + len(models)
    figure = Figure(figsize=(1.6 * columns + 4, 1.6 * len(digits)), layout="constrained")
    grid = figure.add_gridspec(len(digits), columns + 3)
    for row, digit in enumerate(digits):
        axis = figure.add_subplot(grid[row, 0])
        axis.imshow(digit.squeeze(-1), cmap="gray", vmin=0, vmax=1)
        axis.set_axis_off()
        if row == 0:
            axis.set_title("input", fontsize=9)
    for column, (name, model) in enumerate(models.items(), start=1):
        predictions = np.asarray(model(digits, training=False))
        for row, prediction in enumerate(predictions):
            axis = figure.add_subplot(grid[row, column])
            axis.imshow(prediction.squeeze(-1), cmap="gray", vmin=0, vmax=1)
            axis.set_axis_off()
            if row == 0:
                axis.set_title(f"{_wrap(name)}\nval {records[name]['val_loss'][-1]:.4f}",
                               fontsize=7)
    bars = figure.add_subplot(grid[:, columns:])
    stems = list(records)
    later = [later_mean(records[s]["epoch_seconds"]) for s in stems]
    first = [records[s]["epoch_seconds"][0] for s in stems]
    positions = np.arange(len(stems))
    bars.barh(positions - 0.2, first, height=0.4, label="epoch 1")
    bars.barh(positions + 0.2, later, height=0.4, label="later epochs (mean)")
    bars.set_yticks(positions, stems, fontsize=8)
    bars.invert_yaxis()
    bars.set_xlabel("seconds per epoch")
    bars.legend(fontsize=8)
    figure.suptitle(f"reconstructions of {source} validation digits, and epoch times")
    return figure


def gather(folders):
    """{row name: (folder, stem, record)} over `folders`, names unique (see the docstring)."""
    found = [(folder, stem, record) for folder in folders
             for stem, record in load_records(folder).items()]
    stems = [stem for _, stem, _ in found]
    rows = {}
    for folder, stem, record in found:
        name = stem
        if stems.count(stem) > 1:
            name = f"{os.path.basename(os.path.normpath(folder))}/{stem}"
        if name in rows:
            raise UserError(f"two folders called {os.path.basename(os.path.normpath(folder))} "
                            f"both hold a {stem} run; give folders with different names")
        rows[name] = (folder, stem, record)
    return rows


def main(argv=None):
    parser = cli.OneLineParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folders", nargs="*", default=[config.BASE_IMG_PATH],
                        help="folders with run records (default %(default)s)")
    parser.add_argument("--output-dir", default=None,
                        help="where comparison.md and comparison.png go (default: the "
                             "first folder)")
    parser.add_argument("--digits-from", choices=("sample", "tfds"), default="sample",
                        help="whose validation digits the figure shows; tfds reads "
                             "$TFDS_DATA_DIR (default %(default)s: works offline)")
    parser.add_argument("--with-article", action="store_true",
                        help="append the article's own figures, labelled, to the table")
    args = parser.parse_args(argv)
    for folder in args.folders:
        if not os.path.isdir(folder):
            raise UserError(f"{folder} is not a folder")
    runs = gather(args.folders)
    if not runs:
        raise UserError(f"no run records in {', '.join(args.folders)}; run "
                        "train_cpu.py, train_gpu.py or train_tpu.py first")
    output_dir = args.output_dir or args.folders[0]
    cli.check_output_dir(output_dir)

    rows = [table_row(name, record) for name, (_, _, record) in runs.items()]
    table = markdown_table(rows)
    if args.with_article:
        table += "\n\nThe article's Table 1, for reference (its machines, full MNIST):\n\n"
        table += markdown_table(ARTICLE_ROWS)
    print(table)

    from pyimagesearch.outputs import StagedOutputs

    with StagedOutputs(output_dir) as staged:
        with open(staged.path("comparison.md"), "w") as handle:
            handle.write(table + "\n")
        figure = comparison_figure(runs, args.digits_from)
        figure.savefig(staged.path("comparison.png"), format="png", dpi=80)
    print(f"[INFO] wrote {os.path.join(output_dir, 'comparison.md')} and comparison.png")


if __name__ == "__main__":
    cli.run_main(main, sys.argv[1:])
