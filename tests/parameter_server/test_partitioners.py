"""Partitioners: TensorFlow's test cases (sharded_variable_test.PartitionerTest) and layout."""


import numpy as np
import pytest

from stratax._src.parameter_server.partitioners import (
    partition_count,
    shard_offsets,
    shard_sizes,
)
from stratax.partitioners import (
    FixedShardsPartitioner,
    MaxSizePartitioner,
    MinSizePartitioner,
)


def test_fixed_shards_partitioner():
    assert FixedShardsPartitioner(num_shards=2)([10, 3], np.float32) == [2, 1]
    assert FixedShardsPartitioner(num_shards=5)([3, 3], np.float32) == [3, 1]


def test_min_size_partitioner():
    assert MinSizePartitioner(min_shard_bytes=4, max_shards=2)([6, 1], np.float32) == [2, 1]
    assert MinSizePartitioner(min_shard_bytes=4, max_shards=10)([6, 1], np.float32) == [6, 1]
    # Default 256 KiB minimum: a 1000 x 64 float32 table (256,000 bytes) stays whole.
    assert MinSizePartitioner(max_shards=2)([1000, 64], "float32") == [1, 1]


def test_max_size_partitioner():
    assert MaxSizePartitioner(max_shard_bytes=4)([6, 1], np.float32) == [6, 1]
    assert MaxSizePartitioner(max_shard_bytes=4, max_shards=2)([6, 1], np.float32) == [2, 1]
    assert MaxSizePartitioner(max_shard_bytes=1024)([6, 1], np.float32) == [1, 1]


@pytest.mark.parametrize("make", [
    lambda: MinSizePartitioner(min_shard_bytes=0),
    lambda: MinSizePartitioner(max_shards=0),
    lambda: MaxSizePartitioner(max_shard_bytes=0),
    lambda: MaxSizePartitioner(max_shard_bytes=4, max_shards=0),
    lambda: FixedShardsPartitioner(0),
])
def test_bad_arguments_raise(make):
    with pytest.raises(ValueError, match="positive"):
        make()


def test_only_axis_zero():
    with pytest.raises(ValueError, match="axis 0"):
        FixedShardsPartitioner(2)([4, 4], np.float32, axis=1)


def test_contiguous_blocks_as_tensorflow():
    assert shard_sizes(13, 5) == [3, 3, 3, 2, 2]
    assert shard_offsets([3, 3, 3, 2, 2]) == [0, 3, 6, 9, 11]
    assert shard_sizes(10, 2) == [5, 5]
    with pytest.raises(ValueError, match="Cannot split"):
        shard_sizes(3, 4)


@pytest.mark.parametrize("result", [[2, 2, 1], [2], (2, 1, 1, 1), [0, 1, 1], 2, [2.0, 1, 1],
                                    ["2", 1, 1], [True, 1, 1], None])
def test_a_bad_partitioner_result_is_a_value_error_naming_it(result):
    """TensorFlow's check: one positive int per axis, 1 past axis 0 (else ValueError)."""
    with pytest.raises(ValueError, match=r"variable_partitioner must return a list of 3 ints.*"
                                         r"'table' of shape \(10, 4, 2\)"):
        partition_count(lambda shape, dtype: result, "table", (10, 4, 2), np.dtype("float32"))


def test_more_shards_than_rows_are_capped_at_the_rows():
    assert partition_count(lambda shape, dtype: [8, 1], "w", (3, 2), np.dtype("float32")) == 3
    assert partition_count(FixedShardsPartitioner(2), "w", (5, 2), np.dtype("float32")) == 2
