"""The article's hardware test, timed properly: one batched matrix multiply-add.

    python tools/matmul_benchmark.py                         # CPU, float32
    python tools/matmul_benchmark.py --device gpu --dtype float16
    python tools/matmul_benchmark.py --device tpu            # all TPU cores
    python tools/matmul_benchmark.py --device tpu --rehearse 8 --repeats 3
    python tools/matmul_benchmark.py --json outputs/matmul_cpu.json
    KERAS_BACKEND=jax python tools/matmul_benchmark.py        # timed by JAX, on the CPU
    KERAS_BACKEND=jax python tools/matmul_benchmark.py --device tpu --rehearse 8

The operation is the article's: w (1024, 512, 16) @ x (1024, 16, 512) + b
(1024, 512, 512), a matmul of 2 x 1024 x 512 x 512 x 16 = 8.59 GFLOP (the add's
0.27 not counted). In float32 it reads w, x (32 MiB each) and b (1 GiB) and
writes 1 GiB: under 4 FLOP per byte, bound by memory bandwidth on every CPU, GPU
and TPU. Both rates are reported: FLOP/s against the devices' arithmetic peak,
bytes per second against their memory bandwidth where it is known.

The article starts a timer, issues the op and stops the timer: on a GPU or
TPU that times only the *launch* (the device runs asynchronously), and the
first call also pays for set-up. Here the op is compiled, warmed up, then
timed over many repetitions, each until the devices are done; the naive
single timing is shown beside it.

Who times it is chosen as train_tpu.py chooses its route (tpu.choose_route):
TensorFlow, the article's, unless KERAS_BACKEND=jax asks for JAX, or --device
tpu finds a TPU with jax and no tensorflow-tpu (Colab's and Kaggle's TPUs,
where TensorFlow cannot reach the chips). JAX runs `jax.numpy.matmul(w, x) + b`,
compiled ahead of the clock, its batch split over the devices of train_tpu.py's
DataParallel (a TPU's, or N JAX CPU devices for --rehearse N), each call timed
until `block_until_ready()` returns. The record's "framework" says which one timed it.

Every peak printed is an upper bound, summed over all the devices the run
used (a MirroredStrategy over 4 GPUs or 8 TPU cores splits the batch over
all of them): GPU figures are data-sheet maxima at boost clock; the CPU
figure is cores x clock x the most float32 FLOPs a core can issue per cycle
(see `cpu_peak`). A fraction of such a peak is what the op reached at best.
"""
import argparse
import math
import os
import pathlib
import re
import statistics
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # the repository's root
from pyimagesearch import host as hosts, tpu  # noqa: E402


def choose_framework(argv, environ=None, host=None):
    """"jax" or "tensorflow": who times the op, chosen before either is imported.

    As train_tpu.py chooses its route (tpu.choose_route): KERAS_BACKEND=jax
    asks for JAX on any --device; unset, --device tpu on a TPU with jax and no
    tensorflow-tpu (Colab's and Kaggle's images) takes JAX too. Anything else
    is TensorFlow's: another KERAS_BACKEND is set aside in one line. A TPU, or
    JAX, gets train_tpu.py's set-up (tpu.prepare: the TPU's runtime, N JAX CPU
    devices for --rehearse N). `environ`, `host`: stand-ins for tests.
    """
    environ = os.environ if environ is None else environ
    host = hosts.detect() if host is None else host
    early = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    early.add_argument("--device")
    device = early.parse_known_args(argv)[0].device
    asked = environ.get("KERAS_BACKEND")
    if asked != "jax" and not (asked is None and device == "tpu"
                               and tpu.choose_route({}, host) == "jax"):
        hosts.prepare_tensorflow(environ)
        if device == "tpu":
            tpu.prepare(argv, environ, host)
        return "tensorflow"
    environ["KERAS_BACKEND"] = "jax"
    if device != "tpu":  # the CPU only: JAX then starts no TPU or GPU runtime
        environ.setdefault("JAX_PLATFORMS", "cpu")
    tpu.prepare(argv, environ, host)
    return "jax"


if __name__ == "__main__":
    FRAMEWORK = choose_framework(sys.argv[1:])
else:  # imported (the tests): TensorFlow's, as every other tool
    hosts.prepare_tensorflow()
    FRAMEWORK = "tensorflow"

