"""The article's Table 1 from your own runs, and their reconstructions side by side.

    python train_cpu.py && python train_tpu.py --rehearse 8
    python compare.py                      # reads outputs/*.json
    python compare.py outputs outputs/quoted/large_batch/*/ --output-dir /tmp/cmp

Reads every run record (cpu.json, tpu_rehearsal.json, tpu_lr-scaling-sqrt.json: a
run's name says its device, the flags that set it apart and, for a CPU on a GPU or
TPU runtime, that runtime) in the folders given (default: outputs), prints Table 1
as Markdown and writes it to comparison.md in --output-dir (default: the first
folder). A row is named by its file, or by folder and file where two folders hold
runs of the same name (fixed_steps/tpu_rehearsal), and says what trained, where,
for how many epochs and with which flags. Epoch 1 stands apart (it includes
tracing and compilation; a run of one epoch has no later epochs, ms/step or
images/s). Epoch seconds include validation; ms/step and images/s count the
training steps alone. A file that is not a run record is named and skipped.

comparison.png shows the same 8 validation digits reconstructed by at most 6 runs
(those --figure names, else the 6 that started last; one line names the others),
with their validation loss per epoch. Only their models are loaded, so a folder
of hundreds of runs compares in seconds.
"""
import argparse
import json
import math
import os
import re
import statistics
import sys

from pyimagesearch import host
host.prepare_tensorflow()  # Keras on TensorFlow (KERAS_BACKEND set aside in one line)

from pyimagesearch import config, exits, files  # noqa: E402
from pyimagesearch.errors import OneLineParser, UserError  # noqa: E402

LABEL_POINTS = 12  # figure text size: at the saved dpi, about 17 pixels high
FIGURE_DPI = 100

REQUIRED = ("device", "replicas", "global_batch_size", "steps_per_epoch",
            "epoch_seconds", "loss", "val_loss", "data_source")
FIGURE_RUNS = 6  # columns of reconstructions: beyond this the figure's digits get too small

COLUMNS = ("run", "device", "runtime", "epochs", "flags", "replicas", "global batch",
           "steps/epoch", "epoch 1 (s, with val.)", "later epochs (s, with val.)",
           "ms/step (training)", "images/s (training)", "loss", "val_loss", "data", "rehearsal")
# flags of a record's command that name places and schedules, not the run (records
# written before the scripts recorded their "flags" have only the command)
NOT_THE_RUN = {"--output-dir", "--data-dir", "--logdir", "--backup-dir", "--backup-every",
               "--profile-steps", "--rehearse", "--tpu", "--startup-timeout"}
# The article prints no table of figures: its Table 1 rows are rebuilt here from
# its three training logs (a CPU, a Tesla T4, 8 TPU cores), per epoch as the
# logs print them, in whole seconds and ms, by the rule used for our rows. It
# sends readers to Colab, but says of none of its logs where it ran.
ARTICLE_LOGS = {  # name: (device, runtime, replicas, global batch, steps, seconds, ms/step,
    #                     loss, val_loss)
    "article: CPU": ("CPU", "not stated", 1, 128, 468, [65, 57, 56, 57, 57],
                     [133, 122, 120, 122, 121], "0.0015", "0.0014"),
    "article: GPU (Tesla T4)": ("Tesla T4", "not stated", 1, 128, 468, [24, 4, 4, 4, 4],
                                [15, 8, 8, 8, 8], "0.0015", "0.0015"),
    "article: TPU (8 cores)": ("TPU, 8 cores", "not stated", 8, 1024, 58, [8, 2, 2, 2, 2],
                               [60, 31, 30, 27, 27], "0.0087", "0.0072"),
}


