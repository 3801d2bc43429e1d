"""TF_CONFIG as platforms set it, and workers that disagree: real processes started by hand.

Each cluster runs inside a network namespace of its own (`unshare --net`,
loopback only), so TensorFlow's servers, which listen on every interface,
are reachable from this machine alone. An empty TF_CONFIG is no cluster, and
the wait for peers finds them on IPv6 loopback as on IPv4.
"""
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys

import keras
import numpy as np
import pytest

import train_cpu
import train_gpu
from conftest import output_files, outputs_name

from pyimagesearch import cluster as cluster_module
from pyimagesearch import workarounds
from pyimagesearch.cluster import Cluster, read_tf_config, wait_for_peers
from pyimagesearch.errors import PeerLost, UserError

ONE_SGD_STEP = ["--epochs", "1", "--steps-per-epoch", "1", "--optimizer", "sgd",
                "--learning-rate", "0.5", "--data-source", "sample"]
# what train_gpu.py --rehearse 1 names the outputs and logs of ONE_SGD_STEP:
# gpu_rehearsal_epochs-1_steps-per-epoch-1_data-source-sample_optimizer-sgd_learning-rate-0.5
ONE_SGD_REHEARSAL = outputs_name("gpu", [*ONE_SGD_STEP, "--rehearse", "1"])

# Runs inside the namespace: start one process per task with its TF_CONFIG,
# wait for all (bounded), print {task: [status, output]} as JSON. A task's
# first argument may be an object of environment variables for it; the value
# "{metadata}" there is the address of a stand-in for Google Cloud's metadata
# server, which the driver serves on loopback (it answers every question).
DRIVER = r"""
import http.server, json, os, socket, subprocess, sys, threading
tasks = json.loads(sys.argv[1])  # [[type, {env}?, script args...], ...]
timeout = float(sys.argv[2])

class Metadata(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.send_header("Metadata-Flavor", "Google")
        self.end_headers()
        self.wfile.write(b"a-google-cloud-vm")

    def log_message(self, *args):
        pass

metadata = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Metadata)
threading.Thread(target=metadata.serve_forever, daemon=True).start()
served = f"127.0.0.1:{metadata.server_address[1]}"
ports = []
for _ in tasks:
    probe = socket.socket(); probe.bind(("127.0.0.1", 0)); ports.append(probe)
addresses = [f"127.0.0.1:{p.getsockname()[1]}" for p in ports]
for p in ports:
    p.close()
cluster, counts = {}, {}
for (kind, *_), address in zip(tasks, addresses):
    if kind != "evaluator":
        cluster.setdefault(kind, []).append(address)
processes = []
for kind, *args in tasks:
    index = counts.get(kind, 0)
    counts[kind] = index + 1
    extra = args.pop(0) if args and isinstance(args[0], dict) else {}
    if not args:
        continue  # in the cluster, never started
    env = {**os.environ, "TF_CONFIG": json.dumps(
        {"cluster": cluster, "task": {"type": kind, "index": index}}),
        **{key: value.replace("{metadata}", served) for key, value in extra.items()}}
    processes.append(subprocess.Popen([sys.executable, *args], env=env, text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
results = []
for process in processes:
    try:
        out, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        for other in processes:
            other.kill()
        out, _ = process.communicate()
        out += "\n[driver] timed out"
    results.append([process.returncode, out])
print(json.dumps(results))
"""


def _cluster(repo, tasks, timeout=120):
    """Run `tasks` ([type, script, args...]) as one cluster; [(status, output)] per task.

    A task given as [type] alone is in the cluster but never started.
    """
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        pytest.skip("needs unshare and ip for a loopback-only network namespace")
    command = ["unshare", "--net", "sh", "-c", 'ip link set lo up && exec "$@"', "sh",
               sys.executable, "-c", DRIVER, json.dumps(tasks), str(timeout)]
    if os.geteuid() != 0:
        command[1:1] = ["--map-root-user"]
    done = subprocess.run(command, cwd=repo, capture_output=True, text=True,
                          timeout=timeout + 60)
    assert done.returncode == 0, done.stderr[-2000:]
    return [tuple(result) for result in json.loads(done.stdout)]


