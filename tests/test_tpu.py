"""The TPU, with stand-ins: a v5e's files, libtpu, TensorFlow's TPU calls failing as they do.

No TPU is here. The host is described with the files its own tools read (a
folder standing in for /); train_tpu.py's set-up before TensorFlow's import is
recorded by a stand-in hook at that import; the TPU resolver and TPU calls are
replaced by fakes that fail the way TensorFlow does.
"""
import socket
import subprocess
import sys
import textwrap
import threading

import pytest
import tensorflow as tf

import train_tpu
from conftest import ENV

from pyimagesearch import host as hosts
from pyimagesearch import tpu
from pyimagesearch.errors import UserError


@pytest.fixture(autouse=True)
def tensorflow_tpu_installed(monkeypatch):
    """TensorFlow's TPU route, as with tensorflow-tpu installed (JAX's: tests/test_jax_route.py)."""
    real = hosts.installed_version
    monkeypatch.setattr(hosts, "installed_version", lambda name: "2.19.1" if name ==
                        "tensorflow-tpu" else real(name))


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


# --- the host ------------------------------------------------------------------

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


# --- set up before TensorFlow's import ----------------------------------------------------------------------

V5E_HOST = hosts.Host("colab", 0, 1, "v5e")
V3_HOST = hosts.Host("kaggle", 0, 8, "v2/v3")
NO_TPU = hosts.Host("local", 0, 0, "")


def test_the_variables_are_set_on_a_v5e_from_libtpus_own_path(monkeypatch):
    monkeypatch.delitem(sys.modules, "tensorflow")  # as before train_tpu.py imports it
    environ = {}
    said = tpu.prepare([], environ, V5E_HOST, lambda: "/site/libtpu/libtpu.so")
    assert environ == {tpu.USE_C_API: "true",
                       tpu.LIBRARY_PATH: "/site/libtpu/libtpu.so"}
    assert said.startswith("PJRT through /site/libtpu/libtpu.so (libtpu ")


@pytest.mark.parametrize("builds, refused", [
    ({"tensorflow-cpu": "2.20.0"}, True),  # a TPU VM's requirements-tpu-vm.txt, jax removed
    ({"tensorflow-cpu": "2.20.0", "tensorflow-tpu": "2.19.1"}, False),
    ({"tensorflow": "2.19.1"}, False),  # a TPU VM image's own build may reach the chips
])
def test_on_a_tpu_vm_tensorflow_cpu_alone_is_refused_with_both_installs(monkeypatch, capsys,
                                                                         builds, refused):
    monkeypatch.delitem(sys.modules, "tensorflow")
    monkeypatch.setattr(hosts, "installed_version", builds.get)
    tpu_vm = hosts.Host("local", 0, 4, "v5e")
    if not refused:
        assert tpu.prepare([], {"KERAS_BACKEND": "tensorflow"}, tpu_vm, lambda: "/x.so")
        return
    with pytest.raises(SystemExit) as stopped:
        tpu.prepare([], {"KERAS_BACKEND": "tensorflow"}, tpu_vm, lambda: "/x.so")
    assert stopped.value.code == 2
    assert capsys.readouterr().err.strip().endswith(
        "tensorflow-cpu 2.20.0 cannot reach a TPU: for Keras on JAX, pip install -r "
        "requirements-tpu-vm.txt; for TensorFlow's TPUStrategy, pip install -r "
        "requirements-tpu.txt; or add --rehearse 8")


@pytest.mark.parametrize("argv, host", [(["--rehearse", "8"], V5E_HOST), ([], NO_TPU),
                                        ([], V3_HOST)])
def test_nothing_is_set_for_a_rehearsal_without_a_tpu_or_on_older_chips(monkeypatch, argv,
                                                                         host):
    monkeypatch.delitem(sys.modules, "tensorflow")
    environ = {}
    tpu.prepare(argv, environ, host, lambda: "/site/libtpu/libtpu.so")
    assert environ == {}


@pytest.mark.parametrize("mine", [
    {tpu.USE_C_API: "false", tpu.LIBRARY_PATH: "/mine/libtpu.so"},
    {tpu.LIBRARY_PATH: "/mine/libtpu.so"},
    {tpu.USE_C_API: ""},  # set, even empty: the user's choice
])
def test_the_users_own_values_are_kept(monkeypatch, mine):
    monkeypatch.delitem(sys.modules, "tensorflow")
    environ = dict(mine)
    said = tpu.prepare([], environ, V5E_HOST, lambda: pytest.fail("libtpu was asked"))
    assert environ == mine
    assert said.startswith("PJRT as you set it")


