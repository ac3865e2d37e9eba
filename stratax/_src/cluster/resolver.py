"""``ClusterResolver``: the interface every cluster resolver implements, and the
``ProcessLayout`` a resolver may state outright.

A cluster resolver answers "which cluster is this process part of, and which task is it?" from
its environment (TF_CONFIG, Slurm, Kubernetes, the stratax launcher, ...). It is pure
configuration: it never starts JAX, never opens a socket and never looks at devices.
Modelled on TensorFlow's ``tf.distribute.cluster_resolver.ClusterResolver``.
"""

from __future__ import annotations

import abc
import dataclasses

from stratax._src.cluster.cluster_spec import ClusterSpec


def format_master_url(master: str, rpc_layer: str | None = None) -> str:
    """Prefixes ``master`` with ``"<rpc_layer>://"`` when an RPC layer is given (TF behaviour)."""
    if rpc_layer:
        return f"{rpc_layer}://{master}"
    return master


@dataclasses.dataclass(frozen=True)
class ProcessLayout:
    """This process' place in a synchronous multi-process group.

    Attributes:
      coordinator_address: ``"host:port"`` of the process that hosts the ``jax.distributed``
        coordination service (process 0), or ``None`` in local mode.
      num_processes: Number of processes in the group (1 in local mode).
      process_id: This process' id in ``[0, num_processes)``.
      task_type: This process' job name (``"chief"``/``"worker"``), or ``None`` in local mode.
      task_id: This process' index within its job, or ``None`` in local mode.

    Example:
      >>> ProcessLayout("host0:2222", num_processes=3, process_id=1, task_type="worker",
      ...               task_id=0).is_coordinator
      False
    """

    coordinator_address: str | None
    num_processes: int
    process_id: int
    task_type: str | None
    task_id: int | None

    @property
    def is_coordinator(self) -> bool:
        """True for process 0, the one that hosts the coordination service."""
        return self.process_id == 0

    @property
    def is_local(self) -> bool:
        """True when there is no cluster: one process, no coordinator."""
        return self.coordinator_address is None


class ClusterResolver(abc.ABC):
    """Base class of all cluster resolvers.

    Subclasses implement ``cluster_spec()`` (and ``master()`` where TensorFlow's lookup of the
    task's address is not enough); they set ``task_type``, ``task_id`` and ``rpc_layer`` (all
    may also be overridden by assignment, as in TensorFlow).

    Example:
      >>> class Fixed(ClusterResolver):
      ...     def cluster_spec(self):
      ...         return ClusterSpec({"worker": ["localhost:2222"]})
      >>> Fixed().cluster_spec().num_tasks("worker")
      1
    """

    _task_type: str | None = None
    _task_id: int | None = None
    _rpc_layer: str | None = None

    @classmethod
    def is_available(cls) -> bool:
        """True when this process' environment is the kind this resolver reads.

        ``detect_cluster_resolver()`` asks each resolver in turn; the base class answers
        ``False`` (a resolver built from explicit arguments is never auto-detected).
        """
        return False

    @abc.abstractmethod
    def cluster_spec(self) -> ClusterSpec:
        """Returns the cluster this process belongs to; an empty spec means local mode."""

    def master(
        self,
        task_type: str | None = None,
        task_id: int | None = None,
        rpc_layer: str | None = None,
    ) -> str:
        """Returns the address of a task (this one by default), prefixed with ``rpc_layer://``.

        Args:
          task_type: Job name of the task; defaults to this process' ``task_type``.
          task_id: Index of the task; defaults to this process' ``task_id``.
          rpc_layer: Protocol prefix; defaults to this resolver's ``rpc_layer``.

        Returns:
          ``"[rpc_layer://]host:port"``, or ``""`` when there is no cluster to connect to.
        """
        task_type = task_type if task_type is not None else self.task_type
        task_id = task_id if task_id is not None else self.task_id
        if task_type is None or task_id is None:
            return ""
        return format_master_url(
            self.cluster_spec().task_address(task_type, task_id), rpc_layer or self.rpc_layer
        )

    @property
    def task_type(self) -> str | None:
        """Job name of this process (``"chief"``, ``"worker"``, ...), or ``None`` in local mode."""
        return self._task_type

    @task_type.setter
    def task_type(self, task_type: str | None) -> None:
        self._task_type = task_type

    @property
    def task_id(self) -> int | None:
        """Index of this process within its job, or ``None`` in local mode."""
        return self._task_id

    @task_id.setter
    def task_id(self, task_id: int | None) -> None:
        self._task_id = task_id

    @property
    def rpc_layer(self) -> str | None:
        """Protocol prefix for ``master()`` addresses (e.g. ``"grpc"``), or ``None``."""
        return self._rpc_layer

    @rpc_layer.setter
    def rpc_layer(self, rpc_layer: str | None) -> None:
        self._rpc_layer = rpc_layer

    @property
    def environment(self) -> str:
        """The environment the cluster runs in (TF's ``"google"``/``"cloud"``); ``""`` if unset."""
        return ""

    def num_accelerators(
        self, task_type: str | None = None, task_id: int | None = None
    ) -> dict[str, int]:
        """Accelerators per task that the cluster configuration states, e.g. ``{"GPU": 2}``.

        The base class returns ``{}``: finding the devices a process really has is the runtime
        layer's job (it asks JAX), so a resolver only reports what its configuration says.
        TensorFlow's version connects to the master to list devices; stratax never does that
        here because this layer must not start JAX.
        """
        del task_type, task_id
        return {}

    def explicit_process_layout(self) -> ProcessLayout | None:
        """The process layout when the environment states it outright, else ``None``.

        ``process_layout()`` calls this first; the default ``None`` means "derive the layout from
        ``cluster_spec()``". The stratax launcher's resolver overrides it because the launcher
        names the coordinator, the process count and the process id directly.
        """
        return None

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(task_type={self.task_type!r}, task_id={self.task_id!r}, "
            f"cluster_spec={self.cluster_spec()!r})"
        )
