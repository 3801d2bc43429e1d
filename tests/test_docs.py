"""README.md and docs/ against the repository and the records they quote; no training.

What a reader relies on: the README is short and follows the article's order, the top
level holds the article's scripts, Table 1 is what compare.py prints, and every figure
quoted is the one in its record under outputs/quoted/. The commands, links and the
listing's map the documentation gives are held by test_docs_commands.py.

To quote a new figure: commit its record under outputs/quoted/ and add a Quote to QUOTES
below: the document, the text exactly as it appears there with {name} for each figure,
and for each name the record, the path to the value in it and its format.
"""
import json
import re
import statistics
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
QUOTED = REPO / "outputs" / "quoted"
README = REPO / "README.md"
DOCS = sorted((REPO / "docs").glob("*.md"))
MAX_README_LINES = 220
# the article's sections, in its order; the README's own sections go between them
ARTICLE_ORDER = ["Configuring your environment", "Project structure", "Hardware",
                 "Distribute the training", "Data", "Losses", "A tale of comparison",
                 "Summary"]
QUICK_START = ["pip install -r requirements.txt && python train_cpu.py",
               "pip install -r requirements-dev.txt && python -m pytest -q"]
TOP_LEVEL_SCRIPTS = {"train_cpu.py", "train_gpu.py", "train_tpu.py", "compare.py"}


def documents():
    """{path relative to the repository: text} of the README and every docs/ page."""
    return {str(path.relative_to(REPO)): path.read_text() for path in [README, *DOCS]}


# --- quoted figures -----------------------------------------------------------------

def _mean_after_first(values):
    return statistics.mean(values[1:])


REDUCE = {"last": lambda values: values[-1], "mean_after_first": _mean_after_first,
          "sum": sum, "median": statistics.median}


def _load(record):
    with open(QUOTED / record) as handle:
        return json.load(handle)


@dataclass
class Figure:
    """One number in a record: the file under outputs/quoted/, the path to it, its format."""
    record: str
    path: tuple
    fmt: str = "{}"
    reduce: str = None  # a name in REDUCE, applied to a list

    def value(self):
        value = _load(self.record)
        for key in self.path:
            value = value[key]
        if self.reduce:
            value = REDUCE[self.reduce](value)
        return self.fmt.format(value)


@dataclass
class Computed:
    """A number computed from a whole record (a ratio, a unit change), then formatted."""
    record: str
    compute: object  # record -> number
    fmt: str = "{}"

    def value(self):
        return self.fmt.format(self.compute(_load(self.record)))


@dataclass
class Quote:
    """Text that must appear in `doc` once its {names} are filled from records.

    Runs of white space count as one space, so a quote may wrap across lines.
    """
    doc: str
    text: str
    figures: dict = field(default_factory=dict)

    def render(self):
        return self.text.format(**{name: figure.value()
                                   for name, figure in self.figures.items()})


def _each(record, path, fmt, sep=", "):
    """Every value of a list in a record, formatted and joined: '4.84, 4.28, ...'."""
    def joined(found):
        for key in path:
            found = found[key]
        return sep.join(fmt.format(value) for value in found)
    return Computed(record, joined)


def _giga(record, key):
    return Computed(record, lambda r: r[key] / 1e9, "{:.2f}")


def _val(record, epoch=-1):
    return Figure(record, ("val_loss", epoch), "{:.4f}")


def _loss(record, epoch=-1):
    return Figure(record, ("loss", epoch), "{:.4f}")


LB = "large_batch/{}/tpu_rehearsal.json"
QUICK_START_RECORD = "quick_start/cpu.json"
QUICK_START_LOG = QUOTED / "quick_start" / "train_cpu.log"
MATMUL = "benchmarks/matmul_cpu.json"
MATMUL16 = "benchmarks/matmul_cpu_bfloat16.json"
MATMUL_TPU = "benchmarks/matmul_tpu_rehearsal.json"
LEVERS = "benchmarks/levers_cpu.json"
PIPE_IN = "benchmarks/pipeline_input.json"
PIPE_TRAIN = "benchmarks/pipeline_training.json"
FLOOR = "benchmarks/floor_cpu.json"
TFR = "tfrecord_training/{}/cpu.json"
MW = "multi_worker/gpu_rehearsal.json"
RESUMED = "resume/cpu.json"
PREEMPTED = "preemption/cpu.json"
CLUSTER_PREEMPTED = "preemption/cluster/gpu_rehearsal.json"
INTEL = "machines/intel_xeon.json"
JAX_REHEARSAL = "jax/tpu_rehearsal_jax.json"
JAX_TF_REHEARSAL = "jax/tpu_rehearsal.json"
NOTEBOOK_TIME = "notebook/first_run.json"


