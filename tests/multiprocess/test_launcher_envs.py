"""Real processes started with another launcher's environment join one group (issue 33).

Each case starts two processes with the variables that torchrun / a PyTorchJob, Open MPI's
mpirun, MPICH's mpiexec or a JAX job script gives its children (no TF_CONFIG, no STRATAX_*), on
127.0.0.1 with free ports, and checks that they form one two-replica group with exactly one
chief, instead of two single-worker runs that both write checkpoints as chief. torchrun's case
is two nodes of two processes each, where the environment names only the coordinator's host: the
cluster spec lists every worker once the group has formed (issue 49 #4).
"""

import json

import pytest
from conftest import free_ports

pytestmark = pytest.mark.timeout(240)


def _torchrun(rank: int, port: int) -> dict[str, str]:
    # `torchrun --nnodes 2 --nproc-per-node 2` children, both "nodes" on 127.0.0.1; the
    # coordinator is MASTER_ADDR:MASTER_PORT + 1.
    return {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port - 1), "WORLD_SIZE": "4",
            "RANK": str(rank), "LOCAL_RANK": str(rank % 2), "LOCAL_WORLD_SIZE": "2",
            "GROUP_RANK": str(rank // 2), "ROLE_RANK": str(rank), "ROLE_WORLD_SIZE": "4",
            "GROUP_WORLD_SIZE": "2", "TORCHELASTIC_RUN_ID": "test"}


def _open_mpi(rank: int, port: int) -> dict[str, str]:
    # Open MPI 4's mpirun: the coordinator's host comes from its daemon's URI (JAX's rule), the
    # port from JAX_COORDINATOR_PORT.
    return {"OMPI_COMM_WORLD_RANK": str(rank), "OMPI_COMM_WORLD_SIZE": "2",
            "OMPI_COMM_WORLD_LOCAL_RANK": str(rank),
            "OMPI_MCA_orte_hnp_uri": "1531576320.0;tcp://127.0.0.1:34911",
            "JAX_COORDINATOR_PORT": str(port)}


def _mpich(rank: int, port: int) -> dict[str, str]:
    # MPICH / Intel MPI's mpiexec (Hydra) names no host: the user gives the coordinator.
    return {"PMI_RANK": str(rank), "PMI_SIZE": "2", "MPI_LOCALRANKID": str(rank),
            "JAX_COORDINATOR_ADDRESS": f"127.0.0.1:{port}"}


def _jax_job(rank: int, port: int) -> dict[str, str]:
    return {"JAX_COORDINATOR_ADDRESS": f"127.0.0.1:{port}", "JAX_NUM_PROCESSES": "2",
            "JAX_PROCESS_ID": str(rank)}


@pytest.mark.parametrize(
    "environment, resolver",
    [
        (_torchrun, "TorchrunClusterResolver"),
        (_open_mpi, "MPIClusterResolver"),
        (_mpich, "MPIClusterResolver"),
        (_jax_job, "JAXClusterResolver"),
    ],
    ids=["torchrun", "open_mpi", "mpich", "jax_job"],
)
def test_processes_form_one_group_and_the_spec_lists_them(workers, environment,
                                                          resolver) -> None:
    (port,) = free_ports(1)
    size = 4 if resolver == "TorchrunClusterResolver" else 2
    for rank in range(size):
        workers.start(["launcher_env_program.py"], [""],
                      extra_env={**environment(rank, port), "STRATAX_CPU_COLLECTIVES": "gloo"})
    outputs = workers.wait(timeout=200)
    reports = []
    for rank, (proc, out) in enumerate(zip(workers.procs, outputs, strict=True)):
        assert proc.returncode == 0, f"rank {rank} failed:\n{out[-3000:]}"
        lines = [line for line in out.splitlines() if line.startswith("{")]
        assert lines, f"rank {rank} printed no report:\n{out[-3000:]}"
        reports.append(json.loads(lines[-1]))
    ranks = list(range(size))
    assert [r["resolver"] for r in reports] == [resolver] * size
    assert [r["replicas"] for r in reports] == [size] * size
    assert [r["is_chief"] for r in reports] == [True] + [False] * (size - 1)
    assert [r["worker_index"] for r in reports] == ranks
    assert [r["gathered"] for r in reports] == [ranks] * size
    # Before the group forms the environment names the coordinator only (two nodes, mpirun, a
    # JAX job); once formed, every process' spec lists every worker, worker 0 the coordinator.
    assert [r["spec_before"] for r in reports] == [[f"127.0.0.1:{port}"]] * size
    every_worker = {"worker": [f"127.0.0.1:{port + rank}" for rank in ranks]}
    assert [r["spec"] for r in reports] == [every_worker] * size


def test_world_without_coordinator_fails_fast_naming_the_variable(workers) -> None:
    """The issue's symptom: WORLD_SIZE=2 without MASTER_ADDR must not train alone."""
    workers.start(["launcher_env_program.py"], [""],
                  extra_env={"WORLD_SIZE": "2", "RANK": "0"})
    (out,) = workers.wait(timeout=120)
    assert workers.procs[0].returncode != 0, out[-3000:]
    assert "WORLD_SIZE=2 but MASTER_ADDR is not set" in out, out[-3000:]
    assert '"replicas"' not in out
