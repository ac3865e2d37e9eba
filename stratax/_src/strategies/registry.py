"""String aliases for strategies, used by the ``stratax`` command (``--strategy mirrored``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from stratax._src.strategies.base import Strategy
from stratax._src.strategies.mirrored import MirroredStrategy
from stratax._src.strategies.multi_worker import MultiWorkerMirroredStrategy
from stratax._src.strategies.one_device import OneDeviceStrategy
from stratax._src.strategies.tpu import TPUStrategy

_REGISTRY: dict[str, Callable[[], Strategy]] = {
    "mirrored": MirroredStrategy,
    "multi_worker_mirrored": MultiWorkerMirroredStrategy,
    "one_device": lambda: OneDeviceStrategy("cpu:0"),
    "tpu": TPUStrategy,
}


def register_strategy(name: str, factory: Callable[[], Strategy]) -> None:
    """Makes ``factory`` available as ``--strategy name``."""
    _REGISTRY[name] = factory


def strategy_names() -> list[str]:
    return sorted(_REGISTRY)


def strategy_from_name(name: str, **kwargs: Any) -> Strategy:
    """Builds the strategy registered as ``name`` (``-`` and ``_`` are interchangeable).

    Raises:
        ValueError: no strategy has that name.
    """
    key = name.strip().lower().replace("-", "_")
    if key not in _REGISTRY:
        raise ValueError(f"Unknown strategy {name!r}; choose one of {strategy_names()}.")
    return _REGISTRY[key](**kwargs)
