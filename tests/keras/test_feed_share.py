"""A worker's share of array batches, gathered directly, equals cutting it from the global batch."""

import numpy as np
import pytest

from stratax._src.keras.feed_layout import FeedLayout
from stratax._src.keras.feed_sources import ArraySource


@pytest.mark.parametrize("shuffle", [False, True, "batch"])
@pytest.mark.parametrize("rank", [0, 1])
def test_own_rows_equal_the_share_of_the_global_batch(shuffle, rank):
    x = {"a": np.arange(70 * 3, dtype=np.float32).reshape(70, 3), "b": np.arange(70)}
    arrays = (x, np.arange(70) % 5, np.linspace(0, 1, 70))
    source = ArraySource(arrays, 16, shuffle)  # 4 whole batches and a last one of 6 rows
    layout = FeedLayout(num_replicas=4, process_rank=rank, num_processes=2)
    direct = list(source.local_batches(seed=7, epoch=2, skip=1, layout=layout))
    cut = [layout.local(batch) for batch in source.batches(seed=7, epoch=2, skip=1)]
    assert len(direct) == len(cut) == 4
    assert [replicated for _, replicated in direct] == [False, False, False, True]
    for (mine, _), (theirs, _) in zip(direct, cut, strict=True):
        np.testing.assert_array_equal(mine[0]["a"], theirs[0]["a"])
        np.testing.assert_array_equal(mine[0]["b"], theirs[0]["b"])
        np.testing.assert_array_equal(mine[1], theirs[1])
        np.testing.assert_array_equal(mine[2], theirs[2])
    assert len(direct[0][0][1]) == 8  # half of a global batch of 16


@pytest.mark.parametrize("shuffle", [False, True, "batch"])
def test_a_row_pass_names_the_batches_rows(shuffle):
    x = np.arange(70 * 3, dtype=np.float32).reshape(70, 3)
    source = ArraySource((x,), 16, shuffle)
    for epoch in (0, 1):
        rows = source.row_pass(seed=7, epoch=epoch, skip=1)
        batches = list(source.batches(seed=7, epoch=epoch, skip=1))
        assert rows.order.dtype == np.int32
        assert len(batches) == len(list(rows.spans())) == 4
        for (start, size), (cut,) in zip(rows.spans(), batches, strict=True):
            np.testing.assert_array_equal(rows.batch(start, size)[0], cut)
    # Unshuffled, every epoch's order is the same array: a runner that placed it keeps it.
    same = source.row_pass(seed=7, epoch=5, skip=0).order is rows.order
    assert same == (shuffle is False)
