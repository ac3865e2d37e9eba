"""What each pod of ``examples/deploy/kubernetes/`` gets from Kubernetes; a job from Slurm.

For every pod a manifest makes, once its controller has acted: the pod's host name, the DNS
names that reach it (through the headless Service that selects it), its labels, its command,
and its environment: the container's own ``env`` block (``value``, ``fieldRef``,
``secretKeyRef``) plus what the platform adds. The rules, each from its source:

- Indexed Job (``batch/v1``, Kubernetes >= 1.27): pod ``i`` gets the host name
  ``<job>-<i>``, the labels ``batch.kubernetes.io/job-name`` and
  ``batch.kubernetes.io/job-completion-index``, and ``JOB_COMPLETION_INDEX=i`` in every
  container; with ``subdomain: S`` and a headless Service ``S`` selecting it, it is
  ``<host>.S`` (``<host>.S.<ns>.svc.cluster.local``) in DNS. ``HOSTNAME`` is the host name.
- JobSet (``jobset.x-k8s.io/v1alpha2``, controller v0.12, ``pkg/controllers/
  jobset_controller.go``): replicated job ``r`` makes Indexed Jobs ``<js>-<r>-<j>``; with
  ``network.enableDNSHostnames`` the pods' subdomain is ``network.subdomain`` or the JobSet's
  name, and the controller makes that headless Service selecting
  ``jobset.sigs.k8s.io/jobset-name: <js>``.
- Kubeflow TFJob (``kubeflow.org/v1``, training-operator v1.9, ``pkg/controller.v1/
  tensorflow/tensorflow.go``): replica ``i`` of type ``T`` is pod and headless Service
  ``<job>-<t>-<i>`` (``t`` = lower-case ``T``), reached at ``<job>-<t>-<i>.<ns>.svc``; when the
  job has more than one replica in all, the container named ``tensorflow`` gets
  ``TF_CONFIG = {"cluster": {t: [<host>:<port>, ...]}, "task": {"type": t, "index": i},
  "environment": "cloud"}``, the port being that container's port named ``tfjob-port``
  (default 2222).

- Slurm: sbatch gives the batch script the job's variables (``SLURM_JOB_NODELIST``,
  ``SLURM_TASKS_PER_NODE``, ...), from its ``#SBATCH`` lines; srun adds each task's
  (``tests/multiprocess/programs/fake_slurm.py``).

Nothing here is specific to stratax: the tests feed these environments to stratax.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "examples" / "deploy"
KUBERNETES = DEPLOY / "kubernetes"
CLUSTER_DOMAIN = "cluster.local"
TFJOB_CONTAINER = "tensorflow"  # kubeflowv1.TFJobDefaultContainerName
TFJOB_PORT_NAME = "tfjob-port"  # kubeflowv1.TFJobDefaultPortName
TFJOB_DEFAULT_PORT = 2222  # kubeflowv1.TFJobDefaultPort


@dataclass
class Pod:
    """One pod as its controller creates it, and what Kubernetes gives its main container."""

    name: str  # the name the tests use for it (the host name)
    hostname: str
    namespace: str
    labels: dict[str, str]
    container: dict[str, Any]  # the main container (the first, or the TFJob's "tensorflow")
    spec: dict[str, Any]  # the pod spec (for schema checks of the pods a controller makes)
    platform_env: dict[str, str] = field(default_factory=dict)  # added by Kubernetes/operator
    dns_names: list[str] = field(default_factory=list)  # names that resolve to this pod
    failure_policy: dict[str, Any] | None = None  # the owning Job's podFailurePolicy

    @property
    def argv(self) -> list[str]:
        return [*self.container.get("command", []), *self.container.get("args", [])]

    def env(self, secrets: dict[tuple[str, str], str] | None = None) -> dict[str, str]:
        """The container's environment: platform variables, then its ``env`` block in order."""
        values = dict(self.platform_env)
        for entry in self.container.get("env", []):
            values[entry["name"]] = self._value(entry, secrets or {})
        return values

    def _value(self, entry: dict[str, Any], secrets: dict[tuple[str, str], str]) -> str:
        if "value" in entry:
            return str(entry["value"])
        source = entry["valueFrom"]
        if "fieldRef" in source:
            return self._field(source["fieldRef"]["fieldPath"])
        if "secretKeyRef" in source:
            ref = source["secretKeyRef"]
            return secrets[(ref["name"], ref["key"])]
        raise ValueError(f"{self.name}: unsupported valueFrom {source}")

    def _field(self, path: str) -> str:
        label = re.fullmatch(r"metadata\.labels\['([^']+)'\]", path)
        if label:
            return self.labels[label.group(1)]  # a missing label: the pod would not start
        simple = {"metadata.name": self.name, "metadata.namespace": self.namespace}
        return simple[path]


