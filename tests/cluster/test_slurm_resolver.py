"""SlurmClusterResolver: addresses per node, jobs split, GPUs and malformed Slurm variables."""

from __future__ import annotations

import os

import pytest

from stratax._src.cluster.process_layout import ProcessLayout, process_layout
from stratax._src.cluster.slurm import SlurmClusterResolver


def _slurm(cluster_env: pytest.MonkeyPatch, **variables: str) -> None:
    for name, value in variables.items():
        cluster_env.setenv(f"SLURM_{name}", value)


def _two_by_two(cluster_env: pytest.MonkeyPatch, procid: int) -> None:
    _slurm(cluster_env, PROCID=str(procid), NTASKS="4", JOB_NODELIST="n[1-2]",
           TASKS_PER_NODE="2(x2)")


def test_default_all_workers(cluster_env: pytest.MonkeyPatch) -> None:
    _two_by_two(cluster_env, 3)
    resolver = SlurmClusterResolver()
    assert resolver.cluster_spec().as_dict() == {
        "worker": ["n1:8888", "n1:8889", "n2:8888", "n2:8889"]
    }
    assert (resolver.task_type, resolver.task_id) == ("worker", 3)
    assert resolver.get_task_info() == ("worker", 3)
    assert resolver.local_task_id == 1
    assert resolver.master() == "n2:8889"
    assert resolver.master("worker", 0, rpc_layer="grpc") == "grpc://n1:8888"
    assert resolver.num_accelerators() == {}
    assert resolver.environment == ""
    assert process_layout(resolver) == ProcessLayout("n1:8888", 4, 3, "worker", 3)


def test_step_variables_win_over_job_variables(cluster_env: pytest.MonkeyPatch) -> None:
    _slurm(cluster_env, PROCID="1", NTASKS="8", JOB_NODELIST="n[1-4]", TASKS_PER_NODE="2(x4)",
           STEP_NUM_TASKS="3", STEP_NODELIST="gpu[07-08]", STEP_TASKS_PER_NODE="2,1")
    resolver = SlurmClusterResolver(port_base=9000, rpc_layer="grpc")
    assert resolver.cluster_spec().as_dict() == {
        "worker": ["gpu07:9000", "gpu07:9001", "gpu08:9000"]
    }
    assert resolver.master() == "grpc://gpu07:9001"


def test_jobs_are_assigned_in_sorted_name_order_like_tf(cluster_env: pytest.MonkeyPatch) -> None:
    _two_by_two(cluster_env, 1)
    resolver = SlurmClusterResolver(jobs={"worker": 2, "chief": 1, "ps": 1})
    assert resolver.cluster_spec().as_dict() == {
        "chief": ["n1:8888"], "ps": ["n1:8889"], "worker": ["n2:8888", "n2:8889"],
    }
    assert (resolver.task_type, resolver.task_id) == ("ps", 0)


def test_tasks_per_node_argument(cluster_env: pytest.MonkeyPatch) -> None:
    _slurm(cluster_env, PROCID="0", NTASKS="3", JOB_NODELIST="a,b,c", TASKS_PER_NODE="garbage")
    resolver = SlurmClusterResolver(tasks_per_node=1)
    assert resolver.cluster_spec().as_dict() == {"worker": ["a:8888", "b:8888", "c:8888"]}
    _slurm(cluster_env, JOB_NODELIST="garbage[")
    resolver = SlurmClusterResolver(tasks_per_node={"x": 2, "y": 1})
    assert resolver.cluster_spec().as_dict() == {"worker": ["x:8888", "x:8889", "y:8888"]}


def test_gpus_from_slurm_and_auto_set(cluster_env: pytest.MonkeyPatch) -> None:
    _two_by_two(cluster_env, 3)
    _slurm(cluster_env, GPUS_ON_NODE="4")
    cluster_env.setenv("CUDA_VISIBLE_DEVICES", "unchanged")  # so the fixture restores it
    resolver = SlurmClusterResolver()
    assert resolver.num_accelerators() == {"GPU": 2}
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "unchanged"
    SlurmClusterResolver(auto_set_gpu=True)
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "2,3"
    SlurmClusterResolver(gpus_per_node=8, gpus_per_task=3, auto_set_gpu=True)
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "3,4,5"


def test_gpus_per_task_from_slurm(cluster_env: pytest.MonkeyPatch) -> None:
    _two_by_two(cluster_env, 0)
    _slurm(cluster_env, GPUS_PER_TASK="1")
    assert SlurmClusterResolver().num_accelerators() == {"GPU": 1}


