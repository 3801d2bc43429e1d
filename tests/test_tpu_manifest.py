"""docs/tpus.md's JobSet for a GKE TPU slice (issue 44), checked offline as the cluster's is.

Nothing here runs Kubernetes or a TPU. The manifest is read from the docs and validated
against the vendored JobSet v0.12.0 CRD with test_manifests.py's strict validator and its
webhook checks; then what makes it a TPU slice is checked: one pod per host, every chip of
the topology asked for, the pods kept on one node pool, each running train_tpu.py on JAX
with flags its parser takes; and the failure policy is replayed, as for the cluster's.
"""
import copy
import math
import re

import pytest

from test_manifests import (REPO, _container, _doc_manifest, _jobset_outcome,
                            _jobset_webhook_errors, _rjob, _schema_errors)

from pyimagesearch import cli

DOC = REPO / "docs" / "tpus.md"
# GKE's TPU accelerator labels and the chips one host of a multi-host slice holds
# (GKE's "Plan TPUs in GKE" tables: ct5lp-hightpu-4t, ct6e-standard-4t, ct4p-hightpu-4t)
CHIPS_PER_HOST = {"tpu-v5-lite-podslice": 4, "tpu-v6e-slice": 4, "tpu-v4-podslice": 4}
JAX_COORDINATOR_PORT = 8476  # jax 0.6.2 and 0.7.2, jax/_src/clusters/cloud_tpu_cluster.py
# the ports GKE's multi-host TPU JobSets open (GKE's "Deploy TPU workloads", xpk)
PORTS = {8471: "libtpu", JAX_COORDINATOR_PORT: "JAX's coordinator", 8431: "libtpu's metrics"}


def _slice():
    return _doc_manifest("JobSet", DOC)


def _pod(manifest):
    return _rjob(manifest)["template"]["spec"]


def _chips(topology):
    """The chips of a GKE TPU topology: '4x4' is 16, '2x2x4' is 16."""
    return math.prod(int(side) for side in topology.split("x"))


def test_the_slice_jobset_is_valid_for_its_crd():
    manifest = _slice()
    assert _schema_errors(manifest) == []
    assert _jobset_webhook_errors(manifest) == []


def _slice_problems(manifest):
    """What keeps `manifest` from being one slice with one pod per host; [] if nothing."""
    (rjob,) = manifest["spec"]["replicatedJobs"]
    job, pod = rjob["template"]["spec"], _pod(manifest)
    selector = pod.get("nodeSelector", {})
    accelerator = selector.get("cloud.google.com/gke-tpu-accelerator")
    topology = selector.get("cloud.google.com/gke-tpu-topology")
    if accelerator not in CHIPS_PER_HOST or not topology:
        return [f"no TPU accelerator and topology in the nodeSelector: {selector}"]
    per_host = CHIPS_PER_HOST[accelerator]
    hosts = _chips(topology) // per_host
    problems = []
    if rjob["replicas"] != 1:
        problems.append(f"{rjob['replicas']} slices")
    if job.get("completionMode") != "Indexed":  # GKE's TPU_WORKER_ID: the completion index
        problems.append("not an Indexed Job")
    if not job["parallelism"] == job["completions"] == hosts:
        problems.append(f"{job['parallelism']} pods for {hosts} hosts")
    chips = int(_container(pod)["resources"]["limits"].get("google.com/tpu", 0))
    if chips != per_host:
        problems.append(f"{chips} chips a pod, not its host's {per_host}")
    # all the slice's pods on one node pool: the slice's own interconnect joins them
    annotations = manifest["metadata"].get("annotations", {})
    if annotations.get("alpha.jobset.sigs.k8s.io/exclusive-topology") != \
            "cloud.google.com/gke-nodepool":
        problems.append("pods not kept on one node pool")
    # on the host's network a pod resolves the JobSet's service names (TPU_WORKER_HOSTNAMES,
    # JAX's coordinator) only with this DNS policy (Kubernetes' "Pod's DNS Policy")
    if pod.get("hostNetwork") and pod.get("dnsPolicy") != "ClusterFirstWithHostNet":
        problems.append("hostNetwork without dnsPolicy ClusterFirstWithHostNet")
    ports = {port["containerPort"] for port in _container(pod).get("ports", [])}
    problems += [f"no container port {port} ({what})" for port, what in PORTS.items()
                 if port not in ports]
    return problems


def test_its_pods_fill_one_slice_one_pod_per_host():
    manifest = _slice()
    assert _slice_problems(manifest) == []
    assert _rjob(manifest)["parallelism"] == 4  # a v5e-16: 4 hosts of 4 chips