def load(path: Path) -> list[dict[str, Any]]:
    with open(path) as f:
        return [doc for doc in yaml.safe_load_all(f) if doc]


def manifests() -> list[Path]:
    return sorted(KUBERNETES.glob("*.yaml"))


def _namespace(doc: dict[str, Any]) -> str:
    return doc["metadata"].get("namespace", "default")


def _selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def _attach_dns(pods: list[Pod], services: list[dict[str, Any]]) -> None:
    """Gives each pod the names a headless Service named after its subdomain publishes."""
    for pod in pods:
        subdomain = pod.spec.get("subdomain")
        for svc in services:
            spec = svc["spec"]
            if (svc["metadata"]["name"] == subdomain and spec.get("clusterIP") == "None"
                    and _selects(spec.get("selector", {}), pod.labels)
                    and _namespace(svc) == pod.namespace):
                short = f"{pod.hostname}.{subdomain}"
                pod.dns_names += [short, f"{short}.{pod.namespace}.svc.{CLUSTER_DOMAIN}"]


def _indexed_job_pods(job_name: str, job_spec: dict[str, Any], namespace: str,
                      extra_labels: dict[str, str]) -> list[Pod]:
    if job_spec.get("completionMode") != "Indexed":
        raise ValueError(f"Job {job_name}: not an Indexed Job")
    template = job_spec["template"]
    pods = []
    for index in range(job_spec["completions"]):
        hostname = f"{job_name}-{index}"
        labels = {**template.get("metadata", {}).get("labels", {}), **extra_labels,
                  "batch.kubernetes.io/job-name": job_name, "job-name": job_name,
                  "batch.kubernetes.io/job-completion-index": str(index)}
        spec = dict(template["spec"])
        container = spec["containers"][0]
        pods.append(Pod(name=hostname, hostname=hostname, namespace=namespace, labels=labels,
                        container=container, spec=spec,
                        platform_env={"HOSTNAME": hostname, "JOB_COMPLETION_INDEX": str(index)},
                        failure_policy=job_spec.get("podFailurePolicy")))
    return pods


def indexed_job(docs: list[dict[str, Any]]) -> list[Pod]:
    """The pods of the Indexed Job in ``docs``, with the DNS names of the Services beside it."""
    (job,) = [d for d in docs if d["kind"] == "Job"]
    pods = _indexed_job_pods(job["metadata"]["name"], job["spec"], _namespace(job), {})
    _attach_dns(pods, [d for d in docs if d["kind"] == "Service"])
    return pods


def jobset(doc: dict[str, Any]) -> list[Pod]:
    """The pods of a JobSet, and the headless Service its controller makes for them."""
    name, namespace, spec = doc["metadata"]["name"], _namespace(doc), doc["spec"]
    network = spec.get("network", {})
    dns = network.get("enableDNSHostnames", True)  # the webhook's default
    subdomain = network.get("subdomain") or name
    pods: list[Pod] = []
    for rjob in spec["replicatedJobs"]:
        for job_index in range(rjob.get("replicas", 1)):
            job_spec = json.loads(json.dumps(rjob["template"]["spec"]))
            if dns:
                job_spec["template"]["spec"]["subdomain"] = subdomain
            job_name = f"{name}-{rjob['name']}-{job_index}"
            pods += _indexed_job_pods(job_name, job_spec, namespace, {
                "jobset.sigs.k8s.io/jobset-name": name,
                "jobset.sigs.k8s.io/replicatedjob-name": rjob["name"],
                "jobset.sigs.k8s.io/job-index": str(job_index)})
    service = {"kind": "Service", "metadata": {"name": subdomain, "namespace": namespace},
               "spec": {"clusterIP": "None",
                        "selector": {"jobset.sigs.k8s.io/jobset-name": name}}}
    _attach_dns(pods, [service] if dns else [])
    return pods


def _tfjob_port(replica: dict[str, Any]) -> int:
    for container in replica["template"]["spec"]["containers"]:
        if container["name"] == TFJOB_CONTAINER:
            for port in container.get("ports", []):
                if port.get("name") == TFJOB_PORT_NAME:
                    return int(port["containerPort"])
    return TFJOB_DEFAULT_PORT


