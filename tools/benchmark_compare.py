"""How long compare.py takes on a folder of many runs, as a reader runs it.

    python tools/benchmark_compare.py                    # 200 runs, from outputs/quoted's
    python tools/benchmark_compare.py --runs 200 --json outputs/quoted/benchmarks/compare_200.json
    python tools/benchmark_compare.py --compare /tmp/old/compare.py   # another version

A notebook that keeps its runs across sessions gathers many. This copies the
records and models of a folder of real runs (`--from`, default outputs/quoted)
into `--runs` runs in a temporary folder, each with a name (cpu_seed-7, as a run
with --seed 7 is called) and a start time of its own, then times `python
compare.py FOLDER` in a fresh process, start to end, and reports the seconds, the
rows of Table 1 and any warning compare.py printed (matplotlib's among them).
"""
import argparse
import datetime
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from pyimagesearch import host  # noqa: E402
host.prepare_tensorflow()  # Keras on TensorFlow (KERAS_BACKEND set aside in one line)

from pyimagesearch import cli, exits, files  # noqa: E402
from pyimagesearch.errors import OneLineParser, UserError  # noqa: E402

# TensorFlow's own log lines (absl's form, or TensorFlow 2.20's), not compare.py's
NATIVE = re.compile(r"^(WARNING: All log messages|[IWEF]\d{4} |[\d-]+ [\d:.]+: [IWEF] )")


def make_runs(source, folder, count):
    """`count` run records with their models in `folder`, copied round-robin from `source`."""
    stems = sorted(name[:-len(".json")] for name in os.listdir(source) if name.endswith(".json")
                   and os.path.isfile(os.path.join(source, name[:-len(".json")] + ".keras")))
    if not stems:
        raise UserError(f"{source} holds no run record with its model (NAME.json and "
                        "NAME.keras); give --from a folder of runs")
    start = datetime.datetime(2026, 12, 1, tzinfo=datetime.timezone.utc)
    for index in range(count):
        stem = stems[index % len(stems)]
        with open(os.path.join(source, f"{stem}.json")) as handle:
            record = json.load(handle)
        name = f"{stem}_seed-{index}"
        record.update(name=name, seed=index, flags=["--seed", str(index)],
                      started_at=(start + datetime.timedelta(minutes=index)).isoformat())
        with open(os.path.join(folder, f"{name}.json"), "w") as handle:
            json.dump(record, handle)
        shutil.copyfile(os.path.join(source, f"{stem}.keras"),
                        os.path.join(folder, f"{name}.keras"))
    return stems


def time_compare(script, folder):
    """(seconds, exit status, stdout, stderr) of `python SCRIPT FOLDER` run from the repository."""
    began = time.perf_counter()
    done = subprocess.run([sys.executable, script, folder], cwd=REPO, capture_output=True,
                          text=True)
    return time.perf_counter() - began, done.returncode, done.stdout, done.stderr


def main(argv=None):
    parser = OneLineParser(description=__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=cli.integer(1, 10_000), default=200,
                        help="run records to compare (default %(default)s)")
    parser.add_argument("--from", dest="source", default=str(REPO / "outputs" / "quoted"),
                        help="the folder of real runs they are copied from "
                             "(default outputs/quoted)")
    parser.add_argument("--compare", default="compare.py",
                        help="the compare.py to time (default: this repository's)")
    parser.add_argument("--json", default=None, help="also write the figures here")
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parser.parse_args(argv)
    if args.json:
        files.check_output_file(args.json)
    with tempfile.TemporaryDirectory(prefix="compare-runs-") as folder:
        stems = make_runs(args.source, folder, args.runs)
        seconds, status, out, err = time_compare(args.compare, folder)
    rows = [line for line in out.splitlines()
            if line.startswith("| ") and not line.startswith(("| run |", "| --- |"))]
    warnings = [line for line in err.splitlines()
                if "warn" in line.lower() and not NATIVE.match(line)]
    print(f"[INFO] python {args.compare} on {args.runs} runs (with their models): "
          f"{seconds:.1f} s, exit status {status}, {len(rows)} rows in Table 1, "
          f"{len(warnings)} warning lines")
    for line in warnings + ([err.strip().splitlines()[-1]] if status and err.strip() else []):
        print(f"  {line}")
    if args.json:
        from pyimagesearch.outputs import machine_info

        files.write_json(args.json, {
            "runs": args.runs, "copied_from": sorted(stems), "seconds": seconds,
            "exit_status": status, "table_rows": len(rows), "warnings": warnings,
            "machine": machine_info(), "load_average": os.getloadavg(),
            "measured_at": datetime.datetime.now(datetime.timezone.utc).isoformat(
                timespec="seconds"),
            "command": ["tools/benchmark_compare.py", *argv]})
    if status:
        raise UserError(f"{args.compare} ended with exit status {status}")


if __name__ == "__main__":
    exits.run_main(main)
