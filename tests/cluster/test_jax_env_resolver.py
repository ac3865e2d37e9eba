"""JAXClusterResolver: the JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES / JAX_PROCESS_ID job."""

from __future__ import annotations

import pytest

from stratax._src.cluster.jax_env import JAXClusterResolver
from stratax._src.cluster.process_layout import ProcessLayout, process_layout
from stratax._src.core import env

JOB = {env.JAX_COORDINATOR_ADDRESS: "node0:1234", env.JAX_NUM_PROCESSES: "3",
       env.JAX_PROCESS_ID: "2"}


def _set(cluster_env: pytest.MonkeyPatch, variables: dict) -> None:
    for name, value in variables.items():
        if value:
            cluster_env.setenv(name, value)
        else:
            cluster_env.delenv(name, raising=False)


def test_job(cluster_env: pytest.MonkeyPatch) -> None:
    _set(cluster_env, JOB)
    resolver = JAXClusterResolver()
    assert process_layout(resolver) == ProcessLayout("node0:1234", 3, 2, "worker", 2)
    assert resolver.master("worker", 0) == "node0:1234"
    assert JAXClusterResolver.is_available()


def test_one_process_needs_no_coordinator(cluster_env: pytest.MonkeyPatch) -> None:
    _set(cluster_env, {env.JAX_NUM_PROCESSES: "1", env.JAX_PROCESS_ID: "0"})
    assert process_layout(JAXClusterResolver()).is_local


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({env.JAX_COORDINATOR_ADDRESS: ""},
         r"JAX_NUM_PROCESSES=3 but JAX_COORDINATOR_ADDRESS is not set"),
        ({env.JAX_PROCESS_ID: ""}, r"JAX_PROCESS_ID is not set .*JAX_NUM_PROCESSES"),
        ({env.JAX_NUM_PROCESSES: ""}, r"JAX_NUM_PROCESSES is not set"),
        ({env.JAX_PROCESS_ID: "3"}, r"JAX_PROCESS_ID=3 is not below JAX_NUM_PROCESSES=3"),
        ({env.JAX_COORDINATOR_ADDRESS: "node0:port"}, r"JAX_COORDINATOR_ADDRESS is 'node0:port'"),
    ],
)
def test_partial_or_contradictory_environment(cluster_env: pytest.MonkeyPatch, overrides: dict,
                                              message: str) -> None:
    _set(cluster_env, {**JOB, **overrides})
    with pytest.raises(ValueError, match=message):
        JAXClusterResolver()


@pytest.mark.parametrize(
    "variables, available",
    [
        ({}, False),
        ({env.JAX_COORDINATOR_ADDRESS: "h:1"}, False),  # JAX's override for other launchers
        ({env.JAX_PROCESS_ID: "0"}, True),
        ({env.JAX_NUM_PROCESSES: "2"}, True),
    ],
)
def test_is_available(cluster_env: pytest.MonkeyPatch, variables: dict, available: bool) -> None:
    _set(cluster_env, variables)
    assert JAXClusterResolver.is_available() is available
