"""Keras on JAX past one host: a TPU slice's processes, rehearsed as processes on this machine.

tools/launch_workers.py starts one process per "host", each with 4 JAX CPU
devices and Keras' KERAS_DISTRIBUTION_* variables (the launcher's, never a
reader's): their collectives travel over gloo. On a real slice JAX finds the
hosts itself. Every run here is bounded in time; a hang fails the test.
"""
import json
import os
import signal
import socket
import subprocess
import sys

import pytest

import compare
import launch_workers
from conftest import ENV, REPO, one_line, outputs_name

from pyimagesearch import cli
from pyimagesearch.cluster import agree
from pyimagesearch.errors import PeerLost, UserError
from pyimagesearch.plan import Settings, make_plan

jax_slice = pytest.importorskip("pyimagesearch.jax_slice")  # needs jax, as the route does

TWO_STEPS = ["--epochs", "1", "--steps-per-epoch", "2"]
BOUND_S = 240  # no run here may take longer than this
NAME = outputs_name("tpu", ["--rehearse", "4", *TWO_STEPS, "--data-source", "sample"]) + "_jax"


def _jax(**variables):
    """This environment on Keras' JAX backend, with `variables` (KERAS_DISTRIBUTION_...)."""
    env = {key: value for key, value in ENV.items()
           if not key.startswith(("KERAS_DISTRIBUTION_", "JAX_", "TF_CONFIG", "TPU_"))}
    return {**env, "KERAS_BACKEND": "jax", **{key: str(value) for key, value in
                                              variables.items()}}


def _free_port():
    with socket.socket() as handle:
        handle.bind(("127.0.0.1", 0))
        return handle.getsockname()[1]


# --- joining: what JAX finds, and what a process refuses before it starts ------------------------

def test_one_process_alone_joins_nothing():
    # a rehearsal without the launcher's variables, or a machine without TPU chips
    assert jax_slice.join(300.0, rehearsal=True, environ={}) is None
    assert jax_slice.join(300.0, rehearsal=False, environ={}) is None


@pytest.mark.parametrize("variables, said", [
    ({"KERAS_DISTRIBUTION_NUM_PROCESSES": "0"}, "NUM_PROCESSES='0': give a whole number from "
                                                "1 to 4096"),
    ({"KERAS_DISTRIBUTION_NUM_PROCESSES": "4097"}, "from 1 to 4096"),
    ({"KERAS_DISTRIBUTION_NUM_PROCESSES": "two"}, "from 1 to 4096"),
    ({"KERAS_DISTRIBUTION_NUM_PROCESSES": "2", "KERAS_DISTRIBUTION_PROCESS_ID": "2"},
     "PROCESS_ID='2': give a whole number from 0 to 1"),
    ({"KERAS_DISTRIBUTION_NUM_PROCESSES": "2", "KERAS_DISTRIBUTION_PROCESS_ID": "-1"},
     "from 0 to 1")])
def test_a_process_count_or_index_that_is_no_such_number_is_one_line_before_jax_starts(
        variables, said):
    with pytest.raises(UserError, match=said):
        jax_slice.join(1.0, rehearsal=True, environ=variables)


def test_a_tpu_host_that_cannot_tell_whether_it_is_one_of_several_refuses(tmp_path):
    # a TPU VM (stand-in chips) where JAX finds no slice: never trained as if alone
    for chip in range(4):
        pci = tmp_path / f"sys/bus/pci/devices/0000:00:0{chip}.0"
        pci.mkdir(parents=True)
        (pci / "vendor").write_text("0x1ae0\n")
        (pci / "device").write_text("0x0063\n")
    done = subprocess.run([sys.executable, "train_tpu.py", *TWO_STEPS, "--data-source",
                           "sample", "--output-dir", str(tmp_path / "out")], cwd=REPO,
                          env=_jax(PYIMAGESEARCH_HOST_ROOT=tmp_path), capture_output=True,
                          text=True, timeout=BOUND_S)
    assert one_line(done).startswith("train_tpu.py: error: cannot tell whether this host is one "
                                     "of several: JAX found no slice to join (")
    assert not (tmp_path / "out").exists() or not os.listdir(tmp_path / "out")


