"""How much the input pipeline matters: train_cpu.py's pipeline against an article-style one.

    python tools/prepare_mnist.py --data-dir /tmp/tfds --stand-in   # once, if no MNIST
    python tools/benchmark_pipeline.py --data-dir /tmp/tfds
    python tools/benchmark_pipeline.py --data-dir /tmp/tfds --steps 50 --trials 1   # a quick look
    python tools/benchmark_pipeline.py --data-dir /tmp/tfds --input-only --json bench.json
    python tools/benchmark_pipeline.py --floor --trials 5 --json floor.json   # the sample

Training mode (the default): the set-ups read the same prepared tfds MNIST and
train the same model, loss, optimizer and batch (128) on the CPU, taking turns
in this one process. ``article-style`` is how a tfds pipeline is usually
written: ``tfds.load``, a per-image ``map`` to float, shuffle, batch, no
prefetch, and no cache, so every epoch decodes all 60,000 PNGs again (tfds'
own cache of datasets under 250 MiB, which hides that for MNIST but for no
dataset big enough to need distributed training, is switched off).
``efficient pipeline`` is train_cpu.py's (``Source.dataset``): every PNG
decoded once, uint8 images in memory, a whole batch converted at once,
prefetch; ``train_cpu.py`` adds the script's several steps per call
(``steps_per_execution``). A trial trains two epochs of --steps and keeps the
second (the first includes tracing); speed-ups are medians over the trials.

Floor mode (``--floor``): train_cpu.py's epoch as the script runs it (its
pipeline, steps per execution, strategy and validation pass) against the same
steps on one batch already in memory without validation; their ratio.

Input-only mode (``--input-only``): no model, the pipelines alone, drained
inside a compiled function as a training step pulls them: article-style, the
TFRecord reader (written from --data-dir into a temporary folder unless
--tfrecord-dir names one write_tfrecords.py wrote), the in-memory pipeline, and
article-style with tfds' cache. Each trial drains one untimed epoch (tracing,
files, shuffle buffers, tfds' cache), then times --epochs more: images per
second, the median over the trials.
"""
import argparse
import os
import pathlib
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # the repository's root
from pyimagesearch import host  # noqa: E402
host.prepare_tensorflow()  # Keras on TensorFlow (KERAS_BACKEND set aside in one line)

from pyimagesearch import cli, config, exits, files  # noqa: E402
from pyimagesearch.errors import OneLineParser, UserError  # noqa: E402
from pyimagesearch.pipeline import Reading  # noqa: E402

# one pass over MNIST's training split; both pipelines repeat, so any count works
FULL_EPOCH_STEPS = config.TRAIN_IMAGES // config.BATCH_SIZE
TFRECORD_SHARDS = 8          # shards per split of the temporary TFRecords


def article_style_pipeline(data_dir, batch_size, tfds_cache=False):
    """tfds.load + per-image map + shuffle + batch; every epoch decodes every PNG again.

    `tfds_cache` lets tfds keep the decoded split in memory after the first
    epoch, which it does by itself for datasets under 250 MiB such as MNIST.
    """
    import tensorflow as tf
    import tensorflow_datasets as tfds

    dataset = tfds.load(config.DATA_NAME, split=config.TRAIN_FLAG, data_dir=data_dir,
                        try_gcs=True, as_supervised=True,
                        read_config=tfds.ReadConfig(try_autocache=tfds_cache))

    def to_pair(image, label):
        image = tf.cast(image, tf.float32) / 255.0
        return image, image

    dataset = dataset.map(to_pair).shuffle(config.SHUFFLE_SIZE)
    return dataset.batch(batch_size, drop_remainder=True).repeat()


def efficient_pipeline(source, batch_size):
    """train_cpu.py's training batches from a resolved Source: in memory, or its TFRecords."""
    return source.dataset(config.TRAIN_FLAG, Reading(
        batch_size, config.SHUFFLE_SIZE, seed=config.SEED, repeat=True, drop_remainder=True))


PROFILED_STEPS = 26  # steps of the second epoch traced with --profile-dir (2 x 13)


