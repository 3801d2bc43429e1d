"""What mixed precision and XLA give on this machine: epochs timed in one process.

    python tools/benchmark_levers.py                       # CPU: float32, bfloat16, XLA
    python tools/benchmark_levers.py --device gpu --batch-size 1024 --json gpu_1024.json

Each set-up trains the article's autoencoder on the same data, batch and
optimizer with train_cpu.py's pipeline (benchmark_pipeline.time_epoch), taking
turns over `--trials` rounds; a trial is two epochs and keeps the second (the
first includes tracing and XLA compilation). Reported: the median seconds of an epoch of
`--steps` steps and the speed-up over float32 in the same process.

- float32: the article's set-up;
- mixed_bfloat16, mixed_float16: Keras mixed-precision policies (float16
  with loss scaling, as `--precision mixed_float16` trains);
- xla: float32 with `jit_compile=True`.

On a CPU, mixed_float16 runs through slow emulation on most machines and is
left out unless asked for with --setups.
"""
import argparse
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # the repository's root
from pyimagesearch import host  # noqa: E402
host.prepare_tensorflow()  # Keras on TensorFlow (KERAS_BACKEND set aside in one line)

from pyimagesearch import cli, config, exits, files  # noqa: E402
from pyimagesearch.errors import OneLineParser  # noqa: E402

SETUPS = {"float32": ("float32", False), "mixed_bfloat16": ("mixed_bfloat16", False),
          "mixed_float16": ("mixed_float16", False), "xla": ("float32", True)}
DEFAULT_SETUPS = {"cpu": ("float32", "mixed_bfloat16", "xla"),
                  "gpu": ("float32", "mixed_float16", "xla")}


def build_parser():
    """The flags of benchmark_levers.py."""
    parser = OneLineParser(description=__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=("cpu", "gpu"), default="cpu")
    parser.add_argument("--setups", nargs="+", choices=tuple(SETUPS), default=None,
                        help="set-ups to time (default: float32, the 16-bit type the "
                             "device is made for, xla)")
    parser.add_argument("--batch-size", type=cli.integer(1, config.TRAIN_IMAGES),
                        default=config.BATCH_SIZE,
                        help=f"batch, at most MNIST's {config.TRAIN_IMAGES:,} training "
                             "images (default %(default)s)")
    parser.add_argument("--steps", type=cli.integer(1, cli.MAX_STEPS),
                        default=None,
                        help="steps per epoch (default: 60,000 images / batch)")
    parser.add_argument("--trials", type=cli.integer(1), default=3,
                        help="rounds over the set-ups (default %(default)s)")
    parser.add_argument("--data-source", choices=("sample", "tfds"), default="sample",
                        help="the digits (default %(default)s: works offline)")
    parser.add_argument("--json", default=None, help="also write the figures here")
    return parser


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser().parse_args(argv)
    if args.json:
        files.check_output_file(args.json)
    setups = args.setups or DEFAULT_SETUPS[args.device]
    steps = args.steps or config.TRAIN_IMAGES // args.batch_size

    import tensorflow as tf
    from benchmark_pipeline import efficient_pipeline, take_turns, time_epoch  # siblings
    from pyimagesearch import sources, strategies
    from pyimagesearch.outputs import machine_info
    from pyimagesearch.plan import steps_per_execution

    if args.device == "gpu":  # every visible GPU, as train_gpu.py; none is one line
        strategies.check_gpus()
        chosen = tf.distribute.MirroredStrategy()
    else:  # train_cpu.py's: TensorFlow's default strategy, any GPU hidden
        strategies.cpu_only()
        chosen = tf.distribute.get_strategy()
    source = sources.resolve_source(args.data_source, config.DATA_NAME)
    dataset = efficient_pipeline(source, args.batch_size)
    def timed(precision, jit_compile):
        return lambda trial: time_epoch(dataset, steps, steps_per_execution(steps),
                                        precision=precision, jit_compile=jit_compile,
                                        strategy=chosen)

    seconds, medians = take_turns({name: timed(*SETUPS[name]) for name in setups},
                                  args.trials, width=15)
    baseline = medians.get("float32")
    print(f"\nepoch of {steps} steps x {args.batch_size} images on {args.device}, "
          f"median of {args.trials} trials" + ("; speed-up over float32" if baseline else ""))
    for name, value in medians.items():
        ratio = f"  {baseline / value:.2f}x" if baseline else ""
        print(f"  {name:15s} {value:6.2f} s{ratio}")
    if args.json:
        files.write_json(args.json, {
            "device": args.device, "batch_size": args.batch_size, "steps": steps,
            "seconds": seconds, "median_seconds": medians,
            "speedup_over_float32": {name: baseline / value for name, value
                                     in medians.items()} if baseline else None,
            "tensorflow_version": tf.__version__, "machine": machine_info(),
            "command": ["tools/benchmark_levers.py", *argv]})


if __name__ == "__main__":
    exits.run_main(main)
