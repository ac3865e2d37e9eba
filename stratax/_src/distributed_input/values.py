"""Distributed values: ``PerReplica`` (one value per replica), ``Mirrored`` (one value everywhere).

Both derive from ``DistributedValues``, as in TensorFlow, so
``isinstance(x, sx.DistributedValues)`` asks whether ``x`` is either.

Both are JAX pytrees, so they pass through ``jax.jit``, ``jax.tree.map`` and ``strategy.run``.

A ``PerReplica`` holds its components *stacked*: one ``jax.Array`` of shape
``(num_replicas, *component_shape)`` whose leading axis is sharded over the strategy's
``"replica"`` mesh axis, so component ``i`` lives on replica ``i``'s device and stacking costs no
copy. A ``Mirrored`` holds one array replicated on every replica's device. Where TensorFlow's
``strategy.run`` returns a ``Mirrored``, stratax returns the replicated ``jax.Array`` itself, which
is usable everywhere a JAX array is; ``Mirrored`` marks such a value explicitly.

A batch from a distributed dataset whose rows do not split evenly over the replicas is padded
with zero rows to one per-replica row count (SPMD needs equal shapes); its ``PerReplica`` leaves
then carry ``valid_rows``, the number of real rows of each replica (see ``docs/uneven_batches.md``).
"""

from __future__ import annotations

from typing import Any

import jax


class DistributedValues:
    """The base of values that live on the replicas: ``PerReplica`` and ``Mirrored``.

    TensorFlow's ``tf.distribute.DistributedValues``: not made directly, but what
    ``experimental_distribute_values_from_function``, a distributed dataset's batches and
    ``strategy.run`` give.

    Example:
        >>> batch = next(iter(strategy.experimental_distribute_dataset(ds)))  # doctest: +SKIP
        >>> isinstance(batch, sx.DistributedValues)                          # doctest: +SKIP
        True
    """

    __slots__ = ()


@jax.tree_util.register_pytree_node_class
class PerReplica(DistributedValues):
    """One value per replica, e.g. each replica's loss or its slice of the batch.

    Example:
        >>> per_replica_losses = strategy.run(step, args=(batch,))      # doctest: +SKIP
        >>> strategy.reduce(sx.ReduceOp.SUM, per_replica_losses, axis=None)  # doctest: +SKIP
    """

    __slots__ = ("stacked", "valid_rows")

    def __init__(self, stacked: Any, valid_rows: tuple[int, ...] | None = None) -> None:
        self.stacked = stacked
        self.valid_rows = None if valid_rows is None else tuple(int(v) for v in valid_rows)

    @property
    def values(self) -> tuple[Any, ...]:
        """The components, one per replica, in replica order (padding rows removed)."""
        rows = self.valid_rows
        return tuple(
            self.stacked[i] if rows is None else self.stacked[i, : rows[i]]
            for i in range(self.stacked.shape[0])
        )

    @property
    def num_replicas(self) -> int:
        return int(self.stacked.shape[0])

    @property
    def is_padded(self) -> bool:
        """True when some replica's component has padding rows (an uneven batch)."""
        rows = self.valid_rows
        return rows is not None and any(r != self.stacked.shape[1] for r in rows)

    def tree_flatten(self) -> tuple[tuple[Any], tuple[int, ...] | None]:
        return (self.stacked,), self.valid_rows

    @classmethod
    def tree_unflatten(cls, aux: tuple[int, ...] | None, children: tuple[Any]) -> PerReplica:
        return cls(children[0], aux)

    def __repr__(self) -> str:
        shape = getattr(self.stacked, "shape", None)
        if shape is None:
            return f"PerReplica({self.stacked!r})"
        rows = "" if self.valid_rows is None else f", valid_rows={self.valid_rows}"
        return f"PerReplica(num_replicas={shape[0]}, component_shape={tuple(shape[1:])}{rows})"


@jax.tree_util.register_pytree_node_class
class Mirrored(DistributedValues):
    """One value that is identical on every replica (a replicated ``jax.Array``).

    Example:
        >>> lr = sx.Mirrored(jnp.float32(0.1))                       # doctest: +SKIP
        >>> strategy.run(step, args=(lr, batch))                     # doctest: +SKIP
    """

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value

    @property
    def primary(self) -> Any:
        """The value (every replica holds the same)."""
        return self.value

    def tree_flatten(self) -> tuple[tuple[Any], None]:
        return (self.value,), None

    @classmethod
    def tree_unflatten(cls, aux: None, children: tuple[Any]) -> Mirrored:
        del aux
        return cls(children[0])

    def __repr__(self) -> str:
        return f"Mirrored({self.value!r})"


def is_distributed_leaf(value: Any) -> bool:
    """``is_leaf`` for ``jax.tree`` functions that must stop at distributed values."""
    return isinstance(value, (PerReplica, Mirrored))
