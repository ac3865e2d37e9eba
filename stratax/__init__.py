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

What importing stratax does, and when:

- ``import stratax`` only prepares the environment (``stratax._src.startup``): JAX becomes
  Keras' backend, and ``STRATAX_CPU_DEVICES`` splits the CPU before JAX starts. It imports
  neither JAX nor Keras, so ``stratax launch`` and ``import stratax.launch`` start fast.
- The first use of a name that needs JAX or Keras (``sx.MirroredStrategy``, ``sx.run``...) runs
  the one install step, ``stratax._src.keras.install.install()``: it checks the Keras and JAX
  versions, registers the default strategy and the strategies' Keras runners, and installs the
  Keras hooks listed in ``stratax._src.seam``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from stratax._src import startup as _startup

_startup.prepare_environment()

__version__ = "0.1.0"

# Public name -> the module that defines it (a module itself when the name is a submodule).
_EXPORTS = {
    "partitioners": "stratax.partitioners",
    "coordinator": "stratax.coordinator",
    "checkpoint": "stratax.checkpoint",
    "serving": "stratax.serving",
    "ShardedVariable": "stratax._src.parameter_server.variables",
    "PSVariable": "stratax._src.parameter_server.variables",
    "PerWorkerVariable": "stratax._src.parameter_server.per_worker_variables",
    "Server": "stratax._src.parameter_server.tasks.server",
    "ParameterServerStrategy": "stratax._src.parameter_server.strategy",
    "AutoShardPolicy": "stratax._src.distributed_input.input_context",
    "BackupAndRestore": "stratax._src.keras.callbacks.backup",
    "CollectiveTimeoutError": "stratax._src.core.errors",
    "CommunicationImplementation": "stratax._src.strategies.multi_worker",
    "CommunicationOptions": "stratax._src.strategies.multi_worker",
    "CrossDeviceOps": "stratax._src.strategies.cross_device_ops",
    "DistributedDataset": "stratax._src.distributed_input.distributed_dataset",
    "DistributedIterator": "stratax._src.distributed_input.distributed_dataset",
    "DistributedValues": "stratax._src.distributed_input.values",
    "HierarchicalCopyAllReduce": "stratax._src.strategies.cross_device_ops",
    "InputContext": "stratax._src.distributed_input.input_context",
    "InputOptions": "stratax._src.distributed_input.input_context",
    "InputReplicationMode": "stratax._src.distributed_input.input_context",
    "Mirrored": "stratax._src.distributed_input.values",
    "MirroredStrategy": "stratax._src.strategies.mirrored",
    "MixedStrategyError": "stratax._src.core.errors",
    "MultiWorkerMirroredStrategy": "stratax._src.strategies.multi_worker",
    "NcclAllReduce": "stratax._src.strategies.cross_device_ops",
    "OneDeviceStrategy": "stratax._src.strategies.one_device",
    "PREEMPTION_EXIT_CODE": "stratax._src.keras.callbacks.backup",
    "PerReplica": "stratax._src.distributed_input.values",
    "ReduceOp": "stratax._src.core.reduce_op",
    "ReductionToOneDevice": "stratax._src.strategies.cross_device_ops",
    "ReplicaContext": "stratax._src.strategies.replica_context",
    "RunOptions": "stratax._src.strategies.run_options",
    "Strategy": "stratax._src.strategies.base",
    "TPUStrategy": "stratax._src.strategies.tpu",
    "SyncBatchNormalization": "stratax._src.keras.sync_batch_norm",
    "StrataxError": "stratax._src.core.errors",
    "ValueContext": "stratax._src.distributed_input.input_context",
    "WorkerUnavailableError": "stratax._src.core.errors",
    "callbacks": "stratax.callbacks",
    "cluster_resolver": "stratax.cluster_resolver",
    "compute_average_loss": "stratax._src.strategies.losses",
    "config": "stratax.config",
    "datasets": "stratax.datasets",
    "experimental": "stratax.experimental",
    "experimental_set_strategy": "stratax._src.core.context",
    "get_replica_context": "stratax._src.core.context",
    "get_strategy": "stratax._src.core.context",
    "has_strategy": "stratax._src.core.context",
    "in_cross_replica_context": "stratax._src.core.context",
    "launch": "stratax.launch",
    "observe": "stratax.observe",
    "scale_regularization_loss": "stratax._src.strategies.losses",
    "set_cpu_device_count": "stratax._src.startup",
    "tpu": "stratax.tpu",
    "DatasetCreator": "stratax._src.keras.dataset_creator",
}
# Names that need neither JAX nor Keras: using them does not run the install step.
_LIGHT = frozenset({"cluster_resolver", "launch", "CollectiveTimeoutError", "MixedStrategyError",
                    "StrataxError", "WorkerUnavailableError", "observe"})

