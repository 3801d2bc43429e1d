"""Keras on JAX, train_tpu.py's route on Colab's and Kaggle's TPUs: rehearsed on JAX CPU devices.

The route's choice and set-up before TensorFlow's import, what it refuses in one
line (saying what works where it is read), a missing package, the loss (the
article's scale=1 takes the one-device step), backups and resume, and the
custom loop's jax.value_and_grad step. JAX runs in processes of its own: this
test session's Keras is TensorFlow's.
"""
import json
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from conftest import ENV, REPO, one_line, output_files, outputs_name

from pyimagesearch import cli, host as hosts, tpu
from pyimagesearch.errors import UserError
from pyimagesearch.plan import Settings, make_plan, run_name

pytest.importorskip("jax")  # requirements-dev.txt installs it

TINY = ["--epochs", "1", "--steps-per-epoch", "2", "--data-source", "sample"]
COLAB_TPU, KAGGLE_TPU = hosts.Host("colab", 0, 1, "v5e"), hosts.Host("kaggle", 0, 8, "v5e")
CLOUD_TPU_VM, PLAIN = hosts.Host("local", 0, 4, "v4"), hosts.Host("local", 0, 0, "")
COLAB_GPU = hosts.Host("colab", 1, 0, "")
JAX_TPU = "pip install -r requirements-jax-tpu.txt"


def jax_env(devices=None, **more):
    env = {**ENV, "KERAS_BACKEND": "jax", **more}
    if devices:
        env.update(JAX_PLATFORMS="cpu", JAX_NUM_CPU_DEVICES=str(devices))
    return env


def train_tpu(*args, env=None, timeout=300):
    return subprocess.run([sys.executable, "train_tpu.py", *map(str, args)], cwd=REPO,
                          env=env or jax_env(), capture_output=True, text=True, timeout=timeout)


# --- the route, chosen before TensorFlow's import ----------------------------------------------

@pytest.mark.parametrize("asked, host, jax_installed, tf_tpu, route", [
    (None, KAGGLE_TPU, True, False, "jax"),          # Colab's and Kaggle's TPU images
    (None, KAGGLE_TPU, True, True, "tensorflow"),    # tensorflow-tpu installed: its route
    (None, KAGGLE_TPU, False, False, "tensorflow"),  # no JAX
    (None, PLAIN, True, False, "tensorflow"),        # no TPU: the article's, rehearsed
    ("jax", PLAIN, False, False, "jax"),             # asked for: taken as asked
    ("tensorflow", KAGGLE_TPU, True, False, "tensorflow"),
])
def test_the_route_follows_keras_backend_else_the_tpu_image(monkeypatch, asked, host,
                                                            jax_installed, tf_tpu, route):
    monkeypatch.setattr(hosts, "installed", lambda module: jax_installed)
    monkeypatch.setattr(hosts, "installed_version", lambda name: tf_tpu and "2.19.1")
    environ = {} if asked is None else {"KERAS_BACKEND": asked}
    assert tpu.choose_route(environ, host) == route
    assert environ.get("KERAS_BACKEND", "tensorflow") == route  # unset, Keras takes TF


@pytest.mark.parametrize("asked", ["torch", "numpy", ""])
def test_a_backend_neither_route_takes_is_refused(asked):
    with pytest.raises(UserError, match=f"not KERAS_BACKEND={asked}; set KERAS_BACKEND=jax$"):
        tpu.choose_route({"KERAS_BACKEND": asked}, KAGGLE_TPU)
    said = one_line(train_tpu("--rehearse", "2", env={**ENV, "KERAS_BACKEND": "torch"}))
    assert said == ("train_tpu.py: error: train_tpu.py runs Keras on TensorFlow or on JAX, not "
                    "KERAS_BACKEND=torch; set KERAS_BACKEND=jax or KERAS_BACKEND=tensorflow")


def test_prepare_on_jax_gives_a_rehearsal_its_devices_and_keeps_the_tpu_free(monkeypatch):
    monkeypatch.delitem(sys.modules, "tensorflow")  # as at the top of train_tpu.py
    environ = {"KERAS_BACKEND": "jax", "TPU_LOAD_LIBRARY": "0", "PYIMAGESEARCH_TPU_HOLD": "0"}
    said = tpu.prepare(["--rehearse", "8"], environ, KAGGLE_TPU, lambda: "/lib/libtpu.so")
    assert said == "Keras on JAX: a rehearsal on 8 JAX CPU devices"
    assert environ["JAX_NUM_CPU_DEVICES"] == "8" and environ["JAX_PLATFORMS"] == "cpu"
    assert environ["TPU_LOAD_LIBRARY"] == "0"  # the chips stay free for a real run
    mine = {"KERAS_BACKEND": "jax", "JAX_NUM_CPU_DEVICES": "2"}  # the reader's, too few
    with pytest.raises(SystemExit):
        tpu.prepare(["--rehearse", "8"], mine, KAGGLE_TPU)


