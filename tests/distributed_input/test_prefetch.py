"""The background prefetcher and ``InputOptions.experimental_fetch_to_device``."""

import gc
import threading
import time

import jax
import numpy as np
import pytest

import stratax as sx
from stratax._src.distributed_input.prefetch import Prefetcher


def _prefetch_threads():
    return [t for t in threading.enumerate() if t.name == "stratax-prefetch" and t.is_alive()]


def _wait_until(condition, seconds=5.0):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return condition()


def test_prefetcher_runs_ahead_by_at_most_depth():
    produced = []

    def source():
        for i in range(10):
            produced.append(i)
            yield i

    items = Prefetcher(source(), depth=2)
    assert next(items) == 0
    assert _wait_until(lambda: len(produced) >= 3)
    time.sleep(0.2)
    # One taken, two waiting in the queue, one held by the blocked producer.
    assert len(produced) <= 4
    assert list(items) == list(range(1, 10))
    assert _wait_until(lambda: not _prefetch_threads())


def test_prefetcher_reraises_source_errors_in_the_consumer():
    def source():
        yield 1
        raise KeyError("bad record 7")

    items = Prefetcher(source(), depth=2)
    assert next(items) == 1
    with pytest.raises(KeyError, match="bad record 7"):
        next(items)
    with pytest.raises(StopIteration):
        next(items)
    assert _wait_until(lambda: not _prefetch_threads())


def test_prefetcher_thread_stops_when_abandoned():
    def endless():
        i = 0
        while True:
            yield i
            i += 1

    items = Prefetcher(endless(), depth=2)
    assert next(items) == 0
    assert _prefetch_threads() and all(t.daemon for t in _prefetch_threads())
    del items
    gc.collect()
    assert _wait_until(lambda: not _prefetch_threads())


def test_depth_zero_runs_in_the_caller():
    items = Prefetcher(iter([1, 2]), depth=0)
    assert not _prefetch_threads()
    assert list(items) == [1, 2]
    with pytest.raises(ValueError, match="received -1"):
        Prefetcher(iter([]), depth=-1)


def test_distributed_iterator_places_batches_in_the_background():
    strategy = sx.MirroredStrategy(["cpu:0", "cpu:1"])
    batches = [np.full((4, 2), i, np.float32) for i in range(5)]
    iterator = iter(strategy.experimental_distribute_dataset(batches))
    first = next(iterator)
    assert isinstance(first.stacked, jax.Array)
    assert first.stacked.sharding.is_equivalent_to(strategy.batch_sharding(), 3)
    assert _prefetch_threads()
    rest = list(iterator)
    assert [float(strategy.gather(b, axis=0)[0, 0]) for b in rest] == [1, 2, 3, 4]
    assert _wait_until(lambda: not _prefetch_threads())
    abandoned = iter(strategy.experimental_distribute_dataset(batches))
    next(abandoned)
    assert _prefetch_threads()
    del abandoned
    gc.collect()
    assert _wait_until(lambda: not _prefetch_threads())  # stopped when garbage collected


def test_fetch_to_device_false_keeps_host_numpy_per_replica():
    strategy = sx.MirroredStrategy(["cpu:0", "cpu:1", "cpu:2"])
    options = sx.InputOptions(experimental_fetch_to_device=False)
    data = np.arange(10, dtype=np.float32)
    for dist in (strategy.experimental_distribute_dataset([data[:6], data[6:]], options),
                 strategy.distribute_datasets_from_function(
                     lambda ctx: [data[:2], data[2:4], data[4:6], data[6:8], data[8:]], options)):
        steps = list(dist)
        assert all(isinstance(b.stacked, np.ndarray) for b in steps)
        assert [len(p) for p in strategy.experimental_local_results(steps[-1])] == [2, 2, 0]
        total = sum(float(strategy.run(
            lambda x: sx.get_replica_context().all_reduce("sum", x.sum()), args=(b,)))
            for b in steps)
        assert total == data.sum()
        np.testing.assert_array_equal(
            np.concatenate([strategy.gather(b, axis=0) for b in steps]), data)


def test_input_pipeline_errors_reach_the_loop():
    strategy = sx.MirroredStrategy(["cpu:0", "cpu:1"])

    def batches():
        yield np.zeros(4)
        raise OSError("disk gone")

    iterator = iter(strategy.experimental_distribute_dataset(batches()))
    next(iterator)
    with pytest.raises(OSError, match="disk gone"):
        next(iterator)
