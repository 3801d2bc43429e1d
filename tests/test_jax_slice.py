"""train_tpu.py on Keras' JAX backend across processes: a TPU slice's hosts, rehearsed here.

The launcher starts the processes as a slice's hosts would run (one each,
the same command), with Keras' KERAS_DISTRIBUTION_* variables in place of
the TPU's metadata; each holds 4 JAX CPU devices, and their collectives go
over gloo on loopback. What no slice has run here is said in docs/tpus.md.
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
from pyimagesearch import jax_route, jax_slice, outputs
from pyimagesearch.errors import UserError
from pyimagesearch.plan import Settings

# two steps of the article's global batch of 1024
TWO_STEPS = ["--epochs", "1", "--steps-per-epoch", "2"]
BOUND_S = 240  # no run here may take longer than this (a hang fails the test, not the suite)


@pytest.mark.parametrize("environ, count", [
    ({}, 1),
    ({"KERAS_DISTRIBUTION_NUM_PROCESSES": "1"}, 1),
    ({"KERAS_DISTRIBUTION_NUM_PROCESSES": "2"}, 2),
    ({"KERAS_DISTRIBUTION_NUM_PROCESSES": str(jax_slice.MAX_PROCESSES)},
     jax_slice.MAX_PROCESSES),
    ({"TPU_WORKER_HOSTNAMES": ""}, 1),
    ({"TPU_WORKER_HOSTNAMES": "ae-0-0.ae"}, 1),
    ({"TPU_WORKER_HOSTNAMES": "a,b,c,d"}, 4),
    # Keras' own variable wins over GKE's
    ({"KERAS_DISTRIBUTION_NUM_PROCESSES": "2", "TPU_WORKER_HOSTNAMES": "a,b,c,d"}, 2),
])
def test_the_processes_a_run_spans(environ, count):
    assert jax_slice.processes(environ) == count


@pytest.mark.parametrize("text", ["0", str(jax_slice.MAX_PROCESSES + 1), "", "two", "-1",
                                  "٣"])
def test_a_process_count_that_is_no_count_is_one_line(text):
    with pytest.raises(UserError, match="KERAS_DISTRIBUTION_NUM_PROCESSES=.*from 1 to 4096"):
        jax_slice.processes({"KERAS_DISTRIBUTION_NUM_PROCESSES": text})


@pytest.mark.parametrize("given", ["2", "-1", "x", ""])
def test_a_process_index_outside_the_count_is_one_line_before_jax_starts(given):
    with pytest.raises(UserError, match=r"KERAS_DISTRIBUTION_PROCESS_ID=.*from 0 to 1"):
        jax_slice.join(2, 1, {"KERAS_DISTRIBUTION_PROCESS_ID": given})


@pytest.mark.parametrize("flags, rehearsal, refused", [
    ({"loop": "custom"}, True, "--loop custom: on one host only (this run spans 2 JAX"),
    ({"backup_dir": "backups"}, False, "--backup-dir backups: every host of the slice reads"),
    ({"backup_dir": "gs://bucket/backups"}, False, None),  # every host reads a bucket
    ({"backup_dir": "backups"}, True, None),  # a rehearsal's processes share this disk
])
def test_what_several_processes_cannot_share_is_one_line(flags, rehearsal, refused):
    if refused is None:
        jax_route.refuse_levers(Settings(**flags), processes=2, rehearsal=rehearsal)
        return
    with pytest.raises(UserError) as said:
        jax_route.refuse_levers(Settings(**flags), processes=2, rehearsal=rehearsal)
    assert str(said.value).startswith(refused) and "\n" not in str(said.value)
    jax_route.refuse_levers(Settings(**flags), processes=1, rehearsal=rehearsal)  # one host


def test_process_0_is_the_chief():
    first, second = (jax_slice.Slice(workers=2, task_index=i, devices_per_host=4)
                     for i in (0, 1))
    assert first.is_chief and not second.is_chief
    assert (second.name, second.tasks) == ("process 1", ["process:0", "process:1"])


def test_the_launcher_tells_jax_processes_kerass_variables_and_tensorflow_its_tf_config():
    assert launch_workers.cluster_environment([5000, 5001, 5002], 2, "jax") == {
        "KERAS_DISTRIBUTION_JOB_ADDRESSES": "127.0.0.1:5000",  # the coordinator: worker 0
        "KERAS_DISTRIBUTION_NUM_PROCESSES": "3", "KERAS_DISTRIBUTION_PROCESS_ID": "2"}
    told = launch_workers.cluster_environment([5000, 5001], 1, "tensorflow")
    assert json.loads(told["TF_CONFIG"])["task"] == {"type": "worker", "index": 1}


# JAX's C++ record of the end it puts to a process (jaxlib 0.7.2), as it reaches fd 2
JAX_ENDS = {
    "lost": b"E1206 05:37:31.226 4913 coordination_service_agent.cc:332] Polled an error "
            b"from coordination service (this can be an error from this or another task).\n"
            b"F1206 05:37:31.227 4913 client.h:75] Terminating process because the JAX "
            b"distributed service detected fatal errors. This most likely indicates that "
            b"another task died\n"
            b"Additional GRPC error information from remote target coordination_service\n"
            b':UNKNOWN:Error received from peer  {grpc_message:"Socket closed"}\n',
    "not joined": b"F1206 05:38:39.266 5150 client.h:75] Terminating process because the "
                  b"JAX distributed service detected fatal errors. absl::Status: "
                  b"DEADLINE_EXCEEDED: Deadline Exceeded\n\n"
                  b"RPC: /tensorflow.CoordinationService/RegisterTask\n",
}
FILTERED = """
import os, sys
from pyimagesearch.runtime import this_process
from pyimagesearch.terminal import end_collective_noise_filter, filter_collective_noise
filter_collective_noise(this_process, ("our line: lost", "our line: not joined"))
os.write(2, b"a line of its own\\n" + sys.stdin.buffer.read())
end_collective_noise_filter(this_process)
"""


@pytest.mark.parametrize("ending", sorted(JAX_ENDS))
def test_jaxs_record_of_the_end_it_puts_to_a_process_is_one_line(repo, ending):
    result = subprocess.run([sys.executable, "-c", FILTERED], cwd=repo, input=JAX_ENDS[ending],
                            capture_output=True, timeout=60)
    assert result.stderr.decode().splitlines() == ["a line of its own", f"our line: {ending}"]


def _free_port():
    with socket.socket() as handle:
        handle.bind(("127.0.0.1", 0))
        return handle.getsockname()[1]


def _jax(**variables):
    """This environment, on Keras' JAX backend, with `variables` (KERAS_DISTRIBUTION_...)."""
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("KERAS_DISTRIBUTION_", "JAX_", "TF_CONFIG"))}
    return {**env, "KERAS_BACKEND": "jax", **{key: str(value) for key, value in
                                              variables.items()}}


