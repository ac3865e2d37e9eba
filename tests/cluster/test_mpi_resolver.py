"""MPIClusterResolver: Open MPI, MPICH / Intel MPI (PMI) and PMIx environments."""

from __future__ import annotations

import pytest

from stratax._src.cluster.mpi import MPIClusterResolver, orte_coordinator_address
from stratax._src.cluster.process_layout import ProcessLayout, process_layout
from stratax._src.core import env

# The URI Open MPI 4's mpirun exports (format as in JAX's ompi_cluster.py).
ORTE_URI = "1531576320.0;tcp://10.96.0.1,10.148.0.1:34911"
OPEN_MPI = {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2",
            "OMPI_COMM_WORLD_LOCAL_RANK": "1"}
HYDRA = {"PMI_RANK": "1", "PMI_SIZE": "2", "MPI_LOCALRANKID": "1"}
SLURM_STEP = {"SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_JOB_NODELIST": "n[1-2]",
              "SLURM_TASKS_PER_NODE": "1(x2)"}


def _set(cluster_env: pytest.MonkeyPatch, *groups: dict) -> None:
    for group in groups:
        for name, value in group.items():
            if value:
                cluster_env.setenv(name, value)
            else:
                cluster_env.delenv(name, raising=False)


def test_open_mpi_4_coordinator_follows_jax(cluster_env: pytest.MonkeyPatch) -> None:
    _set(cluster_env, OPEN_MPI, {env.OMPI_MCA_ORTE_HNP_URI: ORTE_URI})
    resolver = MPIClusterResolver()
    # JAX's rule: mpirun's first IP, port (jobid // 4096) % 4096 + 61440.
    port = 1531576320 // 4096 % 4096 + 61440
    assert resolver.coordinator_address == f"10.96.0.1:{port}"
    assert process_layout(resolver) == ProcessLayout(f"10.96.0.1:{port}", 2, 1, "worker", 1)
    assert resolver.local_rank == 1
    assert MPIClusterResolver.is_available()


def test_orte_uri_forms() -> None:
    ipv6 = "1314521088.0;tcp6://[fe80::b9b:ac5d:9cf0:b858,2620:10d:c083:150e::3000:2]:43370"
    port = 1314521088 // 4096 % 4096 + 61440
    assert orte_coordinator_address(ipv6) == f"[fe80::b9b:ac5d:9cf0:b858]:{port}"
    with pytest.raises(ValueError, match=r"OMPI_MCA_orte_hnp_uri='junk' is not .*"
                                         r"JAX_COORDINATOR_ADDRESS"):
        orte_coordinator_address("junk")


def test_jax_port_and_address_overrides(cluster_env: pytest.MonkeyPatch) -> None:
    _set(cluster_env, OPEN_MPI, {env.OMPI_MCA_ORTE_HNP_URI: ORTE_URI,
                                 env.JAX_COORDINATOR_PORT: "12345"})
    assert MPIClusterResolver().coordinator_address == "10.96.0.1:12345"
    _set(cluster_env, {env.JAX_COORDINATOR_ADDRESS: "head:7000"})
    assert MPIClusterResolver().coordinator_address == "head:7000"


def test_mpich_hydra_with_explicit_coordinator(cluster_env: pytest.MonkeyPatch) -> None:
    _set(cluster_env, HYDRA, {env.JAX_COORDINATOR_ADDRESS: "node0:61234"})
    resolver = MPIClusterResolver()
    assert process_layout(resolver) == ProcessLayout("node0:61234", 2, 1, "worker", 1)
    assert resolver.local_rank == 1


def test_one_rank_is_local(cluster_env: pytest.MonkeyPatch) -> None:
    _set(cluster_env, {"PMI_RANK": "0", "PMI_SIZE": "1"})
    layout = process_layout(MPIClusterResolver())
    assert layout.is_local and layout.num_processes == 1


@pytest.mark.parametrize(
    "groups, message",
    [
        ((HYDRA,), r"PMI_RANK=1 of PMI_SIZE=2: the MPI launcher does not say which host rank 0 .*"
                   r"JAX_COORDINATOR_ADDRESS=<host of rank 0>:<free port>.*mpiexec -genv"),
        ((OPEN_MPI,), r"OMPI_COMM_WORLD_RANK=1 of OMPI_COMM_WORLD_SIZE=2.*mpirun -x"),
        (({"PMIX_RANK": "0"},), r"PMIX_RANK is set but no world size"),
        ((OPEN_MPI, {"OMPI_COMM_WORLD_SIZE": ""}), r"OMPI_COMM_WORLD_RANK is set but no world"),
        ((OPEN_MPI, {"OMPI_COMM_WORLD_RANK": "2"}),
         r"OMPI_COMM_WORLD_RANK=2 is not below OMPI_COMM_WORLD_SIZE=2"),
        ((OPEN_MPI, {"PMI_RANK": "0", "PMI_SIZE": "2"}),
         r"OMPI_COMM_WORLD_RANK=1 but PMI_RANK=0: two MPI launchers' variables disagree"),
        ((OPEN_MPI, {"PMI_RANK": "1", "PMI_SIZE": "4"}),
         r"OMPI_COMM_WORLD_SIZE=2 but PMI_SIZE=4"),
        ((HYDRA, {"PMI_SIZE": "0"}), r"PMI_SIZE='0' is not an integer >= 1"),
        ((OPEN_MPI, {env.OMPI_MCA_ORTE_HNP_URI: "oops"}), r"OMPI_MCA_orte_hnp_uri='oops'"),
    ],
)
def test_partial_or_contradictory_environment(cluster_env: pytest.MonkeyPatch, groups: tuple,
                                              message: str) -> None:
    _set(cluster_env, *groups)
    with pytest.raises(ValueError, match=message):
        MPIClusterResolver()


@pytest.mark.parametrize(
    "groups, available",
    [
        ((), False),
        ((OPEN_MPI,), True),
        ((HYDRA,), True),
        (({"PMIX_RANK": "0"},), True),
        # srun --mpi=pmi2 / pmix: Slurm's resolver knows every node, so it takes the process.
        (({"PMI_RANK": "1", "PMI_SIZE": "2"}, SLURM_STEP), False),
        (({"PMIX_RANK": "1"}, SLURM_STEP), False),
        # ... unless mpirun/mpiexec (their own variables) or the user's coordinator say otherwise.
        ((HYDRA, SLURM_STEP), True),
        ((OPEN_MPI, SLURM_STEP), True),
        (({"PMI_RANK": "1", "PMI_SIZE": "2", env.JAX_COORDINATOR_ADDRESS: "h:1"}, SLURM_STEP),
         True),
    ],
)
def test_is_available(cluster_env: pytest.MonkeyPatch, groups: tuple, available: bool) -> None:
    _set(cluster_env, *groups)
    assert MPIClusterResolver.is_available() is available
