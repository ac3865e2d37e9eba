"""What ``import stratax`` does, and only this: prepare the environment, import nothing heavy.

Keras must run on JAX, and a CPU split into several devices must be set before JAX starts, so
both are settled when stratax is imported — cheaply, through environment variables, so that
``import stratax`` (and ``stratax launch``) stay fast:

- Keras' backend: ``KERAS_BACKEND=jax`` unless Keras is already running, in which case it must
  already be on JAX (clear error otherwise);
- ``STRATAX_CPU_DEVICES=N``: the CPU is split into ``N`` devices (``XLA_FLAGS`` while JAX is not
  imported yet, JAX's config when it is).
"""

from __future__ import annotations

import logging
import os
import sys

from stratax._src.core import env, logs

logger = logging.getLogger(__name__)

_FORCE_FLAG = "--xla_force_host_platform_device_count"


def ensure_jax_backend() -> None:
    """Selects Keras' JAX backend, or fails clearly if Keras already runs on another.

    Raises:
        RuntimeError: Keras was imported with another backend before stratax (where TensorFlow
            is installed, ``import keras`` or ``import tensorflow`` without ``KERAS_BACKEND``).
    """
    keras = sys.modules.get("keras")
    if keras is not None:
        backend = keras.backend.backend()
        if backend != "jax":
            # stratax's start-up hook (_stratax_keras_backend.py) leaves Keras' default alone
            # where TensorFlow is installed or the user named a backend (KERAS_BACKEND,
            # keras.json), and `import tensorflow` imports Keras too.
            raise RuntimeError(
                f"Keras was imported with the {backend!r} backend before stratax (by `import "
                "keras`, or by `import tensorflow`, which imports Keras); stratax needs the JAX "
                "backend. Either put `import stratax` before `import keras` and `import "
                f"tensorflow`, or set `{env.KERAS_BACKEND}=jax` in the environment before "
                "starting Python."
            )
        return
    requested = os.environ.get(env.KERAS_BACKEND)
    if requested and requested != "jax":
        logger.warning("%s=%s overridden to 'jax': stratax runs Keras on JAX.",
                       env.KERAS_BACKEND, requested)
    os.environ[env.KERAS_BACKEND] = "jax"


def cpu_device_count_from_env() -> int | None:
    """``STRATAX_CPU_DEVICES`` as a count, or ``None`` when unset.

    Raises:
        ValueError: the variable is not an integer >= 1.
    """
    return env.get_optional_int(env.STRATAX_CPU_DEVICES, 1,
                                    meaning="CPU devices to split the host into, one replica each",
                                    unset="for one CPU device")


def force_cpu_devices_flag(count: int) -> None:
    """Sets the XLA flag that splits the CPU into ``count`` devices (read when JAX starts)."""
    flags = [f for f in os.environ.get(env.XLA_FLAGS, "").split() if not f.startswith(_FORCE_FLAG)]
    os.environ[env.XLA_FLAGS] = " ".join([*flags, f"{_FORCE_FLAG}={count}"])


def set_cpu_device_count(count: int) -> None:
    """Splits the host CPU into ``count`` JAX devices: ``MirroredStrategy`` gets ``count`` replicas.

    Must run before JAX starts (before the first computation or device query). The environment
    equivalent is ``STRATAX_CPU_DEVICES=count`` (read on ``import stratax``) or
    ``XLA_FLAGS=--xla_force_host_platform_device_count=count``.

    Example:
        >>> import stratax as sx
        >>> sx.set_cpu_device_count(4)           # doctest: +SKIP
        >>> sx.MirroredStrategy().num_replicas_in_sync   # doctest: +SKIP
        4

    Raises:
        ValueError: ``count`` is not a positive integer.
        RuntimeError: JAX already started with a different number of CPU devices.
    """
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ValueError(f"CPU device count must be a positive integer; received {count!r}.")
    import jax

    from stratax._src import seam

    if seam.jax_backends_initialized():
        have = len(jax.local_devices(backend="cpu"))
        if have == count:
            return
        raise RuntimeError(
            f"JAX has already started with {have} CPU device(s), so it cannot be split into "
            f"{count}. Call `sx.set_cpu_device_count({count})` at the top of the program, before "
            f"any JAX computation, or set `{env.STRATAX_CPU_DEVICES}={count}` in the environment."
        )
    if _FORCE_FLAG in os.environ.get(env.XLA_FLAGS, ""):
        force_cpu_devices_flag(count)
    jax.config.update("jax_num_cpu_devices", count)


def prepare_environment() -> None:
    """Everything ``import stratax`` does (see the module docstring)."""
    logs.configure_from_env()
    ensure_jax_backend()
    count = cpu_device_count_from_env()
    if count is None:
        return
    if "jax" in sys.modules:
        set_cpu_device_count(count)
    else:
        force_cpu_devices_flag(count)