def _large_batch_row(label, record):
    """A row of the README's large-batch table: steps, learning rate, val_loss, seconds."""
    return Quote("README.md", label + " | {steps} | {lr} | {val} | {later} |", {
        "steps": Figure(record, ("steps_per_epoch",)),
        "lr": Figure(record, ("learning_rate",), "{:.2g}"),
        "val": _val(record),
        "later": Figure(record, ("epoch_seconds",), "{:.1f}", "mean_after_first")})


QUOTES = [
    # the README
    _large_batch_row("| `python train_tpu.py --rehearse 8` (the article's TPU set-up)",
                     "tpu_rehearsal.json"),
    _large_batch_row("| `... --rehearse 8 --lr-scaling sqrt`", LB.format("sqrt_lr")),
    _large_batch_row("| `... --rehearse 8 --lr-scaling linear`", LB.format("linear_lr")),
    _large_batch_row("| `... --rehearse 8 --steps-per-epoch 468`", LB.format("fixed_steps")),
    _large_batch_row("| `python train_cpu.py` (batch 128), for reference", "cpu.json"),
    Quote("README.md", "- loss: {loss} - val_loss: {val}\n[INFO] evaluating the model...",
          {"loss": _loss(QUICK_START_RECORD), "val": _val(QUICK_START_RECORD)}),
    Quote("README.md", "Its later epochs took about {later} s there",
          {"later": Figure(QUICK_START_RECORD, ("epoch_seconds",), "{:.0f}",
                           "mean_after_first")}),
    Quote("docs/machine.md", "took {table1} s on the Intel machine on 2026-12-02 ([Table 1's "
          "`cpu`](../outputs/quoted/cpu.json)) and about {later} s on 2026-12-06", {
              "table1": Figure("cpu.json", ("epoch_seconds",), "{:.1f}", "mean_after_first"),
              "later": Figure(QUICK_START_RECORD, ("epoch_seconds",), "{:.0f}",
                              "mean_after_first")}),
    Quote("README.md", "gave a naive {naive} s and a measured median of {median} s",
          {"naive": Figure(MATMUL, ("naive_seconds",), "{:.2f}"),
           "median": Figure(MATMUL, ("seconds", "median"), "{:.3f}")}),
    Quote("docs/tpus.md", "Keras on JAX with `scale=1` ends at loss {loss} and val_loss {val}",
          {"loss": _loss(JAX_REHEARSAL), "val": _val(JAX_REHEARSAL)}),
    Quote("docs/tpus.md", "configuration with `scale=8` at loss {loss} and val_loss {val}",
          {"loss": _loss(JAX_TF_REHEARSAL), "val": _val(JAX_TF_REHEARSAL)}),
    Quote("docs/tpus.md", "The JAX epochs took {jax} s after the first, TensorFlow's {tf} s",
          {"jax": Figure(JAX_REHEARSAL, ("epoch_seconds",), "{:.1f}", "mean_after_first"),
           "tf": Figure(JAX_TF_REHEARSAL, ("epoch_seconds",), "{:.1f}", "mean_after_first")}),
    Quote("README.md", "on 8 JAX CPU devices its SGD step is {ratio} times the one-device step",
          {"ratio": Figure("listings/jax_loss_step.json", ("steps", "8:1", "ratio"), "{:.3f}")}),
    Quote("README.md", "The op moves {gb} GB for {gflop} GFLOP",
          {"gb": _giga(MATMUL, "bytes_moved"), "gflop": _giga(MATMUL, "flops")}),
    Quote("docs/notebook.md", "the notebook took {total} s there: the matmul {matmul} s, "
          "`train_cpu.py` {cpu} s, the TPU's rehearsal {tpu} s, TensorBoard {board} s and "
          "`compare.py` {compare} s. With an article-style epoch of {epoch} s, that comes to "
          "about {colab} s on Colab's free CPU", {
              "total": Figure(NOTEBOOK_TIME, ("notebook_seconds",), "{:.0f}"),
              **{name: Figure(NOTEBOOK_TIME, ("cells", cell), "{:.0f}") for name, cell in (
                  ("matmul", "matmul-run"), ("cpu", "train-cpu"), ("tpu", "train-tpu"),
                  ("board", "tensorboard"), ("compare", "compare"))},
              "epoch": Computed(NOTEBOOK_TIME, lambda r: statistics.mean(
                  r["article_style_epoch_seconds"]), "{:.0f}"),
              "colab": Figure(NOTEBOOK_TIME, ("colab_free_cpu_estimate_seconds",), "{:.0f}")}),
    Quote("docs/notebook.md", "came to {one} s and {two} s", {
        "one": Figure("notebook/first_run_normal_operands_1.json",
                      ("colab_free_cpu_estimate_seconds",), "{:.0f}"),
        "two": Figure("notebook/first_run_normal_operands_2.json",
                      ("colab_free_cpu_estimate_seconds",), "{:.0f}")}),
    Quote("README.md", "about {colab} s on Colab's free CPU", {
        "colab": Figure(NOTEBOOK_TIME, ("colab_free_cpu_estimate_seconds",), "{:.0f}")}),
]


