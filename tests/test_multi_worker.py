"""Multi-worker training: TF_CONFIG checks, and real worker processes on loopback.

The worker processes are started by launch_workers.py, which puts them in a
network namespace of their own (loopback only); every test stops what it
started, even when it fails.
"""
import json
import os
import re
import signal
import subprocess
import sys

import keras
import numpy as np
import pytest

import train_cpu
from conftest import output_files, outputs_name

from pyimagesearch.cluster import read_tf_config
from pyimagesearch.errors import UserError

ONE_SGD_STEP = ["--epochs", "1", "--steps-per-epoch", "1", "--optimizer", "sgd",
                "--learning-rate", "0.5", "--data-source", "sample"]


def _config(cluster, task):
    return {"TF_CONFIG": json.dumps({"cluster": cluster, "task": task})}


def test_a_two_worker_tf_config_is_read():
    cluster = read_tf_config(_config({"worker": ["a:1", "b:2"]}, {"type": "worker", "index": 1}))
    assert (cluster.workers, cluster.task_type, cluster.task_index) == (2, "worker", 1)
    assert not cluster.is_chief
    first = read_tf_config(_config({"worker": ["a:1", "b:2"]}, {"type": "worker", "index": 0}))
    assert first.is_chief  # worker 0 writes when no chief is named
    chief = {"chief": ["c:1"], "worker": ["a:1"]}
    assert read_tf_config(_config(chief, {"type": "chief", "index": 0})).is_chief
    assert not read_tf_config(_config(chief, {"type": "worker", "index": 0})).is_chief
    assert read_tf_config({}) is None and read_tf_config({"TF_CONFIG": " "}) is None


@pytest.mark.parametrize("environ, complaint", [
    ({"TF_CONFIG": "{not json"}, "not valid JSON"),
    (_config({"worker": ["a:1", "b:2"]}, {"type": "worker", "index": 2}), "outside the cluster"),
    (_config({"worker": ["a:1", "b:2"]}, {"type": "parameter", "index": 0}), "task type"),
    (_config({"worker": ["a:1", "b:2"], "ps": ["p:3"]}, {"type": "worker", "index": 0}),
     "no parameter servers"),
    (_config({"worker": ["a", "b:2"]}, {"type": "worker", "index": 0}), "host:port"),
    (_config({"worker": ["a:1", "b:\u00b2"]}, {"type": "worker", "index": 0}), "port 1 to"),
    (_config({"worker": ["a:1", "b:99999"]}, {"type": "worker", "index": 0}), "port 1 to"),
    (_config({"worker": ["a:1", "b:0"]}, {"type": "worker", "index": 0}), "port 1 to"),
    (_config({"worker": [":1", "b:2"]}, {"type": "worker", "index": 0}), "port 1 to"),
    (_config({"chief": ["a:1"], "worker": ["a:1"]}, {"type": "worker", "index": 0}),
     "names a:1 more than once"),
    ({"TF_CONFIG": json.dumps({"cluster": {"worker": ["a:1", "b:2"]}})}, '"task"'),
])
def test_a_broken_tf_config_is_a_user_error(environ, complaint):
    with pytest.raises(UserError, match=complaint):
        read_tf_config(environ)


def test_the_forms_platforms_set_are_read():
    # Vertex AI on one machine: a cluster of one, run as a single machine
    environ = _config({"chief": ["a:1"]}, {"type": "chief", "index": 0})
    assert read_tf_config(environ) is None and "TF_CONFIG" not in environ
    environ = {"TF_CONFIG": ""}  # set but empty: TensorFlow must not parse it
    assert read_tf_config(environ) is None and "TF_CONFIG" not in environ
    # "master", the chief's legacy name, is rewritten for TensorFlow
    environ = _config({"master": ["m:1"], "worker": ["a:1"]}, {"type": "master", "index": 0})
    cluster = read_tf_config(environ)
    assert cluster.is_chief and (cluster.task_type, cluster.workers) == ("chief", 2)
    assert json.loads(environ["TF_CONFIG"])["cluster"] == {"chief": ["m:1"], "worker": ["a:1"]}
    # an evaluator (Vertex AI's worker pool 3) is read, not refused
    evaluator = read_tf_config(_config({"chief": ["c:1"], "worker": ["a:1"]},
                                       {"type": "evaluator", "index": 0}))
    assert evaluator.task_type == "evaluator" and not evaluator.is_chief


def test_a_broken_tf_config_is_one_line_and_exit_2(in_process, monkeypatch, tmp_path):
    monkeypatch.setenv("TF_CONFIG", '{"cluster": {"worker": ["127.0.0.1:1"]}}')
    result = in_process("train_gpu.py", "--rehearse", "1", "--output-dir", str(tmp_path))
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "TF_CONFIG" in lines[0], result.stderr
    assert os.listdir(tmp_path) == []


