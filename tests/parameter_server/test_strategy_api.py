"""ParameterServerStrategy's strategy-side API, TensorFlow's cases
(``parameter_server_strategy_v2_test``): an ``sx.Strategy``, ``run``/``reduce`` outside
``schedule`` (a warning, then run on the chief), ``experimental_local_results``,
``extended.colocate_vars_with`` and ``create_variable(aggregation=...)``."""

import enum
import logging
import types

import keras
import numpy as np
import pytest
from cluster_helpers import local_cluster  # noqa: F401 - a fixture

import stratax as sx

pytestmark = pytest.mark.timeout(180)


def test_run_and_reduce_outside_schedule_warn_and_run_on_the_chief(local_cluster, caplog):  # noqa: F811
    strategy = local_cluster()
    assert isinstance(strategy, sx.Strategy)
    with strategy.scope():
        v = strategy.create_variable(np.int64(1), name="v")

    def step_fn(iterator):
        ctx = sx.get_replica_context()
        return next(iterator) + v, ctx.replica_id_in_sync_group, sx.in_cross_replica_context()

    with caplog.at_level(logging.WARNING):
        out, replica, cross = strategy.run(step_fn, args=(iter(range(8)),))
        assert (out, replica, cross) == (1, 0, False)   # the variable's value, read now
        assert strategy.reduce("SUM", None, axis=None) is None
    warnings = [r.getMessage() for r in caplog.records if "outside ClusterCoordinator" in
                r.getMessage()]
    assert len(warnings) == 2 and "ParameterServerStrategy.run" in warnings[0]
    v.assign(np.int64(5))
    assert strategy.run(lambda: v + 1) == 6                # pulled afresh on every call
    per_example = strategy.run(lambda: np.arange(6, dtype=np.float32))
    assert float(strategy.reduce(sx.ReduceOp.MEAN, per_example, axis=0)) == 2.5
    assert float(strategy.reduce("SUM", np.float32(3.0))) == 3.0   # one replica: counted once
    (local,) = strategy.experimental_local_results(per_example)
    np.testing.assert_array_equal(local, np.arange(6))
    # The rest of sx.Strategy's API works on the chief's one replica.
    assert strategy.mesh.devices.size == 1 and len(strategy.devices) == 1
    np.testing.assert_array_equal(strategy.gather(per_example, axis=0), np.arange(6))
    values = strategy.experimental_distribute_values_from_function(
        lambda ctx: np.float32(ctx.replica_id_in_sync_group + 7))
    assert [float(x) for x in strategy.experimental_local_results(values)] == [7.0]
    with strategy.scope():
        assert sx.get_strategy() is strategy and sx.in_cross_replica_context()
    assert repr(strategy) == "ParameterServerStrategy(num_replicas_in_sync=1)"


def test_colocate_vars_with_places_new_variables_with_the_given_one(local_cluster):  # noqa: F811
    strategy = local_cluster(variable_partitioner=sx.partitioners.FixedShardsPartitioner(2))
    v1 = strategy.create_variable(np.float32(0.0), name="v1")
    with strategy.extended.colocate_vars_with(v1):
        v2 = strategy.create_variable(np.float32(1.0), name="v2")
        table = strategy.create_variable(np.zeros((10, 2), np.float32), name="slots")
    v3 = strategy.create_variable(np.float32(2.0), name="v3")
    assert v1.device == v2.device == table.device and v1.device != v3.device
    assert not isinstance(table, sx.ShardedVariable)       # colocated: not partitioned
    assert isinstance(strategy.create_variable(np.zeros((10, 2), np.float32)),
                      sx.ShardedVariable)                 # the partitioner applies again
    assert float(v2.numpy()) == 1.0
    with (pytest.raises(TypeError, match="colocate_vars_with needs a variable of this strategy"),
          strategy.extended.colocate_vars_with(np.zeros(3))):
        pass


