"""Where the scripts run, with stand-ins: a v5e's files, libtpu, Colab's Drive, Kaggle.

No GPU, TPU, Colab or Kaggle is here. These tests describe each of them
with the files and variables that the platforms' own tools read (runtime.py
names them), and hold what the notebook and train_tpu.py do there.
"""
import os
import subprocess
import sys
import textwrap

import pytest

from pyimagesearch.runtime import this_process
from pyimagesearch import runtime as backend
from pyimagesearch import runtime as hosts
from pyimagesearch import notebook
from pyimagesearch.notebook import records
from pyimagesearch import tpu_runtime


@pytest.fixture(autouse=True)
def tensorflow_tpu_installed(monkeypatch):
    """TensorFlow's TPU route, as with tensorflow-tpu installed (JAX's: tests/test_jax_route.py)."""
    monkeypatch.setattr(backend, "tensorflow_tpu_installed", lambda: True)


V5E, V3 = "0x0063", "0x0027"


def fake_machine(root, tpu=None, chips=1, gpus=0, device_files=False):
    """A folder that reads like / on a machine with `chips` TPUs of PCI id `tpu`, or `gpus` GPUs."""
    for index in range(chips if tpu else 0):
        if device_files:  # a container without /sys: only the device files
            name = f"dev/vfio/{index}" if tpu == V5E else f"dev/accel{index}"
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            (root / name).write_text("")
            continue
        pci = root / f"sys/bus/pci/devices/0000:00:{index + 4:02x}.0"
        pci.mkdir(parents=True)
        (pci / "vendor").write_text("0x1ae0\n")
        (pci / "device").write_text(tpu + "\n")
    (root / "dev/vfio").mkdir(parents=True, exist_ok=True)
    for index in range(gpus):
        (root / f"dev/nvidia{index}").write_text("")
    (root / "dev/vfio/vfio").write_text("")  # the generic node, on every machine with vfio
    return root


# --- runtime.py: the host ------------------------------------------------------------------

@pytest.mark.parametrize("tpu, chips, device_files, generation, pjrt", [
    (V5E, 1, False, "v5e", True),           # Colab's v5e-1
    (V5E, 8, False, "v5e", True),           # Kaggle's v5e-8
    ("0x006f", 8, False, "v6e", True),
    (V3, 8, False, "v2/v3", False),         # Kaggle's v3-8
    ("0x005e", 4, False, "v4", False),
    (V5E, 1, True, "v5e or later", True),   # /dev/vfio/0 without /sys
    (V3, 8, True, "v2-v4", False),          # /dev/accel0..7 without /sys
])
def test_tpu_chips_and_their_generation(tmp_path, tpu, chips, device_files, generation, pjrt):
    host = hosts.detect(fake_machine(tmp_path, tpu, chips, device_files=device_files), {}, {})
    assert (host.tpu_chips, host.tpu_generation, host.needs_pjrt) == (chips, generation, pjrt)
    assert host.accelerator == "tpu"


@pytest.mark.parametrize("files, chips, generation", [
    (["dev/vfio/5"], 1, "v5e or later"),            # a container given one chip, not the first
    (["dev/vfio/2", "dev/vfio/7"], 2, "v5e or later"),
    (["dev/accel3"], 1, "v2-v4"),
    (["dev/vfio/vfio"], 0, ""),                      # vfio's own node is no chip
])
def test_any_chip_device_file_counts(tmp_path, files, chips, generation):
    for name in files:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("")
    assert hosts.tpu_chips(str(tmp_path)) == (chips, generation)


def test_a_machine_without_accelerators_and_one_with_gpus(tmp_path):
    plain = hosts.detect(fake_machine(tmp_path / "plain"), {}, {})
    assert (plain.accelerator, plain.tpu_chips, plain.gpus, plain.needs_pjrt) == ("cpu", 0, 0,
                                                                                   False)
    assert hosts.detect(fake_machine(tmp_path / "t4x2", gpus=2), {}, {}).gpus == 2
    driver_only = tmp_path / "driver" / "proc/driver/nvidia"
    driver_only.mkdir(parents=True)
    (driver_only / "version").write_text("NVRM version: 550\n")
    assert hosts.detect(tmp_path / "driver", {}, {}).accelerator == "gpu"