def _matmul_row(label, record):
    """A row of the matmul table: naive, median (min to max), TFLOP/s, % of peak, GB/s."""
    def peak_share(r):
        return f"{100 * r['tflops'] / r['peak_tflops']:.0f}%" if r["peak_tflops"] else \
            "none printed"
    return Quote("docs/hardware-and-benchmarks.md",
                 label + " | {naive} s | {median} s of {n} runs ({low} to {high}) | "
                 "{tflops} | {share} | {gbs} |", {
                     "naive": Figure(record, ("naive_seconds",), "{:.2f}"),
                     "median": Figure(record, ("seconds", "median"), "{:.3f}"),
                     "n": Figure(record, ("seconds", "repetitions")),
                     "low": Figure(record, ("seconds", "min"), "{:.3f}"),
                     "high": Figure(record, ("seconds", "max"), "{:.3f}"),
                     "tflops": Figure(record, ("tflops",), "{:.3f}"),
                     "share": Computed(record, peak_share),
                     "gbs": Figure(record, ("gb_per_second",), "{:.1f}")})


def _lever_row(label, setup):
    return Quote("docs/hardware-and-benchmarks.md",
                 label + " | {trials} | {low} | {median} | {ratio}x |", {
        "trials": _each(LEVERS, ("seconds", setup), "{:.2f}"),
        "low": Computed(LEVERS, lambda r: min(r["seconds"][setup]), "{:.2f}"),
        "median": Figure(LEVERS, ("median_seconds", setup), "{:.2f}"),
        "ratio": Figure(LEVERS, ("speedup_over_float32", setup), "{:.2f}")})


def _pipeline_row(label, pipeline):
    return Quote("docs/data-and-tfrecords.md", label + " | {trials} | {median} | {ratio}x |", {
        "trials": _each(PIPE_IN, ("trials", pipeline), "{:,.0f}", " / "),
        "median": Figure(PIPE_IN, (pipeline,), "{:,.0f}"),
        "ratio": Figure(PIPE_IN, ("speedup_over_article_style", pipeline), "{:.1f}")})


def _training_row(label, setup):
    return Quote("docs/data-and-tfrecords.md", label + " | {trials} | {median} | {ratio}x |", {
        "trials": _each(PIPE_TRAIN, ("seconds", setup), "{:.2f}"),
        "median": Figure(PIPE_TRAIN, ("median_seconds", setup), "{:.2f}"),
        "ratio": Figure(PIPE_TRAIN, ("speedup_over_article_style", setup), "{:.2f}"),
        "spe": Figure(PIPE_TRAIN, ("steps_per_execution",))})


def _epochs_row(doc, label, record):
    """A row of a run's epochs: val_loss after each, seconds of each."""
    figures = {f"v{i}": _val(record, i) for i in range(5)}
    figures["seconds"] = _each(record, ("epoch_seconds",), "{:.2f}")
    figures["data"] = Figure(record, ("data_source",))
    return Quote(doc, label + " | {data} | {v0}, {v1}, {v2}, {v3}, {v4} | {seconds} |", figures)


