"""matmul_benchmark.py: FLOP and byte counts, statistics, and the peaks it compares against.

The peaks are checked on fake /proc/cpuinfo text and GPU names, so the tests
say the same on any machine; tiny real runs cover the timing paths, TensorFlow's
here and JAX's in processes of their own (KERAS_BACKEND=jax).
"""
import json
import os

import pytest

import matmul_benchmark
from conftest import ENV, one_line, run

from pyimagesearch.host import Host


def _cpuinfo_text(vendor, family, flags, processors=4, siblings=4, cores=2, mhz=3000.0):
    """/proc/cpuinfo text for one package of `processors` CPUs, SMT when siblings > cores."""
    blocks = [f"processor\t: {n}\nvendor_id\t: {vendor}\ncpu family\t: {family}\n"
              f"model name\t: fake {vendor}\ncpu MHz\t\t: {mhz}\nphysical id\t: 0\n"
              f"siblings\t: {siblings}\ncore id\t\t: {n % cores}\ncpu cores\t: {cores}\n"
              f"flags\t\t: fpu sse2 {flags}\n"
              for n in range(processors)]
    return "\n".join(blocks) + "\n"


ZEN4 = _cpuinfo_text("AuthenticAMD", 25, "avx avx2 fma avx512f")
ZEN5 = _cpuinfo_text("AuthenticAMD", 26, "avx avx2 fma avx512f")
XEON = _cpuinfo_text("GenuineIntel", 6, "avx avx2 fma avx512f")
ZEN3 = _cpuinfo_text("AuthenticAMD", 25, "avx avx2 fma")
NO_SMT = _cpuinfo_text("GenuineIntel", 6, "avx avx2 fma avx512f", siblings=4, cores=4)


def test_flop_count_of_the_articles_shapes():
    assert matmul_benchmark.matmul_flops() == 2 * 1024 * 512 * 512 * 16 == 8_589_934_592
    with pytest.raises(ValueError):
        matmul_benchmark.matmul_flops((4, 2, 3), (4, 5, 6))


def test_bytes_moved_reads_w_x_b_and_writes_the_result():
    w, x, b = 1024 * 512 * 16, 1024 * 16 * 512, 1024 * 512 * 512
    assert matmul_benchmark.bytes_moved(4) == 4 * (w + x + 2 * b) == 2_214_592_512
    assert matmul_benchmark.bytes_moved(2) == 2_214_592_512 // 2  # bfloat16
    # under 4 FLOP per byte: memory-bound on every device the script knows
    assert matmul_benchmark.matmul_flops() / matmul_benchmark.bytes_moved(4) < 4
    tiny = {"w": (2, 3, 5), "x": (2, 5, 7), "b": (2, 3, 7)}
    assert matmul_benchmark.bytes_moved(4, tiny) == 4 * (30 + 70 + 42 + 42)


def test_statistics_leave_out_the_warm_up():
    seconds = [9.0, 8.0, 1.0, 3.0, 2.0, 4.0, 5.0]
    stats = matmul_benchmark.summarize(seconds, warmup=2)
    assert stats["median"] == 3.0 and stats["repetitions"] == 5
    assert (stats["min"], stats["max"]) == (1.0, 5.0)
    with pytest.raises(ValueError):
        matmul_benchmark.summarize([1.0, 2.0], warmup=2)


def test_gpu_peaks_add_up_over_replicas():
    one = matmul_benchmark.gpu_peaks("NVIDIA A100-SXM4-40GB", "float16", 1, True)
    four = matmul_benchmark.gpu_peaks("NVIDIA A100-SXM4-40GB", "float16", 4, True)
    assert (one["peak_tflops"], one["memory_gb_per_second"]) == (312.0, 1555.0)
    assert (four["peak_tflops"], four["memory_gb_per_second"]) == (4 * 312.0, 4 * 1555.0)
    assert four["peak_basis"].startswith("4 x 312")
    assert matmul_benchmark.gpu_peaks(
        "NVIDIA A100-SXM4-80GB", "float16", 2, True)["memory_gb_per_second"] == 2 * 2039.0


def test_a_rehearsal_shares_one_cpu_so_its_peak_is_not_multiplied():
    peak = {"tflops": 0.3, "basis": "2 core(s) x ..."}
    figures = matmul_benchmark.cpu_peaks("float32", rehearsal=8, peak=peak)
    assert figures["peak_tflops"] == 0.3 and "not 8 x" in figures["peak_basis"]
    assert figures["memory_gb_per_second"] is None  # never guessed for a CPU
    assert matmul_benchmark.cpu_peaks("bfloat16", peak=peak)["peak_tflops"] is None