from pyimagesearch import cli, exits, files  # noqa: E402
from pyimagesearch.errors import OneLineParser, UserError  # noqa: E402
from pyimagesearch.outputs import machine_info  # noqa: E402

SHAPES = {"w": (1024, 512, 16), "x": (1024, 16, 512), "b": (1024, 512, 512)}
# Peak dense TFLOP/s of one GPU (no sparsity), keyed by the chip's name in
# what TensorFlow reports. Source: NVIDIA's data sheets, SXM boards where
# there are several (V100, A100, H100, H200); PCIe and NVL boards of the same
# chip are slower, so for them these are still upper bounds. "tf32" is the
# tensor-core rate TensorFlow uses for float32 matmuls on Ampere and later
# while TF32 is enabled (its default); T4 and V100 have no TF32 and no
# bfloat16, so those have no entry.
PEAK_TFLOPS = {
    ("T4", "float32"): 8.1, ("T4", "float16"): 65.0,
    ("V100", "float32"): 15.7, ("V100", "float16"): 125.0,
    ("A100", "float32"): 19.5, ("A100", "tf32"): 156.0,
    ("A100", "float16"): 312.0, ("A100", "bfloat16"): 312.0,
    ("L4", "float32"): 30.3, ("L4", "tf32"): 60.0,  # the sheet's 120 is with sparsity
    ("L4", "float16"): 121.0, ("L4", "bfloat16"): 121.0,
    ("H100", "float32"): 67.0, ("H100", "tf32"): 494.7,
    ("H100", "float16"): 989.0, ("H100", "bfloat16"): 989.0,
    ("H200", "float32"): 67.0, ("H200", "tf32"): 494.7,
    ("H200", "float16"): 989.0, ("H200", "bfloat16"): 989.0,
}
# Memory bandwidth in GB/s of one GPU, first matching pattern wins. Source:
# NVIDIA's data sheets; variants differ (A100 40 GB and 80 GB, V100S, H100
# PCIe / SXM / NVL), so the patterns name the variant where it changes the
# figure and otherwise take the fastest board, keeping the fraction a lower
# bound. Whole words only: "L4" must not match an "L40S", "V100" not a "V100S".
MEMORY_GB_PER_SECOND = (
    (r"\bT4\b", 320.0), (r"\bV100\b", 900.0),
    (r"\bA100\b.*\b80GB\b", 2039.0), (r"\bA100\b", 1555.0),
    (r"\bL4\b", 300.0),
    (r"\bH100 NVL\b", 3938.0), (r"\bH100\b", 3350.0), (r"\bH200\b", 4800.0),
)


def matmul_flops(w_shape=None, x_shape=None):
    """FLOPs of a batched matmul (B, M, K) @ (B, K, N): a multiply and an add per term."""
    w_shape, x_shape = w_shape or SHAPES["w"], x_shape or SHAPES["x"]
    batch, m, k = w_shape
    batch_x, k_x, n = x_shape
    if (batch, k) != (batch_x, k_x):
        raise ValueError(f"shapes {w_shape} and {x_shape} do not multiply")
    return 2 * batch * m * n * k


def bytes_moved(item_size, shapes=None):
    """Bytes w @ x + b must move at least: w, x and b read once, the result written once.

    An unfused matmul then add also writes and rereads the 1 GiB product, so
    the real traffic can be larger; this count keeps the GB/s a lower bound.
    """
    shapes = shapes or SHAPES
    (batch, m, _), (_, _, n) = shapes["w"], shapes["x"]
    elements = (math.prod(shapes["w"]) + math.prod(shapes["x"])
                + math.prod(shapes["b"]) + batch * m * n)
    return elements * item_size


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


def cpuinfo(text=None):
    """/proc/cpuinfo (or `text` in its format) as one {field: value} dict per processor."""
    if text is None:
        try:
            with open("/proc/cpuinfo") as handle:
                text = handle.read()
        except OSError:
            return []
    processors = []
    for block in text.split("\n\n"):
        fields = {}
        for line in block.splitlines():
            key, sep, value = line.partition(":")
            if sep:
                fields[key.strip()] = value.strip()
        if fields:
            processors.append(fields)
    return processors


