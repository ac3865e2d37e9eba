"""Real processes started with another launcher's environment join one group (issue 33).

Each case starts two processes with the variables that torchrun / a PyTorchJob, Open MPI's
mpirun, MPICH's mpiexec or a JAX job script gives its children (no TF_CONFIG, no STRATAX_*), on
127.0.0.1 with free ports, and checks that they form one two-replica group with exactly one
chief, instead of two single-worker runs that both write checkpoints as chief.
"""

import json

import pytest
from conftest import free_ports

pytestmark = pytest.mark.timeout(240)


def _torchrun(rank: int, port: int) -> dict[str, str]:
    # torchrun's children; the coordinator is MASTER_ADDR:MASTER_PORT + 1.
    return {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port - 1), "WORLD_SIZE": "2",
            "RANK": str(rank), "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": "2",
            "TORCHELASTIC_RUN_ID": "test"}


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
def test_two_processes_form_one_group(workers, environment, resolver) -> None:
    (port,) = free_ports(1)
    for rank in range(2):
        workers.start(["launcher_env_program.py"], [""],
                      extra_env={**environment(rank, port), "STRATAX_CPU_COLLECTIVES": "gloo"})
    outputs = workers.wait(timeout=200)
    reports = []
    for rank, (proc, out) in enumerate(zip(workers.procs, outputs, strict=True)):
        assert proc.returncode == 0, f"rank {rank} failed:\n{out[-3000:]}"
        lines = [line for line in out.splitlines() if line.startswith("{")]
        assert lines, f"rank {rank} printed no report:\n{out[-3000:]}"
        reports.append(json.loads(lines[-1]))
    assert [r["resolver"] for r in reports] == [resolver, resolver]
    assert [r["replicas"] for r in reports] == [2, 2]
    assert [r["is_chief"] for r in reports] == [True, False]
    assert [r["worker_index"] for r in reports] == [0, 1]
    assert [r["gathered"] for r in reports] == [[0, 1], [0, 1]]
    if resolver == "TorchrunClusterResolver":
        # One node: the spec lists both workers, as under Slurm, for guide code that counts them.
        assert [r["spec_workers"] for r in reports] == [2, 2]


def test_world_without_coordinator_fails_fast_naming_the_variable(workers) -> None:
    """The issue's symptom: WORLD_SIZE=2 without MASTER_ADDR must not train alone."""
    workers.start(["launcher_env_program.py"], [""],
                  extra_env={"WORLD_SIZE": "2", "RANK": "0"})
    (out,) = workers.wait(timeout=120)
    assert workers.procs[0].returncode != 0, out[-3000:]
    assert "WORLD_SIZE=2 but MASTER_ADDR is not set" in out, out[-3000:]
    assert '"replicas"' not in out