LISTINGS = ("listings/tf221.json", "listings/tf220.json")


def _listing(record, name, pattern=None):
    """A listing's last line in `record` (the group of `pattern` in it, if given)."""
    def line(r):
        text = r["listings"][name]["last_line"]
        return re.search(pattern, text)[1] if pattern else text
    return Computed(record, line)


def _weights(record):
    return int(re.search(r"weights: (\d+)", record["listings"]["autoencoder"]["last_line"])[1])


def _listing_quotes(record):
    """The README's listings table, its cells filled from one version's record."""
    return [
        Quote("README.md", "| the TPU matmul timing, no TPU | `{error}` |",
              {"error": _listing(record, "matmul_tpu")}),
        Quote("README.md", "| `from tensorflow.distribute.cluster_resolver import "
              "TPUClusterResolver` | `{error}` |",
              {"error": _listing(record, "import_TPUClusterResolver")}),
        Quote("README.md", "| `from tensorflow.distribute import TPUStrategy` | `{error}` |",
              {"error": _listing(record, "import_TPUStrategy", r"^(.*?)(?: \(/.*\))?$")}),
        Quote("README.md", "works: output {shape}, {weights} weights", {
            "shape": _listing(record, "autoencoder", r"output: (\(.*?\))"),
            "weights": Computed(record, _weights, "{:,}")}),
        Quote("README.md", "moves the weights {keras3} times as far as on one device "
              "({legacy} with `tf_keras`", {
                  "keras3": _listing(record, "MSELoss_scale_1_update_on_2_replicas",
                                     r"is ([\d.]+) times"),
                  "legacy": _listing(record, "MSELoss_scale_1_update_on_2_replicas_tf_keras",
                                     r"is ([\d.]+) times")}),
        Quote("README.md", "offline | {line} |", {"line": _listing(record, "tfds_load_try_gcs")}),
        Quote("README.md", "Keras prints {two} times the true error on 2 replicas and {eight} "
              "times on 8", {
                  "two": _listing(record, "MSELoss_printed_loss_on_2_replicas",
                                  r"scale=1\) is ([\d.]+) times"),
                  "eight": _listing(record, "MSELoss_printed_loss_on_8_replicas",
                                    r"scale=1\) is ([\d.]+) times")}),
        Quote("README.md", "`MSELoss(scale=numAcc)`, which prints it {true} times", {
            "true": _listing(record, "MSELoss_printed_loss_on_8_replicas",
                             r"prints ([\d.]+) times the true")}),
        Quote("README.md", "on 2 replicas takes SGD steps {keras3} times too long", {
            "keras3": _listing(record, "MSELoss_scale_1_update_on_2_replicas",
                               r"is ([\d.]+) times")}),
        Quote("docs/distributed-training.md", "with `tf_keras` the article's `scale=1` printed "
              "{legacy} times `scale=2`'s, which was {half} times the true error", {
                  "legacy": _listing(record, "MSELoss_printed_loss_on_2_replicas_tf_keras",
                                     r"scale=1\) is ([\d.]+) times"),
                  "half": _listing(record, "MSELoss_printed_loss_on_2_replicas_tf_keras",
                                   r"prints ([\d.]+) times the true")}),
        Quote("docs/distributed-training.md", "moves the weights {legacy} times as far as on "
              "one device under `tf_keras` with `TF_USE_LEGACY_KERAS=1`, and {keras3} times "
              "under Keras 3", {
                  "keras3": _listing(record, "MSELoss_scale_1_update_on_2_replicas",
                                     r"is ([\d.]+) times"),
                  "legacy": _listing(record, "MSELoss_scale_1_update_on_2_replicas_tf_keras",
                                     r"is ([\d.]+) times")}),
    ]


