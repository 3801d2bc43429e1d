"""The article's hardware test, timed properly: one batched matrix multiply-add.

    python matmul_benchmark.py                         # CPU, float32
    python matmul_benchmark.py --device gpu --dtype float16
    python matmul_benchmark.py --device tpu            # all TPU cores
    python matmul_benchmark.py --device tpu --rehearse 8 --repeats 3
    python matmul_benchmark.py --json outputs/matmul_cpu.json

The operation is the article's: w (1024, 512, 16) @ x (1024, 16, 512) + b
(1024, 512, 512). The matmul is 2 x 1024 x 512 x 512 x 16 = 8.59 GFLOP (the
add's 0.27 GFLOP is not counted: it is bound by memory, not arithmetic) and
the result is 1 GiB of float32 written per run.

The article starts a timer, issues the op and stops the timer: on a GPU or
TPU that measures only the *launch*, because the device runs asynchronously,
and the first call also pays for set-up. Here the op is compiled once, run a
few times to warm up, then timed over many repetitions, each waiting for the
device to finish (`tf.test.experimental.sync_devices()`, or fetching a value)
before the clock stops. The naive single timing is shown beside it.
"""
import argparse
import json
import os
import re
import statistics
import sys
import time

from pyimagesearch import cli
from pyimagesearch.errors import UserError

SHAPES = {"w": (1024, 512, 16), "x": (1024, 16, 512), "b": (1024, 512, 512)}
# peak dense throughput in TFLOP/s of devices whose name we can recognise;
# sources: the vendors' data sheets (GPU: without sparsity)
PEAK_TFLOPS = {
    ("T4", "float32"): 8.1, ("T4", "float16"): 65.0,
    ("V100", "float32"): 15.7, ("V100", "float16"): 125.0,
    ("A100", "float32"): 19.5, ("A100", "float16"): 312.0, ("A100", "bfloat16"): 312.0,
    ("L4", "float32"): 30.3, ("L4", "float16"): 121.0, ("L4", "bfloat16"): 121.0,
    ("H100", "float32"): 67.0, ("H100", "float16"): 989.0, ("H100", "bfloat16"): 989.0,
    ("H200", "float32"): 67.0, ("H200", "float16"): 989.0, ("H200", "bfloat16"): 989.0,
}


def matmul_flops(w_shape=None, x_shape=None):
    """FLOPs of a batched matmul (B, M, K) @ (B, K, N): a multiply and an add per term."""
    w_shape, x_shape = w_shape or SHAPES["w"], x_shape or SHAPES["x"]
    batch, m, k = w_shape
    batch_x, k_x, n = x_shape
    if (batch, k) != (batch_x, k_x):
        raise ValueError(f"shapes {w_shape} and {x_shape} do not multiply")
    return 2 * batch * m * n * k


