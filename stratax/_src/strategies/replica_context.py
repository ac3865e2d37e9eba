"""``ReplicaContext``: what a replica function sees while ``strategy.run`` executes it."""

from __future__ import annotations

from typing import Any

import jax

from stratax._src.core.reduce_op import ReduceOp
from stratax._src.strategies.packing import packed_collective

REPLICA_AXIS = "replica"

_COLLECTIVES = {
    ReduceOp.SUM: jax.lax.psum,
    ReduceOp.MEAN: jax.lax.pmean,
    ReduceOp.MAX: jax.lax.pmax,
    ReduceOp.MIN: jax.lax.pmin,
}


class ReplicaContext:
    """The replica's view inside ``strategy.run(fn)``: its id and collectives over all replicas.

    Obtain it with ``sx.get_replica_context()`` inside the replica function. Collectives are
    XLA's (``psum``/``pmean``/``pmax``/``pmin``/``all_gather``) over the strategy's ``"replica"``
    mesh axis, so they compile into the step and cost no host round trip.

    Example:
        >>> def step(x):
        ...     ctx = sx.get_replica_context()
        ...     return ctx.all_reduce(sx.ReduceOp.SUM, x * ctx.replica_id_in_sync_group)
    """

    def __init__(self, strategy: Any, *, traced: bool) -> None:
        self._strategy = strategy
        self._traced = traced

    @property
    def strategy(self) -> Any:
        """The strategy running this replica function."""
        return self._strategy

    @property
    def num_replicas_in_sync(self) -> int:
        return self._strategy.num_replicas_in_sync

    @property
    def replica_id_in_sync_group(self) -> Any:
        """This replica's index in ``[0, num_replicas_in_sync)``: a traced int32 inside ``run``."""
        if not self._traced:
            return 0
        return jax.lax.axis_index(REPLICA_AXIS)

    def all_reduce(self, reduce_op: ReduceOp | str, value: Any) -> Any:
        """Combines ``value`` (any pytree of arrays) across all replicas; every replica gets the result.

        Leaves of one dtype travel together in flat packs of at most the strategy's
        ``bytes_per_pack`` (``CommunicationOptions``), one collective per pack.
        """
        op = ReduceOp.from_string(reduce_op)
        if not self._traced:
            return value
        collective = _COLLECTIVES[op]
        return packed_collective(lambda v: collective(v, REPLICA_AXIS), value,
                                 self._strategy.bytes_per_pack)

    def all_gather(self, value: Any, axis: int) -> Any:
        """Concatenates every replica's ``value`` along ``axis``, in replica order (TF's meaning)."""
        if not self._traced:
            return value
        return jax.tree.map(
            lambda v: jax.lax.all_gather(v, REPLICA_AXIS, axis=axis, tiled=True), value
        )

    def __repr__(self) -> str:
        return f"ReplicaContext(strategy={self._strategy!r})"