# what each listing does on TensorFlow 2.20 and 2.21: its exit status (None: stopped)
LISTING_EXITS = {"matmul_cpu": 0, "matmul_gpu": 0, "matmul_tpu": 1,
                 "import_TPUClusterResolver": 1, "import_TPUStrategy": 1,
                 "import_connect_and_initialize": 0, "import_array_to_img": 0,
                 "autoencoder": 0, "loss_reduction_none": 0, "keras3_reduction": 1,
                 "fit_with_MSELoss_scale_1_on_2_replicas": 0, "inference": 0,
                 "MSELoss_scale_1_update_on_2_replicas": 0,
                 "MSELoss_scale_1_update_on_2_replicas_tf_keras": 0,
                 "MSELoss_printed_loss_on_2_replicas": 0, "MSELoss_printed_loss_on_8_replicas": 0,
                 "MSELoss_printed_loss_on_2_replicas_tf_keras": 0, "tfds_load_try_gcs": None}


def test_the_listings_did_what_the_readme_says_on_both_versions():
    for record in LISTINGS:
        found = _load(record)
        assert {name: result["exit_status"] for name, result in found["listings"].items()} \
            == LISTING_EXITS, record
        needs = found["requirements"]
        assert not needs["tensorflow_requires_matplotlib"]
        assert not needs["tensorflow_datasets_requires_matplotlib"]
        assert not needs["tensorflow_datasets_requires_importlib_resources"]
        assert needs["tensorflow_datasets_files_importing_importlib_resources"]
    assert [_load(record)["tensorflow_version"][:4] for record in LISTINGS] == ["2.21", "2.20"]