def _weights(path):
    return [w.numpy() for w in keras.saving.load_model(path).weights]


@pytest.mark.slow  # the default suite's budget (docs/development.md); CI runs it
def test_a_chief_and_a_worker_started_by_hand_equal_one_process(repo, tmp_path):
    # Vertex AI's worker pools 0 and 1: a chief and a worker. The worker is
    # given folders of its own, so anything it wrote would show.
    flags = ["train_gpu.py", *ONE_SGD_STEP, "--rehearse", "1"]
    (chief, chief_out), (worker, worker_out) = _cluster(repo, [
        ["chief", *flags, "--output-dir", str(tmp_path / "cluster"),
         "--backup-dir", str(tmp_path / "backup"), "--logdir", str(tmp_path / "logs")],
        ["worker", *flags, "--output-dir", str(tmp_path / "worker"),
         "--backup-dir", str(tmp_path / "worker-backup"),
         "--logdir", str(tmp_path / "worker-logs")]])
    assert chief == worker == 0, chief_out[-2000:] + worker_out[-2000:]
    name = ONE_SGD_REHEARSAL
    record = json.loads((tmp_path / "cluster" / f"{name}.json").read_text())
    assert (record["workers"], record["global_batch_size"]) == (2, 256)
    assert record["communication"] == "AUTO"  # a rehearsal: NCCL needs GPUs
    assert sorted(os.listdir(tmp_path / "cluster")) == output_files(name)
    assert os.listdir(tmp_path / "logs") == [name]
    assert (tmp_path / "logs" / name).is_dir()
    assert not (tmp_path / "backup").exists()  # the finished run deleted it
    # only the chief writes: outputs, backups and logs
    for folder in ("worker", "worker-backup", "worker-logs"):
        assert not (tmp_path / folder).exists(), folder
    assert "worker 0 done; the chief writes the outputs" in worker_out
    one = ONE_SGD_STEP + ["--batch-size", "256", "--output-dir", str(tmp_path / "one")]
    train_cpu.main(one)
    for a, b in zip(_weights(tmp_path / "one" / f"{outputs_name('cpu', one)}.keras"),
                    _weights(tmp_path / "cluster" / f"{name}.keras")):
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-6)


def test_a_cluster_of_one_and_an_evaluator(in_process, monkeypatch, tmp_path):
    # TF_CONFIG as Vertex AI sets it for one machine, then for an evaluator
    # (its worker pool 3): what the scripts make of it needs no second process
    flags = [*ONE_SGD_STEP, "--rehearse", "1"]
    runs = []
    for task, folder in (("worker", "alone"), ("evaluator", "evaluator")):
        monkeypatch.setenv("TF_CONFIG", json.dumps({
            "cluster": {"worker": ["127.0.0.1:1"]}, "task": {"type": task, "index": 0}}))
        done = in_process("train_gpu.py", *flags, "--output-dir", str(tmp_path / folder))
        runs.append((done.returncode, done.stdout + done.stderr))
    (alone, alone_out), (evaluator, evaluator_out) = runs
    assert alone == 0, alone_out[-2000:]
    assert "cluster of 1 task" in alone_out
    record = tmp_path / "alone" / f"{ONE_SGD_REHEARSAL}.json"
    assert json.loads(record.read_text())["workers"] == 1
    assert evaluator == 0, evaluator_out[-2000:]
    assert "no evaluator is needed" in evaluator_out
    assert not (tmp_path / "evaluator").exists()


def test_an_empty_tf_config_is_no_cluster(tmp_path, monkeypatch):
    monkeypatch.setenv("TF_CONFIG", "")
    args = ["--epochs", "1", "--steps-per-epoch", "3", "--batch-size", "32", "--data-source",
            "sample", "--rehearse", "1", "--output-dir", str(tmp_path)]
    train_gpu.main(args)
    assert (tmp_path / f"{outputs_name('gpu', args)}.json").exists()


