"""detect_cluster_resolver: documented priority order, local fallback, no silent fallback."""

from __future__ import annotations

import json

import pytest

from stratax._src.cluster import (
    RESOLVERS_IN_ORDER,
    KubernetesClusterResolver,
    LauncherClusterResolver,
    SlurmClusterResolver,
    TFConfigClusterResolver,
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


def _set(cluster_env: pytest.MonkeyPatch, *groups: dict) -> None:
    for group in groups:
        for name, value in group.items():
            cluster_env.setenv(name, value)


def test_documented_order() -> None:
    expected = (LauncherClusterResolver, TFConfigClusterResolver, SlurmClusterResolver,
                KubernetesClusterResolver)
    assert expected == RESOLVERS_IN_ORDER


@pytest.mark.parametrize(
    "groups, expected",
    [
        ((LAUNCHER, TF_CONFIG, SLURM, K8S), LauncherClusterResolver),
        ((TF_CONFIG, SLURM, K8S), TFConfigClusterResolver),
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


@pytest.mark.parametrize(
    "groups, message",
    [
        (({"STRATAX_PROCESS_ID": "0"}, TF_CONFIG), r"STRATAX_COORDINATOR_ADDRESS is not set"),
        (({"TF_CONFIG": "{oops"}, SLURM), r"TF_CONFIG is not valid JSON"),
        (({"SLURM_PROCID": "0", "SLURM_NTASKS": "2"}, K8S), r"Neither SLURM_STEP_NODELIST nor"),
        (({"JOB_COMPLETION_INDEX": "0", "STRATAX_K8S_NUM_WORKERS": "2"},),
         r"STRATAX_K8S_SERVICE is not set"),
    ],
)
def test_misconfigured_match_raises_instead_of_falling_through(
    cluster_env: pytest.MonkeyPatch, groups: tuple, message: str
) -> None:
    _set(cluster_env, *groups)
    with pytest.raises(ValueError, match=message):
        detect_cluster_resolver()