def test_libtpus_path_is_used_only_where_the_file_is(monkeypatch, tmp_path):
    library = tmp_path / "libtpu.so"
    stand_in = type(sys)("libtpu")
    stand_in.get_library_path = lambda: str(library)
    monkeypatch.setitem(sys.modules, "libtpu", stand_in)
    monkeypatch.setattr(tpu, "SYSTEM_LIBTPU", str(tmp_path / "lib" / "libtpu.so"))
    assert tpu.libtpu_path() is None  # a path that is not there breaks TF's import
    library.write_bytes(b"")
    assert tpu.libtpu_path() == str(library)
    monkeypatch.setitem(sys.modules, "libtpu", None)  # not installed: a TPU VM's own copy
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "libtpu.so").write_bytes(b"")
    assert tpu.libtpu_path() == str(tmp_path / "lib" / "libtpu.so")


def test_without_libtpu_nothing_is_set_and_the_failure_says_why(monkeypatch):
    monkeypatch.delitem(sys.modules, "tensorflow")
    environ = {}
    assert tpu.prepare([], environ, V5E_HOST, lambda: None).startswith(
        "libtpu is not installed")
    assert environ == {}
    monkeypatch.setattr(tpu, "libtpu_path", lambda: None)
    assert tpu.likely_causes({}).startswith("libtpu is not installed, and a TPU needs it")


def test_after_tensorflow_is_imported_nothing_is_set(monkeypatch):
    import tensorflow  # noqa: F401
    environ = {}
    assert tpu.prepare([], environ, V5E_HOST, lambda: "/x.so").startswith("too late")
    assert environ == {}
    assert "set before TensorFlow is imported" in tpu.likely_causes({})


# what the stand-in hook records at TensorFlow's import
RECORDED = (tpu.USE_C_API, tpu.LIBRARY_PATH, "TPU_LIBRARY_PATH", "TPU_LOAD_LIBRARY")
# a shell's environment has none of these; the test process has this package's hold
CLEARED = RECORDED + ("PYIMAGESEARCH_TPU_HOLD", tpu.RUNTIME_ENV, "KERAS_BACKEND")


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
    env = dict(ENV, PYTHONPATH=str(site), **{hosts.ROOT_ENV: str(tmp_path / "root")})
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
    return {tpu.USE_C_API: "true", tpu.LIBRARY_PATH: str(library),
            "TPU_LIBRARY_PATH": str(library), "TPU_LOAD_LIBRARY": "None", **more}


UNSET = {key: "None" for key in RECORDED}
HELD_OFF = dict(UNSET, TPU_LOAD_LIBRARY="0")  # TensorFlow leaves libtpu alone


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
    env.update({tpu.USE_C_API: "false", tpu.LIBRARY_PATH: "/opt/my/libtpu.so"})
    assert _at_tensorflow_import(repo, env, record) == dict(UNSET, **{
        tpu.USE_C_API: "false", tpu.LIBRARY_PATH: "/opt/my/libtpu.so"})


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
        "TPU_LOAD_LIBRARY"] == "0"


def test_the_tpu_run_drops_the_hold_it_inherits_and_keeps_the_users(repo, tmp_path):
    env, record, library = _stand_ins(tmp_path)
    # started by a process of this package (a launcher, the notebook's kernel)
    inherited = dict(env, **{"TPU_LOAD_LIBRARY": "0", "PYIMAGESEARCH_TPU_HOLD": "0"})
    assert _at_tensorflow_import(repo, inherited, record) == _pjrt(library)
    # the user's own value: "0" for a client of a TPU pod whose chips a service
    # holds (Google's pod tests do that), "1" to load libtpu without its lock
    for mine in ("0", "1"):
        assert _at_tensorflow_import(repo, dict(env, TPU_LOAD_LIBRARY=mine),
                                     record) == _pjrt(library, TPU_LOAD_LIBRARY=mine)
        assert _at_tensorflow_import(repo, dict(env, TPU_LOAD_LIBRARY=mine),
                                     record, script="train_cpu.py")[
            "TPU_LOAD_LIBRARY"] == mine


