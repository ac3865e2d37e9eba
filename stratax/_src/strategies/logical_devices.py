"""TensorFlow's logical-device annotations mapped onto the ``"core"`` axis of a strategy's mesh.

In TensorFlow a TPU replica may span several *logical devices* (cores), and three calls inside
the replica function say how a tensor is laid out over them. On JAX these become sharding
constraints over the mesh's ``"core"`` axis, which XLA's SPMD partitioner honours:

| TensorFlow (``strategy.experimental_...``) | here (``jax.lax.with_sharding_constraint``) |
| --- | --- |
| ``split_to_logical_devices(t, [1, 2])`` | ``with_sharding_constraint(t, P(None, "core"))`` |
| ``replicate_to_logical_devices(t)`` | ``with_sharding_constraint(t, P())`` |
| ``assign_to_logical_device(t, k)`` | replicated over the cores (see below) |

SPMD programs have no "this op runs only on core k": an assigned tensor is kept whole on every
core of the replica, which computes the same values (the placement differs, never the result).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from stratax._src.core import context
from stratax._src.strategies.replica_context import CORE_AXIS


def num_logical_cores(mesh: Mesh) -> int:
    """Logical cores per replica: the size of the ``"core"`` axis (1 when there is none)."""
    return mesh.shape.get(CORE_AXIS, 1)


def _constrain(mesh: Mesh, tensor: Any, spec: P) -> Any:
    if CORE_AXIS not in mesh.shape:
        return tensor
    if context.in_replica_function():
        # Inside `run` the "replica" axis is manual; the spec names the automatic "core" axis.
        return jax.lax.with_sharding_constraint(tensor, spec)
    return jax.lax.with_sharding_constraint(tensor, NamedSharding(mesh, spec))


def split(mesh: Mesh, tensor: Any, partition_dimensions: Sequence[int]) -> Any:
    """Splits ``tensor`` over the replica's cores along the one dimension given > 1.

    Raises:
        ValueError: the dimensions do not match the tensor's rank, do not multiply to the core
            count, split more than one dimension, or the split dimension does not divide.
    """
    shape = tuple(np.shape(tensor))
    dims = [int(d) for d in partition_dimensions]
    cores = num_logical_cores(mesh)
    if len(dims) != len(shape):
        raise ValueError(
            f"partition_dimensions {dims} has {len(dims)} entries but the tensor has rank "
            f"{len(shape)} (shape {shape}); give one entry per dimension."
        )
    if int(np.prod(dims)) != cores:
        raise ValueError(
            f"partition_dimensions {dims} multiply to {int(np.prod(dims))}, but each replica has "
            f"{cores} logical cores; they must multiply to {cores}."
        )
    split_axes = [i for i, d in enumerate(dims) if d > 1]
    if len(split_axes) > 1:
        raise ValueError(
            f"partition_dimensions {dims} splits {len(split_axes)} dimensions; stratax maps a "
            "replica's logical cores onto one mesh axis, so split one dimension, e.g. "
            f"{[cores if i == split_axes[0] else 1 for i in range(len(dims))]}."
        )
    if not split_axes:
        return _constrain(mesh, tensor, P())
    axis = split_axes[0]
    if shape[axis] % cores:
        raise ValueError(
            f"Dimension {axis} of the tensor (size {shape[axis]}) does not split evenly over "
            f"{cores} logical cores; pad it to a multiple of {cores}."
        )
    spec = P(*[CORE_AXIS if i == axis else None for i in range(len(dims))])
    return _constrain(mesh, tensor, spec)


def replicate(mesh: Mesh, tensor: Any) -> Any:
    """Keeps a whole copy of ``tensor`` on every core of the replica."""
    return _constrain(mesh, tensor, P())


def assign(mesh: Mesh, tensor: Any, logical_device_id: int) -> Any:
    """Checks ``logical_device_id`` and keeps ``tensor`` whole on the replica's cores.

    Raises:
        ValueError: the id is not a core of the replica.
    """
    cores = num_logical_cores(mesh)
    if isinstance(logical_device_id, bool) or not isinstance(logical_device_id, int) or not (
            0 <= logical_device_id < cores):
        raise ValueError(
            f"logical_device_id={logical_device_id!r} is not a logical core of the replica; "
            f"use 0 to {cores - 1}."
        )
    return _constrain(mesh, tensor, P())
