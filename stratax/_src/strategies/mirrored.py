"""``MirroredStrategy``: synchronous data parallelism over this process's devices."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from stratax._src.runtime.devices import DeviceLike, resolve_devices
from stratax._src.strategies.base import Strategy
from stratax._src.strategies.cross_device_ops import CrossDeviceOps, resolve_cross_device_ops


class MirroredStrategy(Strategy):
    """One replica per local device; variables mirrored; gradients all-reduced every step.

    With ``devices=None`` it uses every device of JAX's default platform: all GPUs (or TPU
    cores) when there are some, otherwise the CPU devices. A CPU is one device unless split
    before JAX starts with ``sx.set_cpu_device_count(N)`` or ``STRATAX_CPU_DEVICES=N``.

    Args:
        devices: device names (``"gpu:0"``, ``"/gpu:1"``, ``"cpu:0"``) or ``jax.Device``s.
        cross_device_ops: TensorFlow's all-reduce choice (``sx.NcclAllReduce()``,
            ``"hierarchical_copy"``, ...): the strategy's collectives, each XLA's all-reduce,
            for which XLA picks the wire (see ``stratax._src.strategies.cross_device_ops``).
        cores_per_replica: Model parallelism: group the devices into replicas of this many
            logical cores (a ``("replica", "core")`` mesh, as ``TPUStrategy``'s).
        layout_map: A ``keras.distribution.LayoutMap`` splitting variables over the mesh axes.

    Example:
        >>> strategy = sx.MirroredStrategy()
        >>> print(strategy.num_replicas_in_sync)
        >>> with strategy.scope():
        ...     model = keras.Sequential([keras.layers.Dense(10)])
        ...     model.compile(optimizer="adam", loss="mse")
        >>> model.fit(x, y, batch_size=64)          # 64 = global batch
    """

    def __init__(
        self,
        devices: Sequence[DeviceLike] | None = None,
        cross_device_ops: CrossDeviceOps | str | None = None,
        *,
        cores_per_replica: int | None = None,
        layout_map: Any = None,
    ) -> None:
        resolved = resolve_devices(devices)
        platforms = {d.platform for d in resolved}
        if len(platforms) > 1:
            raise ValueError(
                f"MirroredStrategy devices must share one platform; received {sorted(platforms)} "
                "devices. Pick e.g. only the GPUs."
            )
        requested = resolve_cross_device_ops(cross_device_ops)
        if cores_per_replica is not None and (
                isinstance(cores_per_replica, bool) or not isinstance(cores_per_replica, int)
                or cores_per_replica < 1 or len(resolved) % cores_per_replica):
            raise ValueError(
                f"cores_per_replica={cores_per_replica!r} must be a positive integer dividing "
                f"the {len(resolved)} devices."
            )
        super().__init__(resolved, cores_per_replica=cores_per_replica, layout_map=layout_map,
                         cross_device_ops=requested)
