"""LauncherClusterResolver: the STRATAX_* contract with `stratax launch`."""

from __future__ import annotations

import json

import pytest

from stratax._src.cluster.launch_env import LauncherClusterResolver
from stratax._src.cluster.process_layout import ProcessLayout, process_layout
from stratax._src.core import env


def _launched(cluster_env: pytest.MonkeyPatch, process_id: int = 1, num: int = 3,
              **extra: str) -> None:
    cluster_env.setenv(env.STRATAX_COORDINATOR_ADDRESS, "10.0.0.1:51234")
    cluster_env.setenv(env.STRATAX_NUM_PROCESSES, str(num))
    cluster_env.setenv(env.STRATAX_PROCESS_ID, str(process_id))
    for name, value in extra.items():
        cluster_env.setenv(name, value)


def test_contract_names_are_fixed() -> None:
    # Another engineer writes the launcher against these exact names.
    assert (env.STRATAX_COORDINATOR_ADDRESS, env.STRATAX_NUM_PROCESSES, env.STRATAX_PROCESS_ID,
            env.STRATAX_LOCAL_RANK, env.STRATAX_RESTART_COUNT) == (
        "STRATAX_COORDINATOR_ADDRESS", "STRATAX_NUM_PROCESSES", "STRATAX_PROCESS_ID",
        "STRATAX_LOCAL_RANK", "STRATAX_RESTART_COUNT")


def test_multi_node_only_stratax_variables(cluster_env: pytest.MonkeyPatch) -> None:
    _launched(cluster_env, STRATAX_LOCAL_RANK="0", STRATAX_RESTART_COUNT="2")
    resolver = LauncherClusterResolver()
    assert (resolver.task_type, resolver.task_id, resolver.process_id) == ("worker", 1, 1)
    assert resolver.num_processes == 3
    assert resolver.coordinator_address == "10.0.0.1:51234"
    assert (resolver.local_rank, resolver.restart_count) == (0, 2)
    assert process_layout(resolver) == ProcessLayout("10.0.0.1:51234", 3, 1, "worker", 1)
    # Only the coordinator's address is known on several nodes.
    assert resolver.cluster_spec().as_dict() == {"worker": ["10.0.0.1:51234"]}
    assert resolver.master("worker", 0) == "10.0.0.1:51234"
    with pytest.raises(ValueError, match=r"Job 'worker' has no task 1"):
        resolver.master()
    assert LauncherClusterResolver.is_available()


def test_optional_variables_default(cluster_env: pytest.MonkeyPatch) -> None:
    _launched(cluster_env, process_id=0, num=1)
    resolver = LauncherClusterResolver()
    assert (resolver.local_rank, resolver.restart_count) == (None, 0)
    assert resolver.master() == ""
    assert process_layout(resolver).is_coordinator


def test_single_node_uses_the_launchers_tf_config(cluster_env: pytest.MonkeyPatch) -> None:
    workers = ["127.0.0.1:40001", "127.0.0.1:40002", "127.0.0.1:40003"]
    _launched(cluster_env, TF_CONFIG=json.dumps(
        {"cluster": {"worker": workers}, "task": {"type": "worker", "index": 1}}))
    resolver = LauncherClusterResolver(rpc_layer="grpc")
    assert resolver.cluster_spec().as_dict() == {"worker": workers}
    assert resolver.master() == "grpc://127.0.0.1:40002"
    # The launcher's variables, not TF_CONFIG, define the layout.
    assert process_layout(resolver).coordinator_address == "10.0.0.1:51234"


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({env.STRATAX_COORDINATOR_ADDRESS: None}, r"STRATAX_COORDINATOR_ADDRESS is not set .*"
                                                  r"stratax launch"),
        ({env.STRATAX_COORDINATOR_ADDRESS: "10.0.0.1"},
         r"address of STRATAX_COORDINATOR_ADDRESS is '10.0.0.1', expected 'host:port'"),
        ({env.STRATAX_NUM_PROCESSES: None}, r"STRATAX_NUM_PROCESSES is not set"),
        ({env.STRATAX_NUM_PROCESSES: "0"}, r"STRATAX_NUM_PROCESSES='0' is not an integer >= 1"),
        ({env.STRATAX_PROCESS_ID: None}, r"STRATAX_PROCESS_ID is not set"),
        ({env.STRATAX_PROCESS_ID: "3"}, r"STRATAX_PROCESS_ID=3 is not below "
                                        r"STRATAX_NUM_PROCESSES=3"),
        ({env.STRATAX_PROCESS_ID: "first"}, r"STRATAX_PROCESS_ID='first' is not an integer"),
        ({env.STRATAX_LOCAL_RANK: "-1"}, r"STRATAX_LOCAL_RANK='-1' is not an integer >= 0"),
        ({env.STRATAX_RESTART_COUNT: "x"}, r"STRATAX_RESTART_COUNT='x' is not an integer"),
        ({env.TF_CONFIG: json.dumps({"cluster": {"worker": ["a:1", "b:1"]}})},
         r"TF_CONFIG's cluster .* has 2 chief/worker tasks but STRATAX_NUM_PROCESSES=3"),
        ({env.TF_CONFIG: "{"}, r"TF_CONFIG is not valid JSON"),
    ],
)
def test_malformed_contract(cluster_env: pytest.MonkeyPatch, overrides: dict, message: str) -> None:
    _launched(cluster_env)
    for name, value in overrides.items():
        if value is None:
            cluster_env.delenv(name)
        else:
            cluster_env.setenv(name, value)
    with pytest.raises(ValueError, match=message):
        LauncherClusterResolver()


@pytest.mark.parametrize(
    "variables, available",
    [
        ({}, False),
        ({env.STRATAX_LOCAL_RANK: "0", env.STRATAX_RESTART_COUNT: "0"}, False),
        ({env.STRATAX_PROCESS_ID: "0"}, True),  # a partial set is reported, not ignored
        ({env.STRATAX_COORDINATOR_ADDRESS: "h:1"}, True),
    ],
)
def test_is_available(cluster_env: pytest.MonkeyPatch, variables: dict, available: bool) -> None:
    for name, value in variables.items():
        cluster_env.setenv(name, value)
    assert LauncherClusterResolver.is_available() is available