def test_float32_on_ampere_and_later_uses_the_tf32_peak_only_when_enabled():
    enabled = matmul_benchmark.gpu_peaks("NVIDIA L4", "float32", 1, tf32_enabled=True)
    disabled = matmul_benchmark.gpu_peaks("NVIDIA L4", "float32", 1, tf32_enabled=False)
    assert enabled["peak_tflops"] == 60.0 and "tf32" in enabled["peak_basis"]
    assert disabled["peak_tflops"] == 30.3 and "float32" in disabled["peak_basis"]
    h100 = matmul_benchmark.gpu_peaks("NVIDIA H100 80GB HBM3", "float32", 1, True)
    assert h100["peak_tflops"] == 494.7  # dense, not the 989 with sparsity
    # Turing has no TF32: float32 stays float32 whatever the setting
    assert matmul_benchmark.gpu_peaks("Tesla T4", "float32", 1, True)["peak_tflops"] == 8.1
    # whole names only: an L40S is not an L4
    assert matmul_benchmark.gpu_peaks("NVIDIA L40S", "float32", 1, True)["peak_tflops"] is None


@pytest.mark.parametrize("text, per_cycle", [(ZEN4, 32), (ZEN5, 64), (XEON, 64), (ZEN3, 32)])
def test_flops_per_cycle_by_vendor_and_family(text, per_cycle):
    processors = matmul_benchmark.cpuinfo(text)
    assert len(processors) == 4
    assert matmul_benchmark.flops_per_cycle(processors[0]) == per_cycle


def test_cpu_peak_counts_physical_cores_not_smt_siblings():
    processors = matmul_benchmark.cpuinfo(ZEN4)  # 4 vCPUs on 2 cores
    peak = matmul_benchmark.cpu_peak(processors, cpus={0, 1, 2, 3}, max_mhz=3000.0)
    assert peak["cores"] == 2 and peak["tflops"] == pytest.approx(2 * 3.0e9 * 32 / 1e12)
    # CPUs 0 and 2 are the two threads of core 0
    assert matmul_benchmark.cpu_peak(processors, cpus={0, 2}, max_mhz=3000.0)["cores"] == 1
    no_smt = matmul_benchmark.cpuinfo(NO_SMT)
    assert matmul_benchmark.cpu_peak(no_smt, cpus={0, 2}, max_mhz=3000.0)["cores"] == 2


def test_cpu_peak_counts_only_the_cpus_this_process_may_use(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {1}, raising=False)
    assert matmul_benchmark.usable_cpus() == {1}
    peak = matmul_benchmark.cpu_peak(matmul_benchmark.cpuinfo(NO_SMT))
    assert (peak["cpus"], peak["cores"]) == (1, 1)
    assert peak["tflops"] == pytest.approx(peak["ghz"] * 1e9 * 64 / 1e12)


def test_a_tiny_benchmark_run_reports_both_timings(monkeypatch):
    monkeypatch.setattr(matmul_benchmark, "SHAPES",
                        {"w": (8, 16, 4), "x": (8, 4, 16), "b": (8, 16, 16)})
    result = matmul_benchmark.run_benchmark("cpu", repeats=3, warmup=1)
    assert result["flops"] == 2 * 8 * 16 * 16 * 4
    assert result["output_bytes"] == 8 * 16 * 16 * 4  # float32
    assert result["bytes_moved"] == 4 * (8 * 16 * 4 + 8 * 4 * 16 + 2 * 8 * 16 * 16)
    assert result["seconds"]["repetitions"] == 3 and result["seconds"]["warmup"] == 1
    assert result["tflops"] == pytest.approx(
        result["flops"] / result["seconds"]["median"] / 1e12)
    assert result["cpu_model"] and result["cpus_usable"] == len(matmul_benchmark.usable_cpus())
    text = matmul_benchmark.report(result)
    assert "naive" in text and "median" in text and "upper bound" in text


# --- the JAX path: Colab's and Kaggle's TPUs, where TensorFlow cannot reach the chips --------

