"""PSClients against two in-process parameter servers: a push that also pulls the next
step's values (one call per ps) reads them after the update, across shards."""

import numpy as np
import pytest

from stratax._src.parameter_server.tasks.ps import ParameterServer
from stratax._src.parameter_server.transport import rpc
from stratax._src.parameter_server.transport.ps_client import PSClients
from stratax._src.parameter_server.transport.rpc_server import RpcServer


@pytest.fixture
def two_ps():
    servers = [RpcServer(f"ps {i}", "127.0.0.1", 0, ParameterServer().handle, max_workers=2)
               for i in range(2)]
    for server in servers:
        server.start()
    clients = PSClients([f"127.0.0.1:{s.port}" for s in servers], timeout=10)
    yield clients
    clients.close()
    for server in servers:
        server.stop(0)


def _table_on_two_ps(two_ps):
    """A 10 x 2 table in two shards of 5 rows, one per ps, trained by SGD(1.0)."""
    table = np.arange(20, dtype=np.float32).reshape(10, 2)
    desc = {"name": "t", "shape": [10, 2], "dtype": "float32",
            "shards": [[0, "t/part_0", 0, 5], [1, "t/part_1", 5, 5]]}
    for ps, key, start, count in desc["shards"]:
        two_ps.clients[ps].call("create", {"names": [key]}, [table[start:start + count]])
        two_ps.clients[ps].call("set_optimizer", {
            "names": [key], "sparse_updates": "lazy",
            "spec": {"class_name": "SGD", "config": {"learning_rate": 1.0}}})
    return table, desc


def test_push_with_pull_over_two_shards_reads_after_the_update(two_ps):
    table, desc = _table_on_two_ps(two_ps)
    rows = np.array([1, 7], np.int64)                       # one row on each shard
    grad = np.ones((2, 2), np.float32)
    wanted = np.array([0, 7, 9], np.int64)
    values = two_ps.push("c0:0", [(desc, rows, grad)], pull=([desc, desc], [wanted, None]))
    expected = table.copy()
    expected[rows] -= 1.0
    np.testing.assert_array_equal(values[0], expected[wanted])
    np.testing.assert_array_equal(values[1], expected)
    # The step id is applied once per shard: the same push again changes nothing.
    again = two_ps.push("c0:0", [(desc, rows, grad)], pull=([desc], [None]))
    np.testing.assert_array_equal(again[0], expected)
    with pytest.raises(ValueError, match="asynchronous"):
        two_ps.push("c0:1", [(desc, rows, grad)], sync=2, pull=([desc], [None]))


def test_a_rerun_reads_what_a_step_applied_by_one_ps_only_read(two_ps):
    """A worker that died pushing synchronous step c1:0 reached ps 1, not ps 0: ps 1 applied
    the step, ps 0 waits. The re-run reads, with the step's id, the values from before it on
    both, so it pushes the gradient the dead worker computed; a later step reads the new ones."""
    table, desc = _table_on_two_ps(two_ps)
    rows, grad = np.array([1, 7], np.int64), np.ones((2, 2), np.float32)
    two_ps.push("c1:0", [(desc, rows, grad)], sync=2, worker=0)
    two_ps.clients[1].call("push", {"step": "c1:0", "dense": [], "sparse": ["t/part_1"],
                                    "sync": 2, "worker": 1}, [rows[1:] - 5, grad[1:]])
    np.testing.assert_array_equal(two_ps.pull([desc], [rows], step="c1:0")[0], table[rows])
    assert two_ps.pull([desc], [rows])[0][1, 0] == table[7, 0] - 2.0  # ps 1 applied it
    two_ps.push("c1:0", [(desc, rows, grad)], sync=2, worker=1)     # the re-run's push
    expected = table.copy()
    expected[rows] -= 2.0
    np.testing.assert_array_equal(two_ps.pull([desc], [None], after="c1:0")[0], expected)
    with pytest.raises(rpc.RemoteError, match="did not push"):
        two_ps.pull([desc], [np.array([2, 8], np.int64)], step="c1:0")


def test_a_rerun_reads_a_whole_shard_from_before_its_last_step(two_ps):
    table, desc = _table_on_two_ps(two_ps)
    grad = np.ones((10, 2), np.float32)
    for worker in range(2):
        two_ps.push("c1:0", [(desc, None, grad)], sync=2, worker=worker)
    np.testing.assert_array_equal(two_ps.pull([desc], step="c1:0")[0], table)
    np.testing.assert_array_equal(two_ps.pull([desc], step="c0:0")[0], table - 2.0)
    for worker in range(2):
        two_ps.push("c2:0", [(desc, None, grad)], sync=2, worker=worker)
    np.testing.assert_array_equal(two_ps.pull([desc], step="c2:0")[0], table - 2.0)


def test_a_synchronous_step_with_no_rows_of_a_worker_on_a_shard_is_applied(two_ps):
    """Worker 1's rows all fall on shard 0: it still pushes (no rows) to shard 1, which
    applies the step with worker 0's rows alone instead of waiting for worker 1."""
    table, desc = _table_on_two_ps(two_ps)
    two_ps.push("c1:0", [(desc, np.array([1, 7]), np.ones((2, 2), np.float32))], sync=2,
                worker=0)
    two_ps.push("c1:0", [(desc, np.array([1, 2]), np.ones((2, 2), np.float32))], sync=2,
                worker=1)
    expected = table.copy()
    expected[[2, 7]] -= 1.0
    expected[1] -= 2.0                                              # both workers' row
    np.testing.assert_array_equal(two_ps.pull([desc], [None], after="c1:0")[0], expected)
