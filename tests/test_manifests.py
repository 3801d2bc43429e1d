"""The Kubernetes manifests of docs/fault-tolerance-and-tensorboard.md, checked offline.

Nothing here runs Kubernetes. The manifests are read from the docs as YAML and:

- validated against the CRDs' openAPIV3Schema, vendored unchanged in tests/data/crds/:
  JobSet v0.12.0 (kubernetes-sigs/jobset tag v0.12.0, commit f22e565a,
  config/components/crd/bases/jobset.x-k8s.io_jobsets.yaml) and the Training Operator
  v1.9.0's TFJob (kubeflow/training-operator tag v1.9.0, commit 6f74c7f6,
  manifests/base/crds/kubeflow.org_tfjobs.yaml, the same file on release-1.9 at 078ec30f).
  Strictly: where the CRD declares an object's fields, any other is refused (the API
  server would drop it without a word, so a typo would be lost), unless the CRD says
  x-kubernetes-preserve-unknown-fields. The CRDs' CEL rules (x-kubernetes-validations)
  are not run;
- checked for what JobSet's webhook (pkg/webhooks/jobset_webhook.go, v0.12.0), the
  Training Operator's (pkg/webhooks/tensorflow/tfjob_webhook.go, v1.9.0) and Kubernetes'
  Job validation (pkg/apis/batch/validation) add: rule names, failure reasons, exit-code
  lists, restartPolicy;
- replayed: every pod's TF_CONFIG from the manifest's own env list and the labels JobSet
  puts on its pods, for 1 and 2 replicas; and the failure policy, worded as Kubernetes'
  Job controller words a failed Job (pkg/controller/job/pod_failure_policy.go) and
  matched as JobSet's controller matches it (pkg/controllers/failure_policy.go).
"""
import copy
import functools
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml

from conftest import tensorflows

from pyimagesearch import cli, cluster

REPO = Path(__file__).resolve().parent.parent
CRDS = Path(__file__).resolve().parent / "data" / "crds"
DOC = REPO / "docs" / "fault-tolerance-and-tensorboard.md"
LABEL = "jobset.sigs.k8s.io/"
SCALE_UP_S = 900  # s; a GPU node pool that scales from zero can take this long


def _doc_manifest(kind, doc=DOC):
    """The manifest of `kind` in the docs (`doc`), parsed."""
    blocks = re.findall(r"```yaml\n(.*?)```", doc.read_text(), re.S)
    found = [manifest for manifest in map(yaml.safe_load, blocks)
             if manifest.get("kind") == kind]
    assert len(found) == 1, f"one {kind} manifest expected in {doc.name}"
    return found[0]


def _strict(schema):
    """`schema` with unknown fields refused wherever the CRD declares an object's fields."""
    schema = dict(schema)
    if "properties" in schema:
        schema["properties"] = {key: _strict(value) for key, value in schema["properties"].items()}
    for key in ("items", "additionalProperties"):
        if isinstance(schema.get(key), dict):
            schema[key] = _strict(schema[key])
    if "anyOf" in schema:
        schema["anyOf"] = [_strict(choice) for choice in schema["anyOf"]]
    if (schema.get("type") == "object" and "additionalProperties" not in schema
            and not schema.get("x-kubernetes-preserve-unknown-fields")):
        schema["additionalProperties"] = False
    return schema


def _unique_map_keys(validator, keys, instance, schema):
    """x-kubernetes-list-map-keys: no two items of a list-map share their keys."""
    if validator.is_type(instance, "array"):
        seen = [tuple(item.get(key) for key in keys) for item in instance]
        if len(seen) != len(set(seen)):
            yield jsonschema.ValidationError(f"items repeat their keys {keys}: {seen}")


# OpenAPI v3.0, which CRDs use, follows JSON Schema draft 4
KubernetesValidator = jsonschema.validators.extend(
    jsonschema.Draft4Validator, {"x-kubernetes-list-map-keys": _unique_map_keys})