class Launch:
    """launch_workers.py as a subprocess, read line by line; always stopped at the end."""

    def __init__(self, repo, workers, flags):
        self.process = subprocess.Popen(
            [sys.executable, "tools/launch_workers.py", "--workers", str(workers), "--",
             "train_gpu.py", *flags], cwd=repo, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True, start_new_session=True)
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


def _weights(path):
    return [w.numpy() for w in keras.saving.load_model(path).weights]


# slow: tests/test_cluster_forms.py runs a 2-worker step by hand in the default run
@pytest.mark.tf_versions
@pytest.mark.parametrize("devices, global_batch, seed", [
    pytest.param(1, 256, "42", marks=pytest.mark.slow),
    pytest.param(1, 256, "0", marks=pytest.mark.slow),
    pytest.param(2, 512, "42", marks=pytest.mark.slow)])
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
    one = _weights(tmp_path / "one" / f"{outputs_name('cpu', alone)}.keras")
    cluster = _weights(tmp_path / "cluster" / f"{name}.keras")
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
    # the survivor noticed by itself and said so in one line, no traceback
    assert any("[worker 0] train_gpu.py: error: worker 0 lost a peer" in line
               for line in run.lines), "\n".join(run.lines[-20:])
    assert not any("Traceback" in line for line in run.lines)
    # and only that line after epoch 2 began: not TensorFlow's aborted collectives, nor the
    # lines that continue them (gRPC's details, the tasks that stopped sending heartbeats)
    said = [line for line in run.lines if line.startswith("[worker 0]")]
    after = said[said.index("[worker 0] Epoch 2/5") + 1:]
    assert len(after) == 1 and "lost a peer" in after[0], after
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
                   capture_output=True, timeout=300)
    one = _weights(tmp_path / "one" / f"{name}.keras")  # --rehearse is not in the name
    for a, b in zip(one, _weights(tmp_path / "out" / f"{name}.keras")):
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
    ({"epochs": 2, "devices per worker": 1}, "epochs is 1 on chief 0 but 2 on worker 0"),
    ({"epochs": 1, "devices per worker": 2}, "devices per worker is 1 on chief 0 but 2 on "
                                             "worker 0"),
    ({"epochs": 1}, "devices per worker is 1 on chief 0 but None on worker 0"),
])
def test_workers_whose_facts_differ_are_stopped_with_one_line(monkeypatch, theirs, named):
    # the agreement check fed facts that differ, without starting a cluster (a
    # mutation that compared nothing passed every default test before this one)
    from tensorflow.python.eager import context

    from pyimagesearch.cluster import check_workers_agree

    cluster = read_tf_config(_config({"chief": ["a:1"], "worker": ["b:2"]},
                                     {"type": "chief", "index": 0}))
    store = _StandInStore({"pyimagesearch/run/worker:0": json.dumps(theirs)})
    monkeypatch.setattr(context, "context", lambda: store)
    mine = {"epochs": 1, "devices per worker": 1}
    with pytest.raises(UserError, match=f"^the workers disagree: {named}; start every worker"):
        check_workers_agree(cluster, mine)
    assert json.loads(store.values["pyimagesearch/run/chief:0"]) == mine
    store.values["pyimagesearch/run/worker:0"] = json.dumps(mine)
    check_workers_agree(cluster, mine)  # alike: nothing to say


def test_the_chief_probes_the_network_once_and_every_worker_takes_its_answer(monkeypatch):
    # a slow worker's own probe would pick the sample while the others download
    # MNIST; the chief's answer, shared through the key-value store, is everyone's
    import tensorflow as tf
    from tensorflow.python.eager import context

    from pyimagesearch.cluster import shared_decision

    store = _StandInStore({})
    monkeypatch.setattr(context, "context", lambda: store)
    spec = {"worker": ["a:1", "b:2", "c:3"]}
    chief, *others = [read_tf_config(_config(spec, {"type": "worker", "index": i}))
                      for i in range(3)]
    probes = []

    def probe():
        probes.append(1)
        return {"verdict": "silent", "via": "storage.googleapis.com:443"}

    assert shared_decision(chief, "network", probe)["verdict"] == "silent"
    for worker in others:
        assert shared_decision(worker, "network", probe)["verdict"] == "silent"
    assert len(probes) == 1  # the chief's only

    class NoAnswer(_StandInStore):
        def get_config_key_value(self, key, timeout_in_ms=None):
            raise tf.errors.DeadlineExceededError(None, None, "timed out")

    monkeypatch.setattr(context, "context", lambda: NoAnswer({}))
    with pytest.raises(UserError, match="^worker 1 did not get the chief's answer on the "
                                        "network within 120 s"):
        shared_decision(others[0], "network", probe)
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