def test_extended_answers_as_tensorflow_for_parameter_servers(local_cluster):  # noqa: F811
    strategy = local_cluster()
    extended = strategy.extended
    assert extended is strategy.extended
    # Only the chief runs the program past the constructor: it checkpoints and initializes.
    assert extended.should_checkpoint and extended.should_save_summary
    assert extended.experimental_should_init and extended.should_init
    assert not extended.experimental_require_static_shapes
    assert extended.worker_devices == tuple(strategy.devices)  # the chief's, for run outside
    assert extended.parameter_devices == ("/job:ps/replica:0/task:0/device:CPU:0",
                                          "/job:ps/replica:0/task:1/device:CPU:0")
    b = strategy.create_variable(np.float32(0.0), name="b")
    a = strategy.create_variable(np.float32(0.0), name="a")
    assert a.device != b.device
    assert extended.non_slot_devices([b, a]) == (a.device,)  # the first by name
    with strategy.scope():
        layer_var = keras.Variable(np.zeros(2, np.float32), name="k")
    outside = keras.Variable(np.zeros(2, np.float32), name="outside")
    assert extended.variable_created_in_scope(a)
    assert extended.variable_created_in_scope(layer_var)
    assert not extended.variable_created_in_scope(outside)
    # Outside schedule: reduced on the chief's one replica, as strategy.reduce.
    assert float(extended.reduce_to("SUM", np.float32(3.0), a)) == 3.0
    assert extended.update(a, lambda v, x: v.assign(x), args=(np.float32(7.0),)) is a
    assert float(a.numpy()) == 7.0


class VariableAggregation(enum.Enum):   # TensorFlow's enum, by name
    NONE = 0
    SUM = 1
    MEAN = 2
    ONLY_FIRST_REPLICA = 3


def test_create_variable_takes_an_aggregation(local_cluster):  # noqa: F811
    strategy = local_cluster(variable_partitioner=sx.partitioners.FixedShardsPartitioner(2))
    assert strategy.create_variable(np.float32(0.0)).aggregation == "none"
    mean = strategy.create_variable(np.zeros((4, 1), np.float32), aggregation="MEAN")
    assert mean.aggregation == "mean" and {v.aggregation for v in mean.variables} == {"mean"}
    first = strategy.create_variable(np.float32(0.0),
                                     aggregation=VariableAggregation.ONLY_FIRST_REPLICA)
    assert first.aggregation == "only_first_replica"
    with pytest.raises(ValueError, match=r"aggregation='median' is not a variable aggregation"):
        strategy.create_variable(np.float32(0.0), aggregation="median")
    import keras

    with strategy.scope():   # a Keras variable keeps its own aggregation on the ps
        counter = keras.Variable(np.zeros(2, np.float32), aggregation="sum", trainable=False)
    assert strategy.place_variables(counter).aggregation == "sum"


def test_a_distributed_dataset_used_directly_on_the_chief_is_a_value_error(local_cluster):  # noqa: F811
    # TensorFlow's testDistributeDatasetUsedDirectly.
    tf = pytest.importorskip("tensorflow")
    strategy = local_cluster()
    dataset = tf.data.Dataset.range(3)
    for distributed in (strategy.experimental_distribute_dataset(dataset),
                        strategy.distribute_datasets_from_function(lambda: dataset)):
        with pytest.raises(ValueError, match=r"pass it to coordinator\.create_per_worker_dataset"):
            iter(distributed)


def test_scatter_mul_and_div_update_the_shards_on_the_servers(local_cluster):  # noqa: F811
    tf = pytest.importorskip("tensorflow")
    strategy = local_cluster(variable_partitioner=sx.partitioners.FixedShardsPartitioner(3))
    start = np.arange(1, 19, dtype=np.float32).reshape(9, 2)
    table = strategy.create_variable(start, name="scaled")
    expected = tf.Variable(start)
    for op, delta in [("scatter_mul", tf.IndexedSlices(tf.constant([[2.0, 3.0], [4.0, 0.5]]),
                                                       tf.constant([8, 8]))),
                      ("scatter_div", tf.IndexedSlices(tf.constant([[4.0, -2.0], [8.0, 1.0]]),
                                                       tf.constant([0, 4])))]:
        assert getattr(table, op)(delta) is table
        getattr(expected, op)(delta)
    assert len(table.variables) == 3 and len({p.ps for p in table.placements}) == 2
    np.testing.assert_allclose(table.numpy(), expected.numpy(), rtol=1e-6)
    assert table.numpy()[8].tolist() == [17.0 * 8, 18.0 * 1.5]   # a repeated row compounds


