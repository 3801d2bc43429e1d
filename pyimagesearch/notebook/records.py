"""What notebook.ipynb shows from the records on disk, as Markdown, figures and lines.

A run's record epoch by epoch, beside its figure (`show_written`); the
matmul timings of the runs folder beside the article's (`matmul_table`); the
Losses section's numbers, from tools/check_listings.py's and
tools/jax_loss_step.py's records (`loss_scaling_rows`); how long a run will
take on this runtime, from tools/time_notebook.py's record or the article's
logs (`estimate`). Nothing here runs a script: the notebook's cells do.
"""
import json
import pathlib
import re

from pyimagesearch import config, tpu_runtime
from pyimagesearch.notebook import ipython_display, show_markdown

ARTICLE_MATMUL = {"CPU": 0.79, "GPU": 0.000436, "TPU (8 cores)": 0.06}  # naive, its listings
LISTINGS_RECORD = "outputs/quoted/listings/tf221.json"  # tools/check_listings.py's record
JAX_LOSS_RECORD = "outputs/quoted/listings/jax_loss_step.json"  # tools/jax_loss_step.py's
MATMUL_RECORD = "outputs/quoted/benchmarks/matmul_cpu.json"  # tools/matmul_benchmark.py's


def matmul_table(folder, article=ARTICLE_MATMUL, reference=MATMUL_RECORD, repo="."):
    """The matmul records in `folder`/benchmarks beside the article's three timings.

    `reference`, this repository's CPU record, comes first: a row of figures
    measured the same way on a known machine.
    """
    rows = ["| where | naive: one call, timed as the article does (s) | measured: median, "
            "warmed up, each call waited for (s) | from |", "| --- | --- | --- | --- |"]
    paths = [(path, f"{path.name} in the runs folder")
             for path in sorted(pathlib.Path(folder, "benchmarks").glob("matmul_*.json"))]
    if reference:
        paths.insert(0, (pathlib.Path(repo, reference),
                         f"`{reference}`, this repository's machine"))
    for path, source in paths:
        try:
            record = json.loads(path.read_text())
            naive, median = record["naive_seconds"], record["seconds"]["median"]
            where = record["device_name"] + (" (a rehearsal)" if record.get("rehearsal")
                                             else "") + (
                ", JAX" if record.get("framework") == "jax" else "")  # timed with jax.numpy
        except (OSError, ValueError, KeyError, TypeError):
            rows.append(f"| {path.name} | | | unreadable: skipped |")
            continue
        rows.append(f"| {where.replace('|', '/')} | {naive:.6g} | {median:.6g} | {source} |")
    for where, seconds in article.items():
        rows.append(f"| the article: {where} | {seconds:g} | | its listing |")
    return "\n".join(rows)


_RATIO = re.compile(r"(?:is|prints) ([0-9.]+) times")


def loss_scaling_rows(path=LISTINGS_RECORD, repo="."):
    """The Losses section's numbers, from tools/check_listings.py's record: a Markdown table."""
    record = json.loads(pathlib.Path(repo, path).read_text())
    listings = record["listings"]

    def ratios(name):
        line = listings.get(name, {}).get("last_line", "")
        return _RATIO.findall(line)

    keras3 = f"Keras {record['keras_version']} (TF {record['tensorflow_version']})"
    rows = [f"| with N replicas | {keras3} | tf.keras 2 (`TF_USE_LEGACY_KERAS=1`) |",
            "| --- | --- | --- |"]
    step, step2 = (ratios("MSELoss_scale_1_update_on_2_replicas"),
                   ratios("MSELoss_scale_1_update_on_2_replicas_tf_keras"))
    rows.append("| one SGD step with `MSELoss(scale=1)`, N=2, over the step on 1 device | "
                f"{_first(step)} | {_first(step2)} |")
    for replicas in (2, 8):
        new = ratios(f"MSELoss_printed_loss_on_{replicas}_replicas")
        old = ratios(f"MSELoss_printed_loss_on_{replicas}_replicas_tf_keras")
        rows.append(f"| `loss` fit prints with `scale=1` over that with `scale={replicas}`, "
                    f"N={replicas} | {_first(new)} | {_first(old)} |")
        rows.append(f"| `loss` fit prints with `scale={replicas}` over the true mean squared "
                    f"error, N={replicas} | {_last(new)} | {_last(old)} |")
    rows.append(f"\n*From `{path}`: `tools/check_listings.py` ran these listings as "
                "processes, on logical CPU devices.*")
    return "\n".join(rows) + jax_loss_rows(repo)


def jax_loss_rows(repo=".", path=JAX_LOSS_RECORD):
    """The Losses section's JAX numbers, from tools/jax_loss_step.py's record: Markdown."""
    try:
        record = json.loads(pathlib.Path(repo, path).read_text())
        steps = record["steps"]
    except (OSError, ValueError, KeyError):
        return "\n\nOn Keras' JAX backend: not measured."
    rows = [f"\n\n| on Keras' JAX backend (JAX {record['jax_version']}), N devices | "
            "one SGD step over the step on 1 device |", "| --- | --- |"]
    rows += [f"| `MSELoss(scale={case.split(':')[1]})`, N={case.split(':')[0]} | "
             f"{step['ratio']:.3f} |" for case, step in steps.items()]
    rows.append(f"\n*From `{path}`: `tools/jax_loss_step.py` on JAX CPU devices: on JAX the "
                "article's `scale=1` is right, as one jitted step sees the global batch.*")
    return "\n".join(rows)


