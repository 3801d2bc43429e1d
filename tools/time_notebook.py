"""How long the notebook's first Run all takes on Colab's free CPU, estimated from this machine.

    python tools/time_notebook.py --json outputs/quoted/notebook/first_run.json
    python tools/time_notebook.py --cpu 1 --json /tmp/first_run.json   # pinned to CPU 1

Colab's free CPU cannot be timed from here, so the estimate is a ratio (issue
32): the notebook as committed, run top to bottom by nbclient in a fresh copy of
the repository, offline, pinned to one core (`taskset -c 0`: this process's
affinity, which the kernel and the scripts inherit), times 57 s (the article's CPU
epoch) over the epoch of an article-style pipeline (benchmark_pipeline's) timed on
that core before and after the notebook. It assumes Colab's free CPU trains as fast
as the article's CPU did, which the article does not say (its CPU runs were on
Colab). Other work on the machine slows both, so the ratio cancels part of it; the
record keeps the load averages, each cell's seconds, each training cell's run and
epochs, the two article-style epochs, the factor and the estimate.
"""
import argparse
import datetime
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from pyimagesearch import host  # noqa: E402
host.prepare_tensorflow()  # Keras on TensorFlow (KERAS_BACKEND set aside in one line)

from pyimagesearch import exits, files  # noqa: E402
from pyimagesearch.errors import OneLineParser  # noqa: E402

ARTICLE_CPU_EPOCH_S = 57  # the article's train_cpu.py log on Colab's CPU: epochs 2-5
BUDGET_S = 300            # issue 32: the first Run all within 5 minutes on Colab's free CPU
RUN_CELLS = {"cpu": "train-cpu", "tpu_rehearsal": "train-tpu"}  # a CPU runtime's runs
CELL_TIMEOUT_S = 2400     # a bound for a hang, as tests/test_notebook.py's
ARTICLE_STYLE_EPOCH = """
import sys
sys.path[:0] = [{root!r}, {root!r} + "/tools"]
import benchmark_pipeline as bench
from pyimagesearch import config, strategies
strategies.cpu_only()
dataset = bench.article_style_pipeline({data_dir!r}, config.BATCH_SIZE)
print(bench.time_epoch(dataset, bench.FULL_EPOCH_STEPS))
"""


def fresh_copy(destination):
    """The files git would commit, copied: what a reader's clone holds."""
    import shutil

    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT,
                            capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        source = ROOT / name
        if source.is_file():
            (destination / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, destination / name)
    return destination


def article_style_epoch(data_dir):
    """Seconds of the second of two article-style epochs (468 steps of 128), in a fresh Python."""
    code = ARTICLE_STYLE_EPOCH.format(root=str(ROOT), data_dir=str(data_dir))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT)
    if done.returncode:
        raise SystemExit("time_notebook.py: the article-style epoch failed: "
                         + (done.stderr.strip().splitlines() or ["no output"])[-1])
    return float(done.stdout.strip().splitlines()[-1])


