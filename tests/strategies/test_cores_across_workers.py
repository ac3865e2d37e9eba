"""The rules of model parallelism across processes that need no second process: which
``cores_per_replica`` a multi-worker strategy takes, and which rows each worker feeds."""

from types import SimpleNamespace

import numpy as np
import pytest

from stratax._src.keras.feed import GlobalFeed
from stratax._src.keras.feed_layout import FeedLayout
from stratax._src.keras.feed_sources import SequenceSource
from stratax._src.strategies.multi_worker import check_cores_per_replica


def _devices(*per_process):
    """Stand-ins for ``jax.devices()`` of processes with these device counts (this one is 0)."""
    return [SimpleNamespace(process_index=p) for p, n in enumerate(per_process) for _ in range(n)]


@pytest.mark.parametrize("cores", [None, 1, 2, 4, 8])
def test_replicas_inside_a_worker_or_spanning_whole_workers(cores):
    check_cores_per_replica(cores, _devices(2, 2, 2, 2))


@pytest.mark.parametrize(("cores", "devices", "message"), [
    (3, (2, 2), r"cores_per_replica=3 must be a positive integer dividing the 4 devices of the "
                r"2 worker\(s\)"),
    (0, (2, 2), "cores_per_replica=0 must be a positive integer"),
    (True, (2, 2), "cores_per_replica=True must be a positive integer"),
    (2, (2, 4), r"needs the same number of devices in every worker; they have \[2, 4\]"),
    (6, (4, 4, 4), r"cores_per_replica=6 splits a replica unevenly between workers of 4 "
                   r"devices each: .* Use one of \[1, 2, 4, 12\]\."),
])
def test_a_grouping_that_cannot_be_honoured_names_the_value_and_the_fix(cores, devices, message):
    with pytest.raises(ValueError, match=message):
        check_cores_per_replica(cores, _devices(*devices))


@pytest.mark.parametrize(("replicas", "processes", "per_replica", "rows_by_rank"), [
    (2, 2, 1, [(0, 8), (8, 16)]),              # a replica per worker: halves
    (1, 2, 2, [(0, 16), (0, 16)]),             # one replica over both: the whole batch each
    (2, 4, 2, [(0, 8), (0, 8), (8, 16), (8, 16)]),  # 2 replicas of 2 workers each
])
def test_workers_of_one_replica_feed_the_same_rows(replicas, processes, per_replica,
                                                   rows_by_rank):
    batch = (np.arange(16),)
    for rank, (start, stop) in enumerate(rows_by_rank):
        layout = FeedLayout(num_replicas=replicas, process_rank=rank, num_processes=processes,
                            processes_per_replica=per_replica)
        local, replicated = layout.local(batch)
        assert not replicated
        np.testing.assert_array_equal(local[0], np.arange(start, stop))


def test_a_per_worker_input_is_refused_when_a_replica_spans_workers():
    layout = FeedLayout(num_replicas=1, process_rank=0, num_processes=2, processes_per_replica=2)
    with pytest.raises(ValueError, match=r"each replica spans 2 workers, which must feed it the "
                                         r"same rows\. Give every worker the same global batches"):
        GlobalFeed(SequenceSource([(np.zeros((4, 1)),)], False, None), layout, per_worker=True)
