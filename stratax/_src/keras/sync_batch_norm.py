"""``SyncBatchNormalization``: batch statistics over all replicas, also in custom loops.

Where stratax's batch statistics come from, next to TensorFlow's:

- ``model.fit`` with N replicas, ``BatchNormalization``: TensorFlow per replica; stratax over
  the global batch (equal to one device).
- ``strategy.run`` (custom loop), ``BatchNormalization``: per replica in both.
- either path, ``SyncBatchNormalization``: over all replicas in both.

``fit`` computes each step as one program over the global batch, so its statistics equal one
device's (the synchronous-equivalence promise); in a custom loop each replica runs the replica
function on its own rows, as in TensorFlow. ``SyncBatchNormalization`` makes a custom loop use
the global statistics too.
"""

from __future__ import annotations

from typing import Any

import jax
import keras

from stratax._src import seam
from stratax._src.core import context
from stratax._src.strategies.replica_context import REPLICA_AXIS


def _combine_over_replicas(mean: Any, variance: Any) -> tuple[Any, Any]:
    """Mean and variance over every replica's rows (equal per-replica batch sizes)."""
    if not context.in_replica_function():
        return mean, variance
    global_mean = jax.lax.pmean(mean, REPLICA_AXIS)
    second_moment = jax.lax.pmean(variance + mean * mean, REPLICA_AXIS)
    return global_mean, second_moment - global_mean * global_mean


@keras.saving.register_keras_serializable(package="stratax")
class SyncBatchNormalization(seam.batch_normalization_with_moments(_combine_over_replicas)):
    """``BatchNormalization`` whose batch statistics cover all replicas (TensorFlow's layer).

    Takes ``keras.layers.BatchNormalization``'s arguments. Inside ``strategy.run`` the mean and
    variance of each step are combined over the replicas; elsewhere (``fit``, which already
    normalises over the global batch, or one device) it is ``BatchNormalization``.

    Example:
        >>> with strategy.scope():
        ...     model = keras.Sequential([keras.layers.Dense(64),
        ...                               sx.SyncBatchNormalization(),
        ...                               keras.layers.ReLU()])
    """