def test_a_google_pci_device_that_is_no_tpu_is_not_counted(tmp_path):
    pci = tmp_path / "sys/bus/pci/devices/0000:00:03.0"
    pci.mkdir(parents=True)
    (pci / "vendor").write_text("0x1ae0\n")
    (pci / "device").write_text("0x0042\n")  # gVNIC, say
    assert hosts.detect(tmp_path, {}, {}).tpu_chips == 0


def test_kaggle_is_told_from_colab_although_it_is_built_on_colab(tmp_path):
    colab_modules = {"google.colab": object()}
    assert hosts.service(tmp_path, {}, colab_modules) == "colab"
    assert hosts.service(tmp_path, {"KAGGLE_KERNEL_RUN_TYPE": "Interactive",
                                    "COLAB_RELEASE_TAG": "x"}, colab_modules) == "kaggle"
    (tmp_path / "kaggle/working").mkdir(parents=True)
    assert hosts.service(tmp_path, {}, {}) == "kaggle"
    assert hosts.service(tmp_path / "nowhere", {}, {}) == "local"


def test_the_host_root_comes_from_the_environment(tmp_path):
    fake_machine(tmp_path, V5E, 1)
    assert hosts.detect(environ={hosts.ROOT_ENV: str(tmp_path)}, modules={}).needs_pjrt


# --- tpu_runtime.py ----------------------------------------------------------------------

V5E_HOST = hosts.Host("colab", 0, 1, "v5e")
V3_HOST = hosts.Host("kaggle", 0, 8, "v2/v3")
NO_TPU = hosts.Host("local", 0, 0, "")


@pytest.mark.parametrize("argv, expected", [
    ([], False), (["--rehearse", "8"], True), (["--rehearse=1"], True), (["--reh", "8"], True),
    (["--r", "8"], True), (["--rehearsal", "8"], False), (["-r"], False),
    (["--epochs", "1", "--", "--rehearse"], False),
    (["--tpu", "local"], False),
])
def test_a_rehearsal_is_told_from_the_command_line(argv, expected):
    # a prefix (--reh 8) counts as a rehearsal here, so the TPU runtime is not set up for a
    # command that argparse then refuses (allow_abbrev=False: tests/test_guards.py)
    assert tpu_runtime.rehearses(argv) is expected


def test_the_variables_are_set_on_a_v5e_from_libtpus_own_path(monkeypatch):
    monkeypatch.delitem(sys.modules, "tensorflow")  # as before train_tpu.py imports it
    environ = {}
    said = tpu_runtime.prepare([], environ, V5E_HOST, lambda: "/site/libtpu/libtpu.so")
    assert environ == {tpu_runtime.USE_C_API: "true",
                       tpu_runtime.LIBRARY_PATH: "/site/libtpu/libtpu.so"}
    assert said.startswith("PJRT through /site/libtpu/libtpu.so (libtpu ")


@pytest.mark.parametrize("argv, host", [(["--rehearse", "8"], V5E_HOST), ([], NO_TPU),
                                        ([], V3_HOST)])
def test_nothing_is_set_for_a_rehearsal_without_a_tpu_or_on_older_chips(monkeypatch, argv,
                                                                         host):
    monkeypatch.delitem(sys.modules, "tensorflow")
    environ = {}
    tpu_runtime.prepare(argv, environ, host, lambda: "/site/libtpu/libtpu.so")
    assert environ == {}


