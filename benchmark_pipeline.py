"""How much the input pipeline matters: train_cpu.py's pipeline against an article-style one.

    python prepare_mnist.py --data-dir /tmp/tfds --stand-in   # once, if no MNIST
    python benchmark_pipeline.py --data-dir /tmp/tfds
    python benchmark_pipeline.py --data-dir /tmp/tfds --steps 50 --trials 1   # a quick look

Both pipelines read the same prepared tfds MNIST and feed the same model,
loss, optimizer and batch (128) on the CPU, in this one process, taking turns.

- ``efficient`` is ``pyimagesearch.data.get_data`` as train_cpu.py uses it:
  decode every PNG once, keep uint8 images in memory, shuffle, batch, convert
  a whole batch at once, prefetch.
- ``article-style`` is how a tfds pipeline is usually written: ``tfds.load``,
  then a per-image ``map`` to float, shuffle and batch every epoch; no cache,
  so every epoch decodes all 60,000 PNGs again, and no prefetch.

A third set-up, ``train_cpu.py``, is the efficient pipeline with the
training script's other speed-up, several steps per call into the compiled
train function (``steps_per_execution``). Each trial trains two epochs of
468 steps (``--steps``) and keeps the second (the first includes tracing).
Speed-ups are article-style seconds over each set-up's, medians over the
trials; `--json` writes all the figures.
"""
import argparse
import json
import statistics
import sys

from pyimagesearch import cli, config

# one pass over MNIST's training split; both pipelines repeat, so any count works
FULL_EPOCH_STEPS = config.TRAIN_IMAGES // config.BATCH_SIZE


def article_style_pipeline(data_dir, batch_size):
    """tfds.load + per-image map + shuffle + batch, re-read every epoch."""
    import tensorflow as tf
    import tensorflow_datasets as tfds

    dataset = tfds.load(config.DATA_NAME, split=config.TRAIN_FLAG, data_dir=data_dir,
                        try_gcs=True, as_supervised=True)

    def to_pair(image, label):
        image = tf.cast(image, tf.float32) / 255.0
        return image, image

    dataset = dataset.map(to_pair).shuffle(config.SHUFFLE_SIZE)
    return dataset.batch(batch_size, drop_remainder=True).repeat()


def efficient_pipeline(data_dir, batch_size):
    """train_cpu.py's pipeline."""
    from pyimagesearch.data import get_data

    return get_data(config.DATA_NAME, config.TRAIN_FLAG, batchSize=batch_size,
                    shuffleSize=config.SHUFFLE_SIZE, source="tfds", data_dir=data_dir,
                    repeat=True, drop_remainder=True, seed=config.SEED)


def time_epoch(dataset, steps, steps_per_execution=1):
    """Seconds of the second of two training epochs on `dataset`."""
    from pyimagesearch.autoencoder import AutoEncoder
    from pyimagesearch.loss import MSELoss
    from pyimagesearch.train import EpochTimer, make_optimizer

    model = AutoEncoder()
    model.compile(loss=MSELoss(scale=1),
                  optimizer=make_optimizer(config.OPTIMIZER, config.LEARNING_RATE),
                  steps_per_execution=steps_per_execution)
    timer = EpochTimer()
    model.fit(dataset, epochs=2, steps_per_epoch=steps, callbacks=[timer],
              shuffle=False, verbose=0)
    return timer.train_seconds[1]


def main(argv=None):
    parser = cli.OneLineParser(description=__doc__,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", required=True,
                        help="tfds data dir with MNIST prepared")
    parser.add_argument("--trials", type=cli.positive_int, default=2,
                        help="trials per pipeline (default %(default)s)")
    parser.add_argument("--steps", type=cli.positive_int, default=FULL_EPOCH_STEPS,
                        help="training steps per timed epoch (default %(default)s: "
                             f"{config.TRAIN_IMAGES:,} images in batches of "
                             f"{config.BATCH_SIZE})")
    parser.add_argument("--json", default=None, help="write the figures to this file")
    args = parser.parse_args(argv)
    if args.json:
        cli.check_output_file(args.json)

    from pyimagesearch import data, strategy
    from pyimagesearch.train import steps_per_execution

    strategy.cpu_strategy()
    source = data.resolve_source("tfds", config.DATA_NAME, data.resolve_data_dir(args.data_dir))
    print(f"[INFO] data: {source.reason}")
    steps = args.steps
    spe = steps_per_execution(steps)
    # name -> (pipeline, steps per execution)
    setups = {"article-style": (article_style_pipeline, 1),
              "efficient pipeline": (efficient_pipeline, 1),
              "train_cpu.py": (efficient_pipeline, spe)}
    seconds = {name: [] for name in setups}
    for trial in range(args.trials):
        for name, (build, execution) in setups.items():
            dataset = build(args.data_dir, config.BATCH_SIZE)
            seconds[name].append(time_epoch(dataset, steps, execution))
            print(f"[INFO] trial {trial + 1}: {name:18s} {seconds[name][-1]:6.2f} s/epoch")
    medians = {name: statistics.median(values) for name, values in seconds.items()}
    baseline = medians["article-style"]
    ratios = {name: baseline / value for name, value in medians.items()}
    print(f"\nepoch of {steps} steps x {config.BATCH_SIZE} images, median of "
          f"{args.trials} trials; speed-up over article-style")
    for name, value in medians.items():
        print(f"  {name:18s} {value:6.2f} s  {ratios[name]:.2f}x")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"seconds": seconds, "median_seconds": medians,
                       "speedup_over_article_style": ratios, "steps": steps,
                       "trials": args.trials, "steps_per_execution": spe,
                       "batch_size": config.BATCH_SIZE, "data": source.reason},
                      handle, indent=2)


if __name__ == "__main__":
    cli.run_main(main, sys.argv[1:])