def test_pjrt_on_older_chips_is_offered_with_an_environment_variable(repo, tmp_path):
    env, record, library = _stand_ins(tmp_path, tpu=V3)
    assert _at_tensorflow_import(repo, env, record) == UNSET  # stream executor, by default
    env[tpu.RUNTIME_ENV] = "pjrt"
    assert _at_tensorflow_import(repo, env, record) == _pjrt(library)
    assert _at_tensorflow_import(repo, env, record, "--rehearse", "8") == HELD_OFF


def test_another_libtpu_for_the_plugin_is_named_for_tensorflows_loader_too(monkeypatch,
                                                                          tmp_path):
    monkeypatch.delitem(sys.modules, "tensorflow")
    mine = tmp_path / "libtpu.so"
    mine.write_bytes(b"")
    environ = {tpu.LIBRARY_PATH: str(mine)}
    assert tpu.prepare([], environ, V5E_HOST).startswith("PJRT as you set it")
    assert environ["TPU_LIBRARY_PATH"] == str(mine)  # one libtpu in the process
    other = {tpu.LIBRARY_PATH: str(mine), "TPU_LIBRARY_PATH": "/site/libtpu.so"}
    said = tpu.prepare([], other, V5E_HOST)
    assert said == "PJRT as you set it; TPU_LIBRARY_PATH names another libtpu (/site/libtpu.so)"
    assert other["TPU_LIBRARY_PATH"] == "/site/libtpu.so"  # said, not overridden


def test_a_users_hold_on_the_tpu_run_is_kept_and_named_as_a_cause(monkeypatch):
    monkeypatch.delitem(sys.modules, "tensorflow")
    environ = {"TPU_LOAD_LIBRARY": "0"}
    said = tpu.prepare([], environ, V3_HOST)
    assert said == "no TPU that needs PJRT; your TPU_LOAD_LIBRARY=0 keeps TensorFlow from " \
                   "loading libtpu"
    assert environ == {"TPU_LOAD_LIBRARY": "0"}
    assert tpu.likely_causes(environ).startswith(
        "TPU_LOAD_LIBRARY=0 in your environment, which keeps libtpu unloaded; ")
    # this package's own hold is no user's: dropped, and not named
    environ = {"TPU_LOAD_LIBRARY": "0", "PYIMAGESEARCH_TPU_HOLD": "0"}
    assert tpu.prepare([], environ, V3_HOST) == "no TPU that needs PJRT"
    assert environ == {}


def test_an_unknown_runtime_choice_is_one_line_and_auto(monkeypatch, capsys):
    monkeypatch.delitem(sys.modules, "tensorflow")
    environ = {tpu.RUNTIME_ENV: "streamexecutor"}
    assert tpu.prepare([], environ, V3_HOST) == "no TPU that needs PJRT"
    assert capsys.readouterr().err == ("[INFO] PYIMAGESEARCH_TPU_RUNTIME=streamexecutor is "
                                       "neither auto nor pjrt: auto is used\n")



@pytest.fixture
def no_tpu_env(monkeypatch):
    """No TPU name from the environment, so messages name only what the test passes."""
    for name in ("TPU_NAME", "KUBE_GOOGLE_CLOUD_TPU_ENDPOINTS", "TPU_CONFIG"):
        monkeypatch.delenv(name, raising=False)


def _fake_resolver(monkeypatch, init, devices=("CPU", "TPU_SYSTEM", "TPU")):
    """Replace TPUClusterResolver by a class whose constructor runs `init(tpu)`, on a
    machine where TensorFlow lists logical devices of the types in `devices`."""
    class FakeResolver:
        def __init__(self, tpu=None):
            init(tpu)

        def master(self):
            return ""  # as on a TPU VM: no address to probe (none but loopback here)

    monkeypatch.setattr(tf.distribute.cluster_resolver, "TPUClusterResolver",
                        FakeResolver)
    monkeypatch.setattr(tf.config, "list_logical_devices", lambda: [
        tf.config.LogicalDevice(f"/device:{kind}:0", kind) for kind in devices])


def _tpu_set_up(tpu, folder):
    """Run train_tpu.py with --tpu `tpu`: here its TPU set-up fails before any training."""
    train_tpu.main(["--tpu", tpu, "--output-dir", str(folder)])


