"""A Keras ``Distribution`` made from a strategy's mesh: how Keras lays out variables and data."""

from __future__ import annotations

import weakref
from typing import Any

import numpy as np
from keras import distribution as keras_distribution

from stratax._src import seam
from stratax._src.strategies.base import Strategy
from stratax._src.strategies.replica_context import REPLICA_AXIS

# Keras variables created under a several-replica strategy (by id; weakly held), so that
# ``strategy.run`` reads a closed-over variable's current value at every call.
_created_variables: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()


def created_variables() -> list[Any]:
    """The live Keras variables created under the scope of a several-replica strategy."""
    return list(_created_variables.values())


class StrategyDistribution(keras_distribution.DataParallel):
    """Keras' ``DataParallel`` over a stratax strategy's ``"replica"`` axis.

    Variables are replicated on every replica (mirrored). A batch whose size splits over the
    replicas is sharded along its first axis; one that does not (the last, partial batch of an
    epoch) is given whole to every replica, so each computes the same update as one device
    would — slower for that one step, never wrong. In a multi-process run every batch must split.
    """

    def __init__(self, strategy: Strategy) -> None:
        devices = np.array(list(strategy.mesh.devices.flat), dtype=object)
        mesh = keras_distribution.DeviceMesh(
            shape=(devices.size,), axis_names=[REPLICA_AXIS], devices=devices
        )
        super().__init__(device_mesh=mesh, auto_shard_dataset=False)
        seam.accepts_stratax_feeds(self)
        self.strategy = strategy

    def get_variable_layout(self, variable: Any) -> keras_distribution.TensorLayout:
        _created_variables[id(variable)] = variable
        return super().get_variable_layout(variable)

    def get_data_layout(self, data_shape: Any) -> keras_distribution.TensorLayout:
        shape = tuple(data_shape)
        # In a multi-process run Keras passes this process's share of the batch.
        replicas = self.strategy.num_replicas_in_sync // self.num_processes
        if shape and shape[0] is not None and shape[0] % replicas == 0:
            return super().get_data_layout(shape)
        if self.num_processes > 1:
            raise ValueError(
                f"This worker's batch of {shape[0] if shape else 'unknown'} examples does not "
                f"split over its {replicas} replicas; use a per-worker batch size that is a "
                f"multiple of {replicas}."
            )
        return keras_distribution.TensorLayout([None] * len(shape), self.device_mesh)
