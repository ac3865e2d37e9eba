"""Variable partitioners for ``ParameterServerStrategy`` (TensorFlow's
``tf.distribute.experimental.partitioners``)."""

from stratax._src.parameter_server.partitioners import (
    FixedShardsPartitioner,
    MaxSizePartitioner,
    MinSizePartitioner,
    Partitioner,
    ShardInfo,
)

__all__ = ["FixedShardsPartitioner", "MaxSizePartitioner", "MinSizePartitioner", "Partitioner",
           "ShardInfo"]