@pytest.mark.parametrize("mine", [
    {tpu_runtime.USE_C_API: "false", tpu_runtime.LIBRARY_PATH: "/mine/libtpu.so"},
    {tpu_runtime.LIBRARY_PATH: "/mine/libtpu.so"},
    {tpu_runtime.USE_C_API: ""},  # set, even empty: the user's choice
])
def test_the_users_own_values_are_kept(monkeypatch, mine):
    monkeypatch.delitem(sys.modules, "tensorflow")
    environ = dict(mine)
    said = tpu_runtime.prepare([], environ, V5E_HOST, lambda: pytest.fail("libtpu was asked"))
    assert environ == mine
    assert said.startswith("PJRT as you set it")


def test_libtpus_path_is_used_only_where_the_file_is(monkeypatch, tmp_path):
    library = tmp_path / "libtpu.so"
    stand_in = type(sys)("libtpu")
    stand_in.get_library_path = lambda: str(library)
    monkeypatch.setitem(sys.modules, "libtpu", stand_in)
    monkeypatch.setattr(tpu_runtime, "SYSTEM_LIBTPU", str(tmp_path / "lib" / "libtpu.so"))
    assert tpu_runtime.libtpu_path() is None  # a path that is not there breaks TF's import
    library.write_bytes(b"")
    assert tpu_runtime.libtpu_path() == str(library)
    monkeypatch.setitem(sys.modules, "libtpu", None)  # not installed: a TPU VM's own copy
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "libtpu.so").write_bytes(b"")
    assert tpu_runtime.libtpu_path() == str(tmp_path / "lib" / "libtpu.so")


def test_without_libtpu_nothing_is_set_and_the_failure_says_why(monkeypatch):
    monkeypatch.delitem(sys.modules, "tensorflow")
    monkeypatch.setattr(this_process, "tpu_runtime", None)
    environ = {}
    tpu_runtime.prepare([], environ, V5E_HOST, lambda: None)
    assert environ == {}
    assert tpu_runtime.likely_causes().startswith("libtpu is not installed")


def test_after_tensorflow_is_imported_nothing_is_set(monkeypatch):
    import tensorflow  # noqa: F401
    monkeypatch.setattr(this_process, "tpu_runtime", None)
    environ = {}
    assert tpu_runtime.prepare([], environ, V5E_HOST, lambda: "/x.so").startswith("too late")
    assert environ == {}
    assert "set before TensorFlow is imported" in tpu_runtime.likely_causes()


# what the stand-in hook records at TensorFlow's import
RECORDED = (tpu_runtime.USE_C_API, tpu_runtime.LIBRARY_PATH, tpu_runtime.TPU_LIBRARY_PATH,
            tpu_runtime.LOAD_LIBRARY)
# a shell's environment has none of these; the test process has this package's hold
CLEARED = RECORDED + (tpu_runtime.OURS, tpu_runtime.RUNTIME_ENV)


def _distribution(site, name, version):
    """A stand-in installed distribution: what importlib.metadata and pip read."""
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")


def _stand_ins(tmp_path, tpu=V5E):
    """A v5e's files, stand-in tensorflow-tpu and libtpu distributions, and a hook that
    records the environment at the moment anything imports TensorFlow, then ends the
    process (status 0)."""
    fake_machine(tmp_path / "root", tpu, 1) if tpu else fake_machine(tmp_path / "root")
    site = tmp_path / "site"
    (site / "libtpu").mkdir(parents=True)
    (site / "libtpu" / "__init__.py").write_text(
        f"def get_library_path():\n    return {str(site / 'libtpu' / 'libtpu.so')!r}\n")
    (site / "libtpu" / "libtpu.so").write_bytes(b"")
    _distribution(site, "libtpu", "0.0.18")
    _distribution(site, "tensorflow-tpu", "2.20.0")
    record = tmp_path / "at_import.txt"
    (site / "sitecustomize.py").write_text(textwrap.dedent(f"""
        import os, sys

        def importing():  # an import, not a presence check (importlib.util.find_spec)
            frame = sys._getframe(2)
            while frame and frame.f_code.co_name != "_find_and_load":
                frame = frame.f_back
            return frame is not None

        class Record:
            def find_spec(self, name, path=None, target=None):
                if name == "tensorflow" and importing():
                    with open({str(record)!r}, "w") as handle:
                        for key in {RECORDED!r}:
                            handle.write(f"{{key}}={{os.environ.get(key)}}\\n")
                    sys.stdout.flush()
                    os._exit(0)

        sys.meta_path.insert(0, Record())
    """))
    env = dict(os.environ, PYTHONPATH=str(site), **{hosts.ROOT_ENV: str(tmp_path / "root")})
    for key in CLEARED:
        env.pop(key, None)
    return env, record, site / "libtpu" / "libtpu.so"