def summarize(seconds, warmup):
    """Statistics of the timed runs, the first `warmup` of them left out."""
    timed = list(seconds[warmup:])
    if not timed:
        raise ValueError("no timed repetitions left after the warm-up")
    ordered = sorted(timed)
    quartile = max(1, len(ordered) // 4)
    return {"median": statistics.median(timed), "min": ordered[0], "max": ordered[-1],
            "q1": ordered[quartile - 1] if len(ordered) >= 4 else ordered[0],
            "q3": ordered[-quartile] if len(ordered) >= 4 else ordered[-1],
            "repetitions": len(timed), "warmup": warmup}


def _cpuinfo():
    """/proc/cpuinfo as {field: [value per processor]}; empty where there is none."""
    fields = {}
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                key, sep, value = line.partition(":")
                if sep:
                    fields.setdefault(key.strip(), []).append(value.strip())
    except OSError:
        pass
    return fields


def cpu_peak_tflops():
    """A rough float32 peak of this CPU: cores x clock x FLOPs/cycle, or None.

    FLOPs per cycle per core assume two fused multiply-add units: 64 with
    AVX-512, 32 with AVX2. Clock is the nominal one in /proc/cpuinfo; turbo
    can exceed it, so treat this as an estimate, not a bound.
    """
    info = _cpuinfo()
    mhz = [float(value) for value in info.get("cpu MHz", [])]
    flags = " " + " ".join(info.get("flags", []))
    per_cycle = 64 if " avx512f" in flags else 32 if " avx2" in flags else 8
    if not mhz:
        return None
    return (os.cpu_count() or 1) * max(mhz) * 1e6 * per_cycle / 1e12


def _sync():
    """Block until every device has finished its queued work."""
    import tensorflow as tf

    sync = getattr(getattr(tf.test, "experimental", None), "sync_devices", None)
    if sync is not None:
        sync()


def _device_name(device):
    """The accelerator's name as TensorFlow reports it, for the peak lookup."""
    import tensorflow as tf

    if device == "gpu":
        details = tf.config.experimental.get_device_details(
            tf.config.list_physical_devices("GPU")[0])
        return details.get("device_name", "GPU")
    if device == "tpu":
        return "TPU"
    import platform

    models = _cpuinfo().get("model name")
    if models:
        return f"{models[0]} ({os.cpu_count()} cores)"
    return platform.processor() or platform.machine()


def run_benchmark(device="cpu", dtype="float32", repeats=20, warmup=3, rehearse=None,
                  tpu=None):
    """Time the article's op; return a dict of figures."""
    import numpy as np
    import tensorflow as tf

    from pyimagesearch import strategy as strategies

    if dtype == "float16" and (device != "gpu" or rehearse):
        raise UserError("--dtype float16 is for GPUs; use bfloat16 on CPU and TPU")
    strategy = strategies.get_strategy(device, rehearse=rehearse, tpu=tpu)
    tf_dtype = tf.as_dtype(dtype)
    replicas = strategy.num_replicas_in_sync
    if SHAPES["w"][0] % replicas:
        raise UserError(f"the batch of {SHAPES['w'][0]} does not split over "
                        f"{replicas} replicas")

    with strategy.scope():
        def make(name, seed):
            # each replica holds its slice of the 1024 batch
            shape = (SHAPES[name][0] // replicas,) + SHAPES[name][1:]
            return strategy.run(lambda: tf.cast(
                tf.random.stateless_normal(shape, seed=[seed, 0]), tf_dtype))
        w, x, b = make("w", 1), make("x", 2), make("b", 3)

    # the article's way: one eager call, clock stopped without waiting
    start = time.perf_counter()
    output = strategy.run(lambda w, x, b: tf.matmul(w, x) + b, args=(w, x, b))
    naive = time.perf_counter() - start
    del output
    _sync()

    @tf.function
    def step(w, x, b):
        result = strategy.run(lambda w, x, b: tf.matmul(w, x) + b, args=(w, x, b))
        # touch one value per replica so the work cannot be skipped
        return strategy.run(lambda r: r[0, 0, 0], args=(result,))

    seconds = []
    for _ in range(warmup + repeats):
        start = time.perf_counter()
        last = step(w, x, b)
        _sync()
        strategy.experimental_local_results(last)[0].numpy()  # waits for the value
        seconds.append(time.perf_counter() - start)

    stats = summarize(seconds, warmup)
    flops = matmul_flops()
    out_bytes = int(np.prod(SHAPES["b"])) * tf_dtype.size
    name = _device_name(device) if not rehearse else f"{rehearse} logical CPU devices"
    peak = None
    if device == "cpu" or rehearse:
        peak = cpu_peak_tflops() if dtype == "float32" else None
    else:
        # whole words only: "L4" must not match an "L40S"
        peak = next((value for (key, kind), value in PEAK_TFLOPS.items()
                     if re.search(rf"\b{key}\b", name) and kind == dtype), None)
    return {
        "device": device, "device_name": name, "rehearsal": bool(rehearse),
        "replicas": replicas, "dtype": dtype, "flops": flops, "output_bytes": out_bytes,
        "naive_seconds": naive, "seconds": stats,
        "tflops": flops / stats["median"] / 1e12,
        "output_gb_per_second": out_bytes / stats["median"] / 1e9,
        "naive_tflops": flops / naive / 1e12,
        "peak_tflops": peak, "tensorflow_version": tf.__version__,
    }


def report(result):
    """Human-readable lines for a result dict."""
    s = result["seconds"]
    peak = result["peak_tflops"]
    lines = [
        f"device: {result['device_name']} ({result['replicas']} replica(s)), "
        f"{result['dtype']}, TensorFlow {result['tensorflow_version']}",
        f"naive (article's way: first call, no wait): {result['naive_seconds']:.6f} s"
        f"  -> would be {result['naive_tflops']:.3g} TFLOP/s",
        f"measured: median {s['median']:.6f} s over {s['repetitions']} runs "
        f"(min {s['min']:.6f}, q1 {s['q1']:.6f}, q3 {s['q3']:.6f}, max {s['max']:.6f}; "
        f"{s['warmup']} warm-up runs left out)",
        f"          {result['tflops']:.3f} TFLOP/s, "
        f"{result['output_gb_per_second']:.1f} GB/s of output written"
        + (f"; peak {'~' if result['device'] == 'cpu' or result['rehearsal'] else ''}"
           f"{peak:.2f} TFLOP/s ({100 * result['tflops'] / peak:.0f}% of it)" if peak else ""),
    ]
    return "\n".join(lines)


def main(argv=None):
    parser = cli.OneLineParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=("cpu", "gpu", "tpu"), default="cpu")
    parser.add_argument("--dtype", choices=("float32", "bfloat16", "float16"),
                        default="float32")
    parser.add_argument("--repeats", type=cli.positive_int, default=20,
                        help="timed repetitions (default %(default)s)")
    parser.add_argument("--warmup", type=cli.non_negative_int, default=3,
                        help="untimed runs first (default %(default)s)")
    parser.add_argument("--rehearse", type=cli.positive_int, default=None, metavar="N",
                        help="run the --device gpu/tpu code path on N logical CPUs")
    parser.add_argument("--tpu", default=None, help="TPU name or address")
    parser.add_argument("--json", default=None, help="also write the figures here")
    args = parser.parse_args(argv)
    if args.json:
        cli.check_output_file(args.json)  # before the run, not after it
    result = run_benchmark(args.device, args.dtype, args.repeats, args.warmup,
                           args.rehearse, args.tpu)
    print(report(result))
    if args.json:
        try:
            with open(args.json, "w") as handle:
                json.dump(result, handle, indent=2)
        except OSError as error:
            raise UserError(f"cannot write {args.json}: {error.strerror}") from error


if __name__ == "__main__":
    cli.run_main(main, sys.argv[1:])
