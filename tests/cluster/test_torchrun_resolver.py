"""TorchrunClusterResolver: torchrun / Kubeflow PyTorchJob / TorchX environments."""

from __future__ import annotations

import pytest

from stratax._src.cluster.process_layout import ProcessLayout, process_layout
from stratax._src.cluster.torchrun import TorchrunClusterResolver
from stratax._src.core import env


def _torchrun(cluster_env: pytest.MonkeyPatch, **variables: str) -> None:
    base = {"MASTER_ADDR": "node0", "MASTER_PORT": "29500", "WORLD_SIZE": "4", "RANK": "3",
            "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}
    base.update(variables)
    for name, value in base.items():
        if value:
            cluster_env.setenv(name, value)


def test_torchrun_child(cluster_env: pytest.MonkeyPatch) -> None:
    _torchrun(cluster_env)
    resolver = TorchrunClusterResolver()
    assert (resolver.task_type, resolver.task_id, resolver.num_processes) == ("worker", 3, 4)
    assert resolver.local_rank == 1
    # torch's store holds MASTER_PORT on rank 0's host: the coordinator takes the next port.
    assert resolver.coordinator_address == "node0:29501"
    assert process_layout(resolver) == ProcessLayout("node0:29501", 4, 3, "worker", 3)
    # Two nodes: the other node's host is unknown, so only the coordinator is listed...
    assert resolver.cluster_spec().as_dict() == {"worker": ["node0:29501"]}
    assert not resolver.lists_every_worker()
    assert TorchrunClusterResolver.is_available()
    # ...until the strategy has gathered every process' host once the group formed.
    resolver.list_workers(["node0", "node0", "10.0.0.7", "10.0.0.7"])
    assert resolver.cluster_spec().as_dict() == {
        "worker": ["node0:29501", "node0:29502", "10.0.0.7:29503", "10.0.0.7:29504"]}
    assert resolver.lists_every_worker()
    assert resolver.master("worker", 3) == "10.0.0.7:29504"
    with pytest.raises(ValueError, match=r"one host for each of the 4 processes"):
        resolver.list_workers(["node0", "10.0.0.7"])


@pytest.mark.parametrize(
    "master, expected",
    [
        ("localhost", ["localhost:44426", "localhost:44427"]),
        ("fe80::1", ["[fe80::1]:44426", "[fe80::1]:44427"]),
    ],
)
def test_one_node_lists_one_address_per_worker(cluster_env: pytest.MonkeyPatch, master: str,
                                               expected: list) -> None:
    # The case: torchrun --nproc-per-node 2 listed {'worker': ['localhost:44426']}.
    _torchrun(cluster_env, MASTER_ADDR=master, MASTER_PORT="44425", WORLD_SIZE="2", RANK="1",
              LOCAL_RANK="1", LOCAL_WORLD_SIZE="2")
    resolver = TorchrunClusterResolver()
    spec = resolver.cluster_spec()
    assert spec.as_dict() == {"worker": expected}
    assert spec.num_tasks("worker") == 2 and len(spec.as_dict()["worker"]) == 2
    # Worker 0's address is the coordinator's, as under TF_CONFIG; the layout is unchanged.
    assert resolver.master("worker", 0) == resolver.coordinator_address == expected[0]
    assert process_layout(resolver).num_processes == 2


def test_one_node_past_the_last_port_keeps_the_coordinator_only(
    cluster_env: pytest.MonkeyPatch,
) -> None:
    _torchrun(cluster_env, MASTER_ADDR="localhost", MASTER_PORT="65533", WORLD_SIZE="4",
              RANK="0", LOCAL_RANK="0", LOCAL_WORLD_SIZE="4")
    assert TorchrunClusterResolver().cluster_spec().as_dict() == {
        "worker": ["localhost:65534"]}


def test_pytorchjob_pod_without_local_variables(cluster_env: pytest.MonkeyPatch) -> None:
    # The Kubeflow training operator sets no LOCAL_*; MASTER_ADDR is the master's Service.
    _torchrun(cluster_env, MASTER_ADDR="job-master-0", MASTER_PORT="23456", WORLD_SIZE="2",
              RANK="0", LOCAL_RANK="", LOCAL_WORLD_SIZE="")
    resolver = TorchrunClusterResolver()
    layout = process_layout(resolver)
    assert layout == ProcessLayout("job-master-0:23457", 2, 0, "worker", 0)
    assert layout.is_coordinator and resolver.local_rank is None


@pytest.mark.parametrize(
    "overrides, expected",
    [
        ({env.JAX_COORDINATOR_PORT: "40000"}, "node0:40000"),
        ({env.JAX_COORDINATOR_ADDRESS: "10.1.1.1:5000"}, "10.1.1.1:5000"),
        ({env.JAX_COORDINATOR_ADDRESS: "10.1.1.1:5000", env.MASTER_ADDR: ""}, "10.1.1.1:5000"),
        ({env.MASTER_ADDR: "fe80::1"}, "[fe80::1]:29501"),
    ],
)
def test_coordinator_overrides(cluster_env: pytest.MonkeyPatch, overrides: dict,
                               expected: str) -> None:
    _torchrun(cluster_env)
    for name, value in overrides.items():
        if value:
            cluster_env.setenv(name, value)
        else:
            cluster_env.delenv(name)
    assert TorchrunClusterResolver().coordinator_address == expected


def test_world_of_one_is_local(cluster_env: pytest.MonkeyPatch) -> None:
    _torchrun(cluster_env, WORLD_SIZE="1", RANK="0", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
              MASTER_ADDR="", MASTER_PORT="")
    resolver = TorchrunClusterResolver()
    layout = process_layout(resolver)
    assert layout.is_local and layout.num_processes == 1
    assert resolver.master() == ""


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({env.MASTER_ADDR: ""},
         r"WORLD_SIZE=4 but MASTER_ADDR is not set.*JAX_COORDINATOR_ADDRESS"),
        ({env.MASTER_PORT: ""}, r"MASTER_PORT is not set .*torchrun"),
        ({env.MASTER_PORT: "65535"},
         r"MASTER_PORT=65535 leaves no next port.*JAX_COORDINATOR_PORT"),
        ({env.RANK: ""}, r"Environment variable RANK is not set"),
        ({env.WORLD_SIZE: ""}, r"Environment variable WORLD_SIZE is not set"),
        ({env.RANK: "4"}, r"RANK=4 is not below WORLD_SIZE=4; ranks run from 0 to 3"),
        ({env.RANK: "-1"}, r"RANK='-1' is not an integer >= 0"),
        ({env.WORLD_SIZE: "two"}, r"WORLD_SIZE='two' is not an integer >= 1"),
        ({env.LOCAL_RANK: "2"}, r"LOCAL_RANK=2 is not below LOCAL_WORLD_SIZE=2"),
        ({env.RANK: "0"}, r"LOCAL_RANK=1 is above RANK=0"),
        ({env.JAX_COORDINATOR_PORT: "70000"}, r"JAX_COORDINATOR_PORT=70000 is above 65535"),
        ({env.JAX_COORDINATOR_ADDRESS: "node0"}, r"JAX_COORDINATOR_ADDRESS is 'node0', expected"),
    ],
)
def test_partial_or_contradictory_environment(cluster_env: pytest.MonkeyPatch, overrides: dict,
                                              message: str) -> None:
    _torchrun(cluster_env)
    for name, value in overrides.items():
        if value:
            cluster_env.setenv(name, value)
        else:
            cluster_env.delenv(name)
    with pytest.raises(ValueError, match=message):
        TorchrunClusterResolver()


@pytest.mark.parametrize(
    "variables, available",
    [
        ({}, False),
        ({env.MASTER_ADDR: "node0", env.MASTER_PORT: "29500"}, False),  # exported for later
        ({env.LOCAL_RANK: "0"}, False),
        ({env.WORLD_SIZE: "2"}, True),  # a partial set is reported, not ignored
        ({env.RANK: "0"}, True),
    ],
)
def test_is_available(cluster_env: pytest.MonkeyPatch, variables: dict, available: bool) -> None:
    for name, value in variables.items():
        cluster_env.setenv(name, value)
    assert TorchrunClusterResolver.is_available() is available