def time_epoch(dataset, steps, steps_per_execution=1, profile_dir=None,
               precision="float32", jit_compile=False, strategy=None, validation_data=None):
    """Seconds of the second of two training epochs on `dataset`.

    With `validation_data` the epoch includes a pass over it, as a training
    script's epoch does; without, it is the training steps alone.

    With `profile_dir`, a profiler trace of about PROFILED_STEPS steps early
    in the second epoch goes there (Keras counts them in executions).
    `precision`, `jit_compile` and `strategy` (default: TensorFlow's default
    strategy) are those benchmark_levers.py compares.
    """
    import keras
    import tensorflow as tf

    from pyimagesearch.autoencoder import AutoEncoder
    from pyimagesearch.callbacks import EpochTimer
    from pyimagesearch.loss import MSELoss
    from pyimagesearch.strategies import ReplicasAgreeLossScaleOptimizer, set_precision

    strategy = strategy or tf.distribute.get_strategy()
    timer = EpochTimer()
    callbacks = [timer]
    if profile_dir:
        executions = steps // steps_per_execution  # per epoch
        # from the second execution of the second epoch (its first, if it has one)
        first = executions + min(2, executions)
        last = min(first + max(1, PROFILED_STEPS // steps_per_execution) - 1, 2 * executions)
        callbacks.append(keras.callbacks.TensorBoard(profile_dir, write_graph=False,
                                                     profile_batch=(first, last)))
    with strategy.scope():
        set_precision(precision)
        model = AutoEncoder()
        optimizer = keras.optimizers.get({"class_name": config.OPTIMIZER,
                                          "config": {"learning_rate": config.LEARNING_RATE}})
        if precision == "mixed_float16":  # loss scaling, as the scripts' optimizer_config
            optimizer = ReplicasAgreeLossScaleOptimizer(optimizer)
        model.compile(loss=MSELoss(scale=strategy.num_replicas_in_sync), optimizer=optimizer,
                      steps_per_execution=steps_per_execution, jit_compile=jit_compile)
        model.fit(dataset, epochs=2, steps_per_epoch=steps, callbacks=callbacks,
                  validation_data=validation_data, shuffle=False, verbose=0)
    set_precision("float32")
    keras.backend.clear_session()
    return (timer.epoch_seconds if validation_data is not None else timer.train_seconds)[1]


def floor(args, source, command):
    """train_cpu.py's epoch against its floor, taking turns in this process; the figures.

    The epoch is the script's: its pipeline, steps per execution, strategy
    (TensorFlow's default, on the CPU) and a validation pass. The floor is the same model, steps and
    steps per execution on one batch already in memory, repeated: no input
    pipeline to speak of, no validation. Their ratio is what the data and
    the validation cost on top of what the kernels allow.
    """
    import tensorflow as tf

    from pyimagesearch.outputs import machine_info
    from pyimagesearch.plan import steps_per_execution

    steps, batch = args.steps, config.BATCH_SIZE
    spe = steps_per_execution(steps)
    strategy = tf.distribute.get_strategy()  # train_cpu.py's: TensorFlow's default
    validation = source.size(config.VALIDATION_FLAG)
    one_batch = next(iter(efficient_pipeline(source, batch)))
    setups = {
        "train_cpu.py epoch": lambda trial: time_epoch(
            efficient_pipeline(source, batch), steps, spe, strategy=strategy,
            validation_data=get_validation(source, batch)),
        "floor": lambda trial: time_epoch(tf.data.Dataset.from_tensors(one_batch).repeat(),
                                          steps, spe, strategy=strategy),
    }
    seconds, medians = take_turns(setups, args.trials)
    ratios = [epoch / low for epoch, low in zip(seconds["train_cpu.py epoch"],
                                                  seconds["floor"])]
    print(f"\nepoch of {steps} steps x {batch} images ({spe} per execution), validation "
          f"over {validation:,} images; median of {args.trials} trials")
    for name, value in medians.items():
        print(f"  {name:18s} {value:6.2f} s")
    print(f"  epoch / floor      {statistics.median(ratios):6.2f}x (median of the trials' "
          "ratios)")
    return {"seconds": seconds, "median_seconds": medians,
            "min_seconds": {name: min(values) for name, values in seconds.items()},
            "epoch_to_floor": ratios, "median_epoch_to_floor": statistics.median(ratios),
            "steps": steps, "steps_per_execution": spe, "batch_size": batch,
            "validation_images": validation, "trials": args.trials, "data": source.reason,
            "command": command, "machine": machine_info(),
            "load_average_1min": os.getloadavg()[0],
            "tensorflow_version": tf.__version__}


def take_turns(setups, trials, width=18):
    """Seconds of each set-up ({name: timed(trial)}) in `trials` rounds, taking turns, each
    said as it ends; and their medians."""
    seconds = {name: [] for name in setups}
    for trial in range(trials):
        for name, timed in setups.items():
            seconds[name].append(timed(trial))
            print(f"[INFO] trial {trial + 1}: {name:{width}s} {seconds[name][-1]:6.2f} "
                  "s/epoch", flush=True)
    return seconds, {name: statistics.median(values) for name, values in seconds.items()}


def get_validation(source, batch_size):
    """train_cpu.py's validation batches: one pass over the split, in order."""
    return source.dataset(config.VALIDATION_FLAG, Reading(batch_size))


def images_per_second(dataset, steps, epochs, batch_size):
    """Images per second of each of `epochs` epochs of `steps` batches, after one untimed epoch.

    The batches are pulled inside one compiled function, as a training step
    pulls them, so no Python runs per batch.
    """
    import tensorflow as tf

    iterator = iter(dataset)

    @tf.function
    def drain(count):
        checksum = tf.constant(0.0)
        for _ in tf.range(count):
            images, _ = next(iterator)
            checksum += images[0, 0, 0, 0]  # use every batch, so none can be skipped
        return checksum

    drain(tf.constant(steps)).numpy()  # tracing, files, shuffle buffers, tfds' cache
    rates = []
    for _ in range(epochs):
        start = time.perf_counter()
        drain(tf.constant(steps)).numpy()
        rates.append(steps * batch_size / (time.perf_counter() - start))
    return rates


def input_only(args, source, command):
    """Time the input pipelines alone, taking turns; return the figures for --json."""
    import tensorflow as tf

    from pyimagesearch import sources, tfrecords
    from pyimagesearch.outputs import machine_info

    scratch = None
    if args.tfrecord_dir is None:
        scratch = tempfile.mkdtemp(prefix="pyimagesearch-tfrecords-")
        folder = os.path.join(scratch, "mnist")
        print(f"[INFO] writing TFRecords of {source.label} into {folder}")
        tfrecords.write_folder(
            folder, {split: source.examples(split)
                     for split in (config.TRAIN_FLAG, config.VALIDATION_FLAG)},
            origin=source.label, origin_reason=source.reason, command=command,
            shards=TFRECORD_SHARDS)
    else:
        folder = args.tfrecord_dir
    try:
        records = sources.tfrecord_source(folder)
        print(f"[INFO] tfrecord: {records.reason}")
        sizes = [chosen.size(config.TRAIN_FLAG) for chosen in (source, records)]
        origin = records.metadata["source"]
        if origin != source.label or sizes[0] != sizes[1]:
            raise UserError(f"--tfrecord-dir {folder} holds {sizes[1]:,} training images "
                            f"from {origin}, --data-dir {sizes[0]:,} from "
                            f"{source.label}: not the same data")
        batch = config.BATCH_SIZE
        # name -> a fresh pipeline of (image, image) float batches
        setups = {
            "article_style": lambda: article_style_pipeline(source.data_dir, batch),
            "tfrecord": lambda: efficient_pipeline(records, batch),
            "in_memory": lambda: efficient_pipeline(source, batch),
            "article_style_tfds_cache": lambda: article_style_pipeline(
                source.data_dir, batch, tfds_cache=True),
        }
        load, per_epoch = [os.getloadavg()[0]], {name: [] for name in setups}
        for trial in range(args.trials):
            for name, build in setups.items():
                per_epoch[name].append(images_per_second(build(), args.steps, args.epochs,
                                                         batch))
                print(f"[INFO] trial {trial + 1}: {name:25s} "
                      + " ".join(f"{rate:9,.0f}" for rate in per_epoch[name][-1]) + " images/s")
        load.append(os.getloadavg()[0])
    finally:
        if scratch:
            shutil.rmtree(scratch, ignore_errors=True)
    # a trial's figure: all its timed images over all its timed seconds
    per_trial = {name: [len(rates) / sum(1 / rate for rate in rates) for rates in trials]
                 for name, trials in per_epoch.items()}
    medians = {name: statistics.median(values) for name, values in per_trial.items()}
    ratios = {name: value / medians["article_style"] for name, value in medians.items()}
    print(f"\nimages per second, {args.steps} batches of {batch} per epoch, median of "
          f"{args.trials} trials; speed-up over article-style")
    for name, value in medians.items():
        print(f"  {name:25s} {value:11,.0f}  {ratios[name]:6.1f}x")
    return {**medians, "speedup_over_article_style": ratios,
            "trials": per_trial, "epochs": per_epoch,
            "steps_per_epoch": args.steps, "timed_epochs_per_trial": args.epochs,
            "batch_size": batch, "shuffle_size": config.SHUFFLE_SIZE,
            "tfrecord_dir": args.tfrecord_dir or "a temporary folder, deleted",
            "data": source.reason, "tfrecord_data": records.reason,
            "command": command,
            "machine": machine_info(), "load_average_1min": {"start": load[0], "end": load[-1]},
            "tensorflow_version": tf.__version__}


def build_parser():
    """The flags of benchmark_pipeline.py."""
    parser = OneLineParser(description=__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", default=None,
                        help="tfds data dir with MNIST prepared (with --floor: default, "
                             "the 5,000-digit sample, as train_cpu.py offline)")
    parser.add_argument("--trials", type=cli.integer(1), default=None,
                        help="trials per pipeline (default 2, with --input-only 3)")
    parser.add_argument("--steps", type=cli.integer(1), default=FULL_EPOCH_STEPS,
                        help="batches per timed epoch (default %(default)s: "
                             f"{config.TRAIN_IMAGES:,} images in batches of "
                             f"{config.BATCH_SIZE})")
    parser.add_argument("--input-only", action="store_true",
                        help="time the input pipelines alone, no model: article-style, "
                             "TFRecords and in-memory")
    parser.add_argument("--epochs", type=cli.integer(1), default=None,
                        help="with --input-only: timed epochs per trial, after one "
                             "untimed (default 2)")
    parser.add_argument("--tfrecord-dir", default=None,
                        help="with --input-only: a folder write_tfrecords.py wrote from "
                             "--data-dir (default: write one into a temporary folder)")
    parser.add_argument("--profile-dir", default=None,
                        help="training benchmark only: a profiler trace of "
                             f"{PROFILED_STEPS} steps of each set-up's first trial into "
                             "DIR/<set-up>; `tensorboard --logdir DIR`, Profile tab")
    parser.add_argument("--floor", action="store_true",
                        help="train_cpu.py's epoch (with validation) against the same "
                             "steps on one batch in memory, without validation")
    parser.add_argument("--json", default=None, help="write the figures to this file")
    return parser


def parse_args(argv):
    """The flags, checked together, with the defaults that depend on the mode filled in."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.floor and (args.input_only or args.profile_dir):
        parser.error("--floor goes alone, without --input-only or --profile-dir")
    if args.data_dir is None and not args.floor:
        parser.error("--data-dir is needed, except with --floor")
    if not args.input_only and (args.epochs or args.tfrecord_dir):
        parser.error("--epochs and --tfrecord-dir go with --input-only")
    if args.input_only and args.profile_dir:
        parser.error("--profile-dir goes with the training benchmark, not --input-only")
    args.epochs = args.epochs or 2
    if args.trials is None:
        args.trials = 3 if args.input_only else 2
    return args


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    if args.json:
        files.check_output_file(args.json)
    if args.profile_dir:
        files.check_output_dir(args.profile_dir)  # a file there is one line, not a traceback

    from pyimagesearch import sources, strategies
    from pyimagesearch.plan import steps_per_execution

    strategies.cpu_only()  # the benchmark runs on the CPU
    if args.data_dir is None:
        source = sources.SampleSource("the 5,000-digit sample, as train_cpu.py offline")
    else:
        source = sources.resolve_source("tfds", config.DATA_NAME, args.data_dir)
    print(f"[INFO] data: {source.reason}")
    if args.floor or args.input_only:
        mode = floor if args.floor else input_only
        figures = mode(args, source, ["tools/benchmark_pipeline.py", *argv])
        if args.json:
            files.write_json(args.json, figures)
        return
    steps, batch = args.steps, config.BATCH_SIZE
    spe = steps_per_execution(steps)

    setups = {"article-style": (lambda: article_style_pipeline(source.data_dir, batch), 1),
              "efficient pipeline": (lambda: efficient_pipeline(source, batch), 1),
              "train_cpu.py": (lambda: efficient_pipeline(source, batch), spe)}

    def timed(name, pipeline, execution):  # a profile of each set-up's first trial
        profile = args.profile_dir and os.path.join(args.profile_dir, name.replace(" ", "_"))
        return lambda trial: time_epoch(pipeline(), steps, execution, None if trial else profile)

    seconds, medians = take_turns({name: timed(name, *setup) for name, setup in setups.items()},
                                  args.trials)
    baseline = medians["article-style"]
    ratios = {name: baseline / value for name, value in medians.items()}
    print(f"\nepoch of {steps} steps x {config.BATCH_SIZE} images, median of "
          f"{args.trials} trials; speed-up over article-style")
    for name, value in medians.items():
        print(f"  {name:18s} {value:6.2f} s  {ratios[name]:.2f}x")
    if args.json:
        files.write_json(args.json, {"seconds": seconds, "median_seconds": medians,
                                     "speedup_over_article_style": ratios, "steps": steps,
                                     "trials": args.trials, "steps_per_execution": spe,
                                     "batch_size": config.BATCH_SIZE, "data": source.reason})


if __name__ == "__main__":
    exits.run_main(main)