QUOTES += _listing_quotes(LISTINGS[0]) + _listing_quotes(LISTINGS[1])
QUOTES += [
    Quote("README.md", "delivered {a} images/s, the TFRecord reader {t} and the in-memory "
          "pipeline {m}", {"a": Figure(PIPE_IN, ("article_style",), "{:,.0f}"),
                           "t": Figure(PIPE_IN, ("tfrecord",), "{:,.0f}"),
                           "m": Figure(PIPE_IN, ("in_memory",), "{:,.0f}")}),
    # docs/hardware-and-benchmarks.md
    _matmul_row("| `python tools/matmul_benchmark.py` (float32)", MATMUL),
    _matmul_row("| `python tools/matmul_benchmark.py --dtype bfloat16`", MATMUL16),
    _matmul_row("| `python tools/matmul_benchmark.py --device tpu --rehearse 8 --repeats 5`",
                MATMUL_TPU),
    Quote("docs/hardware-and-benchmarks.md", "{peak} TFLOP/s ({basis})", {
        "peak": Figure(MATMUL, ("peak_tflops",), "{:.2f}"),
        "basis": Figure(MATMUL, ("peak_basis",))}),
    _lever_row("| float32 (the article's)", "float32"),
    _lever_row("| `--precision mixed_bfloat16`", "mixed_bfloat16"),
    _lever_row("| `--jit-compile` (XLA)", "xla"),
    Quote("docs/hardware-and-benchmarks.md",
          "TensorFlow's default strategy, and the validation pass over the sample's {val} "
          "images) against its floor", {"val": Figure(FLOOR, ("validation_images",), "{:,}")}),
    Quote("docs/hardware-and-benchmarks.md",
          "(its pipeline, {spe} steps per execution,", {
              "spe": Figure(FLOOR, ("steps_per_execution",))}),
    Quote("docs/hardware-and-benchmarks.md",
          "Medians of {n} trials: epoch {epoch} s, floor {low} s; the ratio of each trial's "
          "epoch to its floor has a median of {ratio}x", {
              "n": Figure(FLOOR, ("trials",)),
              "epoch": Figure(FLOOR, ("median_seconds", "train_cpu.py epoch"), "{:.2f}"),
              "low": Figure(FLOOR, ("median_seconds", "floor"), "{:.2f}"),
              "ratio": Figure(FLOOR, ("median_epoch_to_floor",), "{:.2f}")}),
    Quote("docs/hardware-and-benchmarks.md", "ratios spread from {lowest}x to {highest}x", {
        "lowest": Computed(FLOOR, lambda r: min(r["epoch_to_floor"]), "{:.2f}"),
        "highest": Computed(FLOOR, lambda r: max(r["epoch_to_floor"]), "{:.2f}")}),
    Quote("docs/hardware-and-benchmarks.md", "epoch to floor {before}x before and {after}x "
          "after (medians), epochs of {b} s and {a} s", {
              "before": Figure("benchmarks/rewrite/floor_before.json",
                               ("median_epoch_to_floor",), "{:.2f}"),
              "after": Figure("benchmarks/rewrite/floor_after.json",
                              ("median_epoch_to_floor",), "{:.2f}"),
              "b": Figure("benchmarks/rewrite/floor_before.json",
                          ("median_seconds", "train_cpu.py epoch"), "{:.2f}"),
              "a": Figure("benchmarks/rewrite/floor_after.json",
                          ("median_seconds", "train_cpu.py epoch"), "{:.2f}")}),
    # docs/data-and-tfrecords.md
    _pipeline_row("| article-style: `tfds.load`, per-image `map`, shuffle, batch", "article_style"),
    _pipeline_row("| TFRecords (`--data-source tfrecord`)", "tfrecord"),
    _pipeline_row("| in memory (`get_data`, what `tfds` and `sample` use)", "in_memory"),
    _pipeline_row("| article-style with tfds' own in-memory cache", "article_style_tfds_cache"),
    _training_row("| article-style pipeline", "article-style"),
    _training_row("| efficient pipeline (`get_data`)", "efficient pipeline"),
    _training_row("| efficient pipeline + {spe} steps per execution (`train_cpu.py`)",
                  "train_cpu.py"),
    _epochs_row("docs/data-and-tfrecords.md", "| `--data-source tfrecord`", TFR.format("tfrecord")),
    _epochs_row("docs/data-and-tfrecords.md", "| `--data-source tfds`", TFR.format("tfds")),
    # docs/machine.md
    Quote("docs/machine.md", "| CPU (`/proc/cpuinfo` model name) | `{amd}` | `{intel}` (family "
          "{family}, model {model};", {
              "amd": Figure(FLOOR, ("machine", "cpu_model")),
              "intel": Figure(INTEL, ("cpu_model",)),
              "family": Figure(INTEL, ("cpu_family",)), "model": Figure(INTEL, ("model",))}),
    Quote("docs/machine.md", "| CPUs usable | {amd} | {intel} ({cores} cores, {ghz} GHz", {
        "amd": Figure(FLOOR, ("machine", "cpu_count")),
        "intel": Figure(INTEL, ("vcpus_usable",)), "cores": Figure(INTEL, ("cores",)),
        "ghz": Computed(INTEL, lambda r: r["cpu_mhz_reported"] / 1000, "{:.1f}")}),
    Quote("docs/machine.md", "| memory | not recorded | {gib} GiB |",
          {"gib": Figure(INTEL, ("memory_gib",))}),
    Quote("docs/machine.md", "Linux, Python {py}, TensorFlow {tf}, Keras {keras} |", {
        "py": Figure("cpu.json", ("machine", "python")),
        "tf": Figure("cpu.json", ("tensorflow_version",)),
        "keras": Figure("cpu.json", ("keras_version",))}),
    # docs/distributed-training.md
    Quote("docs/distributed-training.md",
          "trained 5 epochs of {steps} steps of {batch} images ({workers} workers, one replica "
          "each) to val_loss {v0}, {v1}, {v2}, {v3}, {v4}, in {first} s for the first epoch "
          "and {later} s for each later one on average", {
              "steps": Figure(MW, ("steps_per_epoch",)),
              "batch": Figure(MW, ("global_batch_size",)),
              "workers": Figure(MW, ("workers",)),
              **{f"v{i}": _val(MW, i) for i in range(5)},
              "first": Figure(MW, ("epoch_seconds", 0), "{:.1f}"),
              "later": Figure(MW, ("epoch_seconds",), "{:.1f}", "mean_after_first")}),
    Quote("docs/distributed-training.md",
          "in one process (Table 1's `gpu_rehearsal`) reached "
          "{v0}, {v1}, {v2}, {v3}, {v4}", {f"v{i}": _val("gpu_rehearsal.json", i)
                                           for i in range(5)}),
    # docs/fault-tolerance-and-tensorboard.md
    Quote("docs/fault-tolerance-and-tensorboard.md",
          "`resumed_from_epoch` is {resumed}; the record holds {n} epochs of losses (val_loss "
          "{v0}, {v1}, {v2}, {v3}) and `epoch_seconds` for the {ran} epochs this process ran "
          "({s0} and {s1} s)", {
              "resumed": Figure(RESUMED, ("resumed_from_epoch",)),
              "n": Computed(RESUMED, lambda r: len(r["val_loss"])),
              **{f"v{i}": _val(RESUMED, i) for i in range(4)},
              "ran": Computed(RESUMED, lambda r: len(r["epoch_seconds"])),
              "s0": Figure(RESUMED, ("epoch_seconds", 0), "{:.1f}"),
              "s1": Figure(RESUMED, ("epoch_seconds", 1), "{:.1f}")}),
    Quote("docs/fault-tolerance-and-tensorboard.md",
          "printed \"resuming from /tmp/resume/backup: {done} of 4 epochs and {steps} steps "
          "done\"", {"done": Figure(RESUMED, ("resumed_from_epoch",)),
                     "steps": Figure(RESUMED, ("resumed_from_step",))}),
    Quote("docs/fault-tolerance-and-tensorboard.md",
          "has `resumed_from_step` {step} (epoch 1's {spe} steps and {rest} of epoch 2) and "
          "val_loss {v0}, {v1}, {v2}, {v3}. The uninterrupted quick start run", {
              "step": Figure(PREEMPTED, ("resumed_from_step",)),
              "spe": Figure(PREEMPTED, ("steps_per_epoch",)),
              "rest": Computed(PREEMPTED, lambda r: r["resumed_from_step"] % r["steps_per_epoch"]),
              **{f"v{i}": Figure(PREEMPTED, ("val_loss", i), "{:.6f}") for i in range(4)}}),
    Quote("docs/fault-tolerance-and-tensorboard.md",
          "`resumed_from_step` {step} and val_loss {v0}, {v1}, {v2}, {v3}; by hand", {
              "step": Figure(CLUSTER_PREEMPTED, ("resumed_from_step",)),
              **{f"v{i}": _val(CLUSTER_PREEMPTED, i) for i in range(4)}}),
    Quote("docs/fault-tolerance-and-tensorboard.md",
          "more epoch, reached {v0}, {v1}, {v2}, {v3} in its first four", {
              f"v{i}": Figure(QUICK_START_RECORD, ("val_loss", i), "{:.6f}")
              for i in range(4)}),
    Quote("docs/data-and-tfrecords.md", "Both records count {t} training and {v} validation", {
        "t": Figure(TFR.format("tfrecord"), ("train_images",), "{:,}"),
        "v": Figure(TFR.format("tfrecord"), ("validation_images",), "{:,}")}),
    Quote("docs/data-and-tfrecords.md", "Both records count {t} training and {v} validation", {
        "t": Figure(TFR.format("tfds"), ("train_images",), "{:,}"),
        "v": Figure(TFR.format("tfds"), ("validation_images",), "{:,}")}),
    Quote("docs/data-and-tfrecords.md", "load average {start} at the start, {end} at the end", {
        "start": Figure(PIPE_IN, ("load_average_1min", "start"), "{:.1f}"),
        "end": Figure(PIPE_IN, ("load_average_1min", "end"), "{:.1f}")}),
]


