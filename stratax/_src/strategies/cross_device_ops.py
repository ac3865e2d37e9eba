"""``CrossDeviceOps``: how a strategy's replicas combine values, asked by every step.

A strategy holds one, chosen when it is built (``strategies.transport.choose``); ``strategy.run``'s
``ReplicaContext.all_reduce``, ``fit``'s packed train step, its sharded optimizer update and the
compiler of ``strategy.run`` all ask it, and none of them tests for a transport itself.

This base class is XLA's collectives over the ``"replica"`` mesh axis, compiled into the step:
XLA picks the wire (NCCL between GPUs, in-process copies between CPU devices, ICI on TPUs, gloo
or MPI between CPU processes). TensorFlow's choices for ``MirroredStrategy(cross_device_ops=...)``
are kept as its subclasses, so a ported program runs unchanged: each is honoured as the
strategy's collectives, and each is this all-reduce, which computes what NCCL, a hierarchical copy
or a reduction to one device compute. The shared-memory transport between CPU processes of one
host is a subclass too (``strategies.transport``).

Example:
    >>> strategy = sx.MirroredStrategy(cross_device_ops=sx.NcclAllReduce())
    >>> strategy.cross_device_ops
    NcclAllReduce(num_packs=1)
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import Any

import jax

from stratax._src.core.reduce_op import ReduceOp
from stratax._src.strategies.packing import Batched, packed_collective
from stratax._src.strategies.replica_context import REPLICA_AXIS

logger = logging.getLogger(__name__)

COLLECTIVES = {
    ReduceOp.SUM: jax.lax.psum,
    ReduceOp.MEAN: jax.lax.pmean,
    ReduceOp.MAX: jax.lax.pmax,
    ReduceOp.MIN: jax.lax.pmin,
}


@dataclasses.dataclass(frozen=True)
class Exchanges:
    """The two halves of an all-reduce, as ``fit``'s sharded optimizer update uses them.

    Args:
        reduce_scatter: ``arrays -> parts``: part ``rank`` of each flat array, summed over the
            processes (traced inside ``shard_map`` over the replica axis).
        all_gather: ``arrays -> wholes``: every process's flat arrays, concatenated in process
            order.
    """

    reduce_scatter: Callable[[list[jax.Array]], list[jax.Array]]
    all_gather: Callable[[list[jax.Array]], list[jax.Array]]


class CrossDeviceOps:
    """XLA's collectives over the replica axis: the base every strategy's collectives extend.

    Args:
        num_packs: TensorFlow's argument, kept for portability; the pack size is
            ``CommunicationOptions(bytes_per_pack=...)``.
    """

    name = "xla"
    # ffi_call targets whose result is the same on every replica (``invariance`` reads them).
    unifying_calls: frozenset[str] = frozenset()

    def __init__(self, num_packs: int = 1) -> None:
        if num_packs < 1:
            raise ValueError(f"num_packs must be >= 1; received {num_packs}.")
        self.num_packs = num_packs

    def all_reduce(self, op: ReduceOp, value: Any, bytes_per_pack: int, *,
                   only_call: bool = False) -> Any:
        """Reduces every leaf of ``value`` over the replicas (traced inside ``shard_map``).

        Leaves of one dtype travel together in flat packs of at most ``bytes_per_pack`` bytes.
        ``only_call``: the program holds no other all-reduce of this object's (``fit``'s packed
        step), which lets a transport drop its ordering between calls.
        """
        collective = COLLECTIVES[op]
        return packed_collective(lambda v: collective(v, REPLICA_AXIS), value, bytes_per_pack,
                                 batched=self._batched(op, only_call))

    def _batched(self, op: ReduceOp, only_call: bool) -> Batched | None:
        """A transport that takes the whole list of packs in one call, or ``None`` (XLA's
        collective per pack)."""
        del op, only_call
        return None

    def exchanges(self) -> Exchanges | str:
        """The reduce-scatter and all-gather ``fit``'s sharded update runs on, or why there are
        none (XLA's would cost two round trips a step between processes)."""
        return "the all-reduce is not over shared memory on one host"

    def prepare(self, jaxpr: Any) -> Any:
        """The traced body of a ``strategy.run`` program as it should be compiled for this
        transport; XLA's collectives need no change."""
        return jaxpr

    def __repr__(self) -> str:
        return f"{type(self).__name__}(num_packs={self.num_packs})"


class NcclAllReduce(CrossDeviceOps):
    """TensorFlow's NCCL all-reduce; XLA uses NCCL on GPUs by itself."""

    name = "nccl"


class HierarchicalCopyAllReduce(CrossDeviceOps):
    """TensorFlow's hierarchical copy; XLA schedules the transfers itself."""

    name = "hierarchical_copy"


class ReductionToOneDevice(CrossDeviceOps):
    """TensorFlow's reduce-then-broadcast; XLA's all-reduce gives the same values."""

    name = "reduction_to_one_device"

    def __init__(self, reduce_to_device: str | None = None, accumulation_fn: object = None) -> None:
        super().__init__()
        self.reduce_to_device = reduce_to_device
        del accumulation_fn


_BY_NAME = {
    cls.name: cls
    for cls in (CrossDeviceOps, NcclAllReduce, HierarchicalCopyAllReduce, ReductionToOneDevice)
}
_ALIASES = {"ncclallreduce": "nccl", "hierarchicalcopyallreduce": "hierarchical_copy",
            "reductiontoonedevice": "reduction_to_one_device", "auto": "xla"}


def resolve_cross_device_ops(value: CrossDeviceOps | str | None) -> CrossDeviceOps | None:
    """The ``CrossDeviceOps`` a user asked for (an instance or a name), or ``None`` for the
    strategy's choice.

    Raises:
        ValueError: an unknown name.
        TypeError: neither an instance, a name nor ``None``.
    """
    if value is None:
        return None
    if isinstance(value, CrossDeviceOps):
        logger.info("cross_device_ops=%r: XLA compiles the all-reduce and picks its transport.",
                    value)
        return value
    if isinstance(value, str):
        key = value.strip().lower().replace("-", "_")
        key = _ALIASES.get(key.replace("_", ""), key)
        if key in _BY_NAME:
            return _BY_NAME[key]()
        raise ValueError(
            f"Unknown cross_device_ops {value!r}; use one of {sorted(_BY_NAME)} or an instance "
            "such as sx.NcclAllReduce()."
        )
    raise TypeError(
        f"cross_device_ops must be a CrossDeviceOps instance, a name or None; received "
        f"{type(value).__name__}."
    )