def test_prepare_on_jax_lets_jax_take_the_tpu_and_sets_no_tensorflow_runtime(monkeypatch):
    monkeypatch.delitem(sys.modules, "tensorflow")
    monkeypatch.setattr(hosts, "installed", lambda module: True)
    monkeypatch.setattr(hosts, "installed_version", lambda name: None)  # no tensorflow-tpu
    environ = {"TPU_LOAD_LIBRARY": "0", "PYIMAGESEARCH_TPU_HOLD": "0"}
    said = tpu.prepare([], environ, KAGGLE_TPU, lambda: "/lib/libtpu.so")
    assert said.startswith("Keras on JAX: JAX's libtpu reaches the TPU")
    assert environ == {"KERAS_BACKEND": "jax"}  # no hold on libtpu, no PJRT for TensorFlow
    with pytest.raises(SystemExit):  # --tpu NAME: JAX reaches only this machine's chips
        tpu.prepare(["--tpu", "my-tpu"], {"KERAS_BACKEND": "jax"}, KAGGLE_TPU)


def test_on_a_jax_tpu_image_tensorflows_tpu_route_is_refused_before_it_starts(monkeypatch):
    monkeypatch.delitem(sys.modules, "tensorflow")
    monkeypatch.setattr(hosts, "installed_version", lambda name: None)
    with pytest.raises(SystemExit) as stopped:
        tpu.prepare([], {"KERAS_BACKEND": "tensorflow"}, KAGGLE_TPU, lambda: "/lib/libtpu.so")
    assert stopped.value.code == 2


# --- a missing package: one line naming the install for this runtime ----------------------------

@pytest.mark.parametrize("route, host, lacking, said", [
    ("jax", COLAB_TPU, {"tensorflow"}, "tensorflow is not installed (tf.data reads the digits, "
     f"on Keras' JAX backend too): {JAX_TPU}"),
    ("tensorflow", COLAB_TPU, {"tensorflow"}, f"tensorflow is not installed: {JAX_TPU}"),
    ("tensorflow", CLOUD_TPU_VM, {"tensorflow"}, "tensorflow is not installed: pip install -r "
     "requirements-tpu.txt"),
    ("jax", CLOUD_TPU_VM, {"tensorflow"}, "tensorflow is not installed (tf.data reads the "
     "digits, on Keras' JAX backend too): pip install -r requirements-tpu-vm.txt"),
    ("jax", CLOUD_TPU_VM, {"jax"}, "jax is not installed: pip install -r requirements-tpu-vm.txt"),
    ("jax", CLOUD_TPU_VM, {"jax"} | {"keras"}, "keras and jax are not installed: pip install -r "
     "requirements-tpu-vm.txt"),
    ("tensorflow", PLAIN, {"tensorflow", "keras"}, "tensorflow and keras are not installed: "
     "pip install -r requirements.txt"),
    ("tensorflow", COLAB_GPU, {"matplotlib"}, "matplotlib is not installed: pip install -r "
     "requirements.txt"),
    ("jax", PLAIN, {"jax"}, "jax is not installed: pip install jax"),
    ("jax", COLAB_TPU, {"jax"}, 'jax is not installed: pip install "jax[tpu]"'),
    ("jax", PLAIN, {"tensorflow", "keras", "jax"}, "tensorflow, keras and jax are not installed "
     "(tf.data reads the digits, on Keras' JAX backend too): pip install -r requirements.txt "
     "and pip install jax"),
    ("tensorflow", PLAIN, {"jax"}, ""),  # the TensorFlow route never asks for jax
    ("jax", COLAB_TPU, set(), ""),
])
def test_a_missing_package_is_named_with_the_install_for_this_runtime(route, host, lacking,
                                                                      said):
    assert hosts.missing(route, host, lambda module: module not in lacking) == said