@functools.lru_cache(maxsize=None)  # a CRD is parsed once per process
def _validator(crd_file):
    crd = yaml.load((CRDS / crd_file).read_text(), Loader=getattr(yaml, "CSafeLoader",
                                                                  yaml.SafeLoader))
    (version,) = crd["spec"]["versions"]
    schema = _strict(version["schema"]["openAPIV3Schema"])
    # the API server checks an object's own metadata itself; the CRD leaves it open
    schema["properties"]["metadata"] = {
        "type": "object", "required": ["name"], "additionalProperties": False,
        "properties": {"name": {"type": "string", "pattern": r"^[a-z]([-a-z0-9]*[a-z0-9])?$"},
                       "annotations": {"type": "object",
                                       "additionalProperties": {"type": "string"}}}}
    schema["required"] = ["apiVersion", "kind", "metadata", "spec"]
    schema["properties"]["apiVersion"]["enum"] = [f"{crd['spec']['group']}/{version['name']}"]
    schema["properties"]["kind"]["enum"] = [crd["spec"]["names"]["kind"]]
    return KubernetesValidator(schema)


VALIDATORS = {"JobSet": "jobset.x-k8s.io_jobsets.yaml", "TFJob": "kubeflow.org_tfjobs.yaml"}


def _schema_errors(manifest):
    validator = _validator(VALIDATORS[manifest["kind"]])
    return [f"{'.'.join(map(str, error.absolute_path))}: {error.message}"
            for error in validator.iter_errors(manifest)]


def _jobset_webhook_errors(manifest):
    """What JobSet v0.12.0's webhook and Kubernetes' Job validation refuse, of what we use."""
    errors = []
    policy = manifest["spec"].get("failurePolicy", {})
    names = [rule.get("name", "") for rule in policy.get("rules", [])]
    replicated = {rjob["name"] for rjob in manifest["spec"]["replicatedJobs"]}
    for rule in policy.get("rules", []):
        if not re.fullmatch(r"[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?", rule.get("name", "")):
            errors.append(f"rule name {rule.get('name')!r}")
        errors += [f"reason {reason}" for reason in rule.get("onJobFailureReasons", [])
                   if reason not in ("BackoffLimitExceeded", "DeadlineExceeded", "FailedIndexes",
                                     "MaxFailedIndexesExceeded", "PodFailurePolicy")]
        errors += [f"target {name}" for name in rule.get("targetReplicatedJobs", [])
                   if name not in replicated]
        for pattern in rule.get("onJobFailureMessagePatterns", []):
            re.compile(pattern)  # RE2 and Python agree on these plain patterns
    if len(set(names)) != len(names):
        errors.append(f"rule names repeat: {names}")
    for rjob in manifest["spec"]["replicatedJobs"]:
        job = rjob["template"]["spec"]
        pod = job["template"]["spec"]
        containers = {container["name"] for container in pod["containers"]}
        if "podFailurePolicy" in job and pod.get("restartPolicy") != "Never":
            errors.append("a podFailurePolicy needs restartPolicy: Never")
        for rule in job.get("podFailurePolicy", {}).get("rules", []):
            codes, conditions = rule.get("onExitCodes"), rule.get("onPodConditions")
            if bool(codes) == bool(conditions):
                errors.append(f"one of onExitCodes and onPodConditions: {rule}")
            if codes:
                values = codes["values"]
                if values != sorted(set(values)) or (codes["operator"] == "In" and 0 in values):
                    errors.append(f"exit codes must be ordered, unique, not 0: {values}")
                if codes.get("containerName", next(iter(containers))) not in containers:
                    errors.append(f"no container {codes['containerName']}")
            errors += [f"condition status {pattern}" for pattern in conditions or []
                       if pattern.get("status") not in ("True", "False", "Unknown")]
    return errors


def _tfjob_webhook_errors(manifest):
    """What the Training Operator v1.9.0 refuses, of what we use."""
    errors = []
    for role, spec in manifest["spec"]["tfReplicaSpecs"].items():
        containers = spec["template"]["spec"]["containers"]
        if role not in ("Chief", "Master", "PS", "Worker", "Evaluator"):
            errors.append(f"role {role}")
        if spec.get("restartPolicy", "Never") not in ("Always", "OnFailure", "Never", "ExitCode"):
            errors.append(f"restartPolicy {spec['restartPolicy']}")
        if "tensorflow" not in [container["name"] for container in containers]:
            errors.append("no container named tensorflow")  # whose status ExitCode reads
        errors += [f"{container['name']} has no image" for container in containers
                   if not container.get("image")]
    return errors


def _container(pod_spec):
    (container,) = pod_spec["containers"]  # the manifests' pods run one container each
    return container


# --- the manifests against their CRDs -------------------------------------------------

@pytest.mark.parametrize("kind", ["JobSet", "TFJob"])
def test_the_docs_manifests_are_valid_for_their_crds(kind):
    manifest = _doc_manifest(kind)
    assert _schema_errors(manifest) == []
    webhook = _jobset_webhook_errors if kind == "JobSet" else _tfjob_webhook_errors
    assert webhook(manifest) == []


