"""``ReplicaContext``: what a replica function sees while ``strategy.run`` executes it."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from stratax._src.core.reduce_op import ReduceOp

REPLICA_AXIS = "replica"
# The logical cores of one replica (TPUStrategy, model parallelism); left to XLA inside `run`.
CORE_AXIS = "core"

@dataclasses.dataclass(frozen=True)
class BatchRows:
    """The real rows of the distributed batch passed to ``run`` (traced inside the step).

    Args:
        counts: ``int32[num_replicas_in_sync]``, the real rows of every replica (replicated).
        padded_rows: the per-replica row count after padding (the components' leading size).
    """

    counts: Any
    padded_rows: int


class ReplicaContext:
    """The replica's view inside ``strategy.run(fn)``: its id and collectives over all replicas.

    Obtain it with ``sx.get_replica_context()`` inside the replica function. Collectives run
    over the strategy's ``"replica"`` mesh axis: ``all_reduce`` through the strategy's
    ``cross_device_ops``, ``all_gather`` with XLA's; they compile into the step and cost no
    host round trip.

    Example:
        >>> def step(x):
        ...     ctx = sx.get_replica_context()
        ...     return ctx.all_reduce(sx.ReduceOp.SUM, x * ctx.replica_id_in_sync_group)
    """

    def __init__(self, strategy: Any, *, traced: bool, batch_rows: BatchRows | None = None) -> None:
        self._strategy = strategy
        self._traced = traced
        self._batch_rows = batch_rows

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

    @property
    def num_valid_rows(self) -> Any:
        """How many rows of this replica's batch are real (not padding); ``None`` without a batch.

        A distributed batch whose rows do not split evenly over the replicas is padded with zero
        rows (see ``docs/uneven_batches.md``); inside ``run`` this is a traced ``int32``. It is
        ``None`` when no argument of ``run`` came from a distributed dataset.
        """
        rows = self._batch_rows
        if rows is None:
            return None
        return rows.counts[jax.lax.axis_index(REPLICA_AXIS)] if self._traced else rows.counts[0]

    @property
    def global_num_valid_rows(self) -> Any:
        """The real rows of the batch over all replicas (the true global batch), or ``None``."""
        rows = self._batch_rows
        return None if rows is None else jnp.sum(rows.counts)

    @property
    def valid_mask(self) -> Any:
        """``bool[padded_rows]``: True for this replica's real rows, False for padding; or ``None``.

        Use it to mask your own per-example reductions on an uneven last batch, e.g.
        ``jnp.sum(jnp.where(ctx.valid_mask, per_example, 0)) / ctx.global_num_valid_rows``
        (``sx.compute_average_loss`` does this for you).
        """
        rows = self._batch_rows
        if rows is None:
            return None
        return jnp.arange(rows.padded_rows) < self.num_valid_rows

    @property
    def padded_rows(self) -> int | None:
        """The per-replica row count of the current batch after padding, or ``None``."""
        return None if self._batch_rows is None else self._batch_rows.padded_rows

    def all_reduce(self, reduce_op: ReduceOp | str, value: Any) -> Any:
        """Combines ``value`` (a pytree of arrays) across all replicas; every replica gets it.

        Leaves of one dtype travel together in flat packs of at most the strategy's
        ``bytes_per_pack`` (``CommunicationOptions``), one collective per pack.
        """
        op = ReduceOp.from_string(reduce_op)
        if not self._traced:
            return value
        return self._strategy.cross_device_ops.all_reduce(op, value,
                                                          self._strategy.bytes_per_pack)

    def all_gather(self, value: Any, axis: int) -> Any:
        """Concatenates every replica's ``value`` along ``axis`` in replica order (TF's meaning)."""
        if not self._traced:
            return value
        return jax.tree.map(
            lambda v: jax.lax.all_gather(v, REPLICA_AXIS, axis=axis, tiled=True), value
        )

    def __repr__(self) -> str:
        return f"ReplicaContext(strategy={self._strategy!r})"
