"""detect_cluster_resolver: documented priority order, local fallback, no silent fallback."""

from __future__ import annotations

import json

import pytest

from stratax._src.cluster import (
    RESOLVERS_IN_ORDER,
    JAXClusterResolver,
    KubernetesClusterResolver,
    LauncherClusterResolver,
    MPIClusterResolver,
    SlurmClusterResolver,
    TFConfigClusterResolver,
    TorchrunClusterResolver,
    detect_cluster_resolver,
    process_layout,
)

LAUNCHER = {"STRATAX_COORDINATOR_ADDRESS": "h:1", "STRATAX_NUM_PROCESSES": "2",
            "STRATAX_PROCESS_ID": "1"}
TF_CONFIG = {"TF_CONFIG": json.dumps({"cluster": {"worker": ["a:1", "b:1"]},
                                      "task": {"type": "worker", "index": 0}})}
SLURM = {"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_JOB_NODELIST": "n[1-2]",
         "SLURM_TASKS_PER_NODE": "1(x2)"}
K8S = {"JOB_COMPLETION_INDEX": "0", "STRATAX_K8S_NUM_WORKERS": "2",
       "STRATAX_K8S_SERVICE": "svc", "HOSTNAME": "job-0"}
TORCHRUN = {"MASTER_ADDR": "n1", "MASTER_PORT": "29500", "WORLD_SIZE": "2", "RANK": "1",
            "LOCAL_RANK": "0"}
OPEN_MPI = {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2",
            "OMPI_MCA_orte_hnp_uri": "4096.0;tcp://10.0.0.1:1"}
JAX_JOB = {"JAX_COORDINATOR_ADDRESS": "n1:1234", "JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": "1"}


def _set(cluster_env: pytest.MonkeyPatch, *groups: dict) -> None:
    for group in groups:
        for name, value in group.items():
            cluster_env.setenv(name, value)


def test_documented_order() -> None:
    expected = (LauncherClusterResolver, TFConfigClusterResolver, TorchrunClusterResolver,
                MPIClusterResolver, JAXClusterResolver, SlurmClusterResolver,
                KubernetesClusterResolver)
    assert expected == RESOLVERS_IN_ORDER


@pytest.mark.parametrize(
    "groups, expected",
    [
        ((LAUNCHER, TF_CONFIG, TORCHRUN, OPEN_MPI, JAX_JOB, SLURM, K8S), LauncherClusterResolver),
        ((TF_CONFIG, TORCHRUN, OPEN_MPI, JAX_JOB, SLURM, K8S), TFConfigClusterResolver),
        # torchrun / mpirun started inside a Slurm step or a pod: the launcher's group wins.
        ((TORCHRUN, OPEN_MPI, JAX_JOB, SLURM, K8S), TorchrunClusterResolver),
        ((OPEN_MPI, JAX_JOB, SLURM, K8S), MPIClusterResolver),
        ((JAX_JOB, SLURM, K8S), JAXClusterResolver),
        # srun --mpi=pmi2: PMI_* beside Slurm's own variables, which list the nodes.
        (({"PMI_RANK": "0", "PMI_SIZE": "2"}, SLURM), SlurmClusterResolver),
        ((SLURM, K8S), SlurmClusterResolver),
        ((K8S,), KubernetesClusterResolver),
        ((SLURM,), SlurmClusterResolver),
    ],
)
def test_first_available_wins(cluster_env: pytest.MonkeyPatch, groups: tuple,
                              expected: type) -> None:
    _set(cluster_env, *groups)
    resolver = detect_cluster_resolver()
    assert type(resolver) is expected
    assert process_layout(resolver).num_processes == 2


def test_one_task_slurm_step_falls_through(cluster_env: pytest.MonkeyPatch) -> None:
    _set(cluster_env, SLURM, K8S, {"SLURM_NTASKS": "1"})
    assert type(detect_cluster_resolver()) is KubernetesClusterResolver


