"""``OneDeviceStrategy``: everything on one device, with the strategy API."""

from __future__ import annotations

from stratax._src.runtime.devices import DeviceLike, resolve_device
from stratax._src.strategies.base import Strategy


class OneDeviceStrategy(Strategy):
    """Places variables and computation on one device; the reference for synchronous equivalence.

    Code written for ``MirroredStrategy`` runs unchanged; ``num_replicas_in_sync`` is 1.

    Args:
        device: ``"cpu:0"``, ``"gpu:0"``, TensorFlow's ``"/gpu:0"``, or a ``jax.Device``.

    Example:
        >>> strategy = sx.OneDeviceStrategy("cpu:0")
        >>> with strategy.scope():
        ...     model = keras.Sequential([keras.layers.Dense(10)])
    """

    def __init__(self, device: DeviceLike) -> None:
        self._device = resolve_device(device)
        super().__init__([self._device])

    @property
    def device(self) -> str:
        return f"{self._device.platform}:{self._device.id}"

    def __repr__(self) -> str:
        return f"OneDeviceStrategy(device={self.device!r})"
