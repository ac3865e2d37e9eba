"""What stratax makes of each pod's and each Slurm task's environment (no processes).

For every pod of every manifest, and every task of the Slurm script, the environment the
platform gives it (``render.py``) alone is fed to stratax's cluster auto-detection: the
resolver it picks, the cluster it builds, and the process layout of synchronous training must
name the DNS names and ports that really reach the pods, one process per pod, exactly one
coordinator. The real-process runs of the same environments are in
``tests/multiprocess/test_deploy.py``.
"""

from __future__ import annotations

import importlib.util
import json
import os

import pytest
from render import DEPLOY, KUBERNETES, ROOT, pods_of, sbatch_environment

from stratax._src.cluster.detect import detect_cluster_resolver
from stratax._src.cluster.process_layout import process_layout

_spec = importlib.util.spec_from_file_location(
    "_stratax_fake_slurm", ROOT / "tests" / "multiprocess" / "programs" / "fake_slurm.py")
fake_slurm = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fake_slurm)

_CLUSTER_PREFIXES = ("SLURM_", "STRATAX_", "OMPI_", "PMI", "JAX_", "TPU_", "MEGASCALE_")
_CLUSTER_VARS = ("TF_CONFIG", "JOB_COMPLETION_INDEX", "MASTER_ADDR", "MASTER_PORT",
                 "WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "HOSTNAME")


def _only(monkeypatch, env: dict[str, str]) -> None:
    """This process' environment, as far as cluster detection reads it, becomes ``env``."""
    for key in list(os.environ):
        if key.startswith(_CLUSTER_PREFIXES) or key in _CLUSTER_VARS:
            monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, value)


@pytest.mark.parametrize("manifest, resolver, port", [
    ("indexed-job.yaml", "KubernetesClusterResolver", 8888),
    ("jobset.yaml", "KubernetesClusterResolver", 8888),
    ("tfjob-multi-worker.yaml", "TFConfigClusterResolver", 2222),
])
def test_each_pod_joins_one_group_at_pod_zeros_address(monkeypatch, manifest, resolver,
                                                       port) -> None:
    pods = pods_of(KUBERNETES / manifest)
    assert len(pods) == 2
    layouts = []
    for pod in pods:
        with monkeypatch.context() as patch:
            _only(patch, pod.env())
            found = detect_cluster_resolver()
            assert type(found).__name__ == resolver
            addresses = [a for job in found.cluster_spec().jobs
                         for a in found.cluster_spec().job_tasks(job)]
            layouts.append(process_layout(found))
        # Every address of the cluster is a DNS name some pod really has, on the pods' port.
        names = {f"{name}:{port}" for p in pods for name in p.dns_names}
        assert set(addresses) <= names, (addresses, names)
        assert len(addresses) == len(pods)
    assert [layout.process_id for layout in layouts] == [0, 1]
    assert {layout.num_processes for layout in layouts} == {2}
    (coordinator,) = {layout.coordinator_address for layout in layouts}
    assert coordinator.rsplit(":", 1)[0] in pods[0].dns_names
    assert coordinator.endswith(f":{port}")
    assert any(p.get("containerPort") == port for p in pods[0].container["ports"])


def test_parameter_server_tasks_see_the_operators_cluster(monkeypatch) -> None:
    pods = pods_of(KUBERNETES / "tfjob-parameter-server.yaml")
    secrets = {("stratax-ps-token", "token"): "t0k3n"}
    tasks = []
    for pod in pods:
        env = pod.env(secrets)
        assert env["STRATAX_PS_TOKEN"] == "t0k3n"  # every task carries the same token
        with monkeypatch.context() as patch:
            _only(patch, env)
            found = detect_cluster_resolver()
            assert type(found).__name__ == "TFConfigClusterResolver"
            spec = found.cluster_spec().as_dict()
            tasks.append((found.task_type, found.task_id))
        assert spec == {"chief": ["stratax-ps-chief-0.default.svc:2222"],
                        "worker": ["stratax-ps-worker-0.default.svc:2222",
                                   "stratax-ps-worker-1.default.svc:2222"],
                        "ps": ["stratax-ps-ps-0.default.svc:2222"]}
        for address in (a for job in spec.values() for a in job):
            assert any(address == f"{n}:2222" for p in pods for n in p.dns_names)
    assert sorted(tasks) == [("chief", 0), ("ps", 0), ("worker", 0), ("worker", 1)]
    chief = next(p for p in pods if p.name.endswith("chief-0"))
    assert "parameter_server" in chief.argv
    assert all(p.argv == ["stratax", "server"] for p in pods if p is not chief)


def test_tf_config_is_the_operators_json(monkeypatch) -> None:
    """The operator's exact TF_CONFIG (with "environment": "cloud") is accepted as is."""
    (pod, _) = pods_of(KUBERNETES / "tfjob-multi-worker.yaml")
    config = json.loads(pod.env()["TF_CONFIG"])
    assert config == {"cluster": {"worker": ["stratax-tfjob-worker-0.default.svc:2222",
                                             "stratax-tfjob-worker-1.default.svc:2222"]},
                      "task": {"type": "worker", "index": 0}, "environment": "cloud"}


def test_slurm_tasks_join_one_group_on_the_first_node(monkeypatch) -> None:
    script = DEPLOY / "slurm" / "train.sbatch"
    batch = sbatch_environment(script, "77")
    tasks = fake_slurm.task_environments(batch)
    assert [node for node, _ in tasks] == ["node1", "node2"]  # one task per node
    layouts = []
    for _, env in tasks:
        with monkeypatch.context() as patch:
            _only(patch, env)
            found = detect_cluster_resolver()
            assert type(found).__name__ == "SlurmClusterResolver"
            layouts.append(process_layout(found))
    assert [layout.process_id for layout in layouts] == [0, 1]
    assert {layout.coordinator_address for layout in layouts} == {"node1:8888"}
