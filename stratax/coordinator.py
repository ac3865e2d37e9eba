"""``ClusterCoordinator`` and its values (TensorFlow's ``tf.distribute.coordinator``)."""

from stratax._src.parameter_server.closures import PerWorkerValues, RemoteValue, RemoteValueStatus
from stratax._src.parameter_server.coordinator import ClusterCoordinator
from stratax._src.parameter_server.inputs.per_worker_dataset import (
    PerWorkerDataset,
    PerWorkerIterator,
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
