"""ClusterCoordinator without a cluster: dead workers end join() with an error naming them."""

import time

import pytest

from stratax._src.core.errors import WorkerUnavailableError
from stratax._src.parameter_server.coordinator import (
    ClusterCoordinator,
    RemoteValueStatus,
)
from stratax._src.parameter_server.rpc import RpcClient


class _Strategy:
    """What the coordinator reads from its strategy: worker clients and the step deadline."""

    def __init__(self, addresses):
        self._worker_clients = [RpcClient(f"worker {i}", a, timeout=2)
                                for i, a in enumerate(addresses)]
        self._step_timeout = 2.0
        self._coordinator = None


def test_join_raises_when_every_worker_is_gone():
    strategy = _Strategy(["127.0.0.1:9", "127.0.0.1:19"])  # nothing listens there
    coordinator = ClusterCoordinator(strategy)
    try:
        start = time.monotonic()
        values = [coordinator.schedule(lambda: 1) for _ in range(5)]
        with pytest.raises(WorkerUnavailableError, match=r"worker \d at 127\.0\.0\.1:\d+"):
            coordinator.join()
        assert time.monotonic() - start < 10
        assert all(v.status is RemoteValueStatus.FAILED for v in values)
        with pytest.raises(WorkerUnavailableError, match="No worker is left"):
            coordinator.schedule(lambda: 1)
    finally:
        coordinator.shutdown()
        for client in strategy._worker_clients:
            client.close()


def test_strategy_run_outside_schedule_is_explained():
    from stratax._src.parameter_server.coordinator import recording

    with pytest.raises(RuntimeError, match=r"coordinator\.schedule"):
        recording()
