"""``sx.tpu``: TensorFlow's ``tf.tpu`` namespace (``sx.tpu.experimental``)."""

from stratax.tpu import experimental

__all__ = ["experimental"]