ARTICLE_SHAPES = 'SHAPES = {"w": (1024, 512, 16), "x": (1024, 16, 512), "b": (1024, 512, 512)}'
TINY_SHAPES = 'SHAPES = {"w": (8, 32, 16), "x": (8, 16, 32), "b": (8, 32, 32)}'
# the tool run as `python tools/matmul_benchmark.py ARGS` would run it, on operands small
# enough for a shared 2-core machine (the article's 1 GiB ones: the slow test below)
AS_A_SCRIPT = """import pathlib, sys
tool = pathlib.Path("tools/matmul_benchmark.py").resolve()
text = tool.read_text()
assert text.count({article!r}) == 1
sys.argv = [str(tool), *sys.argv[1:]]
exec(compile(text.replace({article!r}, {tiny!r}), str(tool), "exec"),
     {{"__name__": "__main__", "__file__": str(tool)}})
""".format(article=ARTICLE_SHAPES, tiny=TINY_SHAPES)


def _run_tool(args, backend="jax", tiny=True, **environ):
    """`python tools/matmul_benchmark.py ARGS` with KERAS_BACKEND=`backend` (None: unset)."""
    env = {key: value for key, value in ENV.items()
           if key not in ("KERAS_BACKEND", "JAX_PLATFORMS", "JAX_NUM_CPU_DEVICES")}
    env.update({"KERAS_BACKEND": backend} if backend else {}, **environ)
    return run(*(["-c", AS_A_SCRIPT] if tiny else ["tools/matmul_benchmark.py"]), *args,
               env=env)


@pytest.mark.slow  # 7 s; JAX on one CPU device is the default test
def test_on_a_tpu_route_jax_times_the_op_over_the_tpus_devices(tmp_path):
    # KERAS_BACKEND=jax --device tpu --rehearse 8: the route a Colab or Kaggle TPU takes
    # (choose_framework, tpu.prepare), on 8 JAX CPU devices the tool asks JAX for
    record = tmp_path / "matmul.json"
    args = ["--device", "tpu", "--rehearse", "8", "--repeats", "3", "--warmup", "1"]
    done = _run_tool([*args, "--json", record])
    assert done.returncode == 0, done.stderr
    result = json.loads(record.read_text())
    assert result["framework"] == "jax" and result["jax_version"].startswith("0.")
    assert "tensorflow_version" not in result
    assert (result["device"], result["replicas"], result["rehearsal"]) == ("tpu", 8, True)
    assert result["flops"] == 2 * 8 * 32 * 32 * 16  # TINY_SHAPES: 1 matrix a device
    assert (result["seconds"]["repetitions"], result["seconds"]["warmup"]) == (3, 1)
    assert result["command"] == ["tools/matmul_benchmark.py", *args, "--json", str(record)]
    first = done.stdout.splitlines()[0]
    assert first.startswith("device: 8 logical CPU devices on ")
    assert first.endswith("(8 replica(s)), float32, JAX " + result["jax_version"])


def test_without_a_tpu_the_jax_path_says_what_it_found_in_one_line(tmp_path):
    record = tmp_path / "matmul.json"
    done = _run_tool(["--device", "tpu", "--json", record])
    line = one_line(done)
    assert line.startswith("matmul_benchmark.py: error: no TPU for Keras on JAX: this machine, "
                           "no GPU or TPU; JAX sees 1 cpu device(s)")
    assert "jax 0." in line and line.endswith("rehearse on 8 JAX CPU devices")
    assert not record.exists() and done.stdout == ""


def test_jax_times_the_op_on_one_cpu_device(tmp_path):
    record = tmp_path / "matmul.json"
    done = _run_tool(["--dtype", "bfloat16", "--repeats", "2", "--warmup", "0",
                      "--json", record])
    assert done.returncode == 0, done.stderr
    result = json.loads(record.read_text())
    assert (result["framework"], result["replicas"], result["rehearsal"]) == ("jax", 1, False)
    assert result["output_bytes"] == 8 * 32 * 32 * 2  # bfloat16
    assert result["bytes_moved"] == 2 * (8 * 32 * 16 * 2 + 2 * 8 * 32 * 32)
    assert (result["seconds"]["repetitions"], result["seconds"]["warmup"]) == (2, 0)
    assert result["peak_tflops"] is None  # no bfloat16 peak for a CPU
    assert ", bfloat16, JAX 0." in done.stdout.splitlines()[0]