def _flat(text):
    return re.sub(r"\s+", " ", text)


def quote_mismatches(texts, quotes=None):
    """Messages for every quote whose rendered text is not in its document."""
    texts = {name: _flat(text) for name, text in texts.items()}
    problems = []
    for quote in QUOTES if quotes is None else quotes:
        try:
            expected = quote.render()
        except (OSError, KeyError, IndexError, ValueError) as error:
            problems.append(f"{quote.doc}: cannot fill {quote.text!r} from its record: "
                            f"{error!r}")
            continue
        if _flat(expected) not in texts[quote.doc]:
            problems.append(f"{quote.doc}: expected {expected!r} (from the records)")
    return problems


def test_quoted_figures_match_their_records():
    assert quote_mismatches(documents()) == []


def test_the_expected_output_is_a_real_run():
    """The README's output block is lines of the committed log of `python train_cpu.py`."""
    text = README.read_text()
    block = text.split("```\n[INFO] Number of accelerators", 1)[1].split("```", 1)[0]
    shown = ("[INFO] Number of accelerators" + block).splitlines()
    # the log's first line is the one train_cpu.py prints today: the article's line
    assert 'print(f"[INFO] Number of accelerators: {numAcc}")' in (
        REPO / "train_cpu.py").read_text()
    log = QUICK_START_LOG.read_text().splitlines()
    assert [line for line in shown if line != "..." and line not in log] == []
    with open(QUOTED / QUICK_START_RECORD) as handle:
        assert json.load(handle)["command"] == ["train_cpu.py"]  # the quick start's command