def run_notebook(copy, scratch):
    """Run the notebook in `copy` as committed; ({cell id: seconds}, total seconds).

    nbclient runs it, stops at a failed cell, and records when each cell's
    execution began and its reply came (cell.metadata.execution).
    """
    import nbclient
    import nbformat

    notebook = nbformat.read(copy / "notebook.ipynb", as_version=4)
    env = dict(os.environ, TMPDIR=str(scratch),
               PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    client = nbclient.NotebookClient(notebook, timeout=CELL_TIMEOUT_S, kernel_name="python3",
                                     resources={"metadata": {"path": str(copy)}})
    start = time.monotonic()
    try:
        client.execute(env=env)
    except nbclient.exceptions.CellExecutionError as error:
        raise SystemExit(f"time_notebook.py: a cell failed: {error.ename}: {error.evalue}")
    total = round(time.monotonic() - start, 1)
    cells = {}
    for index, cell in enumerate(notebook.cells):
        times = cell.metadata.get("execution", {})
        if cell.cell_type == "code" and "shell.execute_reply" in times:
            began, ended = (datetime.datetime.fromisoformat(times[key]) for key in
                            ("iopub.execute_input", "shell.execute_reply"))
            cells[cell.get("id", str(index))] = round((ended - began).total_seconds(), 1)
    return cells, total


def run_records(folder, runs):
    """{run: its record} for the notebook's runs ("cpu", "tpu_rehearsal", ...) in `folder`.

    A record is matched by its device and whether it is a rehearsal, not by
    its file name, which the scripts choose (it may carry the flags).
    """
    found = {}
    for path in sorted(pathlib.Path(folder).glob("*.json")):
        record = json.loads(path.read_text())
        if "device" in record:
            name = record["device"] + ("_rehearsal" if record.get("rehearsal") else "")
            if name in runs:
                found[name] = record
    return found


def main(argv=None):
    from pyimagesearch.outputs import machine_info

    argv = sys.argv[1:] if argv is None else list(argv)
    parser = OneLineParser(description=__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", required=True, help="where the record goes")
    parser.add_argument("--cpu", type=int, default=0,
                        help="the one CPU to pin everything to (default %(default)s)")
    args = parser.parse_args(argv)
    files.check_output_file(args.json)
    if args.cpu not in os.sched_getaffinity(0):
        parser.error(f"--cpu {args.cpu} is not one this process may use "
                     f"({sorted(os.sched_getaffinity(0))})")
    os.sched_setaffinity(0, {args.cpu})  # taskset -c CPU: inherited by every child
    load = {"start": os.getloadavg()}
    with tempfile.TemporaryDirectory() as scratch:
        scratch = pathlib.Path(scratch)
        data_dir = scratch / "tfds"
        subprocess.run([sys.executable, "tools/prepare_mnist.py", "--data-dir", str(data_dir),
                        "--stand-in"], cwd=ROOT, check=True, capture_output=True)
        epochs = [article_style_epoch(data_dir)]
        print(f"[INFO] article-style epoch, before: {epochs[0]:.1f} s", flush=True)
        load["before_notebook"] = os.getloadavg()
        copy = fresh_copy(scratch / "clone")
        (scratch / "tmp").mkdir()
        cells, total = run_notebook(copy, scratch / "tmp")
        runs = {name: cells.get(cell) for name, cell in RUN_CELLS.items()}
        print(f"[INFO] the notebook: {total:.0f} s; cells {cells}", flush=True)
        load["after_notebook"] = os.getloadavg()
        records = run_records(copy / "outputs/notebook", runs)
        epochs.append(article_style_epoch(data_dir))
        print(f"[INFO] article-style epoch, after: {epochs[1]:.1f} s", flush=True)
        load["end"] = os.getloadavg()
    epoch = statistics.mean(epochs)
    factor = ARTICLE_CPU_EPOCH_S / epoch
    record = {
        "what": "notebook.ipynb as committed, top to bottom, offline, in a fresh copy, "
                f"pinned to CPU {args.cpu}",
        "cpu_model": machine_info()["cpu_model"],
        "cpus_on_the_machine": os.cpu_count(),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "notebook_seconds": total,
        "cells": cells,
        "runs": {name: {"seconds": seconds,
                        "epoch_seconds": records.get(name, {}).get("epoch_seconds", []),
                        "steps_per_epoch": records.get(name, {}).get("steps_per_epoch")}
                 for name, seconds in runs.items()},
        "article_style_epoch_seconds": epochs,
        "article_cpu_epoch_seconds": ARTICLE_CPU_EPOCH_S,
        "factor": factor,
        "assumes": "Colab's free CPU trains an article-style epoch in the article's 57 s",
        "colab_free_cpu_estimate_seconds": round(total * factor, 1),
        "budget_seconds": BUDGET_S,
        "load_average_1_5_15_min": load,
        "command": ["tools/time_notebook.py", *argv],
    }
    print(f"[INFO] the notebook on one core: {total:.0f} s; an article-style epoch "
          f"{epoch:.1f} s there; on Colab's free CPU about {total:.0f} x {ARTICLE_CPU_EPOCH_S}"
          f" / {epoch:.1f} = {total * factor:.0f} s (the budget: {BUDGET_S} s)")
    files.write_json(args.json, record)


if __name__ == "__main__":
    exits.run_main(main)
