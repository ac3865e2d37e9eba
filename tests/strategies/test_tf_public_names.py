"""The rest of ``tf.distribute``'s public API (issue 49 #10): ``DistributedValues``,
``InputReplicationMode``, ``RunOptions`` and ``experimental_set_strategy``, with TensorFlow's
semantics (tensorflow/python/distribute/distribute_lib.py, input_lib's options)."""

import threading

import jax.numpy as jnp
import numpy as np
import pytest

import stratax as sx
from stratax._src.strategies.default import DefaultStrategy


def _strategy():
    return sx.MirroredStrategy(["cpu:0", "cpu:1"])


def test_distributed_values_is_the_base_of_per_replica_and_mirrored():
    strategy = _strategy()
    per_replica = strategy.experimental_distribute_values_from_function(
        lambda ctx: np.full((2,), ctx.replica_id_in_sync_group, np.float32))
    assert isinstance(per_replica, sx.DistributedValues)
    assert isinstance(strategy.run(lambda x: x + 1.0, args=(per_replica,)),
                      sx.DistributedValues)
    assert isinstance(sx.Mirrored(jnp.float32(0.1)), sx.DistributedValues)
    batch = next(iter(strategy.experimental_distribute_dataset(
        [(np.zeros((4, 1), np.float32),)])))
    assert all(isinstance(leaf, sx.DistributedValues) for leaf in batch)
    assert not isinstance(np.zeros(2), sx.DistributedValues)


def test_input_replication_mode_as_tensorflow_names_it():
    assert [m.name for m in sx.InputReplicationMode] == ["PER_WORKER", "PER_REPLICA"]
    assert sx.InputReplicationMode.PER_WORKER.value == "PER_WORKER"
    for given in (sx.InputReplicationMode.PER_WORKER, "PER_WORKER", "per_worker"):
        options = sx.InputOptions(experimental_replication_mode=given)
        assert options.experimental_replication_mode is sx.InputReplicationMode.PER_WORKER
    assert (sx.InputOptions().experimental_replication_mode
            is sx.InputReplicationMode.PER_WORKER)
    with pytest.raises(ValueError, match=r"PER_REPLICA is not supported.*"
                                         r"sx.InputReplicationMode.PER_WORKER"):
        sx.InputOptions(experimental_replication_mode=sx.InputReplicationMode.PER_REPLICA)
    with pytest.raises(ValueError, match=r"'PER_HOST' is not an InputReplicationMode"):
        sx.InputOptions(experimental_replication_mode="PER_HOST")


def test_run_options_are_taken_and_checked():
    strategy = _strategy()
    ones = jnp.ones((2,))
    options = sx.RunOptions(experimental_enable_dynamic_batch_size=False)
    assert options.experimental_bucketizing_dynamic_shape is False
    np.testing.assert_array_equal(strategy.run(lambda x: x * 2.0, args=(ones,), options=options),
                                  [2.0, 2.0])
    with pytest.raises(TypeError, match=r"takes an sx.RunOptions, got dict"):
        strategy.run(lambda x: x, args=(ones,), options={"dynamic": True})


def test_experimental_set_strategy_is_a_scope_left_open():
    strategy = _strategy()
    try:
        sx.experimental_set_strategy(strategy)
        assert sx.get_strategy() is strategy and sx.has_strategy()
        assert sx.in_cross_replica_context()
        with strategy.scope():  # the same strategy's scope may still be entered
            assert sx.get_strategy() is strategy
        other = sx.OneDeviceStrategy("cpu:0")
        sx.experimental_set_strategy(other)  # replaces it
        assert sx.get_strategy() is other
        seen = []
        thread = threading.Thread(target=lambda: seen.append(sx.has_strategy()))
        thread.start()
        thread.join()
        assert seen == [False]  # per thread, as scopes are
    finally:
        sx.experimental_set_strategy(None)
    assert isinstance(sx.get_strategy(), DefaultStrategy) and not sx.has_strategy()


def test_experimental_set_strategy_inside_a_scope_is_an_error():
    strategy = _strategy()
    with strategy.scope(), pytest.raises(RuntimeError, match=r"called inside the scope of .*"
                                                              r"outside any `with strategy"):
        sx.experimental_set_strategy(strategy)
    assert not sx.has_strategy()