def test_a_tpu_that_cannot_be_resolved_is_not_found(monkeypatch, no_tpu_env, tmp_path):
    def init(tpu):
        raise ValueError("Please provide a TPU Name to connect to.")

    _fake_resolver(monkeypatch, init)
    with pytest.raises(UserError) as error:
        _tpu_set_up("my-tpu", tmp_path)
    assert str(error.value) == (
        "no TPU found (Please provide a TPU Name to connect to.); pass --tpu NAME, "
        "or use --rehearse 8 to rehearse on 8 logical CPU devices")


def test_a_tpu_lookup_that_hangs_is_given_up(monkeypatch, no_tpu_env, tmp_path):
    answer = threading.Event()  # never set until the test is over
    _fake_resolver(monkeypatch, lambda tpu: answer.wait())
    monkeypatch.setattr(tpu, "LOOKUP_TIMEOUT_S", 0.01)
    try:
        with pytest.raises(UserError) as error:
            _tpu_set_up("my-tpu", tmp_path)
    finally:
        answer.set()  # let the abandoned lookup thread end
    message = str(error.value)
    assert message.startswith("gave up looking for the TPU after 0.01 s waiting for Google "
                              "Cloud's metadata server")
    assert "--tpu grpc://" in message and "--rehearse 8" in message


def test_a_tpu_in_use_is_found_but_not_initialised(monkeypatch, no_tpu_env, tmp_path):
    _fake_resolver(monkeypatch, lambda tpu: None)
    monkeypatch.setattr(tf.config, "experimental_connect_to_cluster", lambda r: None)

    def initialize_tpu_system(resolver):
        raise tf.errors.AbortedError(
            None, None, "The TPU is already in use by process with pid 4242. Not "
            "attempting to load libtpu.so in this process.\nmore detail")

    monkeypatch.setattr(tf.tpu.experimental, "initialize_tpu_system",
                        initialize_tpu_system)
    with pytest.raises(UserError) as error:
        _tpu_set_up("local", tmp_path)
    assert str(error.value) == (
        "the TPU was found but could not be connected or initialised (TensorFlow said: The "
        "TPU is already in use by process with pid 4242. Not attempting to load libtpu.so in "
        "this process.); end the process that holds it, or use --rehearse 8 to rehearse on "
        "8 logical CPU devices")


def test_a_tpu_that_cannot_be_initialised_names_the_causes_a_user_can_act_on(
        monkeypatch, no_tpu_env, tmp_path):
    _fake_resolver(monkeypatch, lambda tpu: None)
    monkeypatch.setattr(tf.config, "experimental_connect_to_cluster", lambda r: None)
    # what TensorFlow answers where libtpu never loaded: a plain tensorflow
    # build on Colab's v2-8 (googlecolab/colabtools#5203, tensorflow/tensorflow#96203)

    def initialize_tpu_system(resolver):
        raise tf.errors.InvalidArgumentError(
            None, None, "No OpKernel was registered to support Op 'ConfigureDistributedTPU' "
            "used by {{node ConfigureDistributedTPU}} with these attrs: []\nRegistered "
            "devices: [CPU]")
    monkeypatch.setattr(tf.tpu.experimental, "initialize_tpu_system", initialize_tpu_system)
    with pytest.raises(UserError) as error:
        _tpu_set_up("local", tmp_path)
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith("the TPU was found but could not be connected or initialised "
                              "(TensorFlow said: No OpKernel was registered to support Op "
                              "'ConfigureDistributedTPU'")
    assert "; likely causes: " in message and "a libtpu that does not match this TensorFlow " \
           "(pip install -r requirements-tpu.txt installs the pair); another process " \
           "holding the chips (a second notebook, an earlier run: end it or restart the " \
           "runtime); or use --rehearse 8" in message


# What tensorflow-tpu 2.20.0 with libtpu 0.0.18 raised from initialize_tpu_system on a
# host without chips and without PJRT (docs/tpus.md): the frame first, the cause last
GRAPH_ERROR = ("Graph execution error:\n\nDetected at node disconnect_tpu_host/_1 defined at "
               "(most recent call last):\n<stack traces unavailable>\nRET_CHECK failure "
               "(learning/45eac/google/xla/tpu_node_interfaces.cc:432) *platform \n\t "
               "[[{{node disconnect_tpu_host/_1}}]] [Op:__inference__tpu_init_fn_4]")
