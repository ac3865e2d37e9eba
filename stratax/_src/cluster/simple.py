"""``SimpleClusterResolver``: a cluster given explicitly in code (tests, custom launchers)."""

from __future__ import annotations

from collections.abc import Mapping

from stratax._src.cluster.cluster_spec import ClusterInput, ClusterSpec
from stratax._src.cluster.resolver import ClusterResolver, format_master_url


class SimpleClusterResolver(ClusterResolver):
    """Returns exactly the cluster, task and settings it was built with.

    Example:
      >>> resolver = SimpleClusterResolver(
      ...     ClusterSpec({"chief": ["host0:2222"], "worker": ["host1:2222"]}),
      ...     task_type="worker", task_id=0)
      >>> resolver.master("chief", 0, rpc_layer="grpc")
      'grpc://host0:2222'
    """

    def __init__(
        self,
        cluster_spec: ClusterInput,
        master: str = "",
        task_type: str | None = None,
        task_id: int | None = None,
        environment: str = "",
        num_accelerators: Mapping[str, int] | None = None,
        rpc_layer: str | None = None,
    ) -> None:
        """Stores the given cluster description.

        Args:
          cluster_spec: A ``ClusterSpec`` or a dict accepted by ``ClusterSpec``.
          master: Returned by ``master()`` when no task is known.
          task_type: This process' job name.
          task_id: This process' index within its job.
          environment: Returned by ``environment``.
          num_accelerators: Accelerators per task, e.g. ``{"GPU": 2}``; ``{}`` when ``None``.
          rpc_layer: Protocol prefix of ``master()`` addresses.

        Raises:
          ValueError: If ``cluster_spec`` is malformed, ``task_id`` is not an integer >= 0 or an
            accelerator count is not an integer >= 0.
        """
        self._cluster_spec = ClusterSpec(cluster_spec)
        if task_id is not None and (
            isinstance(task_id, bool) or not isinstance(task_id, int) or task_id < 0
        ):
            raise ValueError(f"task_id must be an integer >= 0 or None, got {task_id!r}.")
        accelerators = dict(num_accelerators or {})
        for kind, count in accelerators.items():
            if isinstance(count, bool) or not isinstance(count, int) or count < 0:
                raise ValueError(
                    f"num_accelerators[{kind!r}] must be an integer >= 0, got {count!r}; "
                    'e.g. num_accelerators={"GPU": 2}.'
                )
        self._master = master
        self._task_type = task_type
        self._task_id = task_id
        self._environment = environment
        self._num_accelerators = accelerators
        self._rpc_layer = rpc_layer

    def cluster_spec(self) -> ClusterSpec:
        """The cluster given to the constructor."""
        return self._cluster_spec

    def master(
        self,
        task_type: str | None = None,
        task_id: int | None = None,
        rpc_layer: str | None = None,
    ) -> str:
        """The address of the given task, else the constructor's ``master``.

        Like TensorFlow: an explicit ``task_type`` and ``task_id`` look up the cluster spec;
        without them the ``master`` passed to the constructor is returned.
        """
        rpc_layer = rpc_layer if rpc_layer is not None else self.rpc_layer
        if task_type is not None and task_id is not None:
            return format_master_url(self._cluster_spec.task_address(task_type, task_id), rpc_layer)
        return format_master_url(self._master, rpc_layer) if self._master else ""

    @property
    def environment(self) -> str:
        """The constructor's ``environment``."""
        return self._environment

    def num_accelerators(
        self, task_type: str | None = None, task_id: int | None = None
    ) -> dict[str, int]:
        """The constructor's ``num_accelerators`` (the same for every task)."""
        del task_type, task_id
        return dict(self._num_accelerators)