def _at_tensorflow_import(repo, env, record, *args, script="train_tpu.py"):
    """What the recorded variables held when `python SCRIPT ARGS` imported TensorFlow."""
    record.unlink(missing_ok=True)
    result = subprocess.run([sys.executable, script, *args], cwd=repo, env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return _recorded(record)


def _recorded(record):
    """The variables the stand-in hook wrote at TensorFlow's import."""
    return dict(line.split("=", 1) for line in record.read_text().splitlines())


def _pjrt(library, **more):
    """The recorded variables of a PJRT run through `library`."""
    return {tpu_runtime.USE_C_API: "true", tpu_runtime.LIBRARY_PATH: str(library),
            tpu_runtime.TPU_LIBRARY_PATH: str(library), tpu_runtime.LOAD_LIBRARY: "None",
            **more}


UNSET = {key: "None" for key in RECORDED}
HELD_OFF = dict(UNSET, **{tpu_runtime.LOAD_LIBRARY: "0"})  # TensorFlow leaves libtpu alone


def test_train_tpu_sets_the_variables_before_tensorflow_loads_on_a_v5e(repo, tmp_path):
    env, record, library = _stand_ins(tmp_path)
    assert _at_tensorflow_import(repo, env, record) == _pjrt(library)
    # the matmul benchmark starts TPU runs too
    assert _at_tensorflow_import(repo, env, record, "--device", "tpu",
                                 script="tools/matmul_benchmark.py") == _pjrt(library)


def test_train_tpu_leaves_them_unset_in_a_rehearsal_and_without_a_tpu(repo, tmp_path):
    env, record, _ = _stand_ins(tmp_path / "v5e")
    assert _at_tensorflow_import(repo, env, record, "--rehearse", "8") == HELD_OFF
    assert _at_tensorflow_import(repo, env, record, "--device", "cpu",
                                 script="tools/matmul_benchmark.py") == HELD_OFF
    env, record, _ = _stand_ins(tmp_path / "cpu", tpu=None)
    assert _at_tensorflow_import(repo, env, record) == UNSET  # the TPU run: libtpu may load


def test_train_tpu_keeps_the_users_values(repo, tmp_path):
    env, record, _ = _stand_ins(tmp_path)
    env.update({tpu_runtime.USE_C_API: "false", tpu_runtime.LIBRARY_PATH: "/opt/my/libtpu.so"})
    assert _at_tensorflow_import(repo, env, record) == dict(UNSET, **{
        tpu_runtime.USE_C_API: "false", tpu_runtime.LIBRARY_PATH: "/opt/my/libtpu.so"})


@pytest.mark.parametrize("script, args", [
    ("train_tpu.py", ("--rehearse", "8")),
    ("train_cpu.py", ()),
    ("train_gpu.py", ()),
    ("train_gpu.py", ("--rehearse", "2")),
    ("compare.py", ("outputs/quoted", "--output-dir", "{tmp}")),
    ("tools/matmul_benchmark.py", ("--device", "cpu")),
    ("tools/matmul_benchmark.py", ("--device", "gpu")),
])
def test_only_the_tpu_run_lets_tensorflow_load_libtpu(repo, tmp_path, script, args):
    """On a v5e with tensorflow-tpu: every other process imports TensorFlow with
    TPU_LOAD_LIBRARY=0, so it takes no lock and leaves the chips alone."""
    env, record, library = _stand_ins(tmp_path)
    args = [arg.format(tmp=tmp_path / "out") for arg in args]
    assert _at_tensorflow_import(repo, env, record, *args, script=script)[
        tpu_runtime.LOAD_LIBRARY] == "0"


def test_the_tpu_run_drops_the_hold_it_inherits_and_keeps_the_users(repo, tmp_path):
    env, record, library = _stand_ins(tmp_path)
    # started by a process of this package (a launcher, the notebook's kernel)
    inherited = dict(env, **{tpu_runtime.LOAD_LIBRARY: "0", tpu_runtime.OURS: "0"})
    assert _at_tensorflow_import(repo, inherited, record) == _pjrt(library)
    # the user's own value: "0" for a client of a TPU pod whose chips a service
    # holds (Google's pod tests do that), "1" to load libtpu without its lock
    for mine in ("0", "1"):
        assert _at_tensorflow_import(repo, dict(env, **{tpu_runtime.LOAD_LIBRARY: mine}),
                                     record) == _pjrt(library, **{tpu_runtime.LOAD_LIBRARY: mine})
        assert _at_tensorflow_import(repo, dict(env, **{tpu_runtime.LOAD_LIBRARY: mine}),
                                     record, script="train_cpu.py")[
            tpu_runtime.LOAD_LIBRARY] == mine


def test_pjrt_on_older_chips_is_offered_with_an_environment_variable(repo, tmp_path):
    env, record, library = _stand_ins(tmp_path, tpu=V3)
    assert _at_tensorflow_import(repo, env, record) == UNSET  # stream executor, by default
    env[tpu_runtime.RUNTIME_ENV] = "pjrt"
    assert _at_tensorflow_import(repo, env, record) == _pjrt(library)
    assert _at_tensorflow_import(repo, env, record, "--rehearse", "8") == HELD_OFF


def test_another_libtpu_for_the_plugin_is_named_for_tensorflows_loader_too(monkeypatch,
                                                                          tmp_path):
    monkeypatch.delitem(sys.modules, "tensorflow")
    mine = tmp_path / "libtpu.so"
    mine.write_bytes(b"")
    environ = {tpu_runtime.LIBRARY_PATH: str(mine)}
    assert tpu_runtime.prepare([], environ, V5E_HOST).startswith("PJRT as you set it")
    assert environ[tpu_runtime.TPU_LIBRARY_PATH] == str(mine)  # one libtpu in the process
    other = {tpu_runtime.LIBRARY_PATH: str(mine), tpu_runtime.TPU_LIBRARY_PATH: "/site/libtpu.so"}
    said = tpu_runtime.prepare([], other, V5E_HOST)
    assert said.endswith("; TPU_LIBRARY_PATH names another libtpu (/site/libtpu.so)")
    assert other[tpu_runtime.TPU_LIBRARY_PATH] == "/site/libtpu.so"  # said, not overridden


def test_a_users_hold_on_the_tpu_run_is_kept_and_named_as_a_cause(monkeypatch):
    monkeypatch.delitem(sys.modules, "tensorflow")
    environ = {tpu_runtime.LOAD_LIBRARY: "0"}
    said = tpu_runtime.prepare([], environ, V3_HOST)
    assert said == "no TPU that needs PJRT; your TPU_LOAD_LIBRARY=0 keeps TensorFlow from " \
                   "loading libtpu"
    assert environ == {tpu_runtime.LOAD_LIBRARY: "0"}
    assert tpu_runtime.likely_causes().startswith(
        "TPU_LOAD_LIBRARY=0 in your environment, which keeps libtpu unloaded; on a TPU v5e")
    # this package's own hold is no user's: dropped, and not named
    environ = {tpu_runtime.LOAD_LIBRARY: "0", tpu_runtime.OURS: "0"}
    assert tpu_runtime.prepare([], environ, V3_HOST) == "no TPU that needs PJRT"
    assert environ == {}


def test_an_unknown_runtime_choice_is_one_line_and_auto(monkeypatch, capsys):
    monkeypatch.delitem(sys.modules, "tensorflow")
    environ = {tpu_runtime.RUNTIME_ENV: "streamexecutor"}
    assert tpu_runtime.prepare([], environ, V3_HOST) == "no TPU that needs PJRT"
    assert capsys.readouterr().err == ("[INFO] PYIMAGESEARCH_TPU_RUNTIME=streamexecutor is "
                                       "neither auto nor pjrt: auto is used\n")


# --- notebook.py: the runtime's branches ------------------------------------------------

CPU_HOST = hosts.Host("colab", 0, 0, "")
GPU_HOST = hosts.Host("kaggle", 2, 0, "")


def _scripts(runs):
    return [" ".join(run.argv) for run in runs]


@pytest.mark.parametrize("host, device, rehearse, expected", [
    (V5E_HOST, "auto", True, ["train_tpu.py"]),
    (GPU_HOST, "auto", True, ["train_gpu.py"]),
    (CPU_HOST, "auto", True, ["train_cpu.py", "train_gpu.py --rehearse 2",
                              "train_tpu.py --rehearse 8"]),
    (CPU_HOST, "auto", False, ["train_cpu.py"]),
    (GPU_HOST, "cpu", True, ["train_cpu.py"]),   # no rehearsals on a GPU runtime
    (CPU_HOST, "tpu", True, ["train_tpu.py --rehearse 8"]),
    (CPU_HOST, "gpu", False, ["train_gpu.py --rehearse 2"]),
    (GPU_HOST, "tpu", True, ["train_tpu.py --rehearse 8"]),
])
def test_the_runtime_decides_which_script_runs(host, device, rehearse, expected):
    assert _scripts(notebook.plan_runs(host, device, rehearse)) == expected


def test_a_notebook_set_for_a_gpu_on_a_cpu_says_how_to_change_the_runtime(capsys):
    runs = notebook.plan_runs(CPU_HOST, "gpu", True, ["--epochs", "1"])
    said = capsys.readouterr().out
    assert "Runtime > Change runtime type, then pick a GPU (T4)" in said
    assert "Rehearsing the GPU configuration on the CPU" in said
    assert runs[0].argv == ("train_gpu.py", "--rehearse", "2", "--epochs", "1")


def test_a_device_the_notebook_does_not_know_is_one_line():
    with pytest.raises(notebook.NotebookStop, match="DEVICE is 'TPU'; choose one of auto"):
        notebook.runtime("TPU")


def test_the_matmul_runs_on_the_device_that_trains():
    assert notebook.matmul_device(V5E_HOST) == "tpu"
    assert notebook.matmul_device(GPU_HOST, "gpu") == "gpu"
    assert notebook.matmul_device(CPU_HOST, "tpu") == "cpu"  # a rehearsal
    assert notebook.matmul_device(GPU_HOST, "cpu") == "cpu"


# --- notebook.py: where the runs are kept -----------------------------------------------

def test_drive_keeps_the_runs_on_colab(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    mounted = []
    monkeypatch.setattr(notebook, "DRIVE_MOUNT", str(tmp_path / "drive"))
    folder = notebook.keep_runs_in(CPU_HOST, mount=mounted.append)
    assert mounted == [str(tmp_path / "drive")]
    assert folder == str(tmp_path / "drive" / "MyDrive" / "fast-training-runs")
    assert os.path.isdir(folder)


def test_a_refused_drive_is_one_line_and_the_runs_stay_local(monkeypatch, tmp_path, capsys):
    monkeypatch.chdir(tmp_path)

    class MessageError(Exception):  # google.colab._message's, which a refusal raises
        pass

    def refuse(mountpoint):
        raise MessageError("Error: credential propagation was unsuccessful")

    assert notebook.keep_runs_in(CPU_HOST, mount=refuse) == notebook.LOCAL_FOLDER
    said = capsys.readouterr().out.splitlines()
    assert said[0] == ("[INFO] Google Drive is not mounted (Error: credential propagation was "
                       "unsuccessful): the runs stay in outputs/notebook, which a change of "
                       "runtime empties")
    assert (tmp_path / notebook.LOCAL_FOLDER).is_dir()


def test_outside_colab_drive_is_not_tried(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    assert notebook.keep_runs_in(NO_TPU, mount=lambda m: pytest.fail("mounted")) == \
        notebook.LOCAL_FOLDER
    assert notebook.keep_runs_in(NO_TPU, str(tmp_path / "mine")) == str(tmp_path / "mine")


def test_a_runs_folder_that_cannot_be_made_is_one_line(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(notebook.NotebookStop, match=r"^cannot create .*file/runs: "):
        notebook.keep_runs_in(NO_TPU, str(tmp_path / "file" / "runs"))


# --- notebook.py: running a script --------------------------------------------------------

def test_a_second_run_all_on_a_tpu_runtime_finds_the_tpu_free(repo, tmp_path, monkeypatch):
    """The kernel's TensorBoard imports TensorFlow and lives on: with TPU_LOAD_LIBRARY=0 it
    takes no lock, and the training and matmul scripts still get libtpu, run after run."""
    from tensorboard import manager

    env, record, library = _stand_ins(tmp_path)
    for key in CLEARED:  # a fresh kernel: nothing of this package's yet
        monkeypatch.delenv(key, raising=False)
    for key in ("PYTHONPATH", hosts.ROOT_ENV):
        monkeypatch.setenv(key, env[key])
    for run_all in range(2):
        assert notebook.runtime("auto").accelerator == "tpu"
        # %tensorboard starts `tensorboard` with the kernel's environment (tensorboard/
        # manager.py: 2.21 drops PYTHONPATH and a few others with _subprocess_environ, 2.20
        # passes it whole); PYTHONPATH here only brings in the stand-ins
        launch = getattr(manager, "_subprocess_environ", os.environ.copy)()
        tensorboard = subprocess.run([sys.executable, "-c", "import tensorflow"], timeout=60,
                                     env=dict(launch, PYTHONPATH=env["PYTHONPATH"]))
        assert tensorboard.returncode == 0
        assert _recorded(record)[tpu_runtime.LOAD_LIBRARY] == "0"
        for script in (("train_tpu.py",), ("tools/matmul_benchmark.py", "--device", "tpu")):
            record.unlink()
            notebook.run_script(script, repo)
            assert _recorded(record) == _pjrt(library), (run_all, script)


def test_the_users_own_tpu_load_library_reaches_the_scripts(monkeypatch):
    monkeypatch.setenv(tpu_runtime.LOAD_LIBRARY, "1")
    monkeypatch.delenv(tpu_runtime.OURS, raising=False)
    notebook.runtime("auto", environ=os.environ)
    assert os.environ[tpu_runtime.LOAD_LIBRARY] == "1"
    assert notebook.script_environment()[tpu_runtime.LOAD_LIBRARY] == "1"


def test_a_failing_script_stops_the_notebook_with_its_own_line(tmp_path, capfd):
    script = tmp_path / "fails.py"
    script.write_text("import sys\nprint('[INFO] working')\nprint('a warning', file=sys.stderr)\n"
                      "sys.exit('fails.py: error: no GPU is visible to TensorFlow')\n")
    with pytest.raises(notebook.NotebookStop) as stop:
        notebook.run_script((str(script),), repo=tmp_path)
    assert str(stop.value) == "fails.py: error: no GPU is visible to TensorFlow"
    out, err = capfd.readouterr()
    assert "[INFO] working" in out
    assert err == "a warning\n"  # the last line is the stop's, not shown twice


def test_a_script_that_succeeds_shows_all_it_said(tmp_path, capfd):
    script = tmp_path / "works.py"
    script.write_text("import os, sys\nprint(os.environ['KERAS_BACKEND'])\n"
                      "print('last words', file=sys.stderr)\n")
    notebook.run_script((str(script),), repo=tmp_path)
    out, err = capfd.readouterr()
    assert out.endswith("tensorflow\n")  # JAX-first TPU images set KERAS_BACKEND=jax
    assert err == "last words\n"


def test_the_lines_a_test_refuses_are_left_out(tmp_path, capfd):
    # compare.py's printed Table 1: the notebook shows it once, as Markdown
    script = tmp_path / "table.py"
    script.write_text("print('| run | val_loss |')\nprint('[INFO] wrote comparison.md')\n")
    notebook.run_script((str(script),), repo=tmp_path,
                        show=lambda line: line.startswith("[INFO]"))
    out, _ = capfd.readouterr()
    assert "| run |" not in out and out.endswith("\n[INFO] wrote comparison.md\n")


def test_a_record_becomes_a_table_of_its_epochs():
    record = {"loss": [0.5, 0.25], "val_loss": [0.4, 0.2], "epoch_seconds": [3.14, 2.0]}
    assert records.record_table(record).splitlines()[2:] == [
        "| 1 | 0.5000 | 0.4000 | 3.1 |", "| 2 | 0.2500 | 0.2000 | 2.0 |"]


def test_requirements_tpu_pins_the_libtpu_its_records_resolved(repo):
    import json

    lines = (repo / "requirements-tpu.txt").read_text().splitlines()
    pins = [line for line in lines if line.startswith("libtpu")]
    assert pins == ["libtpu==0.0.10"]  # what tensorflow-tpu 2.19.1 pins itself
    assert "tensorflow-tpu==2.19.1" in lines
    assert not any(line.startswith("--find-links") for line in lines)
    for python in ("310", "311", "312"):  # Cloud TPU VMs' Python, CI's, Kaggle's
        record = json.loads((repo / f"outputs/quoted/tpu/dry_run_py{python}.json").read_text())
        assert record["exit_status"] == 0
        assert record["would_install"]["libtpu"] == "0.0.10"
        assert record["would_install"]["tensorflow_tpu"] == "2.19.1"
    assert "**`libtpu==0.0.10`**" in (repo / "docs/tpus.md").read_text()


def test_train_tpu_chooses_its_own_backend_and_the_others_run_on_tensorflow(monkeypatch):
    # JAX-first TPU images set KERAS_BACKEND=jax: not a choice the notebook made
    monkeypatch.setenv("KERAS_BACKEND", "jax")
    assert "KERAS_BACKEND" not in notebook.script_environment("train_tpu.py")
    for script in ("train_cpu.py", "train_gpu.py", "compare.py", None):
        assert notebook.script_environment(script)["KERAS_BACKEND"] == "tensorflow"


@pytest.mark.parametrize("installed, route", [
    ({"jax": "0.7.2"}, True),                                   # Colab's and Kaggle's images
    ({"jax": "0.7.2", "tensorflow-tpu": "2.19.1"}, False),      # tensorflow-tpu: its route
    ({}, False),                                                # no JAX: TensorFlow's
])
def test_the_notebook_takes_the_jax_route_where_train_tpu_does(installed, route):
    tpu = hosts.Host("colab", 0, 1, "v5e")
    assert notebook.jax_route(tpu, installed.get) is route
    assert notebook.jax_route(hosts.Host("colab", 0, 0, ""), installed.get) is False
    # the same rule as the script's own (runtime.py)
    chosen = backend.tpu_route({}, tpu, "jax" in installed, "tensorflow-tpu" in installed)
    assert (chosen == "jax") is route
