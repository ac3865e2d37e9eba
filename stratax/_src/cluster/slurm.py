"""``SlurmClusterResolver``: the cluster of a Slurm job step, from Slurm's environment variables.

Slurm starts one process per task (``srun python train.py``) and tells each its rank
(``SLURM_PROCID``), the task count, the nodes and the tasks per node. This resolver turns that
into a ``ClusterSpec`` with one ``host:port`` per task (``port_base`` + the task's index on its
node) without calling ``scontrol``, so it works in containers without Slurm's client tools.
Modelled on TensorFlow's ``SlurmClusterResolver``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping

from stratax._src.cluster.cluster_spec import ClusterSpec
from stratax._src.cluster.resolver import ClusterResolver
from stratax._src.cluster.slurm_hostlist import expand_hostlist, expand_tasks_per_node
from stratax._src.core import env

logger = logging.getLogger(__name__)

_RUN_WITH_SRUN = "run the program with srun (e.g. `srun python train.py`) inside a Slurm job."


# What the resolver needs, each as (step variable, job-wide variable); the step's wins.
_TASK_COUNT = (env.SLURM_STEP_NUM_TASKS, env.SLURM_NTASKS)
_NODE_LIST = (env.SLURM_STEP_NODELIST, env.SLURM_JOB_NODELIST)
_TASKS_PER_NODE = (env.SLURM_STEP_TASKS_PER_NODE, env.SLURM_TASKS_PER_NODE)


def _first_set(names: tuple[str, str]) -> tuple[str, str] | None:
    """``(name, value)`` of the first of ``names`` that is set and not blank, else ``None``."""
    for name in names:
        value = os.environ.get(name, "").strip()
        if value:
            return name, value
    return None


def _slurm_var(names: tuple[str, str]) -> tuple[str, str]:
    """``(name, value)`` of the step variable if set, else of the job-wide one."""
    found = _first_set(names)
    if found is None:
        raise ValueError(f"Neither {names[0]} nor {names[1]} is set; " + _RUN_WITH_SRUN)
    return found


def _check_complete(rank: int, tasks_per_node: int | Mapping[str, int] | None) -> None:
    """Raises naming every Slurm variable the resolver needs that is not set.

    ``SLURM_PROCID`` says this process is one task of a Slurm step; without the task count,
    node list and tasks per node it cannot know its peers, and guessing "one task" would train
    a lone worker while its peers wait. ``tasks_per_node=`` given as an argument stands in for
    the tasks-per-node variables, a dict of hosts for the node list too.
    """
    needed = [_TASK_COUNT]
    if not isinstance(tasks_per_node, Mapping):
        needed.append(_NODE_LIST)
        if tasks_per_node is None:
            needed.append(_TASKS_PER_NODE)
    missing = [f"neither {step} nor {job}" for step, job in needed if not _first_set((step, job))]
    if missing:
        raise ValueError(
            f"{env.SLURM_PROCID}={rank} is set, but the Slurm environment does not describe the "
            f"rest of the step: {'; '.join(missing)} is set. Either {_RUN_WITH_SRUN[:-1]}, or "
            f"unset {env.SLURM_PROCID} to train in this process alone."
        )


def _check_count(value: object, what: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{what} must be an integer >= {minimum}, got {value!r}.")
    return value


class SlurmClusterResolver(ClusterResolver):
    """Resolves the cluster of the current Slurm job step.

    Reads ``SLURM_PROCID`` (this task's rank), ``SLURM_STEP_NUM_TASKS`` or ``SLURM_NTASKS``,
    ``SLURM_STEP_NODELIST`` or ``SLURM_JOB_NODELIST`` (compressed, e.g. ``node[01-04,07]``) and
    ``SLURM_STEP_TASKS_PER_NODE`` or ``SLURM_TASKS_PER_NODE`` (e.g. ``2(x3),1``); the step
    variables win. Ranks are laid out over the nodes in node-list order, as Slurm's default
    block distribution places them; when ``SLURM_LOCALID`` contradicts that layout (e.g.
    ``--distribution=cyclic``) construction fails instead of producing wrong addresses.

    Tasks go to jobs like TensorFlow does: ``jobs`` is sorted by job name and ranks are handed
    out in that order (``{"chief": 1, "worker": 3}`` makes rank 0 the chief). By default every
    task is a ``"worker"``.

    Example:
      >>> # srun -N 2 --ntasks-per-node=2 python train.py, on nodes n[1-2]:
      >>> resolver = SlurmClusterResolver(port_base=9000)
      >>> resolver.cluster_spec().as_dict()
      {'worker': ['n1:9000', 'n1:9001', 'n2:9000', 'n2:9001']}
    """

    def __init__(
        self,
        jobs: Mapping[str, int] | None = None,
        port_base: int = 8888,
        gpus_per_node: int | None = None,
        gpus_per_task: int | None = None,
        tasks_per_node: int | Mapping[str, int] | None = None,
        auto_set_gpu: bool = False,
        rpc_layer: str | None = None,
    ) -> None:
        """Reads the Slurm environment and builds the cluster.

        Args:
          jobs: Job name -> number of tasks; the counts must add up to the step's task count.
            Defaults to ``{"worker": <all tasks>}``.
          port_base: Port of the first task on each node; the k-th task on a node gets
            ``port_base + k``.
          gpus_per_node: GPUs on each node; defaults to ``SLURM_GPUS_ON_NODE`` when set.
          gpus_per_task: GPUs per task; defaults to ``SLURM_GPUS_PER_TASK``, else
            ``gpus_per_node // max tasks per node``.
          tasks_per_node: Tasks on every node (int) or per host name (dict); defaults to the
            Slurm tasks-per-node variables.
          auto_set_gpu: When True, sets ``CUDA_VISIBLE_DEVICES`` of this process to its
            ``gpus_per_task`` GPUs (local task k gets GPUs ``k*g .. k*g+g-1``). Done here, at
            construction, so it happens before JAX starts.
          rpc_layer: Protocol prefix of ``master()`` addresses.

        Raises:
          ValueError: If a Slurm variable is missing or malformed, the counts disagree, the
            ports leave 0..65535, more GPUs are requested than a node has, or ``auto_set_gpu``
            is set without a known GPU count.
        """
        self._rank = env.get_int(env.SLURM_PROCID, _RUN_WITH_SRUN, minimum=0)
        _check_complete(self._rank, tasks_per_node)
        tasks_var = _slurm_var(_TASK_COUNT)
        num_tasks = env.parse_int(tasks_var[0], tasks_var[1], minimum=1)
        if self._rank >= num_tasks:
            raise ValueError(
                f"{env.SLURM_PROCID}={self._rank} is not below the task count "
                f"{tasks_var[0]}={num_tasks}; the Slurm environment is inconsistent."
            )
        hosts, counts, from_env = self._resolve_nodes(tasks_per_node)
        if sum(counts) != num_tasks:
            raise ValueError(
                f"The tasks per node {dict(zip(hosts, counts, strict=True))} add up to "
                f"{sum(counts)}, but "
                f"{tasks_var[0]}={num_tasks}; make tasks_per_node match the step's task count."
            )
        self._jobs = self._check_jobs(jobs, num_tasks)
        port_base = _check_count(port_base, "port_base", 0)
        if port_base + max(counts) - 1 > 65535:
            raise ValueError(
                f"port_base={port_base} with up to {max(counts)} tasks per node needs ports up to "
                f"{port_base + max(counts) - 1}, above 65535; lower port_base."
            )
        addresses: list[str] = []
        local_ids: list[int] = []
        for host, count in zip(hosts, counts, strict=True):
            for local in range(count):
                addresses.append(f"{host}:{port_base + local}")
                local_ids.append(local)
        self._local_id = local_ids[self._rank]
        if from_env:
            self._check_block_distribution()
        cluster: dict[str, list[str]] = {}
        start = 0
        for job, count in sorted(self._jobs.items()):
            cluster[job] = addresses[start : start + count]
            if start <= self._rank < start + count:
                self._task_type: str | None = job
                self._task_id: int | None = self._rank - start
            start += count
        self._cluster_spec = ClusterSpec(cluster)
        self._rpc_layer = rpc_layer
        self._gpus_per_node, self._gpus_per_task = self._resolve_gpus(
            gpus_per_node, gpus_per_task, max(counts)
        )
        if auto_set_gpu:
            self._set_visible_gpus()

    @classmethod
    def is_available(cls) -> bool:
        """True inside a Slurm step of more than one task, or one that does not say its size.

        Needs ``SLURM_PROCID`` and a task count (``SLURM_STEP_NUM_TASKS`` or ``SLURM_NTASKS``)
        above 1: a one-task step is plain local training. A missing task count, or one that is
        not a number, also counts as available, so that the resolver names the missing or
        malformed variable instead of silently falling back to a lone worker. Note that a batch
        script run directly (not through ``srun``) sees the allocation's ``SLURM_NTASKS`` too;
        start training with ``srun``.
        """
        if not os.environ.get(env.SLURM_PROCID, "").strip():
            return False
        tasks_var = _first_set(_TASK_COUNT)
        if tasks_var is None:
            return True  # a task that does not say how many there are: the constructor says so
        try:
            return int(tasks_var[1]) > 1
        except ValueError:
            return True

    def _resolve_nodes(
        self, tasks_per_node: int | Mapping[str, int] | None
    ) -> tuple[list[str], list[int], bool]:
        """Host names and their task counts, and whether both came from the environment."""
        if isinstance(tasks_per_node, Mapping):
            if not tasks_per_node:
                raise ValueError("tasks_per_node is an empty dict; give each host a task count.")
            hosts = list(tasks_per_node)
            counts = [
                _check_count(count, f"tasks_per_node[{host!r}]", 1)
                for host, count in tasks_per_node.items()
            ]
            return hosts, counts, False
        nodes_name, nodes_value = _slurm_var(_NODE_LIST)
        try:
            hosts = expand_hostlist(nodes_value)
        except ValueError as error:
            raise ValueError(f"{nodes_name}: {error}") from None
        if tasks_per_node is not None:
            count = _check_count(tasks_per_node, "tasks_per_node", 1)
            return hosts, [count] * len(hosts), False
        tpn_name, tpn_value = _slurm_var(_TASKS_PER_NODE)
        try:
            counts = expand_tasks_per_node(tpn_value)
        except ValueError as error:
            raise ValueError(f"{tpn_name}: {error}") from None
        if len(counts) != len(hosts):
            raise ValueError(
                f"{tpn_name}={tpn_value!r} describes {len(counts)} nodes but "
                f"{nodes_name}={nodes_value!r} lists {len(hosts)} ({hosts}); the Slurm "
                "environment is inconsistent, or pass tasks_per_node= explicitly."
            )
        return hosts, counts, True

    @staticmethod
    def _check_jobs(jobs: Mapping[str, int] | None, num_tasks: int) -> dict[str, int]:
        if jobs is None:
            return {"worker": num_tasks}
        if not isinstance(jobs, Mapping) or not jobs:
            raise ValueError(
                f"jobs must be a non-empty dict of job name to task count, got {jobs!r}; e.g. "
                '{"chief": 1, "worker": 3}.'
            )
        checked = {}
        for job, count in jobs.items():
            if not isinstance(job, str) or not job:
                raise ValueError(f"Job names in jobs must be non-empty strings, got {job!r}.")
            checked[job] = _check_count(count, f"jobs[{job!r}]", 0)
        if sum(checked.values()) != num_tasks:
            raise ValueError(
                f"jobs={checked} asks for {sum(checked.values())} tasks but the Slurm step has "
                f"{num_tasks}; make the counts add up to {num_tasks}."
            )
        return checked

    def _check_block_distribution(self) -> None:
        local_id = env.get_optional_int(env.SLURM_LOCALID, minimum=0)
        if local_id is not None and local_id != self._local_id:
            raise ValueError(
                f"Rank {self._rank} should be task {self._local_id} on its node under Slurm's "
                f"block distribution, but {env.SLURM_LOCALID}={local_id}; start the step with "
                "`srun --distribution=block` (the default) so ranks fill nodes in order."
            )

    def _resolve_gpus(
        self, gpus_per_node: int | None, gpus_per_task: int | None, max_tasks: int
    ) -> tuple[int | None, int | None]:
        if gpus_per_node is None:
            gpus_per_node = env.get_optional_int(env.SLURM_GPUS_ON_NODE, minimum=0)
        else:
            _check_count(gpus_per_node, "gpus_per_node", 0)
        if gpus_per_task is None:
            gpus_per_task = env.get_optional_int(env.SLURM_GPUS_PER_TASK, minimum=0)
        else:
            _check_count(gpus_per_task, "gpus_per_task", 0)
        if gpus_per_task is None and gpus_per_node is not None:
            gpus_per_task = gpus_per_node // max_tasks
        if (
            gpus_per_node is not None
            and gpus_per_task is not None
            and gpus_per_task * max_tasks > gpus_per_node
        ):
            raise ValueError(
                f"{max_tasks} tasks per node x {gpus_per_task} GPUs per task needs "
                f"{gpus_per_task * max_tasks} GPUs, but a node has {gpus_per_node}; lower "
                "gpus_per_task or the tasks per node."
            )
        return gpus_per_node, gpus_per_task

    def _set_visible_gpus(self) -> None:
        if not self._gpus_per_task:
            raise ValueError(
                "auto_set_gpu=True needs the GPUs per task, which are unknown or 0; pass "
                f"gpus_per_node=/gpus_per_task= or run with `srun --gpus-per-task=N` "
                f"({env.SLURM_GPUS_PER_TASK}) or a GPU allocation ({env.SLURM_GPUS_ON_NODE})."
            )
        first = self._local_id * self._gpus_per_task
        visible = ",".join(str(gpu) for gpu in range(first, first + self._gpus_per_task))
        os.environ[env.CUDA_VISIBLE_DEVICES] = visible
        logger.info("Slurm rank %d: %s=%s", self._rank, env.CUDA_VISIBLE_DEVICES, visible)

    def cluster_spec(self) -> ClusterSpec:
        """The cluster of the Slurm step, one address per task."""
        return self._cluster_spec

    def get_task_info(self) -> tuple[str | None, int | None]:
        """``(task_type, task_id)`` of this process (TensorFlow compatibility)."""
        return self.task_type, self.task_id

    @property
    def local_task_id(self) -> int:
        """This task's index among the tasks of its node."""
        return self._local_id

    def num_accelerators(
        self, task_type: str | None = None, task_id: int | None = None
    ) -> dict[str, int]:
        """``{"GPU": gpus_per_task}`` when known from the arguments or Slurm, else ``{}``."""
        del task_type, task_id
        if self._gpus_per_task is None:
            return {}
        return {"GPU": self._gpus_per_task}
