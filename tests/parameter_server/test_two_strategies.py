"""Two ParameterServerStrategy objects on one cluster in one chief process live side by side,
as in TensorFlow: each reads its own same-named variables and runs its own programs and
iterators (issue 36 item 2; the real-process case is in ``chief_program.py``'s ``second``)."""

import numpy as np
import pytest
from cluster_helpers import local_cluster  # noqa: F401 - a fixture

import stratax as sx
from stratax._src.parameter_server.tasks.ownership import ChiefSession, SessionError
from stratax._src.parameter_server.transport import rpc

pytestmark = pytest.mark.timeout(180)


def zeros_dataset(ctx):
    while True:
        yield np.zeros((2, 4), np.float32)


def ones_dataset(ctx):
    while True:
        yield np.ones((2, 4), np.float32)


def _scheduled(strategy, coordinator, variable, iterator, scale):
    """Schedules one step that reads ``variable``, pushes gradient 1 (SGD, rate 1) and returns
    ``read * scale + batch row 0``."""

    def replica_fn(batch):
        value = strategy.read(variable)
        strategy.apply_gradients([(np.ones(4, np.float32), variable)],
                                 {"class_name": "SGD", "config": {"learning_rate": 1.0}})
        return value * scale + batch[0]

    return coordinator.schedule(lambda it: strategy.run(replica_fn, args=(next(it),)),
                                args=(iterator,))


def test_two_strategies_keep_their_own_variables_programs_and_iterators(local_cluster):  # noqa: F811
    first = local_cluster()
    v1 = first.create_variable(np.arange(4, dtype=np.float32), name="v")
    c1 = sx.coordinator.ClusterCoordinator(first)
    it1 = iter(c1.create_per_worker_dataset(zeros_dataset))
    assert c1.fetch(_scheduled(first, c1, v1, it1, 2.0)).tolist() == [0, 2, 4, 6]

    second = local_cluster()           # same cluster, same process: joins the chief's session
    v2 = second.create_variable(np.arange(4, 8, dtype=np.float32), name="v")
    c2 = sx.coordinator.ClusterCoordinator(second)
    assert c2 is not c1 and v2.name == v1.name == "v"
    assert v2.numpy().tolist() == [4, 5, 6, 7]             # its own, not the first one's
    assert v1.numpy().tolist() == [-1, 0, 1, 2]            # one SGD step of the first
    it2 = iter(c2.create_per_worker_dataset(ones_dataset))
    # Each coordinator's first program and iterator would be "p0"/"it0" on the worker.
    assert c2.fetch(_scheduled(second, c2, v2, it2, 1.0)).tolist() == [5, 6, 7, 8]
    assert c1.fetch(_scheduled(first, c1, v1, it1, 2.0)).tolist() == [-2, 0, 2, 4]
    c1.join()
    c2.join()
    assert v1.numpy().tolist() == [-2, -1, 0, 1] and v2.numpy().tolist() == [3, 4, 5, 6]
    assert first.optimizer_iterations(v1) == [2] and second.optimizer_iterations(v2) == [1]

    # Shutting the second down leaves the tasks to the first, which goes on.
    second.shutdown()
    assert c1.fetch(_scheduled(first, c1, v1, it1, 1.0)).tolist() == [-2, -1, 0, 1]
    c1.join()
    assert first.optimizer_iterations(v1) == [3]


def test_another_chief_process_is_still_refused(local_cluster):  # noqa: F811
    # Sharing is per process: another session (another chief process) is refused as before.
    strategy = local_cluster()
    other = rpc.RpcClient("ps 0", strategy._ps_addresses[0], timeout=5)
    try:
        with pytest.raises(SessionError, match="ps 0 is owned by another chief"):
            ChiefSession([other], timeout=1.0).claim()
    finally:
        other.close()