def tfjob(doc: dict[str, Any]) -> list[Pod]:
    """The pods of a TFJob, each with the TF_CONFIG the training operator writes."""
    name, namespace = doc["metadata"]["name"], _namespace(doc)
    replicas = doc["spec"]["tfReplicaSpecs"]
    cluster: dict[str, list[str]] = {}
    for rtype, replica in replicas.items():
        rt = rtype.lower()
        cluster[rt] = [f"{name}-{rt}-{i}.{namespace}.svc:{_tfjob_port(replica)}"
                       for i in range(replica.get("replicas", 1))]
    distributed = sum(r.get("replicas", 1) for r in replicas.values()) != 1
    pods = []
    for rtype, replica in replicas.items():
        rt = rtype.lower()
        spec = replica["template"]["spec"]
        (container,) = [c for c in spec["containers"] if c["name"] == TFJOB_CONTAINER] or [None]
        if container is None:
            raise ValueError(f"TFJob {name}: {rtype} has no container named {TFJOB_CONTAINER!r}, "
                             "so the operator writes no TF_CONFIG")
        for index in range(replica.get("replicas", 1)):
            hostname = f"{name}-{rt}-{index}"
            platform = {"HOSTNAME": hostname}
            if distributed:
                platform["TF_CONFIG"] = json.dumps(
                    {"cluster": cluster, "task": {"type": rt, "index": index},
                     "environment": "cloud"}, sort_keys=True)
            labels = {"training.kubeflow.org/job-name": name,
                      "training.kubeflow.org/replica-type": rt,
                      "training.kubeflow.org/replica-index": str(index)}
            pods.append(Pod(name=hostname, hostname=hostname, namespace=namespace,
                            labels=labels, container=container, spec=spec,
                            platform_env=platform,
                            dns_names=[f"{hostname}.{namespace}.svc",
                                       f"{hostname}.{namespace}.svc.{CLUSTER_DOMAIN}"]))
    return pods


def pods_of(path: Path) -> list[Pod]:
    """Every pod the workload in ``path`` makes (the PersistentVolumeClaim file makes none)."""
    docs = load(path)
    kinds = {d["kind"] for d in docs}
    if "Job" in kinds:
        return indexed_job(docs)
    if kinds == {"JobSet"}:
        return jobset(docs[0])
    if kinds == {"TFJob"}:
        return tfjob(docs[0])
    if kinds == {"PersistentVolumeClaim"}:
        return []
    raise ValueError(f"{path.name}: no renderer for kinds {sorted(kinds)}")


def failure_action(policy: dict[str, Any], exit_codes: dict[str, int],
                   conditions: tuple[str, ...] = ()) -> str:
    """The podFailurePolicy action for a failed pod (Kubernetes' rules, first match wins).

    ``exit_codes`` maps container names to their exit codes; containers that ended with 0 are
    left out of the check, as Kubernetes does. No matching rule: ``"Count"`` (the failure counts
    against ``backoffLimit``).
    """
    failed = {name: code for name, code in exit_codes.items() if code != 0}
    for rule in policy["rules"]:
        on_codes = rule.get("onExitCodes")
        if on_codes is not None:
            container = on_codes.get("containerName")
            codes = [c for n, c in failed.items() if container is None or n == container]
            values = set(on_codes["values"])
            if on_codes["operator"] == "In":
                matched = any(c in values for c in codes)
            else:
                matched = any(c not in values for c in codes)
            if matched:
                return rule["action"]
        for pattern in rule.get("onPodConditions", []):
            if pattern["type"] in conditions and pattern.get("status", "True") == "True":
                return rule["action"]
    return "Count"


def sbatch_options(script: Path) -> dict[str, str]:
    """The ``#SBATCH --name[=value]`` lines of a batch script."""
    options = {}
    for line in script.read_text().splitlines():
        match = re.fullmatch(r"#SBATCH --([a-z-]+)(?:=(.*))?", line.strip())
        if match:
            options[match.group(1)] = match.group(2) or ""
    return options


def sbatch_environment(script: Path, job_id: str, restart: int = 0) -> dict[str, str]:
    """What sbatch gives the batch script ``script`` on the nodes node1..nodeN (the counts from
    its ``#SBATCH`` lines); srun adds each task's own variables."""
    options = sbatch_options(script)
    nodes, per_node = int(options["nodes"]), int(options["ntasks-per-node"])
    nodelist = f"node[1-{nodes}]" if nodes > 1 else "node1"
    tasks_per_node = f"{per_node}(x{nodes})" if nodes > 1 else str(per_node)
    return {"SLURM_JOB_ID": job_id, "SLURM_JOBID": job_id,
            "SLURM_JOB_NAME": options["job-name"], "SLURM_JOB_NODELIST": nodelist,
            "SLURM_NODELIST": nodelist, "SLURM_JOB_NUM_NODES": str(nodes),
            "SLURM_NNODES": str(nodes), "SLURM_NTASKS": str(nodes * per_node),
            "SLURM_NPROCS": str(nodes * per_node), "SLURM_NTASKS_PER_NODE": str(per_node),
            "SLURM_TASKS_PER_NODE": tasks_per_node,
            "SLURM_CPUS_PER_TASK": options["cpus-per-task"],
            "SLURM_RESTART_COUNT": str(restart), "SLURM_SUBMIT_DIR": str(ROOT)}