# the same frame where the node's stack is known (error_interpolation.py)
GRAPH_ERROR_WITH_STACK = (
    "Graph execution error:\n\nDetected at node 'ConfigureDistributedTPU' defined at (most "
    "recent call last):\n  File \"train_tpu.py\", line 38, in main\n    "
    "tf.tpu.experimental.initialize_tpu_system(tpu)\nNode: 'ConfigureDistributedTPU'\n"
    "No TPU platform found.")


@pytest.mark.parametrize("text, cause", [
    (GRAPH_ERROR, "RET_CHECK failure (learning/45eac/google/xla/tpu_node_interfaces.cc:432) "
                  "*platform"),
    (GRAPH_ERROR_WITH_STACK, "No TPU platform found."),
    ("The TPU is already in use by process with pid 4242.\nmore detail",
     "The TPU is already in use by process with pid 4242."),
    ("Graph execution error:\n\nDetected at node X defined at (most recent call last):",
     "Graph execution error:"),  # nothing but the frame: its first line, as before
    ("", "InternalError"),
])
def test_the_cause_is_told_from_tensorflows_frame_around_it(text, cause):
    assert tpu.cause(tf.errors.InternalError(None, None, text)) == cause


def test_a_tpu_that_fails_inside_its_graph_gives_the_cause_in_one_line(
        monkeypatch, no_tpu_env, tmp_path):
    _fake_resolver(monkeypatch, lambda tpu: None)
    monkeypatch.setattr(tf.config, "experimental_connect_to_cluster", lambda r: None)

    def initialize_tpu_system(resolver):
        raise tf.errors.InternalError(None, None, GRAPH_ERROR)

    monkeypatch.setattr(tf.tpu.experimental, "initialize_tpu_system", initialize_tpu_system)
    with pytest.raises(UserError) as error:
        _tpu_set_up("local", tmp_path)
    message = str(error.value)
    assert "\n" not in message and "Graph execution error" not in message
    assert message.startswith("the TPU was found but could not be connected or initialised "
                              "(TensorFlow said: RET_CHECK failure (learning/45eac/google/xla/"
                              "tpu_node_interfaces.cc:432) *platform); likely causes")


def test_no_tpu_device_is_said_before_anything_initialises_the_tpu(monkeypatch, no_tpu_env,
                                                                  tmp_path):
    # the devices tensorflow-tpu 2.20.0 listed on a host without chips, with libtpu loaded,
    # PJRT or not; with PJRT, initialize_tpu_system then died of SIGSEGV (docs/tpus.md)
    _fake_resolver(monkeypatch, lambda tpu: None, devices=("CPU", "TPU_SYSTEM"))
    monkeypatch.setattr(tf.config, "experimental_connect_to_cluster",
                        lambda r: pytest.fail("connected without a TPU device"))
    monkeypatch.setattr(tf.tpu.experimental, "initialize_tpu_system",
                        lambda r: pytest.fail("initialised without a TPU device"))
    with pytest.raises(UserError) as error:
        _tpu_set_up("local", tmp_path)
    message = str(error.value)
    assert message.startswith("TensorFlow lists no TPU device on this machine (only CPU, "
                              "TPU_SYSTEM), so its TPU cannot be initialised; likely causes: ")
    assert message.endswith("or use --rehearse 8 to rehearse on 8 logical CPU devices")


def test_no_device_check_for_a_tpu_at_an_address(monkeypatch):
    """A TPU Node's devices are remote: what answers at its address is the check."""
    class Remote:
        def __init__(self, tpu=None):
            pass

        def master(self):
            return "grpc://10.0.0.2:8470"

    with socket.create_server(("127.0.0.1", 0)) as listening:  # something answers there
        address = f"grpc://127.0.0.1:{listening.getsockname()[1]}"
        Remote.master = lambda self: address
        monkeypatch.setattr(tf.distribute.cluster_resolver, "TPUClusterResolver", Remote)
        monkeypatch.setattr(tf.config, "list_logical_devices",
                            lambda: pytest.fail("devices listed"))
        assert isinstance(tpu.find_tpu(address), Remote)


def _machine(root, device_file):
    """A TPU VM without a readable /sys, as in a container: one chip device file."""
    (root / device_file).parent.mkdir(parents=True, exist_ok=True)
    (root / device_file).write_text("")
    return root


