"""Naming, finding and forcing the devices a strategy runs on.

Devices are given as JAX devices or as strings in TensorFlow's spellings: ``"cpu:0"``,
``"gpu:1"``, ``"/gpu:1"``, ``"/device:GPU:1"``, ``"/job:worker/task:0/device:CPU:0"``. The number is
the index among this process's devices of that platform, as in TensorFlow.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from stratax._src import seam

DeviceLike = str | jax.Device

_DEVICE_RE = re.compile(r"(?:^|/)(?:device:)?(?P<kind>[A-Za-z]+):(?P<index>\d+)$")
_PLATFORM_ALIASES = {"cpu": "cpu", "gpu": "gpu", "cuda": "gpu", "rocm": "gpu", "tpu": "tpu"}


def jax_started() -> bool:
    """True once JAX has initialised its backends (device counts are then fixed)."""
    return seam.jax_backends_initialized()


def default_devices() -> list[jax.Device]:
    """This process's devices of JAX's default platform (GPUs/TPUs if present, else CPUs)."""
    return list(jax.local_devices())


def resolve_device(device: DeviceLike) -> jax.Device:
    """Returns the local JAX device named by ``device`` (see the module docstring for spellings).

    Raises:
        ValueError: the name is malformed or no such device exists here.
        TypeError: ``device`` is neither a string nor a JAX device.
    """
    if isinstance(device, jax.Device):
        return device
    if not isinstance(device, str):
        raise TypeError(
            f"A device must be a string such as 'cpu:0' or '/gpu:1', or a jax.Device; "
            f"received {device!r} of type {type(device).__name__}."
        )
    match = _DEVICE_RE.search(device.strip())
    platform = _PLATFORM_ALIASES.get(match.group("kind").lower()) if match else None
    if match is None or platform is None:
        raise ValueError(
            f"Cannot parse device {device!r}; use 'cpu:0', 'gpu:1', '/gpu:1' or "
            f"'/device:GPU:1' (platform cpu, gpu or tpu, then the local index)."
        )
    index = int(match.group("index"))
    try:
        candidates = jax.local_devices(backend=platform)
    except RuntimeError:
        candidates = []
    if index >= len(candidates):
        available = ", ".join(_name(d) for d in jax.local_devices()) or "none"
        raise ValueError(
            f"Device {device!r} does not exist in this process: found {len(candidates)} "
            f"{platform} device(s). Available: {available}. For more CPU devices call "
            f"`sx.set_cpu_device_count(N)` before JAX starts."
        )
    return candidates[index]


def resolve_devices(devices: Sequence[DeviceLike] | None) -> list[jax.Device]:
    """Resolves a list of device names; ``None`` means all local devices of the default platform.

    Raises:
        ValueError: the list is empty, names an unknown device, or names one device twice.
    """
    if devices is None:
        return default_devices()
    if isinstance(devices, (str, jax.Device)):
        devices = [devices]
    resolved = [resolve_device(d) for d in devices]
    if not resolved:
        raise ValueError("`devices` is empty; pass at least one device, or None for all.")
    if len(set(resolved)) != len(resolved):
        raise ValueError(
            f"`devices` names a device twice: {list(devices)!r}; each replica needs its own device."
        )
    return resolved


def _name(device: jax.Device) -> str:
    same = [d for d in jax.local_devices(backend=device.platform)]
    return f"{device.platform}:{same.index(device)}"


def local_replica_ids(replicas: Any) -> list[int]:
    """Indices of the replicas with a device in this process, in replica order.

    ``replicas``: one device per replica, or one row of devices (its cores) per replica.
    """
    here = jax.process_index()
    return [i for i, cores in enumerate(replicas)
            if any(d.process_index == here for d in np.atleast_1d(np.asarray(cores, object)))]


def process_rank(devices: Sequence[jax.Device]) -> tuple[int, int]:
    """``(rank of this process, number of processes)`` among the processes owning ``devices``."""
    processes = sorted({d.process_index for d in devices})
    return processes.index(jax.process_index()), len(processes)


def device_name(device: jax.Device) -> str:
    """TensorFlow-style short name of a local device, e.g. ``"cpu:1"``."""
    return _name(device)


def place(value: Any, sharding: jax.sharding.Sharding) -> jax.Array:
    """``value`` placed with ``sharding``; an array that already is comes back as it is, and a
    traced one (inside ``jax.jit``) is constrained to it.

    ``jax.device_put`` of an array already placed so is not free between processes, nor is
    the dispatch of the program that takes its result (docs/design/performance.md).
    """
    if isinstance(value, jax.core.Tracer):  # ``strategy.run`` inside the user's ``jax.jit``
        return jax.lax.with_sharding_constraint(value, sharding)
    if isinstance(value, jax.Array) and value.sharding == sharding:
        return value
    return jax.device_put(value, sharding)
