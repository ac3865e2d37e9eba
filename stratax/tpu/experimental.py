"""``sx.tpu.experimental``: TPU start-up and device assignment, as ``tf.tpu.experimental``."""

from stratax._src.runtime.tpu_system import initialize_tpu_system, shutdown_tpu_system
from stratax._src.runtime.tpu_topology import DeviceAssignment, Topology

__all__ = ["DeviceAssignment", "Topology", "initialize_tpu_system", "shutdown_tpu_system"]
