"""The Kubernetes manifests of ``examples/deploy/`` are valid, and their policies do what they say.

Schemas: core kinds (Job, Service, PersistentVolumeClaim, and the Pods and Jobs the operators
create) against Kubernetes' own OpenAPI schemas as ``kubernetes-validate`` bundles them, strict
(unknown fields are errors, as ``kubectl apply`` with its default server-side field validation
rejects them), for the oldest Kubernetes the manifests need (1.31: ``podFailurePolicy`` GA) and
the newest the validator knows. Custom resources (JobSet, TFJob): their metadata as ObjectMeta
and the Jobs and Pods their controllers create from them, strict; the custom fields themselves
are checked by what the tests below read from them (no CRD schema ships in a package this
project can install). Then the rules of the API server's Go validation that no schema states
(podFailurePolicy's), and what each failure policy does with exit code 42 (stratax's preemption)
and with a real error.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
from kubernetes_validate.utils import latest_version
from render import KUBERNETES, failure_action, load, manifests, pods_of

HERE = Path(__file__).parent
K8S_VERSIONS = ("1.31", latest_version())
CUSTOM_KINDS = {("jobset.x-k8s.io/v1alpha2", "JobSet"), ("kubeflow.org/v1", "TFJob")}
PREEMPTION_EXIT_CODE = 42


def validate(doc: dict[str, Any], version: str) -> None:
    """Raises a ``jsonschema.ValidationError`` (or the validator's own error) if ``doc`` is
    invalid for Kubernetes ``version``; an unknown kind is an error, never a pass."""
    if (doc["apiVersion"], doc["kind"]) not in CUSTOM_KINDS:
        kubernetes_validate.validate(doc, version, strict=True)
        return
    # The API server checks a custom resource's metadata as ObjectMeta.
    kubernetes_validate.validate({"apiVersion": "v1", "kind": "ConfigMap",
                                  "metadata": doc["metadata"]}, version, strict=True)
    for created in _created_from(doc):
        kubernetes_validate.validate(created, version, strict=True)


def _created_objects(path: Path) -> list[dict[str, Any]]:
    """The Jobs and Pods that the JobSet controller or the training operator creates."""
    objects = [obj for doc in load(path) for obj in _created_from(doc)]
    for pod in pods_of(path):
        objects.append({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": pod.name},
                        "spec": pod.spec})
    return objects


def _created_from(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The Jobs (JobSet) or Pods (TFJob) a custom resource's controller creates from it."""
    objects = []
    if doc["kind"] == "JobSet":
        for rjob in doc["spec"]["replicatedJobs"]:
            for j in range(rjob.get("replicas", 1)):
                objects.append({"apiVersion": "batch/v1", "kind": "Job",
                                "metadata": {"name": f"{doc['metadata']['name']}-"
                                                     f"{rjob['name']}-{j}"},
                                "spec": rjob["template"]["spec"]})
    if doc["kind"] == "TFJob":
        for replica in doc["spec"]["tfReplicaSpecs"].values():
            spec = dict(replica["template"]["spec"])
            # The operator sets the pod's policy: ExitCode becomes Never (it restarts pods).
            policy = replica.get("restartPolicy", "Never")
            spec["restartPolicy"] = "Never" if policy == "ExitCode" else policy
            objects.append({"apiVersion": "v1", "kind": "Pod",
                            "metadata": {"name": "replica"}, "spec": spec})
    return objects


def _jobs(path: Path) -> list[dict[str, Any]]:
    docs = load(path)
    jobs = [d for d in docs if d["kind"] == "Job"]
    jobs += [o for o in _created_objects(path) if o["kind"] == "Job"]
    return jobs


MANIFESTS = manifests()
WORKLOADS = [p for p in MANIFESTS if pods_of(p)]


def test_every_kind_is_there() -> None:
    kinds = {(d["apiVersion"], d["kind"]) for p in MANIFESTS for d in load(p)}
    assert kinds == {("v1", "PersistentVolumeClaim"), ("v1", "Service"), ("batch/v1", "Job"),
                     ("jobset.x-k8s.io/v1alpha2", "JobSet"), ("kubeflow.org/v1", "TFJob")}
    tfjob_types = {frozenset(d["spec"]["tfReplicaSpecs"]) for p in MANIFESTS for d in load(p)
                   if d["kind"] == "TFJob"}
    assert tfjob_types == {frozenset({"Worker"}), frozenset({"Chief", "Worker", "PS"})}


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_manifest_validates(path: Path, version: str) -> None:
    docs = load(path)
    assert docs, f"{path.name} holds no object"
    for doc in docs:
        validate(doc, version)


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("path", WORKLOADS, ids=lambda p: p.name)
def test_objects_the_controllers_create_validate(path: Path, version: str) -> None:
    objects = _created_objects(path)
    assert objects
    for obj in objects:
        validate(obj, version)


@pytest.mark.parametrize(
    "path, mutate, message",
    [
        ("indexed-job.yaml", lambda d: d[1]["spec"].update(completionsMode="Indexed"),
         "Additional properties"),
        ("indexed-job.yaml",
         lambda d: d[1]["spec"]["podFailurePolicy"]["rules"][0]["onExitCodes"].update(
             values="42"), "is not of type"),
        ("jobset.yaml", lambda d: d[0]["spec"]["replicatedJobs"][0]["template"]["spec"][
            "template"]["spec"]["containers"][0].update(imagePullPolice="Always"),
         "Additional properties"),
        ("tfjob-parameter-server.yaml", lambda d: d[0]["metadata"].update(nam="x"),
         "Additional properties"),
        ("backup-pvc.yaml", lambda d: d[0]["spec"].update(accessModes="ReadWriteMany"),
         "is not of type"),
    ],
)
def test_the_validation_catches_mistakes(path, mutate, message) -> None:
    docs = copy.deepcopy(load(KUBERNETES / path))
    mutate(docs)
    with pytest.raises(jsonschema.ValidationError, match=message):
        for doc in docs:
            validate(doc, K8S_VERSIONS[-1])


def _check_pod_failure_policy(job: dict[str, Any]) -> None:
    """The API server's Go validation of a Job's podFailurePolicy
    (pkg/apis/batch/validation/validation.go), which no schema states."""
    spec = job["spec"]
    policy = spec["podFailurePolicy"]
    template = spec["template"]["spec"]
    assert template["restartPolicy"] == "Never", "podFailurePolicy needs restartPolicy Never"
    names = {c["name"] for c in template["containers"] + template.get("initContainers", [])}
    assert 0 < len(policy["rules"]) <= 20
    for rule in policy["rules"]:
        assert rule["action"] in {"FailJob", "Ignore", "Count", "FailIndex"}
        assert ("onExitCodes" in rule) != ("onPodConditions" in rule), rule
        if "onExitCodes" in rule:
            codes = rule["onExitCodes"]
            assert codes.get("containerName", next(iter(names))) in names, codes
            values = codes["values"]
            assert 0 < len(values) <= 255
            assert values == sorted(set(values)), "values must be unique and ordered"
            assert not (codes["operator"] == "In" and 0 in values)
        else:
            assert 0 < len(rule["onPodConditions"]) <= 20
    if any(r["action"] == "FailIndex" for r in policy["rules"]):
        assert "backoffLimitPerIndex" in spec


@pytest.mark.parametrize("mutate", [
    lambda p: p["rules"][0].update(action="Restart"),  # no such action
    lambda p: p["rules"][0]["onExitCodes"].update(values=[42, 1]),  # not ordered
    lambda p: p["rules"][0]["onExitCodes"].update(values=[0, 42]),  # 0 with In
    lambda p: p["rules"][0]["onExitCodes"].update(containerName="main"),  # no such container
    lambda p: p["rules"][1].update(onExitCodes={"operator": "In", "values": [1]}),  # both
])
def test_the_job_rules_catch_mistakes(mutate) -> None:
    job = copy.deepcopy(load(KUBERNETES / "indexed-job.yaml")[1])
    mutate(job["spec"]["podFailurePolicy"])
    with pytest.raises(AssertionError):
        _check_pod_failure_policy(job)


@pytest.mark.parametrize("path", [KUBERNETES / "indexed-job.yaml", KUBERNETES / "jobset.yaml"],
                         ids=lambda p: p.name)
def test_jobs_pass_the_api_servers_job_rules(path: Path) -> None:
    jobs = _jobs(path)
    assert jobs
    for job in jobs:
        spec = job["spec"]
        assert spec["completionMode"] == "Indexed"
        assert spec["parallelism"] == spec["completions"], "all workers must run at once"
        _check_pod_failure_policy(job)
        # Pod host names <job>-<index> are DNS labels.
        assert len(f"{job['metadata']['name']}-{spec['completions'] - 1}") <= 63


def test_the_preemption_code_is_strataxs() -> None:
    import stratax as sx

    assert sx.PREEMPTION_EXIT_CODE == PREEMPTION_EXIT_CODE


def test_indexed_job_restarts_preempted_pods_and_fails_on_errors() -> None:
    (pod, *_) = pods_of(KUBERNETES / "indexed-job.yaml")
    policy = pod.failure_policy
    main = pod.container["name"]
    assert failure_action(policy, {main: PREEMPTION_EXIT_CODE}) == "Ignore"  # re-created
    assert failure_action(policy, {main: 143}, ("DisruptionTarget",)) == "Ignore"  # evicted
    for code in (1, 2, 134, 137, 143):  # exception, usage, abort, OOM kill, plain SIGTERM
        assert failure_action(policy, {main: code}) == "FailJob", code
    assert load(KUBERNETES / "indexed-job.yaml")[1]["spec"]["backoffLimit"] == 0


def _jobset_action(jobset: dict[str, Any], reason: str) -> str:
    """The JobSet controller's action for a child Job failed with ``reason`` (first rule whose
    onJobFailureReasons holds it; none: RestartJobSet, pkg/controllers/failure_policy.go)."""
    for rule in jobset["spec"]["failurePolicy"]["rules"]:
        if reason in rule.get("onJobFailureReasons", [reason]):
            return rule["action"]
    return "RestartJobSet"


def test_jobset_restarts_on_preemption_and_fails_on_errors() -> None:
    (jobset,) = load(KUBERNETES / "jobset.yaml")
    (pod, *_) = pods_of(KUBERNETES / "jobset.yaml")
    main = pod.container["name"]
    job_spec = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]
    assert job_spec["backoffLimit"] == 0

    def job_failure_reason(codes, conditions=()):
        action = failure_action(pod.failure_policy, codes, conditions)
        # FailJob: reason PodFailurePolicy; Count with backoffLimit 0: BackoffLimitExceeded.
        return {"FailJob": "PodFailurePolicy", "Count": "BackoffLimitExceeded"}[action]

    preempted = _jobset_action(jobset, job_failure_reason({main: PREEMPTION_EXIT_CODE}))
    evicted = _jobset_action(jobset, job_failure_reason({main: 137}, ("DisruptionTarget",)))
    assert preempted == evicted == "RestartJobSetAndIgnoreMaxRestarts"
    for code in (1, 2, 134, 137):
        assert _jobset_action(jobset, job_failure_reason({main: code})) == "FailJobSet", code