@pytest.mark.slow
def test_master_is_the_chief(repo, tmp_path):
    flags = ["train_gpu.py", *ONE_SGD_STEP, "--rehearse", "1"]
    results = _cluster(repo, [["master", *flags, "--output-dir", str(tmp_path / "master")],
                              ["worker", *flags, "--output-dir", str(tmp_path / "worker")]])
    assert [status for status, _ in results] == [0, 0], results[0][1][-2000:]
    assert (tmp_path / "master" / f"{ONE_SGD_REHEARSAL}.json").exists()
    assert not (tmp_path / "worker").exists()


@pytest.mark.tf_versions
@pytest.mark.slow  # two workers and a stand-in metadata server (about 14 s)
def test_workers_that_disagree_on_the_preemption_handler_all_stop_with_one_line(repo,
                                                                              tmp_path):
    # the chief finds Google Cloud's metadata server (a stand-in: a CPU VM
    # there, where TensorFlow's handler does nothing), the worker does not;
    # building the handler on one alone would leave the other in a collective
    flags = ["train_gpu.py", *ONE_SGD_STEP, "--rehearse", "1",
             "--backup-dir", str(tmp_path / "backup"), "--output-dir", str(tmp_path)]
    results = _cluster(repo, [["chief", {"GCE_METADATA_IP": "{metadata}"}, *flags],
                              ["worker", *flags]], timeout=120)
    for status, output in results:
        assert status == 2, output[-2000:]
        errors = [line for line in output.splitlines() if ": error: " in line]
        assert len(errors) == 1, output[-2000:]
        assert "the workers disagree: TensorFlow's preemption handler is " in errors[0]
        assert any(said in errors[0] for said in (
            "'does nothing (Google Cloud CPU or TPU VM)' on chief 0 but 'acts' on worker 0",
            "'acts' on worker 0 but 'does nothing (Google Cloud CPU or TPU VM)' on chief 0"))
        assert "Traceback" not in output
    assert not list(tmp_path.glob("*.json"))  # no record, of any name


# slow; the default suite checks the agreement with a stand-in store (test_multi_worker.py)
@pytest.mark.parametrize("difference, named", [
    pytest.param(["--epochs", "2"], "epochs is 1 on chief 0 but 2 on worker 0",
                 marks=pytest.mark.slow),
    pytest.param(["--rehearse", "2"], "devices per worker is 1", marks=pytest.mark.slow),
])
@pytest.mark.tf_versions
def test_workers_that_disagree_all_stop_with_one_line(repo, tmp_path, difference, named):
    base = ["train_gpu.py", "--rehearse", "1", "--epochs", "1", "--steps-per-epoch", "1",
            "--data-source", "sample", "--output-dir", str(tmp_path)]
    results = _cluster(repo, [["chief", *base], ["worker", *base, *difference]], timeout=120)
    for status, output in results:
        assert status == 2, output[-2000:]
        errors = [line for line in output.splitlines() if ": error: " in line]
        assert len(errors) == 1 and "the workers disagree" in errors[0], output[-2000:]
        assert "Traceback" not in output and "[driver] timed out" not in output
    assert named in results[0][1]
    assert not list(tmp_path.glob("*.json"))  # no record, of any name


def test_train_cpu_refuses_a_cluster(in_process, monkeypatch, tmp_path):
    config = {"cluster": {"worker": ["127.0.0.1:1", "127.0.0.1:2"]},
              "task": {"type": "worker", "index": 0}}
    monkeypatch.setenv("TF_CONFIG", json.dumps(config))
    result = in_process("train_cpu.py", "--output-dir", str(tmp_path))
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "run train_gpu.py on every machine" in lines[0], result.stderr
    assert os.listdir(tmp_path) == []


