"""``ClusterCoordinator`` and its values (TensorFlow's ``tf.distribute.coordinator``)."""

from stratax._src.parameter_server.coordinator import (
    ClusterCoordinator,
    PerWorkerDataset,
    PerWorkerIterator,
    PerWorkerValues,
    RemoteValue,
    RemoteValueStatus,
)
from stratax._src.parameter_server.step_errors import StepCancelledError, StepError

__all__ = [
    "ClusterCoordinator",
    "PerWorkerDataset",
    "PerWorkerIterator",
    "PerWorkerValues",
    "RemoteValue",
    "RemoteValueStatus",
    "StepCancelledError",
    "StepError",
]