def load_records(folder):
    """{stem: record} for every run record in `folder`; complaints go to stderr.

    A record is used only when every field Table 1 reads is there and of its
    kind, and every number in it is finite; otherwise it is skipped with one
    line that names the file and the field. A person may have edited it, or
    another version of the scripts written it.
    """
    records = {}
    for name in sorted(os.listdir(folder)):
        if not name.endswith(".json") or name.startswith("."):
            continue
        path = os.path.join(folder, name)
        if not os.path.isfile(path):  # a FIFO or a device would block the read for ever
            print(f"skipping {path}: not a regular file", file=sys.stderr)
            continue
        try:
            with open(path) as handle:
                record = json.load(handle)
        except (OSError, ValueError, RecursionError) as error:
            what = "nested too deeply" if isinstance(error, RecursionError) else error
            print(f"skipping {path}: not readable JSON ({what})", file=sys.stderr)
            continue
        missing = [key for key in REQUIRED if not isinstance(record, dict) or key not in record]
        if missing:
            print(f"skipping {path}: not a run record (no {', '.join(missing)})",
                  file=sys.stderr)
            continue
        problem = record_problem(record)
        if problem:
            print(f"skipping {path}: {problem}", file=sys.stderr)
            continue
        records[name[:-len(".json")]] = record
    return records


def _number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def record_problem(record):
    """What keeps `record` out of Table 1, naming the field; None when every field serves."""
    wrong = "a run record with values of the wrong type"
    for key in ("device", "data_source"):
        if not isinstance(record[key], str):
            return f"{wrong} ({key} is {record[key]!r}, not a name)"
    for key in ("replicas", "global_batch_size", "steps_per_epoch", "workers"):
        value = record.get(key, 1)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            return f"{wrong} ({key} is {value!r}, not a whole number from 1)"
    for key in ("epoch_seconds", "train_seconds", "loss", "val_loss"):
        values = record.get(key) or []
        if not isinstance(values, list) or not all(_number(v) for v in values):
            return f"{wrong} ({key} must be a list of numbers)"
        if not all(math.isfinite(v) for v in values):
            return f"a run record with numbers that are not finite ({key}: {values})"
        if key.endswith("seconds") and not all(v > 0 for v in values):
            return f"a run record with seconds that are not above 0 ({key}: {values})"
    for key in ("epoch_seconds", "loss", "val_loss"):
        if not record[key]:
            return f"the run record has no epochs ({key} is empty)"
    rate = record.get("learning_rate", 1.0)
    if rate is not None and not (_number(rate) and math.isfinite(rate)):
        return f"{wrong} (learning_rate is {rate!r}, not a finite number)"
    for key in ("machine", "runtime"):
        if not isinstance(record.get(key, {}), dict):
            return f"{wrong} ({key} is {record[key]!r}, not an object)"
    for key in ("flags", "command"):
        if not isinstance(record.get(key, []), list):
            return f"{wrong} ({key} is {record[key]!r}, not a list)"
    return None


def later_mean(values):
    """Mean over the epochs after the first; None for a run of one epoch."""
    return statistics.mean(values[1:]) if len(values) > 1 else None


def _rounded(value, digits=None):
    return None if value is None else round(value, digits)


def article_rows():
    """The article's Table 1 from its logs: epoch 1, then the mean of the later epochs.

    Its logs print whole seconds and ms, so the means are rounded to whole
    numbers too; they give no images/s.
    """
    return [(name, device, runtime, len(seconds), "", replicas, batch, steps, seconds[0],
             round(later_mean(seconds)), round(later_mean(ms_per_step)), None, loss, val_loss,
             "MNIST", "no")
            for name, (device, runtime, replicas, batch, steps, seconds, ms_per_step, loss,
                       val_loss) in ARTICLE_LOGS.items()]