def _rjob(manifest):
    return manifest["spec"]["replicatedJobs"][0]["template"]["spec"]


@pytest.mark.parametrize("kind, change, complaint", [
    # a typo anywhere, the pod template's container included, is refused
    ("JobSet", lambda m: _rjob(m).update(parallelizm=2), "'parallelizm' was unexpected"),
    ("JobSet", lambda m: _container(_rjob(m)["template"]["spec"]).update(comand=["x"]),
     "'comand' was unexpected"),
    ("JobSet", lambda m: m["spec"]["failurePolicy"]["rules"][0].pop("name"),
     "'name' is a required property"),
    ("JobSet", lambda m: m["spec"]["failurePolicy"]["rules"][0].update(action="Restart"),
     "is not one of"),
    ("JobSet", lambda m: _container(_rjob(m)["template"]["spec"])["env"].append(
        {"name": "WORKERS", "value": "3"}), "repeat their keys"),
    ("JobSet", lambda m: m.update(apiVersion="jobset.x-k8s.io/v1"), "is not one of"),
    ("TFJob", lambda m: m["spec"]["tfReplicaSpecs"]["Worker"].update(replica=2),
     "'replica' was unexpected"),
    ("TFJob", lambda m: m["spec"]["tfReplicaSpecs"]["Worker"]["template"]["spec"].update(
        restartpolicy="Never"), "'restartpolicy' was unexpected"),
    ("TFJob", lambda m: m["spec"].update(runpolicy={}), "'runpolicy' was unexpected"),
])
def test_a_field_the_crd_does_not_declare_is_refused(kind, change, complaint):
    manifest = copy.deepcopy(_doc_manifest(kind))
    change(manifest)
    assert any(complaint in error for error in _schema_errors(manifest))


@pytest.mark.parametrize("change, complaint", [
    (lambda rules, job: rules[1].update(name="preempted"), "rule names repeat"),
    (lambda rules, job: rules[0].update(name="1st"), "rule name '1st'"),
    (lambda rules, job: rules[0].update(onJobFailureReasons=["PodFailure"]), "reason PodFailure"),
    (lambda rules, job: job["podFailurePolicy"]["rules"][2]["onExitCodes"].update(
        values=[2, 1]), "must be ordered"),
    (lambda rules, job: job["template"]["spec"].update(restartPolicy="OnFailure"),
     "needs restartPolicy: Never"),
])
def test_what_the_webhooks_refuse_is_refused(change, complaint):
    manifest = copy.deepcopy(_doc_manifest("JobSet"))
    change(manifest["spec"]["failurePolicy"]["rules"], _rjob(manifest))
    assert any(complaint in error for error in _jobset_webhook_errors(manifest))


@pytest.mark.parametrize("kind", ["JobSet", "TFJob"])
def test_the_manifests_command_waits_past_a_scale_up(kind):
    manifest = _doc_manifest(kind)
    pod = (_rjob(manifest) if kind == "JobSet"
           else manifest["spec"]["tfReplicaSpecs"]["Worker"])["template"]["spec"]
    command = _container(pod)["command"]
    assert command[:2] == ["python", "train_gpu.py"] and (REPO / command[1]).is_file()
    args = cli.build_parser("gpu", "").parse_args(command[2:])  # the script's own flags
    assert args.startup_timeout >= SCALE_UP_S
    assert args.backup_dir  # a restart resumes from it


# --- every pod's TF_CONFIG, from the manifest's env list --------------------------------

def _pods(manifest):
    """Every pod's environment: the env list, with its fieldRefs read from the labels that
    JobSet v0.12.0 puts on a pod (labelAndAnnotateObject), and JOB_COMPLETION_INDEX."""
    name = manifest["metadata"]["name"]
    (rjob,) = manifest["spec"]["replicatedJobs"]
    job = rjob["template"]["spec"]
    for job_index in range(rjob["replicas"]):
        labels = {"jobset-name": name, "replicatedjob-name": rjob["name"],
                  "replicatedjob-replicas": str(rjob["replicas"]),
                  "global-replicas": str(rjob["replicas"]), "job-index": str(job_index),
                  "job-global-index": str(job_index)}
        for pod_index in range(job["completions"]):
            environ = {"JOB_COMPLETION_INDEX": str(pod_index)}  # Kubernetes: an Indexed Job
            for item in _container(job["template"]["spec"])["env"]:
                if "value" in item:
                    environ[item["name"]] = item["value"]
                    continue
                path = item["valueFrom"]["fieldRef"]["fieldPath"]
                label = re.fullmatch(r"metadata\.labels\['jobset\.sigs\.k8s\.io/([a-z-]+)'\]",
                                     path)
                assert label, f"{item['name']}: not a label that JobSet sets: {path}"
                environ[item["name"]] = labels[label[1]]
            # its stable name: Job <jobset>-<rjob>-<j> (placement.GenJobName), pod <job>-<p>
            yield environ, f"{name}-{rjob['name']}-{job_index}-{pod_index}"