def test_a_coordinator_that_never_answers_is_one_line_and_138(tmp_path):
    port = _free_port()  # nothing listens there
    done = subprocess.run(
        [sys.executable, "train_tpu.py", "--rehearse", "4", *TWO_STEPS, "--startup-timeout",
         "1", "--output-dir", str(tmp_path)], cwd=REPO, capture_output=True, text=True,
        timeout=BOUND_S, env=_jax(KERAS_DISTRIBUTION_JOB_ADDRESSES=f"127.0.0.1:{port}",
                                  KERAS_DISTRIBUTION_NUM_PROCESSES=2,
                                  KERAS_DISTRIBUTION_PROCESS_ID=1))
    assert done.returncode == PeerLost.exit_status
    assert done.stderr.strip().splitlines()[-1] == (
        f"train_tpu.py: error: process 1 gave up after 1 s waiting for the coordinator, "
        f"process 0, at 127.0.0.1:{port} (--startup-timeout); start every host's process with "
        "the same command")


def test_the_launcher_tells_jax_processes_kerass_variables_and_tensorflow_its_tf_config():
    assert launch_workers.cluster_environment([5000, 5001, 5002], 2, "jax") == {
        "KERAS_DISTRIBUTION_JOB_ADDRESSES": "127.0.0.1:5000",  # the coordinator: worker 0
        "KERAS_DISTRIBUTION_NUM_PROCESSES": "3", "KERAS_DISTRIBUTION_PROCESS_ID": "2"}
    told = launch_workers.cluster_environment([5000, 5001], 1, "tensorflow")
    assert json.loads(told["TF_CONFIG"])["task"] == {"type": "worker", "index": 1}


@pytest.mark.parametrize("flags, rehearsal, refused", [
    ({"loop": "custom"}, True, "--loop custom: on one host only (this run spans 2 JAX"),
    ({"backup_dir": "backups"}, False, "--backup-dir backups: every host of the slice reads"),
    ({"backup_dir": "gs://bucket/backups"}, False, None),  # every host reads a bucket
    ({"backup_dir": "backups"}, True, None)])  # a rehearsal's processes share this disk
def test_what_several_processes_cannot_share_is_one_line(flags, rehearsal, refused):
    two = jax_slice.Slice(workers=2, task_index=0, devices_per_host=4)
    plan = make_plan("tpu", Settings(batch_size=1024, **flags), 8, rehearsal, two,
                     backend="jax")
    if refused is None:
        cli.refuse(plan, None)
        return
    with pytest.raises(UserError) as said:
        cli.refuse(plan, None)
    assert str(said.value).startswith(refused) and "\n" not in str(said.value)


def test_process_0_is_the_chief_and_writes_alone():
    first, second = (jax_slice.Slice(workers=2, task_index=i, devices_per_host=4)
                     for i in (0, 1))
    assert first.is_chief and not second.is_chief and second.name == "process 1"


def test_an_error_one_process_meets_ends_every_process_with_its_line():
    # a data folder process 1 cannot read, say: both stop with its line, not a lost peer
    posted = {"process 0": {"error": None}, "process 1": {"error": "cannot read /data"}}

    def read(other):
        return json.dumps(posted[other])

    for me, other in (("process 0", "process 1"), ("process 1", "process 0")):
        with pytest.raises(UserError, match="^cannot read /data$"):
            agree(me, [other], posted[me], read, "process", "processes")
    with pytest.raises(UserError, match="^the processes disagree: seed is 40 on process 0 but "
                                        "41 on process 1; start every process with the same"):
        agree("process 0", ["process 1"], {"seed": 40}, lambda other: '{"seed": 41}',
              "process", "processes")


# --- two processes of 4 JAX CPU devices, through the launcher ------------------------------------

