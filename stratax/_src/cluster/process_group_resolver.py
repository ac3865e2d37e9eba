"""``ProcessGroupClusterResolver``: the base of resolvers whose environment states the process
group outright (a rank, a process count, a coordinator), as launchers do.

``stratax launch``, torchrun, MPI's launchers and JAX-style job scripts all hand each process its
global rank and the number of processes; none lists every task's address the way TF_CONFIG
does. So these resolvers share one shape: every process is a ``"worker"`` whose task id is its
rank, and process 0 hosts the ``jax.distributed`` coordinator. Before the group forms the cluster
spec knows only the addresses the environment states (the coordinator's, or every worker's on
one node); once ``MultiWorkerMirroredStrategy`` has formed it, each process' host is gathered
through the coordination service and the spec lists every worker (``list_workers``), as
TensorFlow's resolvers do, so guide code that counts workers in the spec counts them all. The
checks of rank against size live here, once, so every launcher's error reads the same.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from stratax._src.cluster.cluster_spec import ClusterSpec, parse_address
from stratax._src.cluster.process_layout import SYNC_JOBS, ProcessLayout
from stratax._src.cluster.resolver import ClusterResolver
from stratax._src.core import env

_MAX_PORT = 65535


def check_rank(rank_name: str, rank: int, size_name: str, size: int) -> None:
    """Raises unless ``0 <= rank < size``; the message names both variables.

    Raises:
      ValueError: ``rank`` is not below ``size``.
    """
    if rank >= size:
        raise ValueError(
            f"{rank_name}={rank} is not below {size_name}={size}; ranks run from 0 to "
            f"{size - 1}. The launcher's environment is inconsistent: start every process with "
            "the same launcher command."
        )


def workers_at(coordinator_address: str, hosts: Sequence[str]) -> ClusterSpec | None:
    """``{"worker": [...]}`` with worker ``r`` at ``hosts[r]`` and the coordinator's port plus
    ``r``, ``None`` when those ports run past 65535.

    The rule Slurm's resolver follows for a node's tasks (``port_base + k``): only the
    coordinator's address is ever listened on, but every worker gets a distinct address, and
    worker 0's is the coordinator's.
    """
    _, port = parse_address(coordinator_address, env.JAX_COORDINATOR_ADDRESS)
    if port + len(hosts) - 1 > _MAX_PORT:
        return None
    return ClusterSpec({"worker": [f"[{host}]:{port + rank}" if ":" in host
                                   else f"{host}:{port + rank}"
                                   for rank, host in enumerate(hosts)]})


def coordinator_port_override() -> int | None:
    """``JAX_COORDINATOR_PORT`` as a port, or ``None`` when unset.

    JAX's cluster detection uses this variable to replace the port it derives from a cluster
    (``jax/_src/clusters/cluster.py``); the torchrun and MPI resolvers do the same.

    Raises:
      ValueError: The value is not an integer in 1..65535.
    """
    port = env.get_optional_int(env.JAX_COORDINATOR_PORT, minimum=1,
                                    meaning="the jax.distributed coordinator's port")
    if port is not None and port > _MAX_PORT:
        raise ValueError(f"{env.JAX_COORDINATOR_PORT}={port} is above {_MAX_PORT}; choose a free "
                         "port in 1..65535.")
    return port


def coordinator_address_override() -> str | None:
    """``JAX_COORDINATOR_ADDRESS`` (checked as ``host:port``), or ``None`` when unset.

    It is the variable ``jax.distributed.initialize()`` reads for its coordinator, so a job
    script written for JAX works unchanged; it wins over any address derived from a launcher.

    Raises:
      ValueError: The value is not ``host:port``.
    """
    address = os.environ.get(env.JAX_COORDINATOR_ADDRESS, "").strip()
    if not address:
        return None
    parse_address(address, env.JAX_COORDINATOR_ADDRESS)
    return address


class ProcessGroupClusterResolver(ClusterResolver):
    """A process group stated by its launcher: rank, process count and coordinator.

    Subclasses read their launcher's variables and call ``__init__``. A group of one process is
    local mode (no coordinator needed); otherwise ``coordinator_address`` is where process 0
    hosts the ``jax.distributed`` coordination service.

    Example:
      >>> class Fixed(ProcessGroupClusterResolver):
      ...     def __init__(self):
      ...         super().__init__("10.0.0.1:1234", num_processes=2, process_id=1)
      >>> Fixed().explicit_process_layout().num_processes
      2
    """

    def __init__(
        self,
        coordinator_address: str | None,
        num_processes: int,
        process_id: int,
        local_rank: int | None = None,
        rpc_layer: str | None = None,
        cluster_spec: ClusterSpec | None = None,
    ) -> None:
        """Stores the group.

        Args:
          coordinator_address: ``"host:port"`` of process 0's coordinator; ``None`` only for a
            group of one process.
          num_processes: Processes in the group.
          process_id: This process' rank, ``0 <= process_id < num_processes``.
          local_rank: This process' index among the processes of its node, if known.
          rpc_layer: Protocol prefix of ``master()`` addresses.
          cluster_spec: The full cluster when the launcher wrote one (``stratax launch`` on one
            node); by default ``{"worker": {0: coordinator_address}}``.

        Raises:
          ValueError: A group of several processes without a coordinator address.
        """
        if coordinator_address is None and num_processes > 1:
            raise ValueError(
                f"A group of {num_processes} processes needs the coordinator's address; set "
                f"{env.JAX_COORDINATOR_ADDRESS}=<host of rank 0>:<free port> for every process."
            )
        self._coordinator_address = coordinator_address
        self._num_processes = num_processes
        self._local_rank = local_rank
        if cluster_spec is None:
            cluster_spec = (ClusterSpec({}) if coordinator_address is None
                            else ClusterSpec({"worker": {0: coordinator_address}}))
        self._cluster_spec = cluster_spec
        self._task_type = "worker"
        self._task_id = process_id
        self._rpc_layer = rpc_layer

    @property
    def coordinator_address(self) -> str | None:
        """``"host:port"`` of the ``jax.distributed`` coordinator (``None`` for one process)."""
        return self._coordinator_address

    @property
    def num_processes(self) -> int:
        """Number of processes in the job."""
        return self._num_processes

    @property
    def process_id(self) -> int:
        """This process' id (equal to ``task_id``)."""
        return self._task_id if self._task_id is not None else 0

    @property
    def local_rank(self) -> int | None:
        """This process' index on its node, or ``None`` if the launcher did not say."""
        return self._local_rank

    def explicit_process_layout(self) -> ProcessLayout:
        """The layout as the launcher states it."""
        return ProcessLayout(
            coordinator_address=self._coordinator_address,
            num_processes=self._num_processes,
            process_id=self.process_id,
            task_type="worker",
            task_id=self.process_id,
        )

    def cluster_spec(self) -> ClusterSpec:
        """Every worker once the group has formed (see ``list_workers``); before, the
        launcher's full cluster if it stated one, else ``{"worker": {0: coordinator}}``."""
        return self._cluster_spec

    def lists_every_worker(self) -> bool:
        """Whether ``cluster_spec()`` names every process of the group (chief and workers)."""
        spec = self._cluster_spec
        return sum(spec.num_tasks(job) for job in SYNC_JOBS if job in spec) >= self._num_processes

    def list_workers(self, hosts: Sequence[str]) -> None:
        """Lists worker ``r`` at ``hosts[r]`` (see ``workers_at``); ``hosts`` are the processes'
        hosts as gathered once the group formed, ``hosts[0]`` the coordinator's. Ports past
        65535 keep the spec as it was.

        Raises:
          ValueError: ``hosts`` does not have one host per process.
        """
        if len(hosts) != self._num_processes or self._coordinator_address is None:
            raise ValueError(
                f"list_workers needs one host for each of the {self._num_processes} processes "
                f"of a group with a coordinator; received {list(hosts)!r}."
            )
        spec = workers_at(self._coordinator_address, hosts)
        if spec is not None:
            self._cluster_spec = spec

    def master(
        self,
        task_type: str | None = None,
        task_id: int | None = None,
        rpc_layer: str | None = None,
    ) -> str:
        """The address of a task (this one by default), ``""`` for a one-process job.

        Raises:
          ValueError: If the cluster spec does not know that task (usually only the
            coordinator's address is known).
        """
        if self._num_processes == 1 and task_type is None and task_id is None:
            return ""
        return super().master(task_type, task_id, rpc_layer)