def usable_cpus():
    """The CPU numbers this process may run on (its affinity), not all the machine has."""
    if hasattr(os, "sched_getaffinity"):  # Linux; containers and taskset narrow it
        return set(os.sched_getaffinity(0))
    return set(range(os.cpu_count() or 1))


def flops_per_cycle(processor):
    """Most float32 FLOPs one core can issue per cycle: FMA lanes x 2 x FMA units.

    Two FMA units of 16 float32 lanes give 64 with AVX-512 on Intel (parts
    with one 512-bit unit reach 32) and on AMD Zen 5 (family 26; its laptop
    parts split AVX-512 in two, 32). Zen 4 (family 25) runs AVX-512 on
    256-bit units: 32, as two AVX2 FMA units do. Older cores are lower, so
    every value is an upper bound.
    """
    flags = set(processor.get("flags", "").split())
    family = processor.get("cpu family", "")
    if "avx512f" in flags:
        zen4_or_older = (processor.get("vendor_id") == "AuthenticAMD"
                         and family.isdigit() and int(family) < 26)
        return 32 if zen4_or_older else 64
    if "avx2" in flags or "fma" in flags:
        return 32
    return 16 if "avx" in flags else 8


def _cpufreq_max_mhz(cpus):
    """The highest maximum clock the kernel's cpufreq gives for `cpus`, or None (VMs)."""
    clocks = []
    for cpu in cpus:
        try:
            with open(f"/sys/devices/system/cpu/cpu{cpu}/cpufreq/cpuinfo_max_freq") as handle:
                clocks.append(int(handle.read()) / 1000)  # kHz
        except (OSError, ValueError):
            pass
    return max(clocks, default=None)


def cpu_peak(processors=None, cpus=None, max_mhz=None):
    """An upper bound on this process's float32 FLOP/s: cores x clock x FLOPs/cycle.

    Cores are the physical cores behind the CPUs this process may use: SMT
    siblings (more "siblings" than "cpu cores" in /proc/cpuinfo) share one
    core's FMA units, so two vCPUs on one core count once. A hypervisor can
    hide that the vCPUs are siblings on the host, which only makes the bound
    looser. The clock is cpufreq's maximum where the kernel gives it (pass
    `max_mhz` to fix it); otherwise /proc/cpuinfo's "cpu MHz", and then a
    boost clock the machine does not show could exceed it. Returns a dict of
    the figures, or None where /proc/cpuinfo says too little.
    """
    processors = cpuinfo() if processors is None else processors
    cpus = usable_cpus() if cpus is None else set(cpus)
    mine = [p for p in processors if p.get("processor", "").isdigit()
            and int(p["processor"]) in cpus]
    mhz = [float(p["cpu MHz"]) for p in mine if p.get("cpu MHz")]
    if not mine or not (mhz or max_mhz):
        return None
    first = mine[0]
    siblings, per_package = first.get("siblings", ""), first.get("cpu cores", "")
    smt = siblings.isdigit() and per_package.isdigit() and int(siblings) > int(per_package)
    cores = (len({(p.get("physical id"), p.get("core id")) for p in mine}) if smt
             else len(mine))
    clock_source = "as given"
    if max_mhz is None:
        max_mhz, clock_source = _cpufreq_max_mhz(sorted(cpus)), "cpufreq maximum"
    if max_mhz is None:
        max_mhz = max(mhz)
        clock_source = "/proc/cpuinfo's clock; a boost it does not show would raise this"
    per_cycle = flops_per_cycle(first)
    return {"tflops": cores * max_mhz * 1e6 * per_cycle / 1e12, "cores": cores,
            "cpus": len(mine), "ghz": max_mhz / 1000, "flops_per_cycle": per_cycle,
            "basis": f"{cores} core(s) x {max_mhz / 1000:.2f} GHz ({clock_source}) x "
                     f"{per_cycle} float32 FLOP/cycle"}


