"""Several machines on TensorFlow: TF_CONFIG as platforms set it, JobSet pods, real clusters.

Each cluster started by hand runs inside a network namespace of its own
(`unshare --net`, loopback only); tools/launch_workers.py puts its workers in
one too. Every test stops what it started, even when it fails.
"""
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import train_cpu
import train_gpu
from conftest import ENV, one_line, output_files, outputs_name, saved_weights

from pyimagesearch import exits
from pyimagesearch.cluster import Cluster, jobset_tf_config, read_tf_config, wait_for_peers
from pyimagesearch.errors import NothingToDo, PeerLost, UserError

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
                          timeout=timeout + 60, env=ENV)
    assert done.returncode == 0, done.stderr[-2000:]
    return [tuple(result) for result in json.loads(done.stdout)]


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
    for a, b in zip(saved_weights(tmp_path / "one" / f"{outputs_name('cpu', one)}.keras"),
                    saved_weights(tmp_path / "cluster" / f"{name}.keras")):
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
@pytest.mark.slow  # two workers and a stand-in metadata server
def test_the_chief_decides_for_every_worker_whether_the_preemption_handler_acts(repo,
                                                                               tmp_path):
    # the chief finds Google Cloud's metadata server (a stand-in: a CPU VM there, where
    # TensorFlow's handler does nothing), the worker does not; building the handler on
    # one alone would leave the other in a collective
    flags = ["train_gpu.py", *ONE_SGD_STEP, "--rehearse", "1",
             "--backup-dir", str(tmp_path / "backup"), "--output-dir", str(tmp_path)]
    results = _cluster(repo, [["chief", {"GCE_METADATA_IP": "{metadata}"}, *flags],
                              ["worker", *flags]], timeout=120)
    for status, output in results:
        assert status == 0, output[-2000:]
        assert "TensorFlow's preemption handler does nothing on Google Cloud CPU" in output


# slow; the default suite checks the agreement with a stand-in store
@pytest.mark.parametrize("difference, named", [
    pytest.param(["--epochs", "2"], "epochs is 1 on chief 0 but 2 on worker 0",
                 marks=pytest.mark.slow),
    pytest.param(["--seed", "7"], "seed is 42 on chief 0 but 7 on worker 0",
                 marks=pytest.mark.slow),
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
    os.environ["TF_CONFIG"] = json.dumps(config)
    try:
        cluster = read_tf_config()
    finally:
        del os.environ["TF_CONFIG"]
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
    pytest.param(signal.SIGINT, 130, "interrupted", marks=pytest.mark.slow)])  # 5 s
def test_sigterm_and_ctrl_c_stop_a_worker_waiting_for_its_peers(repo, tmp_path, sig, status,
                                                               said):
    # TensorFlow's own wait ignores both: the project's comes first
    port, peer = _free_ports(2)
    config = {"cluster": {"chief": [f"127.0.0.1:{port}"], "worker": [f"127.0.0.1:{peer}"]},
              "task": {"type": "chief", "index": 0}}
    process = subprocess.Popen(
        [sys.executable, "train_gpu.py", *ONE_SGD_STEP, "--rehearse", "1",
         "--output-dir", str(tmp_path)], cwd=repo, text=True, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, env={**ENV, "TF_CONFIG": json.dumps(config)})
    try:
        for line in process.stdout:
            if "is waiting for worker 0 to start (up to 300 s)" in line:
                break
        process.send_signal(sig)
        _, err = process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == status
    assert said in err.strip().splitlines()[-1], err
    assert os.listdir(tmp_path) == []


# --- a Kubernetes JobSet: TF_CONFIG built from the pod's index -----------------------

JOBSET_POD = {"JOBSET_NAME": "autoencoder", "REPLICATED_JOB_NAME": "worker", "REPLICAS": "1",
              "JOB_INDEX": "0", "WORKERS": "2"}


def _pod(index, **more):
    return {**JOBSET_POD, "JOB_COMPLETION_INDEX": str(index), **more}


def test_a_jobset_pod_builds_the_tf_config_of_its_index():
    built = [json.loads(jobset_tf_config(_pod(i))) for i in range(2)]
    hosts = ["autoencoder-worker-0-0.autoencoder:2222", "autoencoder-worker-0-1.autoencoder:2222"]
    assert [spec["cluster"] for spec in built] == [{"worker": hosts}] * 2
    assert [spec["task"] for spec in built] == [{"type": "worker", "index": i} for i in (0, 1)]
    last = json.loads(jobset_tf_config(_pod(0, WORKERS="1", TF_PORT="65535", JOB_INDEX="3",
                                            REPLICAS="4", JOBSET_SUBDOMAIN="net")))
    assert last["cluster"] == {"worker": [f"autoencoder-worker-{job}-0.net:65535"
                                          for job in range(4)]}
    assert last["task"]["index"] == 3

