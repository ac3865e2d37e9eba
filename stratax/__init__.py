"""stratax: TensorFlow's ``tf.distribute`` strategies on JAX, with Keras 3 as the model API.

Port a TensorFlow program by changing two import lines::

    import keras
    import stratax as sx

    strategy = sx.MirroredStrategy()
    with strategy.scope():
        model = keras.Sequential([keras.layers.Dense(128, activation="relu"),
                                  keras.layers.Dense(10, activation="softmax")])
        model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    model.fit(x_train, y_train, epochs=5, batch_size=64)   # 64 = global batch

Keras must run on JAX: an installed stratax makes JAX Keras' default backend (a ``.pth`` hook,
only while ``KERAS_BACKEND`` is unset), and importing stratax before keras selects it too.
Importing stratax also applies ``STRATAX_CPU_DEVICES`` if set.
"""

from stratax._src.keras.backend import ensure_jax_backend as _ensure_jax_backend

_ensure_jax_backend()

from stratax import cluster_resolver, coordinator, datasets, partitioners  # noqa: E402
from stratax._src.core.context import (  # noqa: E402
    get_replica_context,
    get_strategy,
    has_strategy,
    in_cross_replica_context,
)
from stratax._src.core.errors import (  # noqa: E402
    CollectiveTimeoutError,
    MixedStrategyError,
    StrataxError,
    WorkerUnavailableError,
)
from stratax._src.core.reduce_op import ReduceOp  # noqa: E402
from stratax._src.data.distributed_dataset import (  # noqa: E402
    DistributedDataset,
    DistributedIterator,
)
from stratax._src.data.input_context import (  # noqa: E402
    AutoShardPolicy,
    InputContext,
    InputOptions,
    ValueContext,
)
from stratax._src.data.values import Mirrored, PerReplica  # noqa: E402
from stratax._src.runtime.devices import apply_cpu_device_env as _apply_cpu_device_env  # noqa: E402
from stratax._src.runtime.devices import set_cpu_device_count  # noqa: E402
from stratax._src.strategies.base import Strategy  # noqa: E402
from stratax._src.strategies.cross_device_ops import (  # noqa: E402
    CrossDeviceOps,
    HierarchicalCopyAllReduce,
    NcclAllReduce,
    ReductionToOneDevice,
)
from stratax._src.strategies.losses import (  # noqa: E402
    compute_average_loss,
    scale_regularization_loss,
)
from stratax._src.strategies.mirrored import MirroredStrategy  # noqa: E402
from stratax._src.strategies.multi_worker import (  # noqa: E402
    CommunicationImplementation,
    CommunicationOptions,
    MultiWorkerMirroredStrategy,
)
from stratax._src.strategies.one_device import OneDeviceStrategy  # noqa: E402
from stratax._src.parameter_server.server import Server  # noqa: E402
from stratax._src.parameter_server.strategy import ParameterServerStrategy  # noqa: E402
from stratax._src.parameter_server.variables import PSVariable, ShardedVariable  # noqa: E402
from stratax._src.strategies.replica_context import ReplicaContext  # noqa: E402

_apply_cpu_device_env()

from stratax._src.keras import bridge as _bridge  # noqa: E402
from stratax._src.keras.backup import PREEMPTION_EXIT_CODE, BackupAndRestore  # noqa: E402

_bridge.install()

__version__ = "0.1.0"

__all__ = [
    "AutoShardPolicy",
    "BackupAndRestore",
    "CollectiveTimeoutError",
    "CommunicationImplementation",
    "CommunicationOptions",
    "CrossDeviceOps",
    "DistributedDataset",
    "DistributedIterator",
    "HierarchicalCopyAllReduce",
    "InputContext",
    "InputOptions",
    "Mirrored",
    "MirroredStrategy",
    "MixedStrategyError",
    "MultiWorkerMirroredStrategy",
    "NcclAllReduce",
    "OneDeviceStrategy",
    "PSVariable",
    "ParameterServerStrategy",
    "PREEMPTION_EXIT_CODE",
    "PerReplica",
    "ReduceOp",
    "ReductionToOneDevice",
    "ReplicaContext",
    "Server",
    "ShardedVariable",
    "Strategy",
    "StrataxError",
    "ValueContext",
    "WorkerUnavailableError",
    "cluster_resolver",
    "compute_average_loss",
    "coordinator",
    "datasets",
    "get_replica_context",
    "get_strategy",
    "has_strategy",
    "in_cross_replica_context",
    "partitioners",
    "scale_regularization_loss",
    "set_cpu_device_count",
]