def gpu_peaks(name, dtype, devices, tf32_enabled):
    """Upper bounds for `devices` GPUs called `name`: TFLOP/s and memory GB/s, both summed.

    A float32 matmul on a chip with a "tf32" entry runs on TF32 tensor cores
    while `tf.config.experimental.tensor_float_32_execution_enabled()`, so
    that is its peak then; a plain-FP32 peak would let the fraction pass 100%.
    """
    chip = next((key for key, _ in PEAK_TFLOPS if re.search(rf"\b{key}\b", name)), None)
    kind = "tf32" if (dtype == "float32" and tf32_enabled
                      and (chip, "tf32") in PEAK_TFLOPS) else dtype
    per_device = PEAK_TFLOPS.get((chip, kind))
    bandwidth = next((value for pattern, value in MEMORY_GB_PER_SECOND
                      if re.search(pattern, name)), None)
    return {
        "peak_tflops": per_device * devices if per_device else None,
        "peak_basis": (f"{devices} x {per_device:g} TFLOP/s ({chip} {kind}, dense, "
                       "NVIDIA data sheet)" if per_device
                       else f"no {dtype} peak known for {name}"),
        "memory_gb_per_second": bandwidth * devices if bandwidth else None,
        "memory_basis": (f"{devices} x {bandwidth:g} GB/s (NVIDIA data sheet)"
                         if bandwidth else f"no memory bandwidth known for {name}"),
    }


def cpu_peaks(dtype, rehearsal=0, peak=None):
    """Upper bounds for a run on this CPU, however many logical devices share it."""
    peak = cpu_peak() if peak is None else peak
    note = (f"; the {rehearsal} logical devices share these cores, so not {rehearsal} x"
            if rehearsal else "")
    if dtype != "float32" or peak is None:
        basis = f"no {dtype} peak for this CPU" if peak else "/proc/cpuinfo too sparse"
        figures = {"peak_tflops": None, "peak_basis": basis + note}
    else:
        figures = {"peak_tflops": peak["tflops"], "peak_basis": peak["basis"] + note}
    # nothing in /proc or /sys gives a CPU's memory bandwidth, and a guess
    # from the memory type would be one in name only
    return {**figures, "memory_gb_per_second": None,
            "memory_basis": "not readable from the machine for a CPU"}


def _gpu_names():
    """Each visible GPU's name as TensorFlow reports it, for the peak lookup."""
    import tensorflow as tf

    return [tf.config.experimental.get_device_details(gpu).get("device_name", "GPU")
            for gpu in tf.config.list_physical_devices("GPU")]


def timed_calls(call, count):
    """Seconds of each of `count` calls of `call()`, which returns once the devices are done."""
    seconds = []
    for _ in range(count):
        start = time.perf_counter()
        call()
        seconds.append(time.perf_counter() - start)
    return seconds


def device_name_and_peaks(device, dtype, rehearse, replicas, tf32, cpus):
    """What the op ran on, in words, and its peak figures (None where no table gives them)."""
    if rehearse or device == "cpu":
        name = (f"{rehearse} logical CPU devices on " if rehearse else "") + (
            f"{machine_info()['cpu_model']}, {len(cpus)} CPUs")
        return name, cpu_peaks(dtype, rehearsal=rehearse or 0)
    if device == "gpu":
        names = _gpu_names()
        name = " + ".join(sorted(set(names)))
        return name, gpu_peaks(name, dtype, replicas, tf32) if len(set(names)) == 1 else {
            "peak_tflops": None, "peak_basis": "GPUs of different kinds",
            "memory_gb_per_second": None, "memory_basis": "GPUs of different kinds"}
    return "TPU", {"peak_tflops": None, "peak_basis": "no table of TPU peaks here",
                   "memory_gb_per_second": None, "memory_basis": "no table of TPU peaks here"}


def tf_strategy(device, rehearse=None, name=None):
    """The strategy train_<device>.py builds; N logical CPU devices for --rehearse N."""
    import tensorflow as tf

    from pyimagesearch import strategies

    if rehearse:
        return strategies.rehearsal(rehearse)
    if device == "cpu":
        strategies.cpu_only()
        return tf.distribute.get_strategy()  # train_cpu.py's: TensorFlow's default
    if device == "gpu":
        strategies.check_gpus()
        return tf.distribute.MirroredStrategy()
    found = tpu.find_tpu(name)  # the article's TPUClusterResolver(), found or one line
    with tpu.tpu_errors():
        tf.config.experimental_connect_to_cluster(found)
        tf.tpu.experimental.initialize_tpu_system(found)
    return tf.distribute.TPUStrategy(found)