@pytest.mark.parametrize("change, problem", [
    (lambda m: _rjob(m).update(parallelism=3), "3 pods for 4 hosts"),
    (lambda m: _rjob(m).update(completions=8, parallelism=8), "8 pods for 4 hosts"),
    (lambda m: _container(_pod(m))["resources"]["limits"].update({"google.com/tpu": 8}),
     "8 chips a pod"),
    (lambda m: _container(_pod(m))["resources"]["limits"].pop("google.com/tpu"),
     "0 chips a pod"),
    (lambda m: _pod(m)["nodeSelector"].update({"cloud.google.com/gke-tpu-topology": "2x4"}),
     "4 pods for 2 hosts"),
    (lambda m: _pod(m)["nodeSelector"].pop("cloud.google.com/gke-tpu-accelerator"),
     "no TPU accelerator"),
    (lambda m: m["metadata"].pop("annotations"), "not kept on one node pool"),
    (lambda m: _rjob(m).pop("completionMode"), "not an Indexed Job"),
    (lambda m: m["spec"]["replicatedJobs"][0].update(replicas=2), "2 slices"),
    (lambda m: _pod(m).update(hostNetwork=True), "hostNetwork without dnsPolicy"),
    (lambda m: _container(_pod(m))["ports"].pop(), "no container port 8431 (libtpu's metrics)"),
])
def test_a_manifest_that_is_not_one_slice_is_told(change, problem):
    manifest = copy.deepcopy(_slice())
    change(manifest)
    assert any(problem in found for found in _slice_problems(manifest))


def test_the_hosts_network_is_allowed_with_its_dns_policy():
    manifest = copy.deepcopy(_slice())
    _pod(manifest).update(hostNetwork=True, dnsPolicy="ClusterFirstWithHostNet")
    assert _slice_problems(manifest) == [] and _schema_errors(manifest) == []


def test_every_pod_runs_train_tpu_on_jax_with_flags_its_parser_takes():
    container = _container(_pod(_slice()))
    command = container["command"]
    assert command[:2] == ["python", "train_tpu.py"] and (REPO / command[1]).is_file()
    args = cli.build_parser("tpu", "").parse_args(command[2:])
    assert args.output_dir.startswith("gs://")  # process 0 writes; every host reaches a bucket
    assert args.rehearse is None
    assert {"name": "KERAS_BACKEND", "value": "jax"} in container["env"]
    ports = {port["containerPort"] for port in container["ports"]}
    assert JAX_COORDINATOR_PORT in ports


def test_the_coordinator_port_is_the_one_jax_uses():
    cloud_tpu_cluster = pytest.importorskip("jax._src.clusters.cloud_tpu_cluster")
    assert int(cloud_tpu_cluster.coordinator_port) == JAX_COORDINATOR_PORT


@pytest.mark.parametrize("status, outcome", [
    # 1 and 134 too: JAX ends the other hosts with them when host 0 is lost (jaxlib 0.7.2:
    # 1; 0.6.2: SIGABRT, docs/tpus.md)
    (1, "retries, counted"), (134, "retries, counted"), (2, "fails"), (126, "fails"), (127, "fails"),
    (143, "retries, not counted"), (137, "retries, counted"), (138, "retries, counted"),
    (139, "retries, counted"), (3, "retries, counted"), (255, "retries, counted"),
])
def test_a_failed_host_restarts_the_whole_slice_or_fails_it(status, outcome):
    assert _jobset_outcome(_slice(), status) == outcome


def test_a_disrupted_host_restarts_the_slice_uncounted():
    manifest = _slice()
    assert _jobset_outcome(manifest, 137, {"DisruptionTarget"}) == "retries, not counted"
    manifest = copy.deepcopy(manifest)  # the replay itself: without the rule it counts
    _rjob(manifest).pop("podFailurePolicy")
    assert _jobset_outcome(manifest, 137, {"DisruptionTarget"}) == "retries, counted"


# --- the docs' install lines and gcloud commands -------------------------------------------------

def _blocks(language):
    return re.findall(rf"```{language}\n(.*?)```", DOC.read_text(), re.S)


def test_the_image_is_the_tpu_vms_install_on_the_tpu_vms_python():
    (dockerfile,) = _blocks("dockerfile")
    assert "FROM python:3.10" in dockerfile  # the TPU VM image's Python, as the pins are for
    assert "pip install --no-cache-dir -r requirements-tpu-vm.txt" in dockerfile
    pins = (REPO / "requirements-tpu-vm.txt").read_text()
    assert "Python 3.10" in pins and "jax[tpu]==0.6.2" in pins


def test_every_tpu_created_is_deleted_and_runs_on_the_images_python3():
    gcloud = [block for block in _blocks("bash") if "gcloud compute tpus" in block]
    assert len(gcloud) == 2  # one host, and a slice
    for block in gcloud:
        created = re.findall(r"queued-resources create (\S+)", block)
        assert created and re.findall(r"queued-resources delete (\S+) .*--force", block) \
            == created
        assert " python " not in block and "python3 train_tpu.py" in block
        assert "pip install -r requirements-tpu-vm.txt" in block


def test_no_reader_types_a_process_count_or_host_list():
    # JAX finds the slice itself; Keras' variables are the launcher's, for a rehearsal
    for page in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        for variable in ("KERAS_DISTRIBUTION_NUM_PROCESSES=", "KERAS_DISTRIBUTION_PROCESS_ID=",
                         "TPU_WORKER_HOSTNAMES=", "TPU_WORKER_ID="):
            assert variable not in page.read_text(), f"{page.name}: {variable}"