@pytest.mark.parametrize("replicas", [1, 2])
def test_every_pod_of_every_replica_builds_one_cluster(replicas):
    manifest = copy.deepcopy(_doc_manifest("JobSet"))
    manifest["spec"]["replicatedJobs"][0]["replicas"] = replicas
    assert _schema_errors(manifest) == []
    job = _rjob(manifest)
    assert job["completionMode"] == "Indexed" and job["parallelism"] == job["completions"]
    container = _container(job["template"]["spec"])
    (port,) = [p["containerPort"] for p in container["ports"]]
    subdomain = manifest["spec"].get("network", {}).get("subdomain", manifest["metadata"]["name"])
    pods = list(_pods(manifest))
    assert len(pods) == replicas * job["parallelism"]
    specs = {hostname: json.loads(cluster.jobset_tf_config(environ)) for environ, hostname in pods}
    clusters = [spec["cluster"] for spec in specs.values()]
    assert clusters == [clusters[0]] * len(clusters)  # one cluster, the same for every pod
    hosts = clusters[0]["worker"]
    assert sorted(hosts) == sorted(f"{pod}.{subdomain}:{port}" for pod in specs)
    assert sorted(spec["task"]["index"] for spec in specs.values()) == list(range(len(pods)))
    for hostname, spec in specs.items():  # each pod is the worker its own name is listed as
        assert hosts[spec["task"]["index"]] == f"{hostname}.{subdomain}:{port}"
        assert spec["task"]["type"] == "worker"


# --- the failure policy, replayed -------------------------------------------------------

def _job_failure(job, status, conditions=()):
    """(reason, message) of the Job that a pod failing with `status` fails, as Kubernetes'
    Job controller words it (matchPodFailurePolicy), or None if the Job goes on."""
    pod = "default/autoencoder-worker-0-1"
    name = _container(job["template"]["spec"])["name"]
    for index, rule in enumerate(job.get("podFailurePolicy", {}).get("rules", [])):
        codes, message = rule.get("onExitCodes"), None
        if codes and codes.get("containerName", name) == name and status:
            if (status in codes["values"]) == (codes["operator"] == "In"):
                message = (f"Container {name} for pod {pod} failed with exit code {status} "
                           f"matching {rule['action']} rule at index {index}")
        for pattern in rule.get("onPodConditions", []):
            if pattern["type"] in conditions and pattern["status"] == "True" and not message:
                message = (f"Pod {pod} has condition {pattern['type']} matching "
                           f"{rule['action']} rule at index {index}")
        if message:
            if rule["action"] == "FailJob":
                return "PodFailurePolicy", message
            if rule["action"] == "Ignore":
                return None
            break  # Count: as if no rule matched
    if job.get("backoffLimit", 6) == 0:
        return "BackoffLimitExceeded", "Job has reached the specified backoff limit"
    return None


def _jobset_outcome(manifest, status, conditions=()):
    """What the JobSet does when a pod fails so: its first rule that applies, or the
    default (RestartJobSet), as its controller's ruleIsApplicable matches them."""
    failure = _job_failure(_rjob(manifest), status, conditions)
    rjob_name = manifest["spec"]["replicatedJobs"][0]["name"]
    if failure is None:
        return "the Job goes on"
    reason, message = failure
    for rule in manifest["spec"]["failurePolicy"].get("rules", []):
        if (reason in rule.get("onJobFailureReasons", [reason])
                and any(re.search(p, message) for p in rule.get("onJobFailureMessagePatterns",
                                                                ["."]))
                and rjob_name in rule.get("targetReplicatedJobs", [rjob_name])):
            action = rule["action"]
            break
    else:
        action = "RestartJobSet"
    return {"FailJobSet": "fails", "RestartJobSet": "retries, counted",
            "RestartJobSetAndIgnoreMaxRestarts": "retries, not counted"}[action]


