"""The transport decision: which ``CrossDeviceOps`` a strategy's steps run with, made once.

:func:`choose` is called when a strategy is built. Between CPU processes of one host whose
shared-memory all-reduce was set up at start-up (``runtime.cpu_collectives``), a strategy over
one device of every process gets :class:`SharedMemoryAllReduce`; every other strategy gets XLA's
collectives (``CrossDeviceOps``) or the one its user passed. This module is the only one above
the runtime that knows the shared-memory transport exists.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
from jax.sharding import Mesh

from stratax._src.core.reduce_op import ReduceOp
from stratax._src.runtime import hier_collectives, shm_calls, shm_collectives
from stratax._src.strategies.cross_device_ops import COLLECTIVES, CrossDeviceOps, Exchanges
from stratax._src.strategies.packing import Batched
from stratax._src.strategies.replica_context import REPLICA_AXIS

_SHM_OPS = {ReduceOp.SUM: "sum", ReduceOp.MEAN: "sum", ReduceOp.MAX: "max", ReduceOp.MIN: "min"}


class SharedMemoryAllReduce(CrossDeviceOps):
    """The shared-memory all-reduce between CPU processes (``STRATAX_CPU_COLLECTIVES`` ``auto``
    or ``shm``; docs/transport.md): one custom call per all-reduce on one host, and across
    several hosts the hierarchical one (shared memory inside each host, gloo between them) for
    sums and means. Dtypes it does not handle, and a hierarchy's maxima and minima, go through
    XLA's collectives.

    Args:
        devices: the strategy's devices, one per process of the job, in replica order.
        replicas: the strategy's replica count (divides a mean).
    """

    name = "shm"
    unifying_calls = frozenset({shm_collectives.TARGET})

    def __init__(self, devices: Sequence[Any], replicas: int) -> None:
        super().__init__()
        self._devices = list(devices)
        self._replicas = replicas
        self._hierarchical = shm_collectives.state.hierarchical

    def _batched(self, op: ReduceOp, only_call: bool) -> Batched | None:
        if self._hierarchical and op not in (ReduceOp.SUM, ReduceOp.MEAN):
            return None
        collective = COLLECTIVES[op]

        def shared_sum(buffers: list[jax.Array]) -> list[jax.Array]:
            if self._hierarchical:
                return hier_collectives.all_reduce_sum(buffers, self._devices, REPLICA_AXIS,
                                                       only_call=only_call)
            return shm_calls.all_reduce(_SHM_OPS[op], buffers, only_call=only_call)

        def reduce(buffers: list[jax.Array]) -> list[jax.Array]:
            shared = [i for i, b in enumerate(buffers) if shm_calls.supports(b.dtype)]
            out = [collective(b, REPLICA_AXIS) for b in buffers]
            if shared:
                summed = shared_sum([buffers[i] for i in shared])
                for i, value in zip(shared, summed, strict=True):
                    out[i] = value / self._replicas if op is ReduceOp.MEAN else value
            return out

        return Batched(reduce=reduce, takes=shm_calls.supports)

    def exchanges(self) -> Exchanges | str:
        if self._hierarchical:  # the exchanges span one host's processes only
            return super().exchanges()
        return Exchanges(reduce_scatter=shm_calls.reduce_scatter,
                         all_gather=shm_calls.all_gather)

    def prepare(self, jaxpr: Any) -> Any:
        """One shared-memory all-reduce (the usual step) need not be a JAX effect, whose Python
        dispatch is slow between processes (docs/design/performance.md)."""
        return shm_calls.unordered_if_alone(jaxpr)

    def __repr__(self) -> str:
        kind = "hierarchical" if self._hierarchical else "one host"
        return f"SharedMemoryAllReduce({len(self._devices)} processes, {kind})"


def choose(mesh: Mesh, requested: CrossDeviceOps | None = None) -> CrossDeviceOps:
    """The collectives of a strategy over ``mesh``: ``requested`` when the user passed one, the
    shared-memory all-reduce where it was set up for exactly the mesh's devices (one per process
    of the job), else XLA's."""
    if requested is not None:
        return requested
    devices = list(mesh.devices.flat)
    if shm_calls.covers(devices):
        return SharedMemoryAllReduce(devices, mesh.shape[REPLICA_AXIS])
    return CrossDeviceOps()
