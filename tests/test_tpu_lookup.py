"""tpu_lookup.py and train_tpu.py's TPU set-up: a TPU that is not found, hangs, is in use, cannot be reached or initialised.

No TPU is needed: the TPU resolver and TPU calls are replaced by fakes that
fail the way TensorFlow does, and a closed local port stands in for a TPU
address where nothing answers.
"""
import threading

import pytest
import tensorflow as tf

import train_tpu

from pyimagesearch.runtime import this_process
from pyimagesearch import tpu_lookup
from pyimagesearch.errors import UserError


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
    monkeypatch.setattr(tpu_lookup, "local_devices", lambda: [
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
    monkeypatch.setattr(tpu_lookup, "TPU_LOOKUP_TIMEOUT_S", 0.01)
    try:
        with pytest.raises(UserError) as error:
            _tpu_set_up("my-tpu", tmp_path)
    finally:
        answer.set()  # let the abandoned lookup thread end
    message = str(error.value)
    assert message.startswith("gave up looking for TPU 'my-tpu' after 0.01 s waiting "
                              "for Google Cloud's metadata server")
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
        "the TPU on this machine was found but could not be initialised (TensorFlow "
        "said: The TPU is already in use by process with pid 4242. Not attempting to "
        "load libtpu.so in this process.); end the process that holds it, or use "
        "--rehearse 8 to rehearse on 8 logical CPU devices")


@pytest.mark.parametrize("prepared, runtime", [
    ("PJRT through /site/libtpu/libtpu.so (libtpu 0.0.18)",
     "TensorFlow's PJRT runtime, set up as PJRT through /site/libtpu/libtpu.so (libtpu 0.0.18)"),
    ("libtpu is not installed: pip install -r requirements-tpu.txt",
     "libtpu is not installed, and this TPU needs it"),
    ("no TPU that needs PJRT", "on a TPU v5e, v5p or v6e, NEXT_PLUGGABLE_DEVICE_USE_C_API=true "
     "and TF_PLUGGABLE_DEVICE_LIBRARY_PATH=<libtpu's library> set before TensorFlow is "
     "imported (train_tpu.py does it; on v2-v4 PYIMAGESEARCH_TPU_RUNTIME=pjrt asks for it)"),
])
def test_a_tpu_that_cannot_be_initialised_names_the_causes_a_user_can_act_on(
        monkeypatch, no_tpu_env, tmp_path, prepared, runtime):

    monkeypatch.setattr(this_process, "tpu_runtime", prepared)
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
    assert message.startswith("the TPU on this machine was found but could not be initialised "
                              "(TensorFlow said: No OpKernel was registered to support Op "
                              "'ConfigureDistributedTPU'")
    assert f"likely causes: {runtime}; a libtpu that does not match this TensorFlow " \
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
    assert tpu_lookup.tensorflow_cause(tf.errors.InternalError(None, None, text)) == cause


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
    assert message.startswith("the TPU on this machine was found but could not be initialised "
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

    monkeypatch.setattr(tpu_lookup, "answers", lambda address, timeout_s: True)
    monkeypatch.setattr(tpu_lookup, "local_devices", lambda: pytest.fail("devices listed"))
    assert isinstance(tpu_lookup.find_tpu(Remote, "grpc://10.0.0.2:8470"), Remote)


def _machine(root, device_file):
    """A TPU VM without a readable /sys, as in a container: one chip device file."""
    (root / device_file).parent.mkdir(parents=True, exist_ok=True)
    (root / device_file).write_text("")
    return root


@pytest.mark.parametrize("device_file", ["dev/vfio/3", "dev/accel2", "dev/vfio/0",
                                         "dev/accel0"])
def test_a_tpu_vm_is_local_whatever_chip_device_it_shows(monkeypatch, no_tpu_env, tmp_path,
                                                          device_file):
    from pyimagesearch import runtime as host

    monkeypatch.setenv(host.ROOT_ENV, str(_machine(tmp_path, device_file)))
    asked = []
    assert tpu_lookup.tpu_resolver(_colab_resolver(asked), None) == "local"
    assert asked == ["local"]
    assert tpu_lookup.tpu_resolver(_colab_resolver(asked), "my-tpu") == "my-tpu"  # --tpu wins


def test_without_chips_the_plain_lookup_decides(monkeypatch, no_tpu_env, tmp_path):
    from pyimagesearch import runtime as host

    monkeypatch.setenv(host.ROOT_ENV, str(_machine(tmp_path, "dev/vfio/vfio")))  # no chip
    asked = []
    with pytest.raises(ValueError, match="Please provide a TPU Name"):
        tpu_lookup.tpu_resolver(_colab_resolver(asked), None)
    assert asked == [None]


def _colab_resolver(asked):
    """TPUClusterResolver as on Colab's and Kaggle's TPU VMs: no name, no TPU; records calls."""
    def resolver(tpu=None):
        asked.append(tpu)
        if tpu is None:
            raise ValueError("Please provide a TPU Name to connect to.")
        return tpu
    return resolver


def test_a_tpu_that_cannot_be_reached_says_so(monkeypatch, no_tpu_env, tmp_path):
    _fake_resolver(monkeypatch, lambda tpu: None)

    def connect(resolver):
        raise tf.errors.UnavailableError(None, None, "failed to connect to all addresses")

    monkeypatch.setattr(tf.config, "experimental_connect_to_cluster", connect)
    with pytest.raises(UserError, match=r"^could not connect to TPU 'grpc://10\.0\.0\.2"
                                        r":8470' \(TensorFlow said: failed to connect"):
        _tpu_set_up("grpc://10.0.0.2:8470", tmp_path)


@pytest.mark.parametrize("chips, said", [
    (0, "where the TPU should be; on a TPU VM pass --tpu local, else check its address"),
    # TPU_NAME naming the VM itself: TPUClusterResolver gives grpc://<its ip>:8470,
    # where nothing listens; this machine's chips are local devices
    (4, "where the TPU should be; this machine has TPU chips: on a TPU VM pass --tpu local"),
])
def test_a_tpu_address_where_nothing_answers_is_one_line(monkeypatch, tmp_path, chips, said):
    import re
    import socket

    from pyimagesearch import runtime as host

    with socket.create_server(("127.0.0.1", 0)) as probe:
        closed = probe.getsockname()[1]
    address = f"grpc://127.0.0.1:{closed}"
    resolver = tf.distribute.cluster_resolver.TPUClusterResolver
    monkeypatch.setattr(tpu_lookup, "tpu_resolver", lambda found, tpu: resolver(tpu=address))
    monkeypatch.setattr(tpu_lookup, "detect", lambda: host.Host("local", 0, chips, "v4"))
    monkeypatch.setattr(tf.config, "experimental_connect_to_cluster", None)  # never reached
    with pytest.raises(UserError, match=f"^nothing answers at {address}, {re.escape(said)}"):
        _tpu_set_up(address, tmp_path)


def test_a_tpu_at_an_ipv6_address_is_one_line_that_names_it(tmp_path):
    with pytest.raises(UserError, match=r"^TensorFlow's TPUClusterResolver cannot take the "
                                        r"IPv6 address grpc://\[::1\]:8470; give"):
        train_tpu.main(["--tpu", "grpc://[::1]:8470", "--output-dir", str(tmp_path)])