def _exit_table():
    """{status: (the TFJob's column, the JobSet's column)} of the docs' exit-status table."""
    text = DOC.read_text().split("### Exit statuses", 1)[1].split("\n\n**", 1)[0]
    rows = [line.split(" | ") for line in text.splitlines() if re.match(r"\| \d", line)]
    return {int(status): (tfjob, jobset_column.rstrip(" |"))
            for first, _, tfjob, jobset_column in rows
            for status in first.strip("| ").split(", ")}


def test_the_exit_table_says_what_the_jobset_and_the_tfjob_do():
    table = _exit_table()
    assert {1, 2, 126, 127, 130, 137, 138, 139, 143} <= set(table)
    manifest = _doc_manifest("JobSet")
    assert manifest["spec"]["failurePolicy"]["maxRestarts"] >= 1
    for status, (tfjob, jobset_column) in table.items():
        if status == 0:
            assert (tfjob, jobset_column) == ("done", "done")
            continue
        # the Training Operator v1.9: IsRetryableExitCode is exitCode >= 128
        assert tfjob.startswith("retries" if status >= 128 else "fails"), status
        assert jobset_column == _jobset_outcome(manifest, status), status


@pytest.mark.parametrize("status, outcome", [
    (1, "fails"), (2, "fails"), (126, "fails"), (127, "fails"),
    (143, "retries, not counted"), (138, "retries, counted"), (137, "retries, counted"),
    (128, "retries, counted"), (139, "retries, counted"), (3, "retries, counted"),
])
def test_the_jobset_fails_on_a_permanent_status_only(status, outcome):
    assert _jobset_outcome(_doc_manifest("JobSet"), status) == outcome


@pytest.mark.parametrize("status", [137, 143, 2])
def test_a_disrupted_pod_restarts_the_jobset_uncounted_whatever_its_status(status):
    # preempted, evicted, drained, or its node lost: Kubernetes sets DisruptionTarget
    manifest = _doc_manifest("JobSet")
    assert _jobset_outcome(manifest, status, {"DisruptionTarget"}) == "retries, not counted"
    # the replay itself: without the policy, a disruption would fail the JobSet or count
    manifest = copy.deepcopy(manifest)
    _rjob(manifest).pop("podFailurePolicy")
    assert _jobset_outcome(manifest, status, {"DisruptionTarget"}) == "retries, counted"


# --- real processes with what the manifest gives pod 0 and pod 1 ------------------------

@pytest.mark.slow  # 12 s; the default run builds each pod's TF_CONFIG in this process
def test_real_processes_with_the_manifests_pod_environment_build_one_cluster(tmp_path):
    # two train_gpu.py processes, given what the docs' JobSet gives pod 0 and pod 1;
    # the pods' names resolve only in the cluster, so each stops when its peers do
    # not answer within --startup-timeout, after saying the TF_CONFIG it built
    # each pod in a network namespace of its own, as pods are: both listen on 2222
    if subprocess.run(["unshare", "--net", "--map-root-user", "true"],
                      capture_output=True).returncode != 0:
        pytest.skip("needs network namespaces (unshare --net)")
    environ = {key: value for key, value in os.environ.items() if key != "TF_CONFIG"}
    pods = [subprocess.Popen(
        ["unshare", "--net", "--map-root-user", sys.executable, "train_gpu.py", "--rehearse",
         "1", "--startup-timeout", "1",
         "--data-source", "sample", "--output-dir", str(tmp_path / f"pod{index}")],
        cwd=REPO, env={**environ, **pod_environ},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for index, (pod_environ, _) in enumerate(_pods(_doc_manifest("JobSet")))]
    built = []
    for pod in pods:
        out, err = pod.communicate(timeout=180)
        assert pod.returncode == 138, err  # no peer answered: retried by the JobSet
        said = [line for line in out.splitlines() if "TF_CONFIG built from" in line]
        assert len(said) == 1, out
        built.append(json.loads(said[0].split(": ", 1)[1]))
        ours = [line for line in err.strip().splitlines() if not tensorflows(line)]
        assert len(ours) == 1 and ours == err.strip().splitlines()[-1:], err
    assert built[0]["cluster"] == built[1]["cluster"] == {"worker": [
        "autoencoder-worker-0-0.autoencoder:2222", "autoencoder-worker-0-1.autoencoder:2222"]}
    assert [spec["task"]["index"] for spec in built] == [0, 1]