__all__ = sorted(_EXPORTS)

# What editors and type checkers see (one `X as X` re-export per name of `_EXPORTS`; a test
# keeps the two equal); at run time `__getattr__` imports each name on first use.
if TYPE_CHECKING:
    # isort: off
    from stratax import (
        callbacks as callbacks,
        checkpoint as checkpoint,
        cluster_resolver as cluster_resolver,
        config as config,
        coordinator as coordinator,
        datasets as datasets,
        experimental as experimental,
        launch as launch,
        observe as observe,
        partitioners as partitioners,
        serving as serving,
        tpu as tpu,
    )
    from stratax._src.core.context import (
        experimental_set_strategy as experimental_set_strategy,
        get_replica_context as get_replica_context,
        get_strategy as get_strategy,
        has_strategy as has_strategy,
        in_cross_replica_context as in_cross_replica_context,
    )
    from stratax._src.core.errors import (
        CollectiveTimeoutError as CollectiveTimeoutError,
        MixedStrategyError as MixedStrategyError,
        StrataxError as StrataxError,
        WorkerUnavailableError as WorkerUnavailableError,
    )
    from stratax._src.core.reduce_op import ReduceOp as ReduceOp
    from stratax._src.distributed_input.distributed_dataset import (
        DistributedDataset as DistributedDataset,
        DistributedIterator as DistributedIterator,
    )
    from stratax._src.distributed_input.input_context import (
        AutoShardPolicy as AutoShardPolicy,
        InputContext as InputContext,
        InputOptions as InputOptions,
        InputReplicationMode as InputReplicationMode,
        ValueContext as ValueContext,
    )
    from stratax._src.distributed_input.values import (
        DistributedValues as DistributedValues,
        Mirrored as Mirrored,
        PerReplica as PerReplica,
    )
    from stratax._src.keras.callbacks.backup import (
        BackupAndRestore as BackupAndRestore,
        PREEMPTION_EXIT_CODE as PREEMPTION_EXIT_CODE,
    )
    from stratax._src.keras.dataset_creator import DatasetCreator as DatasetCreator
    from stratax._src.keras.sync_batch_norm import SyncBatchNormalization as SyncBatchNormalization
    from stratax._src.parameter_server.per_worker_variables import (
        PerWorkerVariable as PerWorkerVariable,
    )
    from stratax._src.parameter_server.strategy import (
        ParameterServerStrategy as ParameterServerStrategy,
    )
    from stratax._src.parameter_server.tasks.server import Server as Server
    from stratax._src.parameter_server.variables import (
        PSVariable as PSVariable,
        ShardedVariable as ShardedVariable,
    )
    from stratax._src.startup import set_cpu_device_count as set_cpu_device_count
    from stratax._src.strategies.base import Strategy as Strategy
    from stratax._src.strategies.cross_device_ops import (
        CrossDeviceOps as CrossDeviceOps,
        HierarchicalCopyAllReduce as HierarchicalCopyAllReduce,
        NcclAllReduce as NcclAllReduce,
        ReductionToOneDevice as ReductionToOneDevice,
    )
    from stratax._src.strategies.losses import (
        compute_average_loss as compute_average_loss,
        scale_regularization_loss as scale_regularization_loss,
    )
    from stratax._src.strategies.mirrored import MirroredStrategy as MirroredStrategy
    from stratax._src.strategies.multi_worker import (
        CommunicationImplementation as CommunicationImplementation,
        CommunicationOptions as CommunicationOptions,
        MultiWorkerMirroredStrategy as MultiWorkerMirroredStrategy,
    )
    from stratax._src.strategies.one_device import OneDeviceStrategy as OneDeviceStrategy
    from stratax._src.strategies.replica_context import ReplicaContext as ReplicaContext
    from stratax._src.strategies.run_options import RunOptions as RunOptions
    from stratax._src.strategies.tpu import TPUStrategy as TPUStrategy
    # isort: on


def _install() -> None:
    from stratax._src.keras.install import install

    install()


def __getattr__(name: str) -> Any:
    module_name = _EXPORTS.get(name)
    if module_name is None:
        raise AttributeError(f"module 'stratax' has no attribute {name!r}")
    if name not in _LIGHT:
        _install()
    module = importlib.import_module(module_name)
    value = module if module_name == f"{__name__}.{name}" else getattr(module, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