def run_benchmark(device="cpu", dtype="float32", repeats=20, warmup=3, rehearse=None,
                  tpu_name=None):
    """Time the article's op; return a dict of figures."""
    import tensorflow as tf

    check_request(device, dtype, rehearse)
    strategy = tf_strategy(device, rehearse, tpu_name)
    tf_dtype = tf.as_dtype(dtype)
    replicas = strategy.num_replicas_in_sync
    split_batch(replicas)

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
    tf.test.experimental.sync_devices()

    @tf.function
    def step(w, x, b):
        result = strategy.run(lambda w, x, b: tf.matmul(w, x) + b, args=(w, x, b))
        # touch one value per replica so the work cannot be skipped
        return strategy.run(lambda r: r[0, 0, 0], args=(result,))

    def call():  # the step, then every device done and a value back
        last = step(w, x, b)
        tf.test.experimental.sync_devices()
        return strategy.experimental_local_results(last)[0].numpy()

    seconds = timed_calls(call, warmup + repeats)
    tf32 = tf.config.experimental.tensor_float_32_execution_enabled()
    cpus = usable_cpus()
    name, peaks = device_name_and_peaks(device, dtype, rehearse, replicas, tf32, cpus)
    return {"device": device, "device_name": name, "rehearsal": bool(rehearse),
            "replicas": replicas, "dtype": dtype, "tf32_enabled": tf32,
            **figures(tf_dtype.size, naive, seconds, warmup, cpus), **peaks,
            "framework": "tensorflow", "tensorflow_version": tf.__version__}


def figures(item_size, naive, seconds, warmup, cpus):
    """What both frameworks' runs report: the machine, the counts, the times and rates."""
    stats = summarize(seconds, warmup)
    flops = matmul_flops()
    moved = bytes_moved(item_size)
    batch, m, _ = SHAPES["w"]
    return {
        "cpu_model": machine_info()["cpu_model"], "cpus_usable": len(cpus),
        "flops": flops, "output_bytes": batch * m * SHAPES["x"][2] * item_size,
        "bytes_moved": moved,
        "naive_seconds": naive, "seconds": stats,
        "tflops": flops / stats["median"] / 1e12,
        "gb_per_second": moved / stats["median"] / 1e9,
        "naive_tflops": flops / naive / 1e12,
    }


def check_request(device, dtype, rehearse):
    """The requests neither framework takes: one line (UserError)."""
    if dtype == "float16" and (device != "gpu" or rehearse):
        raise UserError("--dtype float16 is for GPUs; use bfloat16 on CPU and TPU")


def split_batch(replicas):
    """The batch of matrices splits evenly over `replicas`, or one line (UserError)."""
    if SHAPES["w"][0] % replicas:
        raise UserError(f"the batch of {SHAPES['w'][0]} does not split over "
                        f"{replicas} replicas")


