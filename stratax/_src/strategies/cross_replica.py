"""The array arithmetic of ``Strategy.reduce`` and ``Strategy.gather``: a per-replica value as a
``(replicas, ...)`` stack, reduced or concatenated along a component axis (``base`` compiles
each, with a replicated result).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from stratax._src.core.reduce_op import ReduceOp

_REDUCERS = {ReduceOp.SUM: jnp.sum, ReduceOp.MEAN: jnp.mean, ReduceOp.MAX: jnp.max,
             ReduceOp.MIN: jnp.min}


def normalize_axis(axis: int, ndim: int) -> int:
    """``axis`` of a per-replica component of rank ``ndim``, made non-negative."""
    if not -ndim <= axis < ndim:
        raise ValueError(f"axis {axis} is out of range for per-replica values of rank {ndim}.")
    return axis % ndim


def stack_axes(axis: int | None, component_ndim: int) -> tuple[int, ...]:
    """The axes of a ``(replicas, ...)`` stack that ``reduce(..., axis)`` reduces over."""
    return (0,) if axis is None else (0, normalize_axis(axis, component_ndim) + 1)


def reduce_stacked(stacked: jax.Array, op: ReduceOp, axes: tuple[int, ...]) -> jax.Array:
    """``op`` over ``axes`` of a ``(replicas, ...)`` stack."""
    return _REDUCERS[op](stacked, axis=axes)


def reduce_copies(value: Any, op: ReduceOp, axes: tuple[int, ...], copies: int) -> jax.Array:
    """``value`` counted once per replica (``copies``), reduced over ``axes`` of that stack."""
    return reduce_stacked(jnp.broadcast_to(value, (copies, *jnp.shape(value))), op, axes)


def gather_stacked(stacked: jax.Array, axis: int) -> jax.Array:
    """``(replicas, ...)`` components concatenated along component axis ``axis``."""
    moved = jnp.moveaxis(stacked, 0, axis)
    return moved.reshape(*moved.shape[:axis], -1, *moved.shape[axis + 2 :])


def concat_real_rows(stacked: jax.Array, valid_rows: tuple[int, ...]) -> jax.Array:
    """Replica ``i``'s first ``valid_rows[i]`` rows, concatenated in replica order."""
    return jnp.concatenate([stacked[i, :rows] for i, rows in enumerate(valid_rows)])
