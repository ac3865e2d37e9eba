"""Fixtures for the cluster tests: a clean cluster environment and an env-leak guard."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from stratax._src.core import env

# Every variable a cluster resolver reads or writes; cleared before each test so that running
# the suite inside Slurm, a pod or `stratax launch` does not change what the tests see.
CLUSTER_VARS = (
    env.TF_CONFIG,
    env.STRATAX_COORDINATOR_ADDRESS,
    env.STRATAX_NUM_PROCESSES,
    env.STRATAX_PROCESS_ID,
    env.STRATAX_LOCAL_RANK,
    env.STRATAX_RESTART_COUNT,
    env.CUDA_VISIBLE_DEVICES,
    env.JOB_COMPLETION_INDEX,
    env.HOSTNAME,
    env.STRATAX_K8S_NUM_WORKERS,
    env.STRATAX_K8S_SERVICE,
    env.STRATAX_K8S_JOB_NAME,
    env.STRATAX_K8S_PORT,
    env.MASTER_ADDR,
    env.MASTER_PORT,
    env.WORLD_SIZE,
    env.RANK,
    env.LOCAL_RANK,
    env.LOCAL_WORLD_SIZE,
    env.OMPI_COMM_WORLD_RANK,
    env.OMPI_COMM_WORLD_SIZE,
    env.OMPI_COMM_WORLD_LOCAL_RANK,
    env.OMPI_MCA_ORTE_HNP_URI,
    env.PMI_RANK,
    env.PMI_SIZE,
    env.PMIX_RANK,
    env.MPI_LOCALRANKID,
    env.JAX_COORDINATOR_ADDRESS,
    env.JAX_COORDINATOR_PORT,
    env.JAX_NUM_PROCESSES,
    env.JAX_PROCESS_ID,
)


def _snapshot() -> dict[str, str]:
    # pytest itself rewrites PYTEST_CURRENT_TEST at every test phase.
    return {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}


@pytest.fixture(autouse=True)
def cluster_env() -> Iterator[pytest.MonkeyPatch]:
    """A MonkeyPatch for os.environ with all cluster variables removed; fails a test that leaks.

    Uses its own MonkeyPatch (not the shared ``monkeypatch`` fixture) so that its changes are
    undone before the leak check runs, whatever order other fixtures are set up in.
    """
    before = _snapshot()
    patch = pytest.MonkeyPatch()
    for name in list(CLUSTER_VARS) + [n for n in os.environ if n.startswith("SLURM_")]:
        patch.delenv(name, raising=False)
    try:
        yield patch
    finally:
        patch.undo()
        after = _snapshot()
        if after != before:
            changed = sorted(
                name for name in set(before) | set(after) if before.get(name) != after.get(name)
            )
            for name in changed:
                if name in before:
                    os.environ[name] = before[name]
                else:
                    del os.environ[name]
            pytest.fail(f"Test leaked environment variables: {changed}")