def run_device(record):
    """What trained: 'CPU: Intel Xeon (2 CPUs)', '8 logical devices on CPU: ...', 'Tesla T4 x 2',
    'TPU v5e, 8 chips, 8 replicas; Keras on JAX' (a run on JAX says so; TensorFlow's do not)."""
    machine = record.get("machine") or {}
    model = " ".join(str(machine.get("cpu_model", "")).replace("(R)", "").replace(
        "(TM)", "").split()) or "not recorded"
    cpus = machine.get("cpu_count")
    cpu = f"{model} ({cpus} CPUs)" if cpus else model
    replicas, device = record["replicas"], record["device"]
    found = (record.get("runtime") or {}).get("devices")
    on_jax = record.get("backend") == "jax"
    if device == "cpu":
        text = f"CPU: {cpu}"
    elif record.get("rehearsal"):
        kind = "JAX CPU" if on_jax else "logical"
        text = f"{counted(replicas // record.get('workers', 1), kind + ' device')} on CPU: {cpu}"
    elif device == "gpu":
        text = f"{found or 'GPU'} x {replicas // record.get('workers', 1)}"
    elif found and "chip" in found:  # the chips the machine has, the replicas trained on
        text = f"{found}, {replicas} replicas"
    else:
        text = f"{found or 'TPU'}, {replicas} cores"
    if record.get("workers", 1) > 1:
        text += f"; {processes(record)}"
    return text + ("; Keras on JAX" if on_jax else "")


def processes(record):
    """A run of several processes: '2 workers' (TensorFlow's cluster), or on JAX, a TPU
    slice's hosts and the devices each holds: '2 hosts x 4 devices'."""
    workers = record.get("workers", 1)
    if record.get("backend") == "jax":
        return f"{workers} hosts x {counted(record['replicas'] // workers, 'device')}"
    return f"{workers} workers"


def counted(count, what):
    """'1 device', '4 devices'."""
    return f"{count} {what}{'' if count == 1 else 's'}"


def run_runtime(record):
    """Where the run ran: 'Colab, 1 GPU', 'this machine, no GPU or TPU'."""
    runtime = record.get("runtime")
    return runtime.get("description") if isinstance(runtime, dict) else "not recorded"


def run_flags(record):
    """The flags that set the run apart: its record's, else its command's but for folders."""
    if isinstance(record.get("flags"), list):
        return " ".join(map(str, record["flags"]))
    command, kept = list(record.get("command") or [])[1:], []
    while command:
        word = str(command.pop(0))
        if word.split("=", 1)[0] in NOT_THE_RUN:
            if "=" not in word and command:
                command.pop(0)
        else:
            kept.append(word)
    return " ".join(kept)


def table_row(stem, record):
    """One row of Table 1 from a run record; the later epochs' cells empty after one epoch."""
    seconds = record["epoch_seconds"]
    train = later_mean(record.get("train_seconds") or seconds)
    steps = record["steps_per_epoch"]
    ms_per_step = None if train is None else 1000 * train / steps
    images = None if train is None else steps * record["global_batch_size"] / train
    return (stem, run_device(record), run_runtime(record), len(record["val_loss"]),
            run_flags(record), record["replicas"], record["global_batch_size"], steps,
            round(seconds[0], 1), _rounded(later_mean(seconds), 1), _rounded(ms_per_step, 1),
            _rounded(images), f"{record['loss'][-1]:.4f}", f"{record['val_loss'][-1]:.4f}",
            record["data_source"], "yes" if record.get("rehearsal") else "no")


def markdown_table(rows):
    """A Markdown table of `rows` under COLUMNS."""
    def cell(value):
        text = "" if value is None else f"{value:,}" if isinstance(value, int) else str(value)
        return text.replace("|", "\\|")  # a | of a hand-edited record would split the row

    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + " --- |" * len(COLUMNS)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def run_label(name, record):
    """What a run is, in short lines for the figure: its name (which says the device), a
    cluster's workers, batch and steps, learning rate, final val_loss."""
    workers = record.get("workers", 1)
    rate = record.get("learning_rate")
    scaling = record.get("learning_rate_scaling", "none")
    lines = wrapped(name) + ([processes(record)] if workers > 1 else []) + [
        f"batch {record['global_batch_size']:,}", f"{record['steps_per_epoch']} steps"]
    if rate is not None:
        lines.append(f"lr {rate:.2g}" + (f" ({scaling})" if scaling != "none" else ""))
    return lines + [f"val_loss {record['val_loss'][-1]:.4f}"]


