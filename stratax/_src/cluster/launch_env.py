"""``LauncherClusterResolver``: the process group that ``stratax launch`` started this process in.

Contract with the launcher (names in ``stratax._src.core.env``), set for every child:

- ``STRATAX_COORDINATOR_ADDRESS``: ``"host:port"`` of the ``jax.distributed`` coordinator.
- ``STRATAX_NUM_PROCESSES``: number of processes in the job, over all nodes.
- ``STRATAX_PROCESS_ID``: this process' id in ``[0, STRATAX_NUM_PROCESSES)``.
- ``STRATAX_LOCAL_RANK``: this process' index among the processes of its node.
- ``STRATAX_RESTART_COUNT``: how many times the launcher restarted the job (0 at first).

On a single node the launcher also writes TF_CONFIG (a ``"worker"`` job with one address per
process); on several nodes it sets only the variables above.
"""

from __future__ import annotations

import os

from stratax._src.cluster.cluster_spec import ClusterSpec, parse_address
from stratax._src.cluster.process_group_resolver import ProcessGroupClusterResolver, check_rank
from stratax._src.cluster.process_layout import SYNC_JOBS
from stratax._src.cluster.tfconfig import parse_tf_config
from stratax._src.core import env

_SET_BY_LAUNCHER = (
    "it is set by `stratax launch` for every process it starts; start the program with "
    "`stratax launch` or unset the other STRATAX_* process variables."
)
_REQUIRED = (env.STRATAX_COORDINATOR_ADDRESS, env.STRATAX_NUM_PROCESSES, env.STRATAX_PROCESS_ID)


class LauncherClusterResolver(ProcessGroupClusterResolver):
    """Reads the process layout that ``stratax launch`` gives each process it starts.

    Every process is a ``"worker"`` whose task id is its process id; process 0 hosts the
    coordinator. ``process_layout()`` takes the coordinator, process count and process id
    straight from the launcher's variables. ``cluster_spec()`` is TF_CONFIG's cluster when the
    launcher wrote one (single node); otherwise only the coordinator's address is known, so the
    spec is the sparse ``{"worker": {0: <coordinator address>}}``.

    Example:
      >>> # Inside `stratax launch --nproc 2 train.py`, process 1:
      >>> resolver = LauncherClusterResolver()
      >>> resolver.task_type, resolver.task_id, resolver.num_processes
      ('worker', 1, 2)
    """

    def __init__(self, rpc_layer: str | None = None) -> None:
        """Reads the STRATAX_* process variables (and TF_CONFIG, when the launcher wrote it).

        Args:
          rpc_layer: Protocol prefix of ``master()`` addresses.

        Raises:
          ValueError: If a required variable is missing or malformed, the process id is not
            below the process count, or TF_CONFIG's chief/worker count disagrees with
            ``STRATAX_NUM_PROCESSES``.
        """
        address = env.get_str(env.STRATAX_COORDINATOR_ADDRESS, _SET_BY_LAUNCHER)
        parse_address(address, env.STRATAX_COORDINATOR_ADDRESS)
        num_processes = env.get_int(env.STRATAX_NUM_PROCESSES, _SET_BY_LAUNCHER, minimum=1)
        process_id = env.get_int(env.STRATAX_PROCESS_ID, _SET_BY_LAUNCHER, minimum=0)
        check_rank(env.STRATAX_PROCESS_ID, process_id, env.STRATAX_NUM_PROCESSES, num_processes)
        restarts = env.get_optional_int(env.STRATAX_RESTART_COUNT, minimum=0)
        self._restart_count = 0 if restarts is None else restarts
        super().__init__(
            address, num_processes, process_id,
            local_rank=env.get_optional_int(env.STRATAX_LOCAL_RANK, minimum=0),
            rpc_layer=rpc_layer, cluster_spec=self._read_cluster(address, num_processes))

    @staticmethod
    def _read_cluster(address: str, num_processes: int) -> ClusterSpec:
        text = os.environ.get(env.TF_CONFIG, "")
        if not text.strip():
            return ClusterSpec({"worker": {0: address}})
        cluster = parse_tf_config(text).cluster
        members = sum(cluster.num_tasks(job) for job in SYNC_JOBS if job in cluster.jobs)
        if members != num_processes:
            raise ValueError(
                f"TF_CONFIG's cluster {cluster!r} has {members} chief/worker tasks but "
                f"{env.STRATAX_NUM_PROCESSES}={num_processes}; TF_CONFIG is probably left over "
                "from another run: unset it or let `stratax launch` write it."
            )
        return cluster

    @classmethod
    def is_available(cls) -> bool:
        """True when any of the launcher's coordinator/count/id variables is set.

        One variable is enough, so that a partial set is reported as an error by the
        constructor rather than silently ignored.
        """
        return any(os.environ.get(name, "").strip() for name in _REQUIRED)

    @property
    def coordinator_address(self) -> str:
        """``"host:port"`` of the ``jax.distributed`` coordinator."""
        return self._coordinator_address or ""

    @property
    def restart_count(self) -> int:
        """How many times the launcher restarted the job before this run (0 at first)."""
        return self._restart_count