def test_read_tf_config_builds_it_only_where_none_is_given(monkeypatch):
    for key, value in _pod(1).items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("TF_CONFIG", "")  # so that the one read_tf_config writes is undone
    monkeypatch.delenv("TF_CONFIG")
    cluster = read_tf_config()
    assert (cluster.workers, cluster.task_index, cluster.is_chief) == (2, 1, False)
    assert json.loads(os.environ["TF_CONFIG"])["task"]["index"] == 1
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": {"worker": ["a:1", "b:2", "c:3"]},
                                                "task": {"type": "worker", "index": 2}}))
    assert read_tf_config().workers == 3  # one given wins
    monkeypatch.delenv("TF_CONFIG")
    monkeypatch.delenv("JOBSET_NAME")
    assert read_tf_config() is None  # an Indexed Job alone is no JobSet


@pytest.mark.parametrize("replicas, workers", [(2, 1), (2, 2), (3, 2)])
def test_the_pods_of_every_replica_form_one_cluster(replicas, workers):
    built = {(job, pod): json.loads(jobset_tf_config(_pod(
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
    ({"REPLICAS": "5001"}, "REPLICAS x WORKERS must be at most 10000 in this JobSet pod, "
                           "got 5001 x 2"),
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
        jobset_tf_config({**_pod(0), **changes})


HEARTBEATS = ("Collective ops is aborted by: Error reported from /job:worker/task:1: The "
              "following tasks are unhealthy (stopped sending heartbeats):\n"
              "/job:worker/replica:0/task:1\nThe tasks have crashed. Check the task logs")


@pytest.mark.parametrize("message, cause", [
    (HEARTBEATS, "Collective ops is aborted by: Error reported from /job:worker/task:1: The "
                 "following tasks are unhealthy (stopped sending heartbeats):"),
    ("recvmsg:Connection reset by peer\nAdditional GRPC error information",
     "recvmsg:Connection reset by peer")])
def test_a_lost_peer_is_one_line_and_status_138(message, cause):
    lost = exits.explained(tf.errors.UnavailableError(None, None, message))
    assert isinstance(lost, PeerLost) and lost.exit_status == 138
    assert str(lost) == (f"lost a peer of its cluster and stopped (UnavailableError: {cause}); "
                         "restart every process together")
    # an error of the same type that names no peer is no lost peer: its traceback stays
    assert exits.explained(tf.errors.UnavailableError(None, None, "a bucket is gone")) is None


def _config(cluster, task):
    return json.dumps({"cluster": cluster, "task": task})


def _read(monkeypatch, text):
    """read_tf_config() with TF_CONFIG=`text` (None: unset)."""
    if text is None:
        monkeypatch.delenv("TF_CONFIG", raising=False)
    else:
        monkeypatch.setenv("TF_CONFIG", text)
    monkeypatch.delenv("JOBSET_NAME", raising=False)
    return read_tf_config()


def test_a_two_worker_tf_config_is_read(monkeypatch):
    pair = {"worker": ["a:1", "b:2"]}
    cluster = _read(monkeypatch, _config(pair, {"type": "worker", "index": 1}))
    assert (cluster.workers, cluster.task_type, cluster.task_index) == (2, "worker", 1)
    assert not cluster.is_chief and cluster.peers == (("worker 0", "a:1"),)
    first = _read(monkeypatch, _config(pair, {"type": "worker", "index": 0}))
    assert first.is_chief  # worker 0 writes when no chief is named
    chief = {"chief": ["c:1"], "worker": ["a:1"]}
    assert _read(monkeypatch, _config(chief, {"type": "chief", "index": 0})).is_chief
    assert not _read(monkeypatch, _config(chief, {"type": "worker", "index": 0})).is_chief
    assert _read(monkeypatch, None) is None and _read(monkeypatch, " ") is None


@pytest.mark.parametrize("text, complaint", [
    ("{not json", "^TF_CONFIG cannot be read"),
    (_config({"worker": ["a:1", "b:2"]}, {"type": "worker", "index": 2}),
     "task worker 2 is not one of its cluster's"),
    (_config({"worker": ["a:1", "b:2"]}, {"type": "parameter", "index": 0}),
     "task parameter 0 is not one of"),
    (_config({"worker": ["a:1", "b:2"], "ps": ["p:3"]}, {"type": "worker", "index": 0}),
     "no parameter servers"),
    (_config({"worker": ["a", "b:2"]}, {"type": "worker", "index": 0}), '"host:port"'),
    (_config({"worker": ["a:1", "b:\u00b2"]}, {"type": "worker", "index": 0}), "1 to 65535"),
    (_config({"worker": ["a:1", "b:99999"]}, {"type": "worker", "index": 0}), "1 to 65535"),
    (_config({"worker": ["a:1", "b:0"]}, {"type": "worker", "index": 0}), "1 to 65535"),
    (_config({"worker": [":1", "b:2"]}, {"type": "worker", "index": 0}), "1 to 65535"),
    (_config({"chief": ["a:1"], "worker": ["a:1"]}, {"type": "worker", "index": 0}),
     "an address twice"),
    (_config({"chief": ["a:1", "b:2"]}, {"type": "chief", "index": 0}), "more than one chief"),
    (json.dumps({"cluster": {"worker": ["a:1", "b:2"]}}), "is not one of its cluster's"),
])
def test_a_broken_tf_config_is_one_line(monkeypatch, text, complaint):
    with pytest.raises(UserError, match=complaint):
        _read(monkeypatch, text)


def test_the_forms_platforms_set_are_read(monkeypatch):
    # Vertex AI on one machine: a cluster of one, run as a single machine
    assert _read(monkeypatch, _config({"chief": ["a:1"]}, {"type": "chief", "index": 0})) is None
    assert "TF_CONFIG" not in os.environ
    assert _read(monkeypatch, "") is None and "TF_CONFIG" not in os.environ  # set but empty
    # "master", the chief's legacy name, is rewritten for TensorFlow
    cluster = _read(monkeypatch, _config({"master": ["m:1"], "worker": ["a:1"]},
                                         {"type": "master", "index": 0}))
    assert cluster.is_chief and (cluster.task_type, cluster.workers) == ("chief", 2)
    assert json.loads(os.environ["TF_CONFIG"])["cluster"] == {"chief": ["m:1"],
                                                              "worker": ["a:1"]}
    # an evaluator (Vertex AI's worker pool 3) has nothing to do: validation runs in training
    with pytest.raises(NothingToDo, match="no evaluator is needed"):
        _read(monkeypatch, _config({"chief": ["c:1"], "worker": ["a:1"]},
                                   {"type": "evaluator", "index": 0}))


def test_a_broken_tf_config_is_one_line_and_exit_2(in_process, monkeypatch, tmp_path):
    monkeypatch.setenv("TF_CONFIG", '{"cluster": {"worker": ["127.0.0.1:1"]}}')
    result = in_process("train_gpu.py", "--rehearse", "1", "--output-dir", str(tmp_path))
    assert "TF_CONFIG" in one_line(result)
    assert os.listdir(tmp_path) == []


class Launch:
    """launch_workers.py as a subprocess, read line by line; always stopped at the end."""

    def __init__(self, repo, workers, flags):
        self.process = subprocess.Popen(
            [sys.executable, "tools/launch_workers.py", "--workers", str(workers), "--",
             "train_gpu.py", *flags], cwd=repo, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True, start_new_session=True, env=ENV)
        self.lines, self.pids = [], {}

    def read_until(self, pattern):
        """Lines up to the first that matches `pattern` (None if output ends first)."""
        for line in self.process.stdout:
            self.lines.append(line.rstrip())
            found = re.match(r"\[launch\] worker (\d+): pid (\d+)", line)
            if found:
                self.pids[int(found[1])] = int(found[2])
            if re.search(pattern, line):
                return line
        return None

    def finish(self, timeout=300):
        """Exit status and stderr; the rest of stdout goes to self.lines."""
        out, err = self.process.communicate(timeout=timeout)
        self.lines += out.splitlines()
        return self.process.returncode, err

    def kill_all(self):
        for pid in [self.process.pid, *self.pids.values()]:
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        self.process.wait()


@pytest.fixture
def launch(repo):
    started = []

    def start(workers, flags):
        started.append(Launch(repo, workers, flags))
        return started[-1]

    yield start
    for launched in started:
        launched.kill_all()


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_rehearsal_of_several_devices_per_worker_is_refused_in_one_line(in_process,
                                                                          monkeypatch, tmp_path):
    # TensorFlow puts one replica on a worker's CPU, whatever logical devices it has
    monkeypatch.setenv("TF_CONFIG", _config({"worker": ["127.0.0.1:1", "127.0.0.1:2"]},
                                            {"type": "worker", "index": 0}))
    said = one_line(in_process("train_gpu.py", "--rehearse", "2", "--output-dir", tmp_path))
    assert "--rehearse 2 under TF_CONFIG: MultiWorkerMirroredStrategy puts one replica on a " \
           "worker's CPU; use --rehearse 1 and more workers" in said
    assert os.listdir(tmp_path) == []


# slow: a 2-worker step by hand is slow too; the default suite's cluster tests are cheaper
@pytest.mark.tf_versions
@pytest.mark.parametrize("devices, global_batch, seed", [
    pytest.param(1, 256, "42", marks=pytest.mark.slow),
    pytest.param(1, 256, "0", marks=pytest.mark.slow),
])
def test_workers_take_the_same_step_as_one_process(launch, tmp_path, devices, global_batch,
                                                   seed):
    flags = ONE_SGD_STEP + ["--seed", seed, "--rehearse", str(devices),
                            "--output-dir", str(tmp_path / "cluster")]
    run = launch(2, flags)
    status, err = run.finish()
    assert status == 0, "\n".join(run.lines[-20:]) + err
    assert not any(_alive(pid) for pid in run.pids.values())
    name = outputs_name("gpu", flags)  # gpu_rehearsal_epochs-1_..., with seed-0 for seed 0
    record = json.loads((tmp_path / "cluster" / f"{name}.json").read_text())
    assert record["workers"] == 2 and record["replicas"] == 2 * devices
    assert record["global_batch_size"] == global_batch and record["loop"] == "custom"
    assert record["strategy"] == "MultiWorkerMirroredStrategy"
    # only the chief wrote; the other worker's copies went to a removed folder
    assert sorted(os.listdir(tmp_path / "cluster")) == output_files(name)
    assert any("worker 1 done; the chief writes" in line for line in run.lines)

    alone = ONE_SGD_STEP + ["--seed", seed, "--batch-size", str(global_batch),
                            "--output-dir", str(tmp_path / "one")]
    train_cpu.main(alone)
    one = saved_weights(tmp_path / "one" / f"{outputs_name('cpu', alone)}.keras")
    cluster = saved_weights(tmp_path / "cluster" / f"{name}.keras")
    for a, b in zip(one, cluster):
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-6)


# slow (33 s): the default run stops a waiting worker by a signal (test_cluster_forms.py),
# and stand-in workers by every signal (test_launcher.py)
@pytest.mark.tf_versions
@pytest.mark.slow
def test_a_killed_worker_stops_the_cluster_with_one_line(launch, tmp_path):
    run = launch(2, ["--rehearse", "1", "--epochs", "5", "--data-source", "sample",
                     "--output-dir", str(tmp_path)])
    assert run.read_until(r"\[worker 0\] Epoch 2/5"), "\n".join(run.lines)
    os.kill(run.pids[1], signal.SIGKILL)
    status, err = run.finish(timeout=240)
    assert status == 128 + signal.SIGKILL  # as the killed worker's
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "worker 1 was killed by SIGKILL" in lines[0], err
    # the survivor noticed by itself and said so in one line, its last, no traceback
    said = [line for line in run.lines if line.startswith("[worker 0]")]
    assert "train_gpu.py: error: lost a peer of its cluster" in said[-1], said[-20:]
    assert not any("Traceback" in line for line in run.lines)
    assert not any(_alive(pid) for pid in run.pids.values())
    assert not list(tmp_path.glob("*.json"))  # no record, of any name


@pytest.mark.slow  # the default suite's budget (docs/development.md); CI runs it
def test_a_bad_flag_fails_every_worker_and_leaves_no_process(launch):
    run = launch(2, ["--rehearse", "1", "--epochz", "1"])
    status, err = run.finish()
    assert status == 2 and "exited with status 2" in err and "Traceback" not in err
    assert any("unrecognized arguments: --epochz" in line for line in run.lines)
    assert not any(_alive(pid) for pid in run.pids.values())


# slow: tests/test_launcher.py stops stand-in workers by every signal in the default run
@pytest.mark.parametrize("sig, status, said", [
    pytest.param(signal.SIGINT, 130, "stopped by SIGINT; all workers stopped",
                 marks=pytest.mark.slow),
    pytest.param(signal.SIGTERM, 143, "stopped by SIGTERM; all workers stopped",
                 marks=pytest.mark.slow)])
def test_ctrl_c_or_sigterm_to_the_launcher_stops_every_worker(launch, tmp_path, sig, status,
                                                             said):
    run = launch(2, ["--rehearse", "1", "--epochs", "5", "--data-source", "sample",
                     "--output-dir", str(tmp_path)])
    assert run.read_until(r"\[worker 1\] \[INFO\] loading"), "\n".join(run.lines)
    os.kill(run.process.pid, sig)
    stopped, err = run.finish(timeout=120)
    assert stopped == status and said in err
    assert not any(_alive(pid) for pid in run.pids.values())


@pytest.mark.tf_versions
@pytest.mark.slow
def test_a_restarted_cluster_resumes_from_its_backup(launch, tmp_path):
    flags = ["--rehearse", "1", "--epochs", "4", "--steps-per-epoch", "60",
             "--data-source", "sample", "--backup-dir", str(tmp_path / "backup"),
             "--output-dir", str(tmp_path / "out")]
    run = launch(2, flags)
    assert run.read_until(r"\[worker 0\] Epoch 3/4"), "\n".join(run.lines)
    os.kill(run.pids[1], signal.SIGKILL)
    assert run.finish(timeout=240)[0] == 128 + signal.SIGKILL
    again = launch(2, flags)  # the same command: TensorFlow's fault-tolerance pattern
    status, err = again.finish()
    assert status == 0, "\n".join(again.lines[-20:]) + err
    assert sum("resuming from" in line and "2 of 4 epochs and 120 steps done" in line
               for line in again.lines) == 2  # both workers
    assert not any(re.search(r"Epoch [12]/4", line) for line in again.lines)
    record = json.loads((tmp_path / "out" / f"{outputs_name('gpu', flags)}.json").read_text())
    assert record["resumed_from_epoch"] == 2 and len(record["loss"]) == 4
    assert not (tmp_path / "backup").exists()


@pytest.mark.tf_versions
@pytest.mark.slow
def test_sigterm_to_one_worker_saves_every_worker_at_one_step_and_resumes_exactly(
        launch, repo, tmp_path):
    flags = ["--rehearse", "1", "--epochs", "4", "--steps-per-epoch", "90",
             "--data-source", "sample", "--backup-dir", str(tmp_path / "backup"),
             "--output-dir", str(tmp_path / "out")]
    run = launch(2, flags)
    assert run.read_until(r"\[worker 1\] Epoch 2/4"), "\n".join(run.lines)
    os.kill(run.pids[1], signal.SIGTERM)  # the worker that is not the chief
    status, err = run.finish(timeout=240)
    # both stop at the agreed step with 143; the launcher names whichever it saw end first
    assert status == 143 and re.search(r"worker [01] exited with status 143", err), err
    errors = {int(line[8]): line for line in run.lines if ": error: " in line}
    assert sorted(errors) == [0, 1], "\n".join(run.lines[-30:])
    assert "stopped by SIGTERM after" in errors[1]
    assert "stopped because a peer got SIGTERM, after" in errors[0]
    steps = {worker: int(re.search(r"after ([\d,]+) steps", line)[1].replace(",", ""))
             for worker, line in errors.items()}
    assert steps[0] == steps[1] and 90 < steps[0] < 180, steps  # in epoch 2, on both
    assert not any("Traceback" in line for line in run.lines)

    again = launch(2, flags)  # the same command, as a scheduler restarts a cluster
    status, err = again.finish()
    assert status == 0, "\n".join(again.lines[-20:]) + err
    assert sum(f"1 of 4 epochs and {steps[0]} steps done" in line
               for line in again.lines) == 2
    name = outputs_name("gpu", flags)  # gpu_rehearsal_epochs-4_steps-per-epoch-90_...
    record = json.loads((tmp_path / "out" / f"{name}.json").read_text())
    assert record["resumed_from_step"] == steps[0] and len(record["val_loss"]) == 4

    # the same training in one process on two devices: exactly what the cluster is
    subprocess.run([sys.executable, "train_gpu.py", "--rehearse", "2", *flags[2:8],
                    "--output-dir", str(tmp_path / "one")], cwd=repo, check=True,
                   capture_output=True, timeout=300, env=ENV)
    one = saved_weights(tmp_path / "one" / f"{name}.keras")  # --rehearse is not in the name
    for a, b in zip(one, saved_weights(tmp_path / "out" / f"{name}.keras")):
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-6)


class _StandInStore:
    """The coordination service's key-value store, as check_workers_agree uses it."""

    def __init__(self, values):
        self.values = dict(values)

    def set_config_key_value(self, key, value):
        self.values[key] = value

    def get_config_key_value(self, key, timeout_in_ms=None):
        return self.values[key]


@pytest.mark.parametrize("theirs, named", [
    ({"epochs": 2, "replicas": 2}, "epochs is 1 on chief 0 but 2 on worker 0"),
    ({"epochs": 1, "replicas": 4}, "replicas is 2 on chief 0 but 4 on worker 0"),
    ({"epochs": 1}, "replicas is 2 on chief 0 but None on worker 0"),
])
def test_workers_whose_facts_differ_are_stopped_with_one_line(monkeypatch, theirs, named):
    # the agreement check fed facts that differ, without starting a cluster (a
    # mutation that compared nothing passed every default test before this one)
    from tensorflow.python.eager import context

    cluster = _read(monkeypatch, _config({"chief": ["a:1"], "worker": ["b:2"]},
                                         {"type": "chief", "index": 0}))
    store = _StandInStore({"pyimagesearch/run/worker 0": json.dumps(theirs)})
    monkeypatch.setattr(context, "context", lambda: store)
    mine = {"epochs": 1, "replicas": 2}
    with pytest.raises(UserError, match=f"^the workers disagree: {named}; start every worker"):
        cluster.agree(mine)
    assert json.loads(store.values["pyimagesearch/run/chief 0"]) == mine
    store.values["pyimagesearch/run/worker 0"] = json.dumps(mine)
    cluster.agree(mine)  # alike: nothing to say


def test_the_chief_probes_the_network_once_and_every_worker_takes_its_answer(monkeypatch):
    # a slow worker's own probe would pick the sample while the others download
    # MNIST; the chief's answer, shared through the key-value store, is everyone's
    from tensorflow.python.eager import context

    store = _StandInStore({})
    monkeypatch.setattr(context, "context", lambda: store)
    spec = {"worker": ["a:1", "b:2", "c:3"]}
    chief, *others = [_read(monkeypatch, _config(spec, {"type": "worker", "index": i}))
                      for i in range(3)]
    probes = []

    def probe():
        probes.append(1)
        return "silent"

    assert chief.decide("network", probe) == "silent"
    for worker in others:
        assert worker.decide("network", probe) == "silent"
    assert len(probes) == 1  # the chief's only

    class NoAnswer(_StandInStore):
        def get_config_key_value(self, key, timeout_in_ms=None):
            raise tf.errors.DeadlineExceededError(None, None, "timed out")

    monkeypatch.setattr(context, "context", lambda: NoAnswer({}))
    with pytest.raises(UserError, match="^worker 1 did not get the chief's answer on the "
                                        "network within 120 s"):
        others[0].decide("network", probe)
    assert len(probes) == 1  # a worker never probes for itself


@pytest.mark.tf_versions
@pytest.mark.slow
def test_a_real_cluster_takes_the_chiefs_data_decision(launch, tmp_path, monkeypatch):
    monkeypatch.setenv("TFDS_DATA_DIR", str(tmp_path / "empty"))
    run = launch(2, ["--rehearse", "1", "--epochs", "1", "--steps-per-epoch", "1",
                     "--data-source", "auto", "--output-dir", str(tmp_path / "out")])
    status, err = run.finish()
    assert status == 0, "\n".join(run.lines[-20:]) + err
    said = [line for line in run.lines if "] [INFO] data source:" in line]
    assert len(said) == 2 and said[0].split("] ", 1)[1] == said[1].split("] ", 1)[1], said


def test_several_gpu_machines_all_reduce_with_nccl_and_a_rehearsal_with_auto(monkeypatch):
    from pyimagesearch import cluster as clusters, strategies

    made = []

    class Recorded:
        def __init__(self, communication_options=None):
            made.append(communication_options.implementation.name)

    monkeypatch.setattr(tf.config, "list_physical_devices",
                        lambda kind=None: ["GPU:0"] if kind == "GPU" else [])
    monkeypatch.setattr(tf.distribute, "MultiWorkerMirroredStrategy", Recorded)
    monkeypatch.setattr(clusters, "wait_for_peers", lambda cluster, timeout_s: None)
    pair = Cluster(2, "worker", 0, False, "127.0.0.1:1", (("worker 1", "127.0.0.1:2"),))
    strategies.multi_worker(pair)
    strategies.multi_worker(pair, rehearse=1)
    assert made == ["NCCL", "AUTO"]
