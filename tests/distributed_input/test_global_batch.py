"""The one global-batch policy: divisibility error, TensorFlow's ceil split, padding."""

import numpy as np
import pytest

from stratax._src.distributed_input import global_batch


def test_check_divisible_message_and_hint():
    global_batch.check_divisible(64, 4, hint="unused {batch}")
    with pytest.raises(ValueError) as error:
        global_batch.check_divisible(63, 2, hint="`model.fit(..., batch_size={batch})`")
    assert str(error.value) == ("Global batch size 63 does not split over 2 replicas; use a "
                                "multiple of 2, e.g. `model.fit(..., batch_size=62)`.")
    with pytest.raises(ValueError, match=r"over 8 replicas; use a multiple of 8, e\.g\. 8\.$"):
        global_batch.check_divisible(3, 8, hint="{batch}")
    with pytest.raises(ValueError, match=r"use a multiple of 3\.$"):
        global_batch.check_divisible(4, 3)


@pytest.mark.parametrize("rows,replicas,sizes", [
    (8, 4, [2, 2, 2, 2]), (6, 4, [2, 2, 2, 0]), (2, 4, [1, 1, 0, 0]), (16, 3, [6, 6, 4]),
    (5, 1, [5]), (0, 2, [0, 0]), (9, 4, [3, 3, 3, 0]),
])
def test_split_sizes_follow_tensorflow(rows, replicas, sizes):
    assert global_batch.split_sizes(rows, replicas) == sizes
    assert global_batch.per_replica_rows(rows, replicas) == max(sizes)


def test_split_and_pad_keeps_rows_in_replica_order():
    stacked = global_batch.split_and_pad(np.arange(1, 7).reshape(6, 1), 4)
    assert stacked.shape == (4, 2, 1)
    assert stacked[..., 0].tolist() == [[1, 2], [3, 4], [5, 6], [0, 0]]
    even = np.arange(8)
    assert global_batch.split_and_pad(even, 4).tolist() == even.reshape(4, 2).tolist()


def test_stack_padded_and_shape_errors():
    stacked, rows = global_batch.stack_padded([np.ones((2, 3)), np.ones((0, 3))], what="parts")
    assert stacked.shape == (2, 2, 3) and rows == [2, 0] and stacked[1].sum() == 0
    with pytest.raises(ValueError, match=r"Parts have different shapes beyond the batch axis "
                                         r"\(replica 0: \(3,\), replica 1: \(4,\)\)"):
        global_batch.stack_padded([np.ones((2, 3)), np.ones((2, 4))], what="parts")
