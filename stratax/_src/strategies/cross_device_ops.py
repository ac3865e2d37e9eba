"""TensorFlow's ``cross_device_ops`` choices, accepted for portability.

In TensorFlow, ``MirroredStrategy(cross_device_ops=...)`` picks how gradients are all-reduced
between devices. In stratax the all-reduce is an XLA collective compiled into the step, and XLA
picks the transport: NCCL between GPUs, in-process copies between CPU devices, ICI on TPUs. So
these classes record the user's choice (visible in logs and ``repr``) without changing the
computation; the result is the same all-reduce in every case.
"""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)


class CrossDeviceOps:
    """Base of the accepted ``cross_device_ops`` values; see the module docstring."""

    name = "xla"

    def __init__(self, num_packs: int = 1) -> None:
        if num_packs < 1:
            raise ValueError(f"num_packs must be >= 1; received {num_packs}.")
        self.num_packs = num_packs

    def __repr__(self) -> str:
        return f"{type(self).__name__}(num_packs={self.num_packs})"


class NcclAllReduce(CrossDeviceOps):
    """TensorFlow's NCCL all-reduce; XLA uses NCCL on GPUs by itself."""

    name = "nccl"


class HierarchicalCopyAllReduce(CrossDeviceOps):
    """TensorFlow's hierarchical copy; XLA schedules the transfers itself."""

    name = "hierarchical_copy"


class ReductionToOneDevice(CrossDeviceOps):
    """TensorFlow's reduce-then-broadcast; XLA's all-reduce gives the same values."""

    name = "reduction_to_one_device"

    def __init__(self, reduce_to_device: str | None = None, accumulation_fn: object = None) -> None:
        super().__init__()
        self.reduce_to_device = reduce_to_device
        del accumulation_fn


_BY_NAME = {
    cls.name: cls
    for cls in (CrossDeviceOps, NcclAllReduce, HierarchicalCopyAllReduce, ReductionToOneDevice)
}
_ALIASES = {"ncclallreduce": "nccl", "hierarchicalcopyallreduce": "hierarchical_copy",
            "reductiontoonedevice": "reduction_to_one_device", "auto": "xla"}


def resolve_cross_device_ops(value: CrossDeviceOps | str | None) -> CrossDeviceOps:
    """Returns a ``CrossDeviceOps`` for ``value`` (an instance, a name, or ``None`` for XLA's)."""
    if value is None:
        return CrossDeviceOps()
    if isinstance(value, CrossDeviceOps):
        logger.info("cross_device_ops=%r: XLA compiles the all-reduce and picks its transport.",
                    value)
        return value
    if isinstance(value, str):
        key = value.strip().lower().replace("-", "_")
        key = _ALIASES.get(key.replace("_", ""), key)
        if key in _BY_NAME:
            return _BY_NAME[key]()
        raise ValueError(
            f"Unknown cross_device_ops {value!r}; use one of {sorted(_BY_NAME)} or an instance "
            "such as sx.NcclAllReduce()."
        )
    raise TypeError(
        f"cross_device_ops must be a CrossDeviceOps instance, a name or None; received "
        f"{type(value).__name__}."
    )