@pytest.mark.slow
def test_a_worker_that_never_starts_is_named_within_the_startup_timeout(repo, tmp_path):
    flags = ["train_gpu.py", *ONE_SGD_STEP, "--rehearse", "1", "--startup-timeout", "10",
             "--output-dir", str(tmp_path)]
    [(status, output)] = _cluster(repo, [["chief", *flags], ["worker"]], timeout=100)
    assert status == 138, output[-2000:]  # a restart may find the worker up
    errors = [line for line in output.splitlines() if ": error: " in line]
    assert len(errors) == 1 and "waiting for worker 0 (127.0.0.1:" in errors[0], output
    assert "Traceback" not in output and "[driver] timed out" not in output
    assert os.listdir(tmp_path) == []


def _free_ports(count):
    sockets = [socket.create_server(("127.0.0.1", 0)) for _ in range(count)]
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def _lonely(port, peer_port):
    """The chief of a two-task cluster, as read from TF_CONFIG."""
    return Cluster(2, "chief", 0, has_chief=True, address=f"127.0.0.1:{port}",
                   peers=(("worker 0", f"127.0.0.1:{peer_port}"),))


def test_the_wait_for_peers_names_who_is_missing_and_frees_its_port():
    port, peer = _free_ports(2)
    with pytest.raises(PeerLost, match=rf"^chief 0 gave up after 0.3 s waiting for worker 0 "
                                       rf"\(127.0.0.1:{peer}\) to start"):
        wait_for_peers(_lonely(port, peer), 0.3, poll_s=0.05)
    socket.create_server(("127.0.0.1", port)).close()  # let go for TensorFlow's server


def test_the_wait_for_peers_ends_when_every_peer_listens():
    port, peer = _free_ports(2)
    with socket.create_server(("127.0.0.1", peer)):
        wait_for_peers(_lonely(port, peer), 0.3, poll_s=0.05)


def test_a_cluster_on_ipv6_loopback_waits_for_its_peer_like_one_on_ipv4():
    if not socket.has_ipv6:
        pytest.skip("no IPv6 here")
    probes = [socket.create_server(("::1", 0), family=socket.AF_INET6) for _ in range(2)]
    port, peer = (probe.getsockname()[1] for probe in probes)
    for probe in probes:
        probe.close()
    config = {"cluster": {"worker": [f"[::1]:{port}", f"[::1]:{peer}"]},
              "task": {"type": "worker", "index": 0}}
    cluster = read_tf_config({"TF_CONFIG": json.dumps(config)})
    assert isinstance(cluster, Cluster) and cluster.address == f"[::1]:{port}"
    with socket.create_server(("::1", peer), family=socket.AF_INET6):
        wait_for_peers(cluster, 2.0, poll_s=0.05)  # listens on [::1] itself, finds the peer


def test_a_port_in_use_is_one_line():
    port, peer = _free_ports(2)
    with socket.create_server(("127.0.0.1", port)), pytest.raises(
            UserError, match=rf"chief 0 cannot listen on port {port}, its TF_CONFIG address"):
        wait_for_peers(_lonely(port, peer), 0.3)


def test_a_port_held_on_another_loopback_address_is_one_line():
    # TensorFlow's server listens on every address: a process holding the port
    # on 127.0.0.2 stopped it with "Could not start gRPC server", a traceback
    port, peer = _free_ports(2)
    with socket.create_server(("127.0.0.2", port)), pytest.raises(
            UserError, match=rf"chief 0 cannot listen on port {port}, its TF_CONFIG address "
                             rf"127.0.0.1:{port} \(Address already in use\); another process"):
        wait_for_peers(_lonely(port, peer), 0.3)


@pytest.mark.parametrize("sig, status, said", [
    (signal.SIGTERM, 143, "stopped by SIGTERM"),
    pytest.param(signal.SIGINT, 130, "interrupted", marks=pytest.mark.slow)])
