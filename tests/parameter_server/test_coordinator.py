"""ClusterCoordinator without a cluster: dead workers end join() with an error naming them."""

import time

import pytest

from stratax._src.core.errors import WorkerUnavailableError
from stratax._src.parameter_server.closures import RemoteValueStatus
from stratax._src.parameter_server.coordinator import ClusterCoordinator
from stratax._src.parameter_server.transport.rpc import RpcClient


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
    from stratax._src.parameter_server.closures import recording

    with pytest.raises(RuntimeError, match=r"coordinator\.schedule"):
        recording()


def test_replica_context_of_a_synchronous_step_refuses_collectives_across_workers():
    """Each worker's step runs alone and the servers sum the gradients: num_replicas_in_sync
    counts the workers (compute_average_loss divides by the global batch), and a collective
    across workers inside the step is refused with the way out, never silently the identity."""
    import types

    from stratax._src.parameter_server.worker_context import WorkerReplicaContext

    sync = WorkerReplicaContext(types.SimpleNamespace(mode="sync", synchronous=True,
                                                        num_replicas_in_sync=2))
    assert sync.num_replicas_in_sync == 2
    for use in (lambda: sync.all_reduce("sum", 1.0), lambda: sync.all_gather(1.0, 0),
                lambda: sync.replica_id_in_sync_group):
        with pytest.raises(ValueError, match=r"synchronous ParameterServerStrategy step.*"
                                             r"strategy\.reduce"):
            use()
    lone = WorkerReplicaContext(types.SimpleNamespace(mode="async", synchronous=False,
                                                        num_replicas_in_sync=1))
    assert (lone.replica_id_in_sync_group, lone.all_reduce("sum", 3.0)) == (0, 3.0)