def test_sharded_variables_compare_elementwise_and_hash_by_identity(local_cluster):  # noqa: F811
    # TensorFlow's sharded_variable_test.test_operator_overload, on the servers.
    strategy = local_cluster(variable_partitioner=sx.partitioners.FixedShardsPartitioner(2))
    sv1 = strategy.create_variable(np.array([1.0, 2.0], np.float32), name="sv1")
    sv2 = strategy.create_variable(np.array([1.0, 2.0], np.float32), name="sv2")
    assert isinstance(sv1, sx.ShardedVariable) and isinstance(sv2, sx.ShardedVariable)
    assert (sv1 == sv2).tolist() == [True, True] and (sv1 + sv2).tolist() == [2.0, 4.0]
    sv2.scatter_update(types.SimpleNamespace(indices=np.array([1]), values=np.array([5.0])))
    assert (sv1 != sv2).tolist() == [False, True] and (sv1 == sv2).tolist() == [True, False]
    assert {sv1: "a", sv2: "b"}[sv2] == "b" and len({sv1, sv2, sv1}) == 2
    with strategy.extended.colocate_vars_with(sv2):   # found among variables that compare equal
        slot = strategy.create_variable(np.zeros(2, np.float32), name="slot")
    assert slot.device == sv2.device


def test_one_replica_fn_reads_variables_on_the_chief_and_on_a_worker(local_cluster,  # noqa: F811
                                                                      caplog):
    # TensorFlow's testRunNotUsedWithClusterCoordinator and StrategyIntegrationTest's
    # testRunNotUsedWithClusterCoordinatorSchedule: the replica function that reads variables
    # runs on the chief outside schedule (a warning) and on a worker inside it.
    import jax.numpy as jnp
    import keras

    strategy = local_cluster(variable_partitioner=sx.partitioners.FixedShardsPartitioner(2))
    coordinator = sx.coordinator.ClusterCoordinator(strategy)
    with strategy.scope():
        v = strategy.create_variable(np.float32(1.0), name="v")
        table = strategy.create_variable(np.arange(12, dtype=np.float32).reshape(6, 2))
        dense = keras.Variable(np.full(2, 3.0, np.float32), name="dense")
        counter = strategy.create_variable(np.float32(0.0), name="counter", per_worker=True)

    def replica_fn():
        value = strategy.read(v)
        rows, positions = strategy.read_rows(table, jnp.array([4, 0, 4]))
        return value + 1, value - 1, rows[positions], strategy.read(dense) * 2

    expected = [2.0, 0.0, [[8.0, 9.0], [0.0, 1.0], [8.0, 9.0]], [6.0, 6.0]]
    with caplog.at_level(logging.WARNING):
        outside = strategy.run(replica_fn)
    assert "outside ClusterCoordinator.schedule" in caplog.text
    assert [np.asarray(x).tolist() for x in outside] == expected
    assert not strategy.is_placed(dense)          # read on the chief: not placed by the read
    scheduled = coordinator.schedule(lambda: strategy.run(replica_fn)).fetch()
    assert [np.asarray(x).tolist() for x in scheduled] == expected
    v.assign(np.float32(5.0))
    strategy.place_variables(dense).assign(np.full(2, 10.0, np.float32))   # the ps' value now
    outside = strategy.run(replica_fn)
    assert float(outside[0]) == 6.0 and np.asarray(outside[3]).tolist() == [20.0, 20.0]
    assert float(strategy.read(v)) == 5.0       # between steps too
    with pytest.raises(RuntimeError, match=r"per-worker variable has one value per worker; "
                                        r"counter\.read_all\(\) gives them"):
        strategy.run(lambda: strategy.read(counter))
    with pytest.raises(RuntimeError, match=r"`strategy\.read` is only valid inside "
                                           r"`strategy\.run"):
        coordinator.schedule(lambda: strategy.read(v))   # in a scheduled function, not in run