@pytest.mark.parametrize("device_file, asked", [
    ("dev/vfio/3", "local"), ("dev/accel2", "local"), ("dev/vfio/vfio", None)])
def test_a_tpu_vm_is_local_whatever_chip_device_it_shows(monkeypatch, no_tpu_env, tmp_path,
                                                          device_file, asked):
    # Colab's and Kaggle's TPU VMs set nothing TPUClusterResolver() reads
    monkeypatch.setenv(hosts.ROOT_ENV, str(_machine(tmp_path, device_file)))
    names = []
    _fake_resolver(monkeypatch, names.append)
    tpu.find_tpu(None)
    tpu.find_tpu("my-tpu")  # --tpu wins
    assert names == [asked, "my-tpu"]


def test_a_tpu_that_cannot_be_reached_says_so(monkeypatch, no_tpu_env, tmp_path):
    _fake_resolver(monkeypatch, lambda tpu: None)

    def connect(resolver):
        raise tf.errors.UnavailableError(None, None, "failed to connect to all addresses")

    monkeypatch.setattr(tf.config, "experimental_connect_to_cluster", connect)
    with pytest.raises(UserError, match=r"^the TPU was found but could not be connected or "
                                        r"initialised \(TensorFlow said: failed to connect"):
        _tpu_set_up("local", tmp_path)


@pytest.mark.parametrize("chips, said", [
    (0, "where the TPU should be; on a TPU VM pass --tpu local, else check its address"),
    # TPU_NAME naming the VM itself: TPUClusterResolver gives grpc://<its ip>:8470,
    # where nothing listens; this machine's chips are local devices
    (4, "where the TPU should be; this machine has TPU chips: on a TPU VM pass --tpu local"),
])
def test_a_tpu_address_where_nothing_answers_is_one_line(monkeypatch, tmp_path, chips, said):
    import re

    with socket.create_server(("127.0.0.1", 0)) as probe:
        closed = probe.getsockname()[1]
    address = f"grpc://127.0.0.1:{closed}"
    monkeypatch.setattr(hosts, "detect", lambda: hosts.Host("local", 0, chips, "v4"))
    monkeypatch.setattr(tf.config, "experimental_connect_to_cluster", None)  # never reached
    with pytest.raises(UserError, match=f"^nothing answers at {address}, {re.escape(said)}"):
        _tpu_set_up(address, tmp_path)


def test_a_tpu_at_an_ipv6_address_is_one_line_that_names_it(tmp_path):
    with pytest.raises(UserError, match=r"^TensorFlow's TPUClusterResolver cannot take the "
                                        r"IPv6 address grpc://\[::1\]:8470; give"):
        train_tpu.main(["--tpu", "grpc://[::1]:8470", "--output-dir", str(tmp_path)])


class _TpuNode:
    """TPUStrategy on a TPU Node, as far as cli.plan looks: 8 cores behind a grpc:// address."""

    num_replicas_in_sync = 8

    def __init__(self, address="grpc://10.0.0.2:8470"):
        self.cluster_resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=address)


@pytest.mark.parametrize("flags, named", [
    (["--backup-dir", "backup"], "--backup-dir backup"),
    (["--logdir", "logs"], "--logdir logs"),
    (["--profile-steps", "1,2"], "--logdir logs"),
    (["--data-source", "tfrecord", "--data-dir", "records"], "--data-dir records")])
def test_a_tpu_node_refuses_local_folders_its_host_cannot_see(flags, named, tmp_path,
                                                              monkeypatch):
    from pyimagesearch import cli

    monkeypatch.chdir(tmp_path)
    args = cli.parse_args("tpu", "", flags)
    with pytest.raises(UserError, match=rf"^a TPU Node \(grpc://10\.0\.0\.2:8470\) reads and "
                                        rf"writes through its own host.*{named} must be in a "
                                        r"bucket \(gs://\.\.\.\)"):
        cli.plan("tpu", args, _TpuNode())
    buckets = cli.parse_args("tpu", "", ["--backup-dir", "ram://b/backup", "--logdir",
                                         "ram://b/logs", "--data-source", "sample",
                                         "--batch-size", "8"])
    assert cli.plan("tpu", buckets, _TpuNode()).is_chief  # buckets: no complaint


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