def test_sigterm_and_ctrl_c_stop_a_worker_waiting_for_its_peers(repo, tmp_path, sig, status,
                                                               said):
    # TensorFlow's own wait ignores both: the project's comes first
    port, peer = _free_ports(2)
    config = {"cluster": {"chief": [f"127.0.0.1:{port}"], "worker": [f"127.0.0.1:{peer}"]},
              "task": {"type": "chief", "index": 0}}
    process = subprocess.Popen(
        [sys.executable, "train_gpu.py", *ONE_SGD_STEP, "--rehearse", "1",
         "--output-dir", str(tmp_path)], cwd=repo, text=True, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, env={**os.environ, "TF_CONFIG": json.dumps(config)})
    try:
        for line in process.stdout:
            if "is waiting for worker 0 to start (up to 300 s)" in line:
                break
        process.send_signal(sig)
        _, err = process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == status
    lines = err.strip().splitlines()
    assert len(lines) == 1 and said in lines[0], err
    assert os.listdir(tmp_path) == []


_TWO_WORKERS = Cluster(workers=2, task_type="worker", task_index=1, has_chief=False)


@pytest.mark.parametrize("module, name, call", [
    ("tensorflow.python.distribute.multi_worker_util", "coordination_leader",
     lambda: workarounds.bound_cluster_start(1)),
    ("tensorflow.python.distribute.failure_handling.failure_handling_util",
     "detect_platform", lambda: workarounds.preemption_handler_acts()),
    ("tensorflow.python.eager.context.Context", "set_config_key_value",
     lambda: cluster_module.check_workers_agree(_TWO_WORKERS, {"epochs": 1})),
    ("tensorflow.python.eager.context.Context", "get_config_key_value",
     lambda: cluster_module.shared_decision(_TWO_WORKERS, "network", dict)),
])
def test_a_private_tensorflow_api_that_is_gone_is_one_line_naming_the_version(
        monkeypatch, module, name, call):
    import importlib

    import tensorflow as tf

    owner, _, attribute = module.rpartition(".")
    try:
        target = importlib.import_module(module)
    except ImportError:  # a class: its module, then the class
        target = getattr(importlib.import_module(owner), attribute)
    monkeypatch.delattr(target, name)
    with pytest.raises(UserError, match=rf"^TensorFlow {re.escape(tf.__version__)} lacks .*"
                                        r"install TensorFlow 2\.19, 2\.20 or 2\.21"):
        call()


def test_a_preemption_handler_without_its_stop_methods_is_left_to_its_own_end():
    workarounds.stop_preemption_handler(object())  # nothing to call: no error


# --- a Kubernetes JobSet: TF_CONFIG built from the pod's index -----------------------

JOBSET_POD = {"JOBSET_NAME": "autoencoder", "REPLICATED_JOB_NAME": "worker", "REPLICAS": "1",
              "JOB_INDEX": "0", "WORKERS": "2"}


def _pod(index, **more):
    return {**JOBSET_POD, "JOB_COMPLETION_INDEX": str(index), **more}


def test_a_jobset_pod_builds_the_tf_config_of_its_index():
    from pyimagesearch import cluster as jobset

    built = [json.loads(jobset.tf_config(_pod(i))) for i in range(2)]
    hosts = ["autoencoder-worker-0-0.autoencoder:2222", "autoencoder-worker-0-1.autoencoder:2222"]
    assert [spec["cluster"] for spec in built] == [{"worker": hosts}] * 2
    assert [spec["task"] for spec in built] == [{"type": "worker", "index": i} for i in (0, 1)]
    last = json.loads(jobset.tf_config(_pod(0, WORKERS="1", TF_PORT="65535", JOB_INDEX="3",
                                            REPLICAS="4", JOBSET_SUBDOMAIN="net")))
    assert last["cluster"] == {"worker": [f"autoencoder-worker-{job}-0.net:65535"
                                          for job in range(4)]}
    assert last["task"]["index"] == 3
    # read_tf_config builds it only where TF_CONFIG is not set: one given wins
    environ = _pod(1)
    cluster = read_tf_config(environ)
    assert (cluster.workers, cluster.task_index, cluster.is_chief) == (2, 1, False)
    assert json.loads(environ["TF_CONFIG"])["task"]["index"] == 1
    given = _pod(1, TF_CONFIG=json.dumps({"cluster": {"worker": ["a:1", "b:2", "c:3"]},
                                          "task": {"type": "worker", "index": 2}}))
    assert read_tf_config(given).workers == 3
    assert read_tf_config({"JOB_COMPLETION_INDEX": "0"}) is None  # an Indexed Job, no JobSet