# runs SCRIPT ARGS as `python SCRIPT ARGS` would, with the packages named in argv[1] missing
HIDE = textwrap.dedent("""
    import runpy, sys
    HIDDEN = set(sys.argv[1].split(","))

    class Hide:
        def find_spec(self, name, path=None, target=None):
            if name.partition(".")[0] in HIDDEN:
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)

    sys.meta_path.insert(0, Hide())
    sys.argv = sys.argv[2:]
    sys.path.insert(0, ".")
    runpy.run_path(sys.argv[0], run_name="__main__")
""")


def _without(hidden, script, *args, **env):
    environ = {key: value for key, value in ENV.items()
               if key not in ("KERAS_BACKEND", "JAX_NUM_CPU_DEVICES", "JAX_PLATFORMS")}
    return subprocess.run([sys.executable, "-c", HIDE, hidden, script, *args], cwd=REPO,
                          env={**environ, **env}, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("hidden, script, args, env, said", [
    ("tensorflow", "train_tpu.py", ["--rehearse", "8"], {},
     "tensorflow is not installed: pip install -r requirements.txt"),
    ("tensorflow", "train_cpu.py", [], {}, "tensorflow is not installed: pip install -r "
                                           "requirements.txt"),
    ("tensorflow", "compare.py", [], {}, "tensorflow is not installed: pip install -r "
                                         "requirements.txt"),
    ("jax", "train_tpu.py", ["--rehearse", "8"], {"KERAS_BACKEND": "jax"},
     "jax is not installed: pip install jax"),
])
def test_a_missing_package_ends_the_script_in_one_line(tmp_path, hidden, script, args, env,
                                                       said):
    done = _without(hidden, script, *args, "--output-dir", str(tmp_path), **env)
    assert said in one_line(done) and done.stderr.strip().splitlines()[-1].startswith(
        f"{script}: error: ")
    assert not list(tmp_path.iterdir())


def test_on_a_cloud_tpu_vm_a_missing_tensorflow_datasets_names_the_tpu_vms_install(tmp_path):
    for chip in range(4):  # a stand-in Cloud TPU VM: a v5e's PCI ids, neither Colab nor Kaggle
        pci = tmp_path / f"root/sys/bus/pci/devices/0000:00:0{chip}.0"
        pci.mkdir(parents=True)
        (pci / "vendor").write_text("0x1ae0\n")
        (pci / "device").write_text("0x0063\n")
    done = _without("tensorflow_datasets", "train_tpu.py", "--rehearse", "2", "--epochs", "1",
                    "--output-dir", str(tmp_path / "out"), KERAS_BACKEND="jax",
                    PYIMAGESEARCH_HOST_ROOT=str(tmp_path / "root"))
    assert one_line(done).endswith("MNIST through tfds needs tensorflow-datasets (No module "
                                   "named 'tensorflow_datasets'): pip install -r "
                                   "requirements-tpu-vm.txt, or use --data-source sample")
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").iterdir())


# --- what the route refuses, with what works where it is read -----------------------------------

def _refused(monkeypatch, host, **settings):
    monkeypatch.setattr(hosts, "detect", lambda: host)
    plan = make_plan("tpu", Settings(batch_size=1024, **settings), 8, backend="jax")
    with pytest.raises(UserError) as refused:
        cli.refuse(plan, None)
    return str(refused.value)


@pytest.mark.parametrize("host, place", [(COLAB_TPU, "Colab"), (KAGGLE_TPU, "Kaggle")])
def test_on_a_jax_tpu_image_a_refused_lever_points_to_what_works_there(monkeypatch, host,
                                                                       place):
    said = _refused(monkeypatch, host, jit_compile=True)
    assert said == ("--jit-compile: not on Keras' JAX backend (JAX compiles every step with XLA "
                    f"anyway); on {place}'s TPU only Keras on JAX reaches the chips "
                    "(TensorFlow's TPU route needs tensorflow-tpu, which would replace JAX's "
                    "libtpu): leave the flag out, or rehearse on TensorFlow's route: "
                    "KERAS_BACKEND=tensorflow python train_tpu.py --rehearse 8")


@pytest.mark.parametrize("host", [PLAIN, CLOUD_TPU_VM, COLAB_GPU])
def test_elsewhere_a_refused_lever_points_to_tensorflows_route(monkeypatch, host):
    assert _refused(monkeypatch, host, jit_compile=True).endswith(
        "; run with KERAS_BACKEND=tensorflow")


def test_the_levers_jax_keeps_are_not_refused(monkeypatch):
    monkeypatch.setattr(hosts, "detect", lambda: PLAIN)
    plan = make_plan("tpu", Settings(batch_size=1024, precision="mixed_float16", loop="custom",
                                     lr_scaling="sqrt", optimizer="sgd", backup_dir="b",
                                     backup_every=5, logdir="logs"), 8, backend="jax")
    cli.refuse(plan, None)


def test_profiling_on_jax_is_refused_where_jaxs_profiler_breaks_tensorflows_tracing():
    # jaxlib sets tensorflow.python.profiler.trace.enabled, a function in TensorFlow 2.21,
    # to a bool; when a TensorFlow keeps a bool there, the refusal must go
    from tensorflow.python.profiler import trace

    plan = make_plan("tpu", Settings(batch_size=1024, profile_steps=(1, 2)), 8, backend="jax")
    if callable(trace.enabled):
        with pytest.raises(UserError, match="^--profile-steps on Keras' JAX backend needs "
                                            "TensorFlow 2.20 or earlier"):
            cli.refuse(plan, None)
    else:
        cli.refuse(plan, None)


def test_the_run_names_keep_jax_apart():
    assert run_name("tpu", Settings(batch_size=1024), True) == "tpu_rehearsal"
    assert run_name("tpu", Settings(batch_size=1024), True, backend="jax") == "tpu_rehearsal_jax"
    assert run_name("tpu", Settings(batch_size=1024), False, "tpu", "jax") == "tpu_jax"


# --- the rehearsal, end to end -------------------------------------------------------------------

def test_the_jax_rehearsal_trains_on_8_devices_and_writes_its_outputs(tmp_path):
    args = TINY + ["--rehearse", "8", "--logdir", tmp_path / "logs"]
    done = train_tpu(*args, "--output-dir", tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    name = outputs_name("tpu", args) + "_jax"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["logs"] + output_files(name)
    record = json.loads((tmp_path / f"{name}.json").read_text())
    assert (record["backend"], record["strategy"], record["replicas"],
            record["global_batch_size"], record["per_replica_batch_size"]) == (
        "jax", "DataParallel", 8, 1024, 128)
    assert record["jax_version"] not in (None, "not installed")
    assert record["tensorflow_build"] == hosts.tensorflow_builds()
    assert "[INFO] Number of accelerators: 8" in done.stdout and "Keras on JAX" in done.stdout
    assert "Traceback" not in done.stderr and list((tmp_path / "logs").iterdir())


def test_on_jax_with_no_tpu_one_line_says_what_was_found(tmp_path):
    said = one_line(train_tpu(*TINY, "--output-dir", tmp_path))
    assert said.startswith("train_tpu.py: error: no TPU for Keras on JAX: this machine, no GPU "
                           "or TPU; JAX sees 1 cpu device(s); jax 0.")
    assert "libtpu" in said and "tensorflow" in said and said.endswith(
        "use --rehearse 8 to rehearse on 8 JAX CPU devices")
    assert not list(tmp_path.iterdir())


# --- the loss on JAX: the article's scale=1 takes the one-device step ----------------------------

@pytest.fixture(scope="module")
def jax_steps():
    done = subprocess.run([sys.executable, "tools/jax_loss_step.py", "2:1", "8:1", "8:8"],
                          cwd=REPO, env=jax_env(8), capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    record = json.loads(done.stdout.splitlines()[-1])
    return dict(record["steps"], backend=record["backend"], step_size=record["step_size"])


@pytest.mark.slow  # 15 s; test_the_quoted_jax_record_says_the_same reads its record
def test_on_jax_the_articles_scale_1_takes_the_one_device_step(jax_steps):
    assert jax_steps["backend"] == "jax" and jax_steps["step_size"] > 1e-3
    for replicas in (2, 8):
        step = jax_steps[f"{replicas}:1"]
        assert abs(step["ratio"] - 1.0) < 1e-3, step
        assert step["max_difference"] < 1e-3 * jax_steps["step_size"], step
    assert abs(jax_steps["8:8"]["ratio"] - 1 / 8) < 1e-3  # TensorFlow's scale=N shrinks it


def test_the_quoted_jax_record_says_the_same(repo):
    record = json.loads((repo / "outputs/quoted/listings/jax_loss_step.json").read_text())
    assert record["backend"] == "jax"
    assert abs(record["steps"]["8:1"]["ratio"] - 1.0) < 1e-3
    assert abs(record["steps"]["8:8"]["ratio"] - 1 / 8) < 1e-3


@pytest.mark.slow
def test_the_custom_loops_jax_step_on_n_devices_is_one_devices_fit_step():
    done = subprocess.run([sys.executable, "tools/jax_loss_step.py", "--loop", "custom", "2:1",
                           "8:1"], cwd=REPO, env=jax_env(8), capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    steps = json.loads(done.stdout.splitlines()[-1])["steps"]
    assert all(abs(steps[case]["ratio"] - 1.0) < 1e-3 for case in ("2:1", "8:1")), steps


@pytest.mark.slow
@pytest.mark.parametrize("loop", ["fit", "custom"])
def test_a_jax_rehearsal_trains_under_float16_in_both_loops(tmp_path, loop):
    args = TINY + ["--rehearse", "2", "--batch-size", "64", "--loop", loop,
                   "--precision", "mixed_float16"]
    done = train_tpu(*args, "--output-dir", tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    record = json.loads((tmp_path / f"{outputs_name('tpu', args)}_jax.json").read_text())
    assert record["precision"] == "mixed_float16" and np.isfinite(record["loss"]).all()


# --- backups and resume on JAX -------------------------------------------------------------------

RESUMED = ["--epochs", "3", "--steps-per-epoch", "6", "--batch-size", "64", "--data-source",
           "sample", "--rehearse", "2"]


@pytest.fixture(scope="module")
def uninterrupted_jax(tmp_path_factory):
    folder = tmp_path_factory.mktemp("jax_whole")
    done = train_tpu(*RESUMED, "--output-dir", folder)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads((folder / f"{outputs_name('tpu', RESUMED)}_jax.json").read_text())


# slow (two JAX processes, 40 s): the backup's code is TensorFlow's too, whose resume the
# default suite holds (tests/test_backup.py); the JAX route's reading of a backup below
@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGKILL])
def test_a_stopped_jax_run_resumes_to_the_uninterrupted_losses(tmp_path, uninterrupted_jax,
                                                               signum):
    args = [*RESUMED, "--backup-dir", tmp_path / "backup", "--output-dir", tmp_path / "out"]
    process = subprocess.Popen([sys.executable, "train_tpu.py", *map(str, args)], cwd=REPO,
                               env=jax_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
    for line in process.stdout:
        if line.startswith("Epoch 2/3"):
            process.send_signal(signum)
            break
    _, err = process.communicate(timeout=300)
    state = json.loads((tmp_path / "backup" / "backup.json").read_text())
    if signum == signal.SIGTERM:  # a whole epoch per call: saved at the epoch's end
        assert process.returncode == 143
        assert err.strip().splitlines()[-1] == (
            f"train_tpu.py: error: stopped by SIGTERM after {state['step']} steps; the backup "
            f"in {tmp_path / 'backup'} holds them: run the same command to resume")
    else:
        assert process.returncode == -signal.SIGKILL
    assert state["step"] in (6, 12) and state["run"]["run"] == "tpu_rehearsal_jax"
    again = train_tpu(*args)
    assert again.returncode == 0, again.stderr[-3000:]
    name = f"{outputs_name('tpu', RESUMED)}_jax"
    record = json.loads((tmp_path / "out" / f"{name}.json").read_text())
    assert record["resumed_from_step"] == state["step"]
    np.testing.assert_allclose(record["val_loss"], uninterrupted_jax["val_loss"], rtol=1e-5)
    assert not (tmp_path / "backup").exists()


@pytest.mark.slow  # 7 s
def test_a_backup_belongs_to_its_backend(tmp_path):
    # a TensorFlow rehearsal's backup is refused by the JAX route, and the other way round
    args = ["--epochs", "1", "--steps-per-epoch", "2", "--batch-size", "64", "--data-source",
            "sample", "--rehearse", "2", "--backup-dir", tmp_path / "b", "--output-dir",
            tmp_path / "o"]
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "backup.json").write_text(json.dumps({
        "run": {"run": "tpu_rehearsal"}, "step": 0, "weights": "weights-0.weights.h5",
        "history": {"loss": [], "val_loss": []}}))
    said = one_line(train_tpu(*args))
    assert "is the backup of another run (" in said
    assert "run 'tpu_rehearsal' -> 'tpu_rehearsal_jax'" in said