def _launch(repo, out, *flags, workers=2):
    command = [sys.executable, "tools/launch_workers.py", "--workers", str(workers), "--",
               "train_tpu.py", "--rehearse", "4", "--output-dir", str(out), *flags]
    return subprocess.Popen(command, cwd=repo, env=_jax(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)


@pytest.fixture(scope="module")
def slice_run(tmp_path_factory):
    """Two steps on 2 processes of 4 JAX CPU devices, and on one device: both records."""
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = tmp_path_factory.mktemp("slice")
    run = _launch(repo, out / "slice", *TWO_STEPS)
    said, _ = run.communicate(timeout=BOUND_S)
    alone = subprocess.run([sys.executable, "train_tpu.py", "--rehearse", "1", *TWO_STEPS,
                            "--output-dir", str(out / "alone")], cwd=repo, env=_jax(),
                           capture_output=True, text=True, timeout=BOUND_S)
    return run.returncode, said, out, alone


@pytest.mark.slow  # the default suite's budget (docs/development.md); CI runs it
def test_two_processes_of_4_devices_train_the_one_device_step(slice_run):
    status, said, out, alone = slice_run
    assert status == 0 and alone.returncode == 0, said[-3000:] + alone.stderr[-2000:]
    name = "tpu_rehearsal_epochs-1_steps-per-epoch-2_jax"
    # process 0 alone writes, and the two steps on 8 devices of 2 processes end where the
    # same steps on one device do: each process fed its half of every global batch
    assert sorted(os.listdir(out / "slice")) == [f"{name}.{s}" for s in ("json", "keras", "png")]
    record = json.loads((out / "slice" / f"{name}.json").read_text())
    once = json.loads((out / "alone" / f"{name}.json").read_text())
    assert (record["workers"], record["replicas"], record["global_batch_size"]) == (2, 8, 1024)
    assert (record["hosts"], record["devices_per_host"], record["slice"]) == (2, 4, "rehearsal")
    assert compare.processes(record) == "2 hosts x 4 devices"
    for key in ("loss", "val_loss"):
        assert record[key] == pytest.approx(once[key], rel=1e-3)
    assert "[worker 1] [INFO] process 1 done; the chief writes the outputs" in said
    assert "[launch] all 2 workers finished" in said


def _kill_when_training(run, worker):
    """Read the launcher's lines until `worker` trains, then SIGKILL it; the rest of them."""
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


@pytest.mark.slow  # the default suite's budget (docs/development.md); CI runs it
@pytest.mark.parametrize("killed, survivor_says", [
    (1, "process 0 of 2 lost process 1: no beat from it for 10 s; restart every process "
        "together"),
    (0, "process 1 of 2 lost a peer (JAX's distributed service ended it, status 1); "
        "restart every process together"),
])
def test_a_lost_process_ends_the_other_in_one_line(repo, tmp_path, killed, survivor_says):
    run = _launch(repo, tmp_path, "--epochs", "3")
    said = _kill_when_training(run, killed)
    survivor = 1 - killed
    assert run.returncode == 128 + signal.SIGKILL, said[-3000:]
    theirs = [line for line in said.splitlines() if line.startswith(f"[worker {survivor}]")]
    assert theirs[-1] == f"[worker {survivor}] train_tpu.py: error: {survivor_says}", said[-3000:]
    assert "Terminating process" not in said and "Traceback" not in said
    assert os.listdir(tmp_path) == []  # nothing written


def _by_hand(repo, tmp_path, count, index, port, *flags):
    return subprocess.Popen(
        [sys.executable, "train_tpu.py", "--rehearse", "4", "--output-dir",
         str(tmp_path / str(index)), *flags], cwd=repo, text=True,
        env=_jax(KERAS_DISTRIBUTION_JOB_ADDRESSES=f"127.0.0.1:{port}",
                 KERAS_DISTRIBUTION_NUM_PROCESSES=count, KERAS_DISTRIBUTION_PROCESS_ID=index),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE)


@pytest.mark.slow  # the default suite's budget (docs/development.md); CI runs it
def test_processes_that_disagree_on_a_flag_stop_before_training_in_one_line(repo, tmp_path):
    port = _free_port()
    runs = [_by_hand(repo, tmp_path, 2, index, port, "--seed", str(40 + index))
            for index in (0, 1)]
    ended = [run.communicate(timeout=BOUND_S) for run in runs]
    for index, (run, (out, err)) in enumerate(zip(runs, ended)):
        assert run.returncode == 2, err[-3000:]
        assert err.strip().splitlines() == [
            f"train_tpu.py: error: the processes disagree: seed is {40 + index} on process "
            f"{index} but {41 - index} on process {1 - index}; start every process with the "
            "same flags, data and number of devices"]
        assert "training the autoencoder" not in out


@pytest.mark.slow  # the default suite's budget (docs/development.md); CI runs it
def test_a_coordinator_that_never_answers_is_one_line(repo, tmp_path):
    port = _free_port()  # nothing listens there
    run = _by_hand(repo, tmp_path, 2, 1, port, "--startup-timeout", "1")
    out, err = run.communicate(timeout=BOUND_S)
    assert run.returncode == 1
    assert err.strip().splitlines() == [
        f"train_tpu.py: error: process 1 could not join the other 1 through 127.0.0.1:{port} "
        "(--startup-timeout 1 s; JAX ended it, status 1); start every host's process with "
        "the same command, or raise --startup-timeout"]
    assert f"[INFO] joining 2 JAX processes through 127.0.0.1:{port}" in out


@pytest.mark.slow  # the default suite's budget (docs/development.md); CI runs it
def test_sigterm_stops_every_process_at_one_step_and_the_same_command_resumes(
        repo, tmp_path, slice_run):
    flags = ["--epochs", "3", "--steps-per-epoch", "2", "--backup-dir", str(tmp_path / "b")]
    run = _launch(repo, tmp_path / "out", *flags)
    for line in run.stdout:
        if line.startswith("[worker 1] Epoch 2/"):
            run.send_signal(signal.SIGTERM)  # the launcher's: it passes it to every process
            break
    said, _ = run.communicate(timeout=BOUND_S)
    assert run.returncode == 128 + signal.SIGTERM, said[-3000:]
    for index in (0, 1):
        assert (f"[worker {index}] train_tpu.py: error: stopped by SIGTERM after 4 steps with "
                f"every process; the backup in {tmp_path / 'b'} holds them") in said, said[-3000:]
    # process 0 saved the second epoch's end; nothing else was written
    assert json.loads((tmp_path / "b" / "checkpoint.json").read_text())["step"] == 4
    assert os.listdir(tmp_path / "out") == []

    again = _launch(repo, tmp_path / "out", *flags)
    said, _ = again.communicate(timeout=BOUND_S)
    assert again.returncode == 0, said[-3000:]
    record = json.loads((tmp_path / "out" / "tpu_rehearsal_epochs-3_steps-per-epoch-2_jax.json"
                         ).read_text())
    assert (record["resumed_from_step"], len(record["loss"])) == (4, 3)
    assert record["loss"][0] == pytest.approx(_first_loss(slice_run), rel=1e-6)
    assert not (tmp_path / "b").exists()  # the outputs are written: the backup is gone


def _first_loss(slice_run):
    _, _, out, _ = slice_run
    name = "tpu_rehearsal_epochs-1_steps-per-epoch-2_jax.json"
    return json.loads((out / "slice" / name).read_text())["loss"][0]


def test_the_quoted_slice_rehearsal_trained_as_one_process_of_8_devices_did(repo):
    # outputs/quoted/jax_slice: `KERAS_BACKEND=jax python tools/launch_workers.py --workers 2
    # -- train_tpu.py --rehearse 4 ...`, beside outputs/quoted/jax's --rehearse 8
    record, once = (json.loads((repo / "outputs" / "quoted" / folder / "tpu_rehearsal_jax.json")
                               .read_text()) for folder in ("jax_slice", "jax"))
    assert (record["hosts"], record["devices_per_host"], once["workers"]) == (2, 4, 1)
    for key in ("loss", "val_loss"):
        assert record[key] == pytest.approx(once[key], rel=1e-3)
    assert "\n2 hosts x 4 devices\n" in outputs.figure_title(None, record)
    assert "[launch] all 2 workers finished" in (
        repo / "outputs" / "quoted" / "jax_slice" / "launch.log").read_text()
