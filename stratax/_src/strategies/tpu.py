"""``TPUStrategy``: synchronous training on the cores of a TPU slice, replicas x logical cores."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np

from stratax._src.cluster.tpu import TPUClusterResolver
from stratax._src.runtime.tpu_system import initialize_tpu_system
from stratax._src.runtime.tpu_topology import DeviceAssignment, Topology
from stratax._src.strategies import logical_devices
from stratax._src.strategies.base import Strategy

logger = logging.getLogger(__name__)


class TPUStrategy(Strategy):
    """Data parallelism over TPU replicas, each replica over one or more logical cores.

    The mesh is ``("replica", "core")``: ``num_replicas_in_sync`` replicas, each spanning
    ``num_cores_per_replica`` cores (1 unless a ``DeviceAssignment`` says otherwise). ``run``
    is SPMD over ``"replica"``; inside it ``experimental_split_to_logical_devices`` and its two
    siblings lay tensors out over ``"core"``, and a Keras ``LayoutMap`` (``layout_map=``) splits
    variables over it. On a pod slice every host runs the program.

    Without a TPU it fails with an error naming the emulation switch; with emulation
    (``STRATAX_TPU_EMULATION=N`` or ``TPUClusterResolver(emulation_cores=N)``) CPU devices act
    as the cores, and the repr and the log say "emulated".

    Args:
        tpu_cluster_resolver: The TPU; ``TPUClusterResolver()`` when ``None``.
        experimental_device_assignment: Replicas x logical cores, from
            ``sx.tpu.experimental.DeviceAssignment.build``; default one core per replica,
            host 0's replicas first on a pod slice (each host feeds its replicas' block of
            every batch in ``fit``).
        experimental_spmd_xla_partitioning: Accepted for TensorFlow compatibility: stratax
            always partitions with XLA's SPMD partitioner.
        layout_map: A ``keras.distribution.LayoutMap`` (variable-path regex -> axes over
            ``("replica", "core")``) for the variables created under ``scope()``.

    Example:
        >>> resolver = sx.cluster_resolver.TPUClusterResolver(tpu="")
        >>> sx.tpu.experimental.initialize_tpu_system(resolver)
        >>> strategy = sx.TPUStrategy(resolver)
        >>> with strategy.scope():
        ...     model = keras.Sequential([keras.layers.Dense(10)])
        ...     model.compile(optimizer="adam", loss="mse")
    """

    _static_batch_shapes = True

    def __init__(
        self,
        tpu_cluster_resolver: TPUClusterResolver | None = None,
        experimental_device_assignment: DeviceAssignment | None = None,
        experimental_spmd_xla_partitioning: bool = False,
        *,
        layout_map: Any = None,
    ) -> None:
        del experimental_spmd_xla_partitioning
        self._resolver = tpu_cluster_resolver or TPUClusterResolver()
        topology = initialize_tpu_system(self._resolver)
        assignment = experimental_device_assignment or _host_by_host(DeviceAssignment.build(
            topology, num_replicas=len(topology.devices)))
        unknown = set(assignment.devices().flat) - set(topology.devices)
        if unknown:
            raise ValueError(
                f"The device assignment uses {len(unknown)} core(s) that are not in this TPU's "
                "topology; build it from the topology that initialize_tpu_system returned."
            )
        self._topology: Topology = topology
        self._assignment = assignment
        super().__init__(list(assignment.devices().flat),
                         cores_per_replica=assignment.num_cores_per_replica, layout_map=layout_map)
        log = logger.warning if topology.emulated else logger.info
        log("%r", self)

    @property
    def cluster_resolver(self) -> TPUClusterResolver:
        return self._resolver

    @property
    def topology(self) -> Topology:
        return self._topology

    @property
    def device_assignment(self) -> DeviceAssignment:
        return self._assignment

    @property
    def num_cores_per_replica(self) -> int:
        """Logical cores of each replica (the ``"core"`` mesh axis)."""
        return self._assignment.num_cores_per_replica

    @property
    def emulated(self) -> bool:
        """True when CPU devices stand in for the TPU cores."""
        return self._topology.emulated

    def experimental_split_to_logical_devices(self, tensor: Any,
                                              partition_dimensions: Sequence[int]) -> Any:
        """Splits ``tensor`` over the replica's logical cores (``partition_dimensions`` per axis).

        Example: ``strategy.experimental_split_to_logical_devices(x, [1, 2])`` splits the
        second axis of ``x`` over 2 cores. Values are unchanged; only their layout is.
        """
        return logical_devices.split(self.mesh, tensor, partition_dimensions)

    def experimental_replicate_to_logical_devices(self, tensor: Any) -> Any:
        """Keeps a whole copy of ``tensor`` on every logical core of the replica."""
        return logical_devices.replicate(self.mesh, tensor)

    def experimental_assign_to_logical_device(self, tensor: Any, logical_device_id: int) -> Any:
        """TensorFlow's placement of ``tensor`` on one logical core; whole on each core here.

        An SPMD program cannot confine an op to one core, so the tensor is kept whole on every
        core of the replica: the same values, another placement.
        """
        return logical_devices.assign(self.mesh, tensor, logical_device_id)

    def __repr__(self) -> str:
        where = (f"emulated on {len(self.devices)} CPU devices" if self.emulated
                 else f"{len(self.devices)} TPU cores")
        return (f"TPUStrategy(num_replicas_in_sync={self.num_replicas_in_sync}, "
                f"num_cores_per_replica={self.num_cores_per_replica}, {where})")


def _host_by_host(assignment: DeviceAssignment) -> DeviceAssignment:
    """``assignment`` with its replicas reordered host by host (stable): on a pod slice the
    chips' coordinate order may interleave the hosts, and ``fit`` feeds each host's share of
    a batch to a block of replicas. One host: unchanged."""
    hosts = [min(device.process_index for device in replica) for replica in assignment.devices()]
    order = np.argsort(hosts, kind="stable")
    if (order == np.arange(len(order))).all():
        return assignment
    return DeviceAssignment(assignment.topology, assignment.core_assignment[order])