@pytest.mark.slow  # 9 s; JAX on one CPU device is the default test
def test_keras_backend_jax_rehearses_a_gpu_on_n_jax_cpu_devices(tmp_path):
    record = tmp_path / "matmul.json"
    done = _run_tool(["--device", "gpu", "--rehearse", "2", "--repeats", "1", "--json", record])
    assert done.returncode == 0, done.stderr
    result = json.loads(record.read_text())
    assert (result["framework"], result["device"], result["replicas"]) == ("jax", "gpu", 2)


@pytest.mark.parametrize("args, environ, said", [
    pytest.param(["--device", "gpu"], {}, "--device gpu is timed with TensorFlow here: run "
                 "with KERAS_BACKEND=tensorflow", marks=pytest.mark.slow),  # 6 s
    (["--tpu", "my-tpu"], {}, "--tpu my-tpu: Keras on JAX trains on this machine's own TPU"),
    (["--device", "tpu", "--rehearse", "3"], {"JAX_NUM_CPU_DEVICES": "2"},
     "JAX_NUM_CPU_DEVICES=2 in your environment and --rehearse 3 disagree"),
])
def test_what_the_jax_path_cannot_time_is_one_line(args, environ, said):
    line = one_line(_run_tool(args, **environ))
    assert line.startswith(f"matmul_benchmark.py: error: {said}"), line


@pytest.mark.parametrize("argv", [["--repeats", "0"], ["--warmup", "-1"], ["--dtype", "int8"],
                                  ["--rehearse", "0"], ["--device", "npu"]])
def test_a_bad_flag_is_one_line_and_status_2(monkeypatch, in_process, argv):
    for timer in ("run_benchmark", "run_jax_benchmark"):
        monkeypatch.setattr(matmul_benchmark, timer,
                            lambda *args: pytest.fail(f"taken, it ran: {args}"))
    line = one_line(in_process("tools/matmul_benchmark.py", *argv))
    assert line.startswith(f"matmul_benchmark.py: error: argument {argv[0]}: "), line


NO_TPU, TPU = Host("local", 0, 0, ""), Host("colab", 0, 1, "v5e")


def test_the_framework_is_chosen_as_train_tpu_chooses_its_route(capsys):
    # jax is installed here and tensorflow-tpu is not: a TPU with them is Colab's, Kaggle's
    environ = {}
    assert matmul_benchmark.choose_framework(["--device", "tpu"], environ, TPU) == "jax"
    assert environ["KERAS_BACKEND"] == "jax"
    # no TPU, or not --device tpu, or KERAS_BACKEND=tensorflow: TensorFlow's
    for argv, host, environ in ((["--device", "tpu"], NO_TPU, {}), ([], TPU, {}),
                                (["--device=tpu"], TPU, {"KERAS_BACKEND": "tensorflow"})):
        assert matmul_benchmark.choose_framework(argv, environ, host) == "tensorflow"
        assert environ["KERAS_BACKEND"] == "tensorflow"
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("argv", [[], ["--device", "cpu", "--rehearse", "1"],
                                  ["--device=gpu", "--rehearse=2"]])
def test_keras_backend_jax_asks_for_jax_on_the_cpu_alone(argv):
    # JAX then starts no TPU or GPU runtime (the JAX CPU devices of --rehearse N: above)
    environ = {"KERAS_BACKEND": "jax"}
    assert matmul_benchmark.choose_framework(argv, environ, NO_TPU) == "jax"
    assert (environ["KERAS_BACKEND"], environ["JAX_PLATFORMS"]) == ("jax", "cpu")


def test_another_backend_is_set_aside_for_tensorflow_in_one_line(capsys):
    environ = {"KERAS_BACKEND": "torch"}
    assert matmul_benchmark.choose_framework(["--device", "tpu"], environ, TPU) == "tensorflow"
    assert environ["KERAS_BACKEND"] == "tensorflow"
    assert capsys.readouterr().err.splitlines() == [
        "[INFO] KERAS_BACKEND=torch set aside: this code runs Keras on TensorFlow"]


@pytest.mark.slow  # 2.2 GB moved per call
def test_the_articles_operands_on_jax_cpu(tmp_path):
    # the article's 1 GiB operands, timed by JAX on the CPU
    record = tmp_path / "matmul.json"
    done = _run_tool(["--repeats", "2", "--warmup", "1", "--json", record], tiny=False)
    assert done.returncode == 0, done.stderr
    result = json.loads(record.read_text())
    assert result["framework"] == "jax" and result["flops"] == 8_589_934_592
    assert result["bytes_moved"] == 2_214_592_512 and result["replicas"] == 1