def wrapped(name, width=18):
    """A run's name in lines of about `width` characters, broken after its `_` and `/`."""
    lines = [""]
    for part in re.findall(r"[^_/]+[_/]?|[_/]", name):
        if lines[-1] and len(lines[-1]) + len(part) > width:
            lines.append("")
        lines[-1] += part
    return lines


def shown_runs(runs, named=None, limit=FIGURE_RUNS):
    """The runs the figure shows: those `named`, else the `limit` latest; and those left out.

    Latest by the time the run started (its record's started_at), so a
    session's new runs are drawn; Table 1 lists every run either way.
    """
    if named:
        unknown = [name for name in named if name not in runs]
        if unknown:
            raise UserError(f"--figure names no run called {', '.join(unknown)}; Table 1's "
                            f"runs are {', '.join(runs)}")
        chosen = list(dict.fromkeys(named))
        if len(chosen) > limit:
            raise UserError(f"--figure names {len(chosen)} runs; the figure shows at most "
                            f"{limit}, so name fewer (Table 1 lists them all)")
    else:
        latest = sorted(runs, key=lambda name: str(runs[name][2].get("started_at", "")),
                        reverse=True)
        chosen = [name for name in runs if name in latest[:limit]]  # in Table 1's order
    return chosen, [name for name in runs if name not in chosen]


def comparison_figure(runs, source):
    """Input digits and each model's reconstruction in columns, plus each run's val_loss."""
    import numpy as np
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter, MaxNLocator

    from pyimagesearch.data import figure_digits
    from pyimagesearch.outputs import load_model
    from pyimagesearch.sources import resolve_source
    from pyimagesearch.strategies import cpu_only

    cpu_only()  # quiet device discovery; a comparison needs no accelerator

    records = {name: record for name, (_, _, record) in runs.items()}
    models = {}
    for name, (folder, stem, _) in runs.items():
        path = os.path.join(folder, f"{stem}.keras")
        if os.path.lexists(path) and not os.path.isfile(path):  # a FIFO: a read for ever
            print(f"skipping {path}: not a regular file", file=sys.stderr)
        elif os.path.exists(path):
            try:
                models[name] = load_model(path)
            except Exception as error:  # a damaged model file is reported, not fatal
                print(f"skipping {path}: cannot load ({error})", file=sys.stderr)
    try:
        resolved = resolve_source(source, config.DATA_NAME)  # fails fast offline
    except UserError as error:  # its advice names the training scripts' flag
        raise UserError(str(error).replace("--data-source sample",
                                           "--digits-from sample")) from error
    digits = figure_digits(resolved)

    predicted = {}
    for name, model in models.items():
        try:
            found = np.asarray(model(digits, training=False))
        except Exception as error:  # a model of something else: named, not fatal
            found = error
        if isinstance(found, Exception) or found.shape != digits.shape:
            why = found if isinstance(found, Exception) else f"gives {found.shape}"
            print(f"skipping {runs[name][0]}/{runs[name][1]}.keras in the figure: not a "
                  f"model of the digits (for {digits.shape} it {why})", file=sys.stderr)
        else:
            predicted[name] = found
    columns = 1 + len(predicted)
    figure = Figure(figsize=(1.9 * columns + 5, 1.5 * len(digits) + 1.5), layout="constrained")
    grid = figure.add_gridspec(len(digits), columns + 3)
    draw_reconstructions(figure, grid, digits, predicted, records)
    # what these runs compare on is how their validation loss falls: their
    # seconds are those of whatever ran them (rehearsals: one shared CPU)
    plain = FuncFormatter(lambda value, _: f"{value:.4g}")  # 0.0013, not 1.3 x 10^-3
    draw_val_loss(figure.add_subplot(grid[:, columns:]), records, plain,
                  MaxNLocator(integer=True))
    figure.suptitle(f"the same 8 {source} validation digits reconstructed by each run,\n"
                    "and its validation loss per epoch", fontsize=LABEL_POINTS + 3)
    return figure