def _tfjob_restarts(replica: dict[str, Any], exit_code: int) -> bool:
    """Whether the training operator (v1.9, pkg/controller.v1/common/pod.go) or the kubelet
    restarts a replica whose container exited with ``exit_code``."""
    policy = replica.get("restartPolicy", "Never")
    if policy == "ExitCode":
        return exit_code >= 128  # 1-127 are permanent errors
    return policy in ("OnFailure", "Always")


@pytest.mark.parametrize("name", ["tfjob-multi-worker.yaml", "tfjob-parameter-server.yaml"])
def test_tfjob_restarts_preempted_tasks_a_bounded_number_of_times(name: str) -> None:
    (tfjob,) = load(KUBERNETES / name)
    for replica in tfjob["spec"]["tfReplicaSpecs"].values():
        # The schema types restartPolicy as a string; these are the operator's values.
        assert replica["restartPolicy"] in {"Always", "OnFailure", "Never", "ExitCode"}
        assert _tfjob_restarts(replica, PREEMPTION_EXIT_CODE)
    assert 0 < tfjob["spec"]["runPolicy"]["backoffLimit"] <= 5
    assert tfjob["spec"]["runPolicy"]["cleanPodPolicy"] == "Running"


@pytest.mark.parametrize("path", WORKLOADS, ids=lambda p: p.name)
def test_backups_and_models_go_to_the_shared_volume(path: Path) -> None:
    """--backup-dir and --output lie under a mount of the claim backup-pvc.yaml defines."""
    (claim,) = load(KUBERNETES / "backup-pvc.yaml")
    assert "ReadWriteMany" in claim["spec"]["accessModes"]  # mounted from several nodes
    checked = 0
    for pod in pods_of(path):
        volumes = {v["name"]: v for v in pod.spec.get("volumes", [])}
        shared = [m["mountPath"] for m in pod.container.get("volumeMounts", [])
                  if volumes[m["name"]].get("persistentVolumeClaim", {}).get("claimName")
                  == claim["metadata"]["name"]]
        argv = pod.argv
        if "train.py" in " ".join(argv) and "parameter_server" not in argv:
            assert "--backup-dir" in argv, f"{pod.name}: MultiWorkerMirrored needs a backup"
        for flag in ("--backup-dir", "--output"):
            if flag in argv:
                folder = argv[argv.index(flag) + 1]
                assert any(folder.startswith(m.rstrip("/") + "/") for m in shared), (flag, folder)
                checked += 1
    assert checked