@pytest.mark.parametrize("replicas, workers", [(2, 1), (2, 2), (3, 2)])
def test_the_pods_of_every_replica_form_one_cluster(replicas, workers):
    from pyimagesearch import cluster as jobset

    built = {(job, pod): json.loads(jobset.tf_config(_pod(
        pod, REPLICAS=str(replicas), WORKERS=str(workers), JOB_INDEX=str(job))))
        for job in range(replicas) for pod in range(workers)}
    hosts = [f"autoencoder-worker-{job}-{pod}.autoencoder:2222"
             for job in range(replicas) for pod in range(workers)]
    assert [spec["cluster"] for spec in built.values()] == [{"worker": hosts}] * len(hosts)
    assert {key: spec["task"]["index"] for key, spec in built.items()} == {
        (job, pod): job * workers + pod for job in range(replicas) for pod in range(workers)}


@pytest.mark.parametrize("changes, complaint", [
    ({"WORKERS": ""}, "lacks WORKERS"),
    ({"JOB_INDEX": " "}, "lacks JOB_INDEX"),
    ({"REPLICAS": ""}, "lacks REPLICAS"),  # a manifest of before: one line, not a split cluster
    ({"REPLICAS": "0"}, "REPLICAS must be a whole number from 1 to 10000"),
    ({"JOB_INDEX": "1"}, "JOB_INDEX must be a whole number from 0 to 0"),
    ({"REPLICAS": "5001"}, "REPLICAS x WORKERS must be at most 10000 in this JobSet pod, got 5001 x 2"),
    ({"WORKERS": "0"}, "WORKERS must be a whole number from 1 to 10000"),
    ({"WORKERS": "10001"}, "from 1 to 10000"),
    ({"JOB_COMPLETION_INDEX": "2"}, "JOB_COMPLETION_INDEX must be a whole number from 0 to 1"),
    ({"JOB_COMPLETION_INDEX": "-1"}, "from 0 to 1"),
    ({"TF_PORT": "0"}, "TF_PORT must be a whole number from 1 to 65535"),
    ({"TF_PORT": "65536"}, "from 1 to 65535"),
    ({"TF_PORT": "\u0662"}, "from 1 to 65535"),
])
def test_a_jobset_pod_without_what_it_needs_is_one_line(changes, complaint):
    with pytest.raises(UserError, match=complaint):
        read_tf_config({**_pod(0), **changes})


HEARTBEATS = ("Collective ops is aborted by: Error reported from /job:worker/task:1: The "
              "following tasks are unhealthy (stopped sending heartbeats):\n"
              "/job:worker/replica:0/task:1\nThe tasks have crashed. Check the task logs")


@pytest.mark.parametrize("message, cause", [
    (HEARTBEATS, "Collective ops is aborted by: Error reported from /job:worker/task:1: The "
                 "following tasks are unhealthy (stopped sending heartbeats): "
                 "/job:worker/replica:0/task:1"),
    ("Collective ops is aborted by: the peer is gone:", "Collective ops is aborted by: the "
                                                        "peer is gone:"),  # nothing follows
    ("recvmsg:Connection reset by peer\nAdditional GRPC error information",
     "recvmsg:Connection reset by peer")])