def _launch(out, *flags, workers=2):
    command = [sys.executable, "tools/launch_workers.py", "--workers", str(workers), "--",
               "train_tpu.py", "--rehearse", "4", "--data-source", "sample", "--output-dir",
               str(out), *flags]
    return subprocess.Popen(command, cwd=REPO, env=_jax(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)


@pytest.fixture(scope="module")
def slice_run(tmp_path_factory):
    """Two steps on 2 processes of 4 JAX CPU devices (TensorBoard's images too), and on one
    device: the launcher's status and lines, the folder, and one device's record."""
    out = tmp_path_factory.mktemp("slice")
    run = _launch(out / "slice", *TWO_STEPS, "--logdir", out / "logs")
    said, _ = run.communicate(timeout=BOUND_S)
    alone = subprocess.run([sys.executable, "train_tpu.py", "--rehearse", "1", *TWO_STEPS,
                            "--data-source", "sample", "--output-dir", str(out / "alone")],
                           cwd=REPO, env=_jax(), capture_output=True, text=True, timeout=BOUND_S)
    assert alone.returncode == 0, alone.stderr[-2000:]
    return run.returncode, said, out, json.loads((out / "alone" / f"{NAME}.json").read_text())


@pytest.mark.slow
def test_two_processes_of_4_devices_train_the_one_device_step_and_exit_0(slice_run):
    status, said, out, once = slice_run
    assert status == 0, said[-3000:]
    # process 0 alone writes; both exit 0; the two steps on 8 devices of 2 processes end where
    # the same steps on one device do: each process fed its share of every global batch;
    # every process ran TensorBoard's reconstructions, a computation over both (a process
    # that skipped it would have left the other waiting in its collective)
    assert sorted(os.listdir(out / "slice")) == [f"{NAME}.{s}" for s in ("json", "keras", "png")]
    record = json.loads((out / "slice" / f"{NAME}.json").read_text())
    assert (record["workers"], record["replicas"], record["global_batch_size"]) == (2, 8, 1024)
    assert (record["hosts"], record["devices_per_host"], record["slice"]) == (2, 4, "rehearsal")
    assert compare.processes(record) == "2 hosts x 4 devices"
    for key in ("loss", "val_loss"):
        assert record[key] == pytest.approx(once[key], rel=1e-3)
    assert "[worker 1] [INFO] process 1 done; the chief writes the outputs" in said
    assert "[launch] all 2 workers finished" in said and "Traceback" not in said
    assert len(os.listdir(out / "logs")) == 1  # process 0's logs only


@pytest.mark.slow
def test_two_processes_reading_tfrecords_train_the_one_device_step(tmp_path):
    import write_tfrecords
    write_tfrecords.main(["--data-source", "sample", "--output-dir", str(tmp_path / "r")])
    flags = [*TWO_STEPS, "--data-source", "tfrecord", "--data-dir", str(tmp_path / "r")]
    run = subprocess.Popen([sys.executable, "tools/launch_workers.py", "--workers", "2", "--",
                            "train_tpu.py", "--rehearse", "4", *flags, "--output-dir",
                            str(tmp_path / "slice")], cwd=REPO, env=_jax(),
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    said, _ = run.communicate(timeout=BOUND_S)
    assert run.returncode == 0, said[-3000:]
    alone = subprocess.run([sys.executable, "train_tpu.py", "--rehearse", "1", *flags,
                            "--output-dir", str(tmp_path / "alone")], cwd=REPO, env=_jax(),
                           capture_output=True, text=True, timeout=BOUND_S)
    assert alone.returncode == 0, alone.stderr[-2000:]
    name = "tpu_rehearsal_epochs-1_steps-per-epoch-2_data-source-tfrecord_jax.json"
    record, once = (json.loads((tmp_path / folder / name).read_text())
                    for folder in ("slice", "alone"))
    # by data, not by file: Keras 3.12's auto-shard would give each process files of its own
    assert record["loss"] == pytest.approx(once["loss"], rel=1e-3)


def _kill_when_training(run, worker):
    """Read the launcher's lines until `worker` trains, then SIGKILL it; all its lines."""
    pid, lines = None, []
    for line in run.stdout:
        lines.append(line)
        if line.startswith(f"[launch] worker {worker}: pid "):
            pid = int(line.split("pid ")[1].split(",")[0])
        if line.startswith(f"[worker {worker}] Epoch 1/"):
            os.kill(pid, signal.SIGKILL)
            break
    rest, _ = run.communicate(timeout=BOUND_S)
    return "".join(lines) + rest


@pytest.mark.slow
def test_a_lost_process_ends_the_other_in_one_line_and_138(tmp_path):
    run = _launch(tmp_path, "--epochs", "3")
    said = _kill_when_training(run, 1)
    assert run.returncode == 128 + signal.SIGKILL, said[-3000:]
    theirs = [line for line in said.splitlines() if line.startswith("[worker 0]")]
    assert theirs[-1] == ("[worker 0] train_tpu.py: error: process 0 of 2 lost process 1: no "
                          "beat from it for 10 s; restart every process together")
    assert "worker 0 exited with status 138" in said or "worker 1 was killed by SIGKILL" in said
    assert os.listdir(tmp_path) == []  # nothing written


@pytest.mark.slow
def test_a_lost_coordinator_is_jaxs_to_report_and_the_launchers_line_is_last(tmp_path):
    # process 0 holds JAX's coordination service: when it goes, JAX's client in every other
    # process ends that process itself (a fatal log line, "Terminating process because the
    # JAX distributed service detected fatal errors", then abort), almost always before our
    # beat watcher looks (jax 0.7.2 passes no missed_heartbeat_callback to change that)
    run = _launch(tmp_path, "--epochs", "3")
    said = _kill_when_training(run, 0)
    assert run.returncode == 128 + signal.SIGKILL, said[-3000:]
    assert ("the JAX distributed service detected fatal errors" in said
            or "[worker 1] train_tpu.py: error: process 1 of 2 lost process 0, the coordinator"
            in said), said[-3000:]
    assert said.strip().splitlines()[-1].startswith(
        "launch_workers.py: error: worker 0 was killed by SIGKILL")
    assert os.listdir(tmp_path) == []


@pytest.mark.slow
def test_processes_that_disagree_on_a_flag_stop_before_training_in_one_line(tmp_path):
    port = _free_port()
    runs = [subprocess.Popen(
        [sys.executable, "train_tpu.py", "--rehearse", "4", "--data-source", "sample",
         "--seed", str(40 + index), "--output-dir", str(tmp_path / str(index))], cwd=REPO,
        text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env=_jax(KERAS_DISTRIBUTION_JOB_ADDRESSES=f"127.0.0.1:{port}",
                 KERAS_DISTRIBUTION_NUM_PROCESSES=2, KERAS_DISTRIBUTION_PROCESS_ID=index))
        for index in (0, 1)]
    for index, (run, (out, err)) in enumerate(zip(runs, [r.communicate(timeout=BOUND_S)
                                                         for r in runs])):
        assert run.returncode == 2, err[-3000:]
        assert err.strip().splitlines()[-1] == (
            f"train_tpu.py: error: the processes disagree: seed is {40 + index} on process "
            f"{index} but {41 - index} on process {1 - index}; start every process with the "
            "same flags, data and number of devices")
        assert "training the autoencoder" not in out


@pytest.mark.slow
def test_sigterm_stops_every_process_at_one_step_and_the_same_command_resumes(tmp_path,
                                                                              slice_run):
    flags = ["--epochs", "3", "--steps-per-epoch", "2", "--backup-dir", str(tmp_path / "b")]
    run = _launch(tmp_path / "out", *flags)
    for line in run.stdout:
        if line.startswith("[worker 1] Epoch 2/"):
            run.send_signal(signal.SIGTERM)  # the launcher's: it passes it to every process
            break
    said, _ = run.communicate(timeout=BOUND_S)
    assert run.returncode == 128 + signal.SIGTERM, said[-3000:]
    for index in (0, 1):
        assert (f"[worker {index}] train_tpu.py: error: stopped by SIGTERM after 4 steps; the "
                f"backup in {tmp_path / 'b'} holds them") in said, said[-3000:]
    assert json.loads((tmp_path / "b" / "backup.json").read_text())["step"] == 4
    assert not (tmp_path / "out").exists() or os.listdir(tmp_path / "out") == []
    again = _launch(tmp_path / "out", *flags)
    said, _ = again.communicate(timeout=BOUND_S)
    assert again.returncode == 0, said[-3000:]
    name = outputs_name("tpu", ["--rehearse", "4", *flags[:4], "--data-source", "sample"])
    record = json.loads((tmp_path / "out" / f"{name}_jax.json").read_text())
    assert (record["resumed_from_step"], len(record["loss"])) == (4, 3)
    status, _, out, _ = slice_run
    first = json.loads((out / "slice" / f"{NAME}.json").read_text())["loss"][0]
    assert record["loss"][0] == pytest.approx(first, rel=1e-6)
    assert not (tmp_path / "b").exists()


def test_the_quoted_slice_rehearsal_trained_as_one_process_of_8_devices_did(repo):
    from pyimagesearch import outputs
    record, once = (json.loads((repo / "outputs" / "quoted" / folder / "tpu_rehearsal_jax.json")
                               .read_text()) for folder in ("jax_slice", "jax"))
    assert (record["hosts"], record["devices_per_host"], once["workers"]) == (2, 4, 1)
    for key in ("loss", "val_loss"):
        assert record[key] == pytest.approx(once[key], rel=1e-3)
    assert "\n2 hosts x 4 devices\n" in outputs.figure_title(record)