def test_nothing_set_is_local_mode(cluster_env: pytest.MonkeyPatch) -> None:
    _set(cluster_env, {"JOB_COMPLETION_INDEX": "3", "TF_CONFIG": "  "})
    resolver = detect_cluster_resolver()
    assert type(resolver) is TFConfigClusterResolver
    assert not resolver.cluster_spec()
    layout = process_layout(resolver)
    assert (layout.coordinator_address, layout.num_processes, layout.process_id) == (None, 1, 0)


def test_torchrun_inside_slurm_uses_torchruns_group(cluster_env: pytest.MonkeyPatch) -> None:
    # srun starts one torchrun per node (SLURM_NTASKS=2); torchrun starts 4 children per node.
    _set(cluster_env, SLURM, TORCHRUN, {"WORLD_SIZE": "8", "RANK": "5"})
    layout = process_layout(detect_cluster_resolver())
    assert (layout.num_processes, layout.process_id, layout.coordinator_address) == (
        8, 5, "n1:29501")


def test_leftover_coordinator_address_is_an_error_not_local_mode(
    cluster_env: pytest.MonkeyPatch,
) -> None:
    _set(cluster_env, {"JAX_COORDINATOR_ADDRESS": "n1:1234"})
    with pytest.raises(ValueError, match=r"JAX_COORDINATOR_ADDRESS='n1:1234' is set, but no "
                                         r"launcher .*JAX_NUM_PROCESSES and JAX_PROCESS_ID"):
        detect_cluster_resolver()
    # With a scheduler that states the group, JAX's override is not in the way.
    _set(cluster_env, SLURM)
    assert type(detect_cluster_resolver()) is SlurmClusterResolver


@pytest.mark.parametrize(
    "groups, message",
    [
        (({"STRATAX_PROCESS_ID": "0"}, TF_CONFIG), r"STRATAX_COORDINATOR_ADDRESS is not set"),
        (({"TF_CONFIG": "{oops"}, SLURM), r"TF_CONFIG is not valid JSON"),
        (({"SLURM_PROCID": "0", "SLURM_NTASKS": "2"}, K8S), r"neither SLURM_STEP_NODELIST nor"),
        # SLURM_PROCID alone, or with the job id: a half-described step, not a lone worker.
        (({"SLURM_PROCID": "0"},), r"SLURM_PROCID=0 is set, but .*neither SLURM_STEP_NUM_TASKS"),
        (({"SLURM_PROCID": "1", "SLURM_JOB_ID": "77"}, K8S),
         r"SLURM_PROCID=1 is set, but .*neither SLURM_STEP_NUM_TASKS nor SLURM_NTASKS"),
        (({"JOB_COMPLETION_INDEX": "0", "STRATAX_K8S_NUM_WORKERS": "2"},),
         r"STRATAX_K8S_SERVICE is not set"),
        # The case: a torchrun world with no coordinator never trains alone.
        (({"WORLD_SIZE": "2", "RANK": "1"}, SLURM), r"WORLD_SIZE=2 but MASTER_ADDR is not set"),
        (({**TORCHRUN, "RANK": "2"}, SLURM), r"RANK=2 is not below WORLD_SIZE=2"),
        (({"PMI_RANK": "1", "PMI_SIZE": "2", "MPI_LOCALRANKID": "1"},),
         r"PMI_RANK=1 of PMI_SIZE=2: the MPI launcher does not say"),
        (({"JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": "0"}, SLURM),
         r"JAX_NUM_PROCESSES=2 but JAX_COORDINATOR_ADDRESS is not set"),
    ],
)
def test_misconfigured_match_raises_instead_of_falling_through(
    cluster_env: pytest.MonkeyPatch, groups: tuple, message: str
) -> None:
    _set(cluster_env, *groups)
    with pytest.raises(ValueError, match=message):
        detect_cluster_resolver()
