"""TensorFlow's loss scaling for custom loops: ``compute_average_loss`` and friends.

With ``N`` replicas each replica sees ``1/N`` of the global batch. If each replica averaged its
own loss and the gradients were then *summed* across replicas, the update would be ``N`` times
too large; TensorFlow's rule is to divide each replica's summed loss by the *global* batch size,
so that the all-reduced (summed) gradients equal single-device gradients exactly.

On an uneven batch (padded, see docs/uneven_batches.md) the padding rows are masked out, and the
default divisor is the number of real rows over all replicas.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp

from stratax._src.core import context


def compute_average_loss(
    per_example_loss: Any,
    sample_weight: Any = None,
    global_batch_size: int | None = None,
) -> Any:
    """``sum(per_example_loss * sample_weight) / global_batch_size`` (``tf.nn.compute_average_loss``).

    Args:
        per_example_loss: this replica's per-example losses, shape ``(per_replica_batch, ...)``.
        sample_weight: optional weights broadcastable to ``per_example_loss``.
        global_batch_size: the batch size over all replicas; defaults to the real rows of the
            current distributed batch over all replicas (padding excluded), or, when ``run`` got
            no distributed batch, this replica's batch size times ``num_replicas_in_sync``.

    Example:
        >>> per_example = keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True)
        >>> loss = sx.compute_average_loss(per_example, global_batch_size=64)
    """
    loss = jnp.asarray(per_example_loss)
    if sample_weight is not None:
        loss = loss * jnp.asarray(sample_weight, dtype=loss.dtype)
    replica = context.get_replica_context()
    mask = getattr(replica, "valid_mask", None)
    masked = mask is not None and loss.ndim >= 1 and loss.shape[0] == replica.padded_rows
    if masked:
        loss = jnp.where(mask.reshape(-1, *([1] * (loss.ndim - 1))), loss, 0)
    if global_batch_size is None:
        if masked:
            global_batch_size = jnp.maximum(replica.global_num_valid_rows, 1)
        else:
            global_batch_size = (loss.shape[0] if loss.ndim else 1) * _replicas_in_sync()
    if isinstance(global_batch_size, (int, float)) and global_batch_size <= 0:
        raise ValueError(f"global_batch_size must be positive; received {global_batch_size}.")
    return jnp.sum(loss) / jnp.asarray(global_batch_size, dtype=loss.dtype)


def scale_regularization_loss(regularization_loss: Any) -> Any:
    """Divides a per-replica regularization loss by ``num_replicas_in_sync`` (TF's rule)."""
    return jnp.asarray(regularization_loss) / _replicas_in_sync()


def _replicas_in_sync() -> int:
    replica = context.get_replica_context()
    if replica is not None:
        return int(replica.num_replicas_in_sync)
    return int(context.get_strategy().num_replicas_in_sync)
