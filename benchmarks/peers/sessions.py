"""Child side: import one system's framework and open its strategy scope.

Runs inside the child interpreter only (TensorFlow's virtual environment or the project's
own), after the parent has set XLA_FLAGS, KERAS_BACKEND and TF_CONFIG in its environment.
Imports are local so that a child never loads another system's framework.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import numpy  # noqa: F401  (imported here so that its version is recorded)

from benchmarks.harness.configs import Device, System


@dataclasses.dataclass
class Session:
    """What the child needs from a system: its keras module, a scope, extra callbacks."""

    keras: Any
    scope: AbstractContextManager[Any]
    replicas: int
    devices: list[str]
    versions: dict[str, str]
    # Waits until every dispatched computation is done (used once, to time the first step).
    sync: Callable[[], None]
    callbacks: list[Any] = dataclasses.field(default_factory=list)


def _module_versions(*names: str) -> dict[str, str]:
    out = {}
    for name in names:
        module = sys.modules.get(name)
        if module is not None and hasattr(module, "__version__"):
            out[name] = str(module.__version__)
    return out


def _tf_session(system: System, device: Device) -> Session:
    import tensorflow as tf

    if system.tf_logical_cpus:
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration()] * system.tf_logical_cpus)
    if system.strategy == "none":
        scope: AbstractContextManager[Any] = contextlib.nullcontext()
        replicas, devices = 1, ["default"]
    else:
        if system.strategy == "mwms":
            strategy = tf.distribute.MultiWorkerMirroredStrategy()
        elif system.tf_logical_cpus:
            names = [f"/cpu:{i}" for i in range(system.tf_logical_cpus)]
            strategy = tf.distribute.MirroredStrategy(devices=names)
        else:
            strategy = tf.distribute.MirroredStrategy()
        scope = strategy.scope()
        replicas = int(strategy.num_replicas_in_sync)
        devices = list(strategy.extended.worker_devices)
    if system.legacy_keras:
        import tf_keras as keras  # what tf.keras means under TF_USE_LEGACY_KERAS=1
    else:
        keras = tf.keras
    versions = _module_versions("tensorflow", "keras", "tf_keras", "numpy")
    versions["tf.keras"] = str(keras.__version__)
    versions["tensorflow.built_with_cuda"] = str(tf.test.is_built_with_cuda())
    # Eager calls of a tf.function return when done on CPU; on GPU, wait for the streams.
    sync = None
    if tf.config.list_logical_devices("GPU"):
        sync = getattr(getattr(tf.test, "experimental", None), "sync_devices", None)
    return Session(keras, scope, replicas, devices, versions, sync or (lambda: None))


def _jax_sync() -> None:
    import jax

    jax.block_until_ready(jax.live_arrays())


def _block_each_step_callback(keras: Any) -> Any:
    """Return a Keras callback that makes the host wait for every training step.

    Implementing ``on_train_batch_end`` turns off Keras' asynchronous callback dispatch, so
    Keras converts each step's logs to Python floats before dispatching the next step: the
    host waits for every step. Needed for Keras ``DataParallel`` on forced CPU devices, where
    many steps in flight deadlock XLA's CPU collectives (shared/FINDINGS.md).
    """

    class _Block(keras.callbacks.Callback):
        def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
            # The logs were already turned into floats (which waited); make the wait explicit.
            _jax_sync()

    return _Block()


def _keras_jax_session(system: System, device: Device) -> Session:
    import jax
    import keras

    devices = jax.devices()
    if system.strategy == "dataparallel":
        keras.distribution.set_distribution(keras.distribution.DataParallel(devices=devices))
        replicas = len(devices)
    else:
        replicas = 1
        devices = devices[:1]
    import jaxlib  # noqa: F401  (imported for its version)

    callbacks = [_block_each_step_callback(keras)] if system.block_each_step else []
    versions = _module_versions("jax", "jaxlib", "keras", "numpy")
    return Session(keras, contextlib.nullcontext(), replicas, [str(d) for d in devices],
                   versions, _jax_sync, callbacks)


def _stratax_session(system: System, device: Device) -> Session:
    import stratax as sx

    strategy: Any
    if system.strategy == "onedevice":
        strategy = sx.OneDeviceStrategy(f"{device}:0")
    elif system.strategy == "mirrored":
        strategy = sx.MirroredStrategy()
    elif system.strategy == "mwms":
        strategy = sx.MultiWorkerMirroredStrategy()
    else:
        raise ValueError(f"stratax has no strategy kind {system.strategy!r} in this harness.")
    import jax
    import jaxlib  # noqa: F401  (imported for its version)
    import keras

    versions = _module_versions("stratax", "jax", "jaxlib", "keras", "numpy")
    devices = getattr(strategy, "extended", None)
    device_names = [str(d) for d in getattr(devices, "worker_devices", ())] or [
        str(d) for d in jax.local_devices()]
    return Session(keras, strategy.scope(), int(strategy.num_replicas_in_sync), device_names,
                   versions, _jax_sync)


def open_session(system: System, device: Device) -> Session:
    """Import ``system``'s framework, build its strategy, and return what the child needs."""
    if system.family == "tf":
        return _tf_session(system, device)
    if system.family == "keras-jax":
        return _keras_jax_session(system, device)
    return _stratax_session(system, device)
