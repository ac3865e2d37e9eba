"""The strategy stack: scopes, default strategy, replica contexts, mixed scopes, ReduceOp."""

import threading

import pytest

import stratax as sx
from stratax._src.strategies.default import DefaultStrategy


def test_default_strategy_outside_any_scope():
    strategy = sx.get_strategy()
    assert isinstance(strategy, DefaultStrategy)
    assert strategy.num_replicas_in_sync == 1
    assert not sx.has_strategy()
    assert not sx.in_cross_replica_context()
    replica = sx.get_replica_context()
    assert replica.replica_id_in_sync_group == 0
    assert replica.all_reduce(sx.ReduceOp.SUM, 3.0) == 3.0


def test_scope_makes_strategy_current_and_restores_it():
    strategy = sx.MirroredStrategy(["cpu:0", "cpu:1"])
    with strategy.scope() as entered:
        assert entered is strategy
        assert sx.get_strategy() is strategy
        assert sx.has_strategy()
        assert sx.in_cross_replica_context()
        assert sx.get_replica_context() is None
        with strategy.scope():  # re-entering the same strategy is allowed
            assert sx.get_strategy() is strategy
    assert isinstance(sx.get_strategy(), DefaultStrategy)
    assert not sx.has_strategy()


def test_scope_is_restored_after_an_exception():
    strategy = sx.OneDeviceStrategy("cpu:0")
    with pytest.raises(KeyError), strategy.scope():
        raise KeyError("boom")
    assert not sx.has_strategy()


def test_mixing_two_strategies_scopes_is_an_error():
    first = sx.MirroredStrategy(["cpu:0", "cpu:1"])
    second = sx.OneDeviceStrategy("cpu:0")
    with first.scope():
        with pytest.raises(sx.MixedStrategyError, match="cannot be mixed"), second.scope():
            pass
        assert sx.get_strategy() is first


def test_scope_is_per_thread():
    strategy = sx.OneDeviceStrategy("cpu:0")
    seen = []
    with strategy.scope():
        worker = threading.Thread(target=lambda: seen.append(sx.has_strategy()))
        worker.start()
        worker.join()
    assert seen == [False]


def test_replica_context_inside_run():
    strategy = sx.MirroredStrategy(["cpu:0", "cpu:1"])
    flags = []

    def fn():
        flags.append((sx.in_cross_replica_context(), sx.get_strategy() is strategy))
        return sx.get_replica_context().replica_id_in_sync_group

    with strategy.scope():
        ids = strategy.run(fn)
    assert flags == [(False, True)] * len(flags) and flags
    assert [int(i) for i in strategy.experimental_local_results(ids)] == [0, 1]


def test_reduce_op_from_string():
    assert sx.ReduceOp.from_string("mean") is sx.ReduceOp.MEAN
    assert sx.ReduceOp.from_string(sx.ReduceOp.MAX) is sx.ReduceOp.MAX
    with pytest.raises(ValueError, match="Unknown reduce op 'avg'"):
        sx.ReduceOp.from_string("avg")