def _first(found):
    """The first ratio a listing printed, or what says it was not measured."""
    return found[0] if found else "not measured"


def _last(found):
    """The last of two or more ratios a listing printed, or what says it was not measured."""
    return found[-1] if len(found) > 1 else "not measured"


def record_table(record):
    """A run record's numbers, epoch by epoch, as a Markdown table."""
    rows = ["| epoch | loss | val_loss | seconds (with validation) |", "| --- | --- | --- | --- |"]
    for epoch, (loss, val_loss, seconds) in enumerate(
            zip(record["loss"], record["val_loss"], record["epoch_seconds"]), start=1):
        rows.append(f"| {epoch} | {loss:.4f} | {val_loss:.4f} | {seconds:.1f} |")
    return "\n".join(rows)


def show_written(run, folder, before=None):
    """The figure and numbers of the record(s) `run` wrote in `folder` (new since `before`).

    The record's name is the script's choice (device, rehearsal, flags):
    whatever the run wrote is shown, and its own name where it wrote none new.
    """
    shown = ipython_display()
    written = [] if before is None else sorted(
        path for path, stamp in run_records(folder).items() if before.get(path) != stamp)
    for path in written or [pathlib.Path(folder, run.name + ".json")]:
        with open(path) as handle:
            record = json.load(handle)
        show_markdown(
            f"**{path.stem}**: {record['replicas']} replica(s), global batch "
            f"{record['global_batch_size']}, {record['steps_per_epoch']} steps per epoch, "
            f"data: {record['data_source']}"
            + (" (a rehearsal on CPU devices)" if record["rehearsal"] else ""))
        show_markdown(record_table(record))
        figure = path.with_suffix(".png")
        if figure.is_file():
            shown.display(shown.Image(filename=str(figure), width=320))


def run_records(folder):
    """{path: modification time} of the run records in `folder`: what a run changed, after."""
    return {path: path.stat().st_mtime_ns for path in pathlib.Path(folder).glob("*.json")}


# tools/time_notebook.py's records: the notebook as committed, and the one its estimates
# use, taken while the machine's load stayed level (docs/notebook.md)
TIMING_RECORD = "outputs/quoted/notebook/first_run.json"
ESTIMATES_RECORD = "outputs/quoted/notebook/first_run_epochs_2.json"
ARTICLE_EPOCHS = {"gpu": ("Tesla T4", 24, 4), "tpu": ("8 TPU cores", 8, 2)}  # its logs' seconds


def _epochs(argv):
    """The epochs that `argv` asks for: its last --epochs, as argparse reads it, else the
    scripts' default."""
    value = tpu_runtime.flag_value(list(argv), "--epochs")
    if value is not None:
        return int(value)
    return config.EPOCHS


def _duration(seconds):
    """Seconds as a reader says them: 40 s, 3.5 min."""
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.1f} min"


def estimate(run, repo="."):
    """One line: about how long `run` will take on this runtime, and what the figure rests on.

    On a CPU: the committed one-core measurement (tools/time_notebook.py),
    scaled to Colab's free CPU by the article's 57 s CPU epoch over an
    article-style epoch timed on that same core, and to `run`'s epochs. The
    article does not say where its CPU log ran: taking it for Colab's free
    CPU is this repository's reading (the article sends readers to Colab). On
    a GPU or TPU: the article's own epochs; nothing here has timed one.
    """
    try:
        epochs = _epochs(run.argv)
    except ValueError:  # the script will say what is wrong with it
        return f"{run.name}: no estimate, its --epochs is not a number"
    if run.name in ARTICLE_EPOCHS:  # a real GPU or TPU, not a rehearsal
        where, first, later = ARTICLE_EPOCHS[run.name]
        return (f"{run.name}: the article's {where} trained {epochs} epoch(s) of this in about "
                f"{first + later * (epochs - 1)} s (its log); start-up (TensorFlow, the data, "
                f"compiling) comes on top, and has not been timed on a real {run.name.upper()}")
    try:
        measured = json.loads(pathlib.Path(repo, ESTIMATES_RECORD).read_text())
        entry = measured["runs"][run.name]
        times = entry["epoch_seconds"]
        later = times[1:] or times
        one_core = entry["seconds"] - sum(times[1:]) + (epochs - 1) * sum(later) / len(later)
        factor = measured["factor"]
    except (OSError, ValueError, KeyError, TypeError, ZeroDivisionError):
        return (f"{run.name}: no measurement of it in {ESTIMATES_RECORD} to estimate its "
                "time from")
    return (f"{run.name}: about {_duration(one_core * factor)} on Colab's free CPU for "
            f"{epochs} epoch(s) (timed on one core here, {entry['seconds']:.0f} s for "
            f"{len(times)} epoch(s), x {factor:.2f}: docs/notebook.md)"
            + ("; its other flags may change that" if _more_flags(run.argv) else ""))


def _more_flags(argv):
    """Whether `argv` holds flags beyond --rehearse N and --epochs N."""
    rest, skip = [], False
    for flag in argv[1:]:
        if skip:
            skip = False
        elif flag in ("--rehearse", "--epochs"):
            skip = True
        elif not flag.startswith("--epochs="):
            rest.append(flag)
    return bool(rest)
