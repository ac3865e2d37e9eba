"""The environment each launched worker sees: the contract the cluster resolvers read.

Every child gets ``STRATAX_COORDINATOR_ADDRESS``, ``STRATAX_NUM_PROCESSES``,
``STRATAX_PROCESS_ID`` (global rank), ``STRATAX_LOCAL_RANK``, ``STRATAX_RESTART_COUNT`` and
``STRATAX_TASK_NAME`` (``worker_1``, or ``chief_0`` / ``ps_2`` under ``--workers/--ps``).
On a single node it also gets ``TF_CONFIG`` listing one ``127.0.0.1`` port per worker (worker 0's
port is the coordinator port), so TF-style programs resolve the same cluster. With several nodes
a launcher cannot know the other hosts' addresses, so ``TF_CONFIG`` is removed instead of
written half right.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence

from stratax._src.core import env as env_names
from stratax._src.launch.config import Address, LaunchConfig
from stratax._src.launch.network import LOOPBACK


@dataclasses.dataclass(frozen=True)
class WorkerSpec:
    """What one child is started with: its ranks, its task and its full environment.

    The task is the child's ``TF_CONFIG`` task (``chief 0``, ``worker 1``, ``ps 2`` under
    ``--workers/--ps``), else ``worker <global rank>``: the names TensorFlow's programs and
    logs use, so a user reads the same name in the launcher's output as in their cluster.
    """

    local_rank: int
    global_rank: int
    env: Mapping[str, str]
    task_type: str = "worker"
    task_index: int | None = None  # None: the global rank

    @property
    def index(self) -> int:
        """The task's index within its job."""
        return self.global_rank if self.task_index is None else self.task_index

    @property
    def name(self) -> str:
        """The task name used in output prefixes and error summaries, e.g. ``ps 2``."""
        return f"{self.task_type} {self.index}"

    @property
    def file_name(self) -> str:
        """The task name in file names and run-directory records, e.g. ``ps_2``."""
        return f"{self.task_type}_{self.index}"


def tf_config_json(worker_addresses: Sequence[str], index: int) -> str:
    """``TF_CONFIG`` for worker ``index`` of a cluster made only of ``worker`` tasks."""
    return json.dumps(
        {"cluster": {"worker": list(worker_addresses)}, "task": {"type": "worker", "index": index}}
    )


def build_worker_specs(
    config: LaunchConfig,
    coordinator: Address,
    restart_count: int,
    base_env: Mapping[str, str],
    worker_ports: Sequence[int] | None = None,
) -> list[WorkerSpec]:
    """Builds one :class:`WorkerSpec` per local rank of this node.

    Args:
        config: the validated launch settings.
        coordinator: address of the ``jax.distributed`` coordinator (global rank 0).
        restart_count: how many times the group was restarted before this start.
        base_env: environment inherited by every child (usually ``os.environ`` plus overrides).
        worker_ports: on a single node, the ``TF_CONFIG`` port of each worker; entry 0 must be
            the coordinator port. Ignored when ``config.nnodes > 1``.

    Raises:
        ValueError: when a single-node launch gets the wrong number of ports or a worker-0 port
            that differs from the coordinator port.
    """
    tf_workers: list[str] | None = None
    if config.nnodes == 1:
        ports = list(worker_ports) if worker_ports is not None else []
        if len(ports) != config.nproc_per_node or ports[0] != coordinator.port:
            raise ValueError(
                f"A single-node launch needs {config.nproc_per_node} worker ports starting with "
                f"the coordinator port {coordinator.port}, got {ports}."
            )
        tf_workers = [str(coordinator)] + [f"{LOOPBACK}:{port}" for port in ports[1:]]

    specs = []
    for local_rank in range(config.nproc_per_node):
        global_rank = config.global_rank(local_rank)
        child_env = dict(base_env)
        child_env.update(
            {
                env_names.STRATAX_COORDINATOR_ADDRESS: str(coordinator),
                env_names.STRATAX_NUM_PROCESSES: str(config.num_processes),
                env_names.STRATAX_PROCESS_ID: str(global_rank),
                env_names.STRATAX_LOCAL_RANK: str(local_rank),
                env_names.STRATAX_RESTART_COUNT: str(restart_count),
                env_names.PYTHONUNBUFFERED: "1",
            }
        )
        task_type, task_index = "worker", global_rank
        if tf_workers is not None:
            child_env[env_names.TF_CONFIG] = tf_config_json(tf_workers, global_rank)
            assign_parameter_server_roles(child_env)
            task = json.loads(child_env[env_names.TF_CONFIG])["task"]
            task_type, task_index = task["type"], task["index"]
        else:
            child_env.pop(env_names.TF_CONFIG, None)
        spec = WorkerSpec(local_rank, global_rank, child_env, task_type, task_index)
        # Its metrics file and dashboard lines carry the same name as its output.
        child_env[env_names.STRATAX_TASK_NAME] = spec.file_name
        specs.append(spec)
    return specs


def parameter_server_tf_config(addresses: Sequence[str], rank: int, workers: int, ps: int) -> str:
    """``TF_CONFIG`` of process ``rank`` in a ParameterServerStrategy cluster on ``addresses``.

    Rank 0 is the ``chief``, ranks ``1..workers`` the ``worker`` tasks and the next ``ps`` ranks
    the ``ps`` tasks (``stratax launch --workers W --ps P`` starts ``1 + W + P`` processes).

    Raises:
        ValueError: when the counts do not match the number of addresses.
    """
    if workers < 1 or ps < 1 or len(addresses) != 1 + workers + ps:
        raise ValueError(
            f"A parameter-server launch needs 1 + workers + ps = {1 + workers + ps} processes "
            f"(workers={workers}, ps={ps}), got {len(addresses)} addresses."
        )
    cluster = {"chief": [addresses[0]], "worker": list(addresses[1:1 + workers]),
               "ps": list(addresses[1 + workers:])}
    if rank == 0:
        task = {"type": "chief", "index": 0}
    elif rank <= workers:
        task = {"type": "worker", "index": rank - 1}
    else:
        task = {"type": "ps", "index": rank - 1 - workers}
    return json.dumps({"cluster": cluster, "task": task})


def assign_parameter_server_roles(child_env: dict[str, str]) -> None:
    """Rewrites a single-node worker ``TF_CONFIG`` into chief/worker/ps roles when
    ``STRATAX_PS_ROLES`` (``"W,P"``, set by ``stratax launch --workers W --ps P``) is present."""
    roles = child_env.get(env_names.STRATAX_PS_ROLES)
    if not roles:
        return
    workers, ps = (int(n) for n in roles.split(","))
    config = json.loads(child_env[env_names.TF_CONFIG])
    child_env[env_names.TF_CONFIG] = parameter_server_tf_config(
        config["cluster"]["worker"], config["task"]["index"], workers, ps)