def test_a_lost_peer_is_one_line_that_names_the_peer(message, cause):
    import tensorflow as tf

    worker = Cluster(workers=2, task_type="worker", task_index=0, has_chief=False)
    lost = cluster_module.peer_lost(worker, tf.errors.UnavailableError(None, None, message))
    assert isinstance(lost, PeerLost)
    assert str(lost) == ("worker 0 lost a peer of its 2-worker cluster and stopped "
                         f"(UnavailableError: {cause})")
    assert cluster_module.peer_lost(None, tf.errors.UnavailableError(None, None, message)) is None


# what TensorFlow printed on a worker whose chief was SIGKILLed (TensorFlow 2.21)
ABORTED_COLLECTIVE = """\
E0000 00:00:1796200363.697002    6942 ring_alg.cc:291] Aborting RingReduce with UNAVAILABLE: recvmsg:Connection reset by peer
Additional GRPC error information from remote target /job:worker/replica:0/task:0 while calling /tensorflow.WorkerService/RecvBuf:
:UNKNOWN:Error received from peer  {grpc_message:"recvmsg:Connection reset by peer", grpc_status:14}
E0000 00:00:1796200363.697235    6942 base_collective_executor.cc:252] BaseCollectiveExecutor::StartAbort UNAVAILABLE: recvmsg:Connection reset by peer
W0000 00:00:1796200363.697423    7083 local_rendezvous.cc:412] Local rendezvous is aborting with status: UNAVAILABLE: Collective ops is aborted by: recvmsg:Connection reset by peer
The error could be from a previous operation. Restart your program to reset.
\t [[{{function_node __inference_train_step_1247}}{{node adam/CollectiveReduceV2}}]] [type.googleapis.com/tensorflow.DerivedStatus='']
"""
# ... whose peer was SIGKILLed and noticed by the coordination service's heartbeats (2.21)
UNHEALTHY_PEER = """\
E0000 00:00:1796311955.702575   25713 base_collective_executor.cc:252] BaseCollectiveExecutor::StartAbort UNAVAILABLE: Error reported from /job:worker/task:1: The following tasks are unhealthy (stopped sending heartbeats):
/job:worker/replica:0/task:1
The tasks have crashed. Check the task logs for an earlier error, or scheduler events (e.g. preemption, eviction) to debug further. [type.googleapis.com/tensorflow.CoordinationServiceError='\\"\\n\\n\\x06worker\\x10\\x01']
E0000 00:00:1796312011.957951   25735 ring_alg.cc:291] Aborting RingReduce with UNAVAILABLE: Collective ops is aborted by: Error reported from /job:worker/task:1: The following tasks are unhealthy (stopped sending heartbeats):
/job:worker/replica:0/task:1
The tasks have crashed. Check the task logs for an earlier error, or scheduler events (e.g. preemption, eviction) to debug further.
The error could be from a previous operation. Restart your program to reset. [type.googleapis.com/tensorflow.DerivedStatus='']
"""
# ... the same on TensorFlow 2.20, whose own log sink starts a record with the date
UNHEALTHY_PEER_2_20 = """\
2026-12-03 15:30:08.005639: E tensorflow/core/common_runtime/base_collective_executor.cc:248] BaseCollectiveExecutor::StartAbort UNAVAILABLE: Error reported from /job:worker/task:1: The following tasks are unhealthy (stopped sending heartbeats):
/job:worker/replica:0/task:1
The tasks have crashed. Check the task logs for an earlier error, or scheduler events (e.g. preemption, eviction) to debug further. [type.googleapis.com/tensorflow.CoordinationServiceError='\\"\\n\\n\\x06worker\\x10\\x01']
2026-12-03 15:30:08.005869: E tensorflow/core/common_runtime/ring_alg.cc:291] Aborting RingReduce with UNAVAILABLE: Collective ops is aborted by: Error reported from /job:worker/task:1: The following tasks are unhealthy (stopped sending heartbeats):
/job:worker/replica:0/task:1
The tasks have crashed. Check the task logs for an earlier error, or scheduler events (e.g. preemption, eviction) to debug further.
The error could be from a previous operation. Restart your program to reset. [type.googleapis.com/tensorflow.DerivedStatus='']
"""
# ... and on TensorFlow 2.19, whose older gRPC gives the peer's error as JSON (seen in CI's
# 2.19 leg under load, 2026-12-04: the survivor printed the two JSON lines)
ABORTED_COLLECTIVE_2_19 = """\
2026-12-04 23:57:59.366000: E tensorflow/core/common_runtime/base_collective_executor.cc:249] BaseCollectiveExecutor::StartAbort UNAVAILABLE: Connection reset by peer
Additional GRPC error information from remote target /job:worker/replica:0/task:1 while calling /tensorflow.WorkerService/RecvBuf:
:{"created":"@1796428704.694865289","description":"Error received from peer ipv4:127.0.0.1:51467","file":"external/com_github_grpc_grpc/src/core/lib/surface/call.cc","file_line":1056,"grpc_message":"Connection reset by peer","grpc_status":14}
2026-12-04 23:57:59.366100: W tensorflow/core/framework/local_rendezvous.cc:404] Local rendezvous is aborting with status: UNAVAILABLE: Collective ops is aborted by: Connection reset by peer
Additional GRPC error information from remote target /job:worker/replica:0/task:1 while calling /tensorflow.WorkerService/RecvBuf:
:{"created":"@1796428704.694865289","description":"Error received from peer ipv4:127.0.0.1:51467","file":"external/com_github_grpc_grpc/src/core/lib/surface/call.cc","file_line":1056,"grpc_message":"Connection reset by peer","grpc_status":14}
The error could be from a previous operation. Restart your program to reset.
"""
# what must pass: other records in either form, and lines that continue none
KEPT = """\
E0000 00:00:1796200363.100000    6942 cuda_dnn.cc:1] Could not create cudnn handle
2026-12-03 15:30:08.100000: E tensorflow/core/common_runtime/gpu/gpu_device.cc:1] No GPU
/job:worker/replica:0/task:1 is named on a line of its own
a line of Python's own
train_gpu.py: error: worker 1 lost a peer of its 2-worker cluster and stopped
"""