def run_jax_benchmark(device="cpu", dtype="float32", repeats=20, warmup=3, rehearse=None):
    """Time the article's op with jax.numpy; return a dict of figures (run_benchmark's)."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec

    from pyimagesearch import strategies

    check_request(device, dtype, rehearse)
    if device == "gpu" and not rehearse:
        raise UserError("--device gpu is timed with TensorFlow here: run with "
                        "KERAS_BACKEND=tensorflow")
    # train_tpu.py's DataParallel: the TPU's devices, N JAX CPU devices, or one for the CPU
    mesh = strategies.data_parallel(rehearse or (1 if device == "cpu" else None)) \
        .device_mesh.backend_mesh
    devices = list(mesh.devices.flat)
    split_batch(len(devices))
    # each device holds its slice of the 1024 batch (TPUStrategy's split, in JAX's terms)
    sharding = NamedSharding(mesh, PartitionSpec(*mesh.axis_names))

    def make(name, seed):  # made on the devices, never whole on the host
        return jax.jit(lambda: jax.random.normal(jax.random.key(seed), SHAPES[name],
                                                 jnp.dtype(dtype)), out_shardings=sharding)()
    w, x, b = make("w", 1), make("x", 2), make("b", 3)

    # the article's way: one eager call, clock stopped without waiting
    start = time.perf_counter()
    output = jnp.matmul(w, x) + b
    naive = time.perf_counter() - start
    output.block_until_ready()
    del output

    # compiled before the clock starts (jit's lower and compile: jax 0.7.2's AOT API)
    step = jax.jit(lambda w, x, b: jnp.matmul(w, x) + b).lower(w, x, b).compile()
    # JAX dispatches asynchronously: each call waits for its result, then lets it go (1 GiB)
    seconds = timed_calls(lambda: step(w, x, b).block_until_ready(), warmup + repeats)
    cpus = usable_cpus()
    name, peaks = device_name_and_peaks(device, dtype, rehearse, len(devices), False, cpus)
    if device == "tpu" and not rehearse:
        name = f"{len(devices)} x {devices[0].device_kind}"  # "8 x TPU v5 lite"
    return {"device": device, "device_name": name, "rehearsal": bool(rehearse),
            "replicas": len(devices), "dtype": dtype, "tf32_enabled": None,
            **figures(jnp.dtype(dtype).itemsize, naive, seconds, warmup, cpus), **peaks,
            "framework": "jax", "jax_version": jax.__version__,
            "jaxlib_version": hosts.installed_version("jaxlib"),
            "libtpu_version": hosts.installed_version("libtpu")}


def report(result):
    """Human-readable lines for a result dict."""
    s = result["seconds"]
    peak, bandwidth = result["peak_tflops"], result["memory_gb_per_second"]
    lines = [
        f"device: {result['device_name']} ({result['replicas']} replica(s)), "
        f"{result['dtype']}, " + (f"JAX {result['jax_version']}" if result.get("framework")
                                  == "jax" else f"TensorFlow {result['tensorflow_version']}"),
        f"naive (article's way: first call, no wait): {result['naive_seconds']:.6f} s"
        f"  -> would be {result['naive_tflops']:.3g} TFLOP/s",
        f"measured: median {s['median']:.6f} s over {s['repetitions']} runs "
        f"(min {s['min']:.6f}, q1 {s['q1']:.6f}, q3 {s['q3']:.6f}, max {s['max']:.6f}; "
        f"{s['warmup']} warm-up runs left out)",
        f"          {result['tflops']:.3f} TFLOP/s; {result['gb_per_second']:.1f} GB/s "
        f"moved ({result['bytes_moved'] / 1e9:.2f} GB per run: w, x, b read, "
        f"result written; {result['flops'] / result['bytes_moved']:.1f} FLOP/byte)",
        "compute peak of all devices used, an upper bound: "
        + (f"{peak:.4g} TFLOP/s = {result['peak_basis']}; "
           f"{100 * result['tflops'] / peak:.0f}% of it" if peak
           else f"none ({result['peak_basis']})"),
        "memory bandwidth of all devices used, an upper bound: "
        + (f"{bandwidth:.4g} GB/s = {result['memory_basis']}; "
           f"{100 * result['gb_per_second'] / bandwidth:.0f}% of it" if bandwidth
           else f"none ({result['memory_basis']})"),
    ]
    return "\n".join(lines)


def main(argv=None):
    parser = OneLineParser(description=__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=("cpu", "gpu", "tpu"), default="cpu")
    parser.add_argument("--dtype", choices=("float32", "bfloat16", "float16"),
                        default="float32")
    parser.add_argument("--repeats", type=cli.integer(1), default=20,
                        help="timed repetitions (default %(default)s)")
    parser.add_argument("--warmup", type=cli.integer(0), default=3,
                        help="untimed runs first (default %(default)s)")
    parser.add_argument("--rehearse", type=cli.integer(1), default=None, metavar="N",
                        help="run the --device gpu/tpu code path on N logical CPUs")
    parser.add_argument("--tpu", default=None,
                        help="TPU name or address (TensorFlow's; JAX finds this machine's)")
    parser.add_argument("--json", default=None, help="also write the figures here")
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parser.parse_args(argv)
    if args.json:
        files.check_output_file(args.json)  # before the run, not after it
    if FRAMEWORK == "jax":  # --tpu was refused by tpu.prepare, before JAX started
        result = run_jax_benchmark(args.device, args.dtype, args.repeats, args.warmup,
                                   args.rehearse)
    else:
        result = run_benchmark(args.device, args.dtype, args.repeats, args.warmup,
                               args.rehearse, args.tpu)
    print(report(result))
    if args.json:
        files.write_json(args.json, {**result, "command": ["tools/matmul_benchmark.py", *argv]})


if __name__ == "__main__":
    exits.run_main(main)