# --- Table 1 ----------------------------------------------------------------------

def table_rows(markdown):
    """The data rows of every Markdown table in `markdown` (not headers or rules)."""
    rows = [line for line in markdown.splitlines() if line.startswith("| ")]
    return [row for row in rows if not row.startswith(("| run |", "| --- |"))]


def table1_mismatches(readme, printed):
    """Rows of compare.py's Table 1 that the README does not hold verbatim."""
    lines = set(readme.splitlines())
    return [row for row in table_rows(printed) if row not in lines]


@pytest.fixture(scope="module")
def printed_table1(tmp_path_factory):
    """What `python compare.py outputs/quoted --with-article` prints (figure in a temp dir)."""
    import contextlib
    import io
    import os

    import compare

    out = tmp_path_factory.mktemp("compare")
    printed, here = io.StringIO(), os.getcwd()
    os.chdir(REPO)  # compare.py's folders are the command's, from the repository root
    try:
        with contextlib.redirect_stdout(printed):
            compare.main(["outputs/quoted", "--with-article", "--output-dir", str(out)])
    finally:
        os.chdir(here)
    return printed.getvalue()


def test_table1_in_the_readme_is_what_compare_prints(printed_table1):
    rows = table_rows(printed_table1)
    assert len(rows) == 6  # cpu, the two rehearsals, the article's three
    assert table1_mismatches(README.read_text(), printed_table1) == []
    # the committed comparison.md is the same table
    assert table_rows((QUOTED / "comparison.md").read_text()) == rows


# --- the README's shape ------------------------------------------------------------

def headings(text, level):
    """The titles of the headings of `level` (2 for ##), in order, outside code blocks."""
    titles, in_code = [], False
    for line in text.splitlines():
        if line.startswith("```"):
            in_code = not in_code
        elif not in_code and line.startswith("#" * level + " "):
            titles.append(line[level + 1:].strip())
    return titles


def test_readme_is_short():
    lines = README.read_text().count("\n")
    assert lines <= MAX_README_LINES, f"README.md has {lines} lines"


def _prose_sentences(text):
    """The README's sentences outside code blocks, tables and headings."""
    paragraphs, in_code = [[]], False
    for line in text.splitlines():
        if line.startswith("```"):
            in_code = not in_code
        elif in_code or line.startswith(("|", "#", "!", "<")) or not line.strip():
            paragraphs.append([])
        else:
            if line.startswith("- "):  # a list item starts a sentence of its own
                paragraphs.append([])
            paragraphs[-1].append(line)
    sentences = []
    for paragraph in paragraphs:
        flat = re.sub(r"`[^`]*`", "CODE", re.sub(r"\]\([^)]*\)", "]", " ".join(paragraph)))
        sentences += [sentence for sentence in re.split(r"(?<=[.!?:;])\s+", flat)
                      if sentence.strip()]
    return sentences


def test_readme_reads_in_one_sitting():
    text = README.read_text()
    long = [sentence for sentence in _prose_sentences(text) if len(sentence.split()) > 40]
    assert long == []
    cells = [cell.strip() for line in text.splitlines() if line.startswith("|")
             for cell in line.strip("|").split("|")]
    assert [cell for cell in cells if len(cell) > 200] == []


def test_the_sentence_check_catches_a_long_one():
    text = "One two.\n\n- " + "word " * 40 + "end.\n| a cell. |\n"
    assert [len(sentence.split()) for sentence in _prose_sentences(text)] == [2, 42]


def test_readme_follows_the_article():
    sections = headings(README.read_text(), 2)
    assert sections[0] == "Quick start"
    assert [title for title in sections if title in ARTICLE_ORDER] == ARTICLE_ORDER


def test_quick_start_keeps_its_two_commands():
    text = README.read_text()
    quick_start = text.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    for command in QUICK_START:
        assert command in quick_start


def test_top_level_holds_the_article_scripts_and_compare():
    assert {path.name for path in REPO.glob("*.py")} == TOP_LEVEL_SCRIPTS


def test_license_exists():
    assert "MIT License" in (REPO / "LICENSE").read_text()