# a process that filters its stderr as a cluster's workers do, writes `ABORTED_COLLECTIVE`
# and KEPT to fd 2 as TensorFlow's C++ would, then ends as argv[1] says: "exit" through
# run_main's os._exit path, "abort" in a crash (its filter must still pass the last words)
FILTERED = r"""
import os, sys
from pyimagesearch import runtime, terminal
terminal.filter_collective_noise(runtime.this_process)
os.write(2, os.environ["NOISE"].encode())
os.write(2, os.environ["KEPT"].encode())
if sys.argv[1] == "abort":
    os.abort()
terminal.end_collective_noise_filter(runtime.this_process)
os._exit(138)
"""


@pytest.mark.parametrize("noise, ending, status", [
    (ABORTED_COLLECTIVE, "exit", 138), (ABORTED_COLLECTIVE, "abort", -signal.SIGABRT),
    (UNHEALTHY_PEER, "exit", 138), (UNHEALTHY_PEER_2_20, "exit", 138),
    (ABORTED_COLLECTIVE_2_19, "exit", 138)],
    ids=["reset", "reset-crash", "heartbeats", "heartbeats-tf2.20", "reset-tf2.19"])
def test_a_lost_peer_leaves_only_its_one_line_and_a_crash_keeps_its_last_words(
        repo, noise, ending, status):
    done = subprocess.run([sys.executable, "-c", FILTERED, ending], cwd=repo,
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, "NOISE": noise, "KEPT": KEPT,
                               "PYIMAGESEARCH_VERBOSE_TF": ""})
    assert done.returncode == status
    # after an abort too: the filter drains the pipe once its writer has died
    assert done.stderr == KEPT
