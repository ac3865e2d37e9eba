"""``sx.config``: TensorFlow's ``tf.config`` calls that a distributed TPU program makes."""

from stratax._src.runtime.tpu_system import experimental_connect_to_cluster

__all__ = ["experimental_connect_to_cluster"]