@pytest.mark.parametrize(
    "variables, kwargs, message",
    [
        ({"PROCID": None}, {}, r"SLURM_PROCID is not set .*srun python train.py"),
        ({"PROCID": "one"}, {}, r"SLURM_PROCID='one' is not an integer"),
        ({"PROCID": "-1"}, {}, r"SLURM_PROCID='-1' is not an integer >= 0"),
        ({"NTASKS": None}, {}, r"SLURM_PROCID=3 is set, but .*: neither SLURM_STEP_NUM_TASKS "
                               r"nor SLURM_NTASKS is set\. Either run the program with srun"),
        ({"NTASKS": "four"}, {}, r"SLURM_NTASKS='four' is not an integer"),
        ({"PROCID": "4"}, {}, r"SLURM_PROCID=4 is not below the task count SLURM_NTASKS=4"),
        ({"JOB_NODELIST": None}, {},
         r": neither SLURM_STEP_NODELIST nor SLURM_JOB_NODELIST is set"),
        ({"JOB_NODELIST": "n[1-2"}, {}, r"SLURM_JOB_NODELIST: Invalid Slurm node list 'n\[1-2'"),
        ({"TASKS_PER_NODE": None}, {},
         r": neither SLURM_STEP_TASKS_PER_NODE nor SLURM_TASKS_PER_NODE is set"),
        ({"TASKS_PER_NODE": "2(y2)"}, {}, r"SLURM_TASKS_PER_NODE: Invalid Slurm tasks-per-node"),
        ({"TASKS_PER_NODE": "2(x3)"}, {},
         r"SLURM_TASKS_PER_NODE='2\(x3\)' describes 3 nodes but SLURM_JOB_NODELIST='n\[1-2\]' "
         r"lists 2"),
        ({"TASKS_PER_NODE": "1,2"}, {}, r"add up to 3, but SLURM_NTASKS=4"),
        ({}, {"tasks_per_node": 3}, r"add up to 6, but SLURM_NTASKS=4"),
        ({}, {"tasks_per_node": 0}, r"tasks_per_node must be an integer >= 1, got 0"),
        ({}, {"tasks_per_node": {}}, r"tasks_per_node is an empty dict"),
        ({}, {"jobs": {"worker": 3}}, r"jobs=\{'worker': 3\} asks for 3 tasks but the Slurm step "
                                      r"has 4"),
        ({}, {"jobs": {"worker": -1, "ps": 5}}, r"jobs\['worker'\] must be an integer >= 0"),
        ({}, {"jobs": {}}, r"jobs must be a non-empty dict"),
        ({}, {"port_base": 65535}, r"needs ports up to 65536, above 65535"),
        ({}, {"port_base": -5}, r"port_base must be an integer >= 0"),
        ({"LOCALID": "0"}, {}, r"Rank 3 should be task 1 on its node .* SLURM_LOCALID=0.*"
                               r"--distribution=block"),
        ({"GPUS_ON_NODE": "2"}, {"gpus_per_task": 2},
         r"2 tasks per node x 2 GPUs per task needs 4 GPUs, but a node has 2"),
        ({}, {"auto_set_gpu": True}, r"auto_set_gpu=True needs the GPUs per task"),
        ({"GPUS_ON_NODE": "1"}, {"auto_set_gpu": True}, r"auto_set_gpu=True needs the GPUs"),
    ],
)
def test_malformed_slurm_environment(
    cluster_env: pytest.MonkeyPatch, variables: dict, kwargs: dict, message: str
) -> None:
    _two_by_two(cluster_env, 3)
    for name, value in variables.items():
        if value is None:
            cluster_env.delenv(f"SLURM_{name}")
        else:
            cluster_env.setenv(f"SLURM_{name}", value)
    with pytest.raises(ValueError, match=message):
        SlurmClusterResolver(**kwargs)


def test_matching_local_id_passes(cluster_env: pytest.MonkeyPatch) -> None:
    _two_by_two(cluster_env, 3)
    _slurm(cluster_env, LOCALID="1")
    assert SlurmClusterResolver().local_task_id == 1


@pytest.mark.parametrize(
    "variables, available",
    [
        ({}, False),
        ({"PROCID": "0"}, True),  # a task that does not say how many: an error, not local
        ({"PROCID": "0", "JOB_ID": "77"}, True),
        ({"PROCID": "0", "NTASKS": "1"}, False),
        ({"PROCID": "0", "NTASKS": "2"}, True),
        ({"NTASKS": "2"}, False),
        ({"PROCID": "0", "NTASKS": "4", "STEP_NUM_TASKS": "1"}, False),
        ({"PROCID": "0", "NTASKS": "1", "STEP_NUM_TASKS": "2"}, True),
        ({"PROCID": "0", "NTASKS": "lots"}, True),  # reported by the constructor, not skipped
    ],
)
def test_is_available(cluster_env: pytest.MonkeyPatch, variables: dict, available: bool) -> None:
    _slurm(cluster_env, **variables)
    assert SlurmClusterResolver.is_available() is available


@pytest.mark.parametrize("extra", [{}, {"JOB_ID": "77"}])
def test_lone_procid_names_every_missing_variable(
    cluster_env: pytest.MonkeyPatch, extra: dict
) -> None:
    # The case: SLURM_PROCID alone (or with SLURM_JOB_ID) was a silent lone worker.
    _slurm(cluster_env, PROCID="1", **extra)
    with pytest.raises(ValueError) as raised:
        SlurmClusterResolver()
    message = str(raised.value)
    for name in ("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_STEP_NODELIST",
                 "SLURM_JOB_NODELIST", "SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"):
        assert name in message
    assert "SLURM_PROCID=1 is set" in message and "unset SLURM_PROCID" in message


def test_tasks_per_node_argument_stands_in_for_missing_variables(
    cluster_env: pytest.MonkeyPatch,
) -> None:
    _slurm(cluster_env, PROCID="0", NTASKS="2")
    with pytest.raises(ValueError) as raised:
        SlurmClusterResolver(tasks_per_node=2)
    assert "SLURM_JOB_NODELIST" in str(raised.value)
    assert "TASKS_PER_NODE" not in str(raised.value)
    resolver = SlurmClusterResolver(tasks_per_node={"a": 1, "b": 1})
    assert resolver.cluster_spec().as_dict() == {"worker": ["a:8888", "b:8888"]}
