"""The synchronous group: which tasks join it, and where this process stands in it
(``ProcessLayout``, defined beside ``ClusterResolver``, which may state one outright).

The synchronous strategies (MultiWorkerMirroredStrategy) run one process per chief/worker task and
join them with ``jax.distributed``, which wants three numbers: the coordinator's address, the
process count and this process' id. :func:`process_layout` derives them from a cluster resolver
so the runtime layer does not have to know TF_CONFIG's job conventions; a resolver whose
environment states them outright returns a ``ProcessLayout`` itself.
"""

from __future__ import annotations

from stratax._src.cluster.resolver import ClusterResolver, ProcessLayout

__all__ = ["SYNC_JOBS", "ProcessLayout", "process_layout"]


# Jobs whose tasks take part in synchronous training, in process-id order.
SYNC_JOBS = ("chief", "worker")
# Jobs that run beside synchronous training but are not part of its process group.
_NON_SYNC_JOBS = ("ps", "evaluator")


def process_layout(resolver: ClusterResolver) -> ProcessLayout:
    """Computes this process' coordinator address, process count and process id.

    Processes are the chief (if any) followed by the workers in task-index order; ``ps`` and
    ``evaluator`` tasks are not part of the group. The coordinator is the chief's address, or
    worker 0's when there is no chief. With an empty cluster (local mode) the layout is a single
    process with no coordinator. A cluster of one task needs no task type or id: this process
    is that task (TensorFlow runs ``{"cluster": {"worker": ["host:port"]}}`` so). A resolver
    whose environment states the layout directly (the stratax launcher) provides it through
    ``explicit_process_layout()``.

    Args:
      resolver: Any cluster resolver.

    Returns:
      The ``ProcessLayout`` of this process.

    Raises:
      ValueError: If this task is a ``ps``/``evaluator`` (or any other non-synchronous job), its
        task type or id is missing or not in the cluster, the cluster has no chief or worker, or
        more than one chief.
    """
    explicit = resolver.explicit_process_layout()
    if explicit is not None:
        return explicit
    spec = resolver.cluster_spec()
    task_type, task_id = resolver.task_type, resolver.task_id
    if task_type in _NON_SYNC_JOBS:
        raise ValueError(
            f"This process is a {task_type!r} task, which takes no part in synchronous "
            "multi-worker training, so it has no process layout. Only 'chief' and 'worker' "
            "tasks join the group; run a 'ps' task with ParameterServerStrategy's server and an "
            "'evaluator' with its own single-process evaluation loop."
        )
    if spec.total_tasks() == 0:
        return ProcessLayout(None, 1, 0, task_type, task_id)
    if (task_type is None or task_id is None) and spec.total_tasks() == 1:
        # TensorFlow accepts a one-task cluster without "task": this process is that task.
        (task_type,) = spec.jobs
        (task_id,) = spec.task_indices(task_type)
    if task_type is None or task_id is None:
        raise ValueError(
            f"The cluster {spec!r} has tasks but this process' task is unknown "
            f"(task_type={task_type!r}, task_id={task_id!r}); set TF_CONFIG's "
            '"task": {"type": "worker", "index": <i>} or pass task_type/task_id to the resolver.'
        )
    if task_type not in SYNC_JOBS:
        raise ValueError(
            f"Task type {task_type!r} is not part of synchronous training; expected one of "
            f"{list(SYNC_JOBS)} (the 'ps' and 'evaluator' jobs run outside the group)."
        )
    jobs = spec.jobs
    if "chief" in jobs and spec.num_tasks("chief") > 1:
        raise ValueError(
            f"The cluster has {spec.num_tasks('chief')} 'chief' tasks "
            f"({spec.job_tasks('chief')}); a cluster has at most one chief, list the others "
            "under 'worker'."
        )
    members = [(job, index) for job in SYNC_JOBS if job in jobs for index in spec.task_indices(job)]
    if not members:
        raise ValueError(
            f"The cluster {spec!r} has no 'chief' or 'worker' task, so there is no synchronous "
            "group to join; add a 'worker' job."
        )
    if (task_type, task_id) not in members:
        raise ValueError(
            f"This process is {task_type}[{task_id}], which is not in the cluster {spec!r}; "
            "fix the task index or the cluster."
        )
    coordinator_job, coordinator_index = members[0]
    return ProcessLayout(
        coordinator_address=spec.task_address(coordinator_job, coordinator_index),
        num_processes=len(members),
        process_id=members.index((task_type, task_id)),
        task_type=task_type,
        task_id=task_id,
    )