def draw_reconstructions(figure, grid, digits, predicted, records):
    """The input digits in `grid`'s first column, then a column per run's reconstructions."""
    for row, digit in enumerate(digits):
        axis = figure.add_subplot(grid[row, 0])
        axis.imshow(digit.squeeze(-1), cmap="gray", vmin=0, vmax=1)
        axis.set_axis_off()
        if row == 0:
            axis.set_title("input", fontsize=LABEL_POINTS)
    for column, (name, predictions) in enumerate(predicted.items(), start=1):
        for row, prediction in enumerate(predictions):
            axis = figure.add_subplot(grid[row, column])
            axis.imshow(prediction.squeeze(-1), cmap="gray", vmin=0, vmax=1)
            axis.set_axis_off()
            if row == 0:
                axis.set_title("\n".join(run_label(name, records[name])),
                               fontsize=LABEL_POINTS)


def draw_val_loss(curves, records, plain, epoch_locator):
    """Each run's val_loss per epoch on the axes `curves`, a log scale labelled by `plain`."""
    for stem, record in records.items():
        epochs = range(1, len(record["val_loss"]) + 1)
        curves.plot(epochs, record["val_loss"], marker="o",
                    label="\n".join(wrapped(stem)))
    curves.set_yscale("log")
    curves.yaxis.set_major_formatter(plain)
    curves.yaxis.set_minor_formatter(plain)
    curves.xaxis.set_major_locator(epoch_locator)
    curves.set_xlabel("epoch", fontsize=LABEL_POINTS)
    curves.set_ylabel("val_loss (log scale)", fontsize=LABEL_POINTS)
    curves.tick_params(labelsize=LABEL_POINTS)
    curves.set_title("validation loss per epoch", fontsize=LABEL_POINTS)
    curves.legend(fontsize=LABEL_POINTS - 2)


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
    parser = OneLineParser(description=__doc__,
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
    parser.add_argument("--figure", nargs="+", default=None, metavar="RUN",
                        help=f"the runs the figure shows, by their names in Table 1 (at most "
                             f"{FIGURE_RUNS}; default: the {FIGURE_RUNS} that started last)")
    args = parser.parse_args(argv)
    for folder in args.folders:
        if not os.path.isdir(folder):
            there = "is not a folder" if os.path.lexists(folder) else "does not exist"
            raise UserError(f"{folder} {there} (in {os.getcwd()}); name the folders that "
                            "hold the runs' records, or run this from the repository")
    runs = gather(args.folders)
    if not runs:
        raise UserError(f"no run records in {', '.join(args.folders)}; run "
                        "train_cpu.py, train_gpu.py or train_tpu.py first")
    output_dir = args.output_dir or args.folders[0]
    files.check_output_dir(output_dir)

    rows = [table_row(name, record) for name, (_, _, record) in runs.items()]
    table = markdown_table(rows)
    if args.with_article:
        table += ("\n\nThe article's Table 1, rebuilt from its training logs, for reference "
                  "(its machines, full MNIST):\n\n")
        table += markdown_table(article_rows())
    print(table)
    shown, left_out = shown_runs(runs, args.figure)
    if left_out:
        print(f"[INFO] the figure shows {len(shown)} of the {len(runs)} runs; left out: "
              f"{', '.join(left_out)} (--figure RUN ... picks others)")
    figure = comparison_figure({name: runs[name] for name in shown}, args.digits_from)
    # each file whole, the table first: a figure that cannot be written leaves the new table
    files.write_bytes(files.join(output_dir, "comparison.md"), (table + "\n").encode())
    files.replace_file(files.join(output_dir, "comparison.png"), lambda local: figure.savefig(
        local, format="png", dpi=FIGURE_DPI), "comparison.md is new, the figure as before")
    print(f"[INFO] wrote {files.join(output_dir, 'comparison.md')} and comparison.png")


if __name__ == "__main__":
    exits.run_main(main)
