"""TensorFlow's variable API on the chief (outside steps), on shards held in a dict here; the
cluster test (`test_cluster.py`) runs the same operations against real parameter servers."""

import types

import numpy as np
import pytest

from stratax._src.parameter_server.variables import Placement, PSVariable, ShardedVariable


@pytest.fixture
def table():
    store, pulls = {}, []

    def pull(var):
        pulls.append(var.name)
        return np.concatenate([store[p.key] for p in var.placements]).copy()

    def assign(var, value):
        base = var.placements[0].start
        for p in var.placements:
            store[p.key] = np.array(value[p.start - base:p.start - base + p.rows])

    placements = [Placement(0, "t/part_0", 0, 4), Placement(1, "t/part_1", 4, 3),
                  Placement(0, "t/part_2", 7, 3)]
    full = np.arange(20, dtype=np.float32).reshape(10, 2)
    for p in placements:
        store[p.key] = full[p.start:p.start + p.rows].copy()
    var = ShardedVariable("t", (10, 2), np.float32, True, placements, pull, assign)
    var.pulls = pulls
    return var


def slices(indices, values):
    return types.SimpleNamespace(indices=np.asarray(indices), values=np.asarray(values))


def test_scatter_ops_touch_only_the_shards_holding_the_rows(table):
    table.scatter_update(slices([8], [[-1.0, -2.0]]))
    assert table.pulls == ["t/part_2"]
    table.scatter_add(slices([0, 0], np.ones((2, 2))))  # repeats compound, as in TensorFlow
    table.scatter_max(slices([5], [[100.0, 0.0]]))
    table.scatter_sub(slices([9], [[1.0, 1.0]]))
    table.scatter_min(slices([1], [[0.0, 0.0]]))
    value = np.asarray(table)
    assert value[8].tolist() == [-1.0, -2.0] and value[0].tolist() == [2.0, 3.0]
    assert value[5].tolist() == [100.0, 11.0] and value[9].tolist() == [17.0, 18.0]
    assert value[1].tolist() == [0.0, 0.0] and value[2].tolist() == [4.0, 5.0]


SCATTER_OPS = ["scatter_update", "scatter_add", "scatter_sub", "scatter_mul", "scatter_div",
               "scatter_max", "scatter_min"]


@pytest.mark.parametrize("op", SCATTER_OPS)
def test_scatter_ops_equal_tensorflows_on_a_plain_variable(table, op):
    # TensorFlow's sharded_variable_test.test_scatter_ops_even_partition, from a value that a
    # multiplication or division changes, with a repeated row (TF compounds repeats in turn).
    tf = pytest.importorskip("tensorflow")
    delta = tf.IndexedSlices(values=tf.constant([[1.5, 2.0], [3.0, -4.0], [0.5, 5.0],
                                                 [-2.0, 6.0]]),
                             indices=tf.constant([0, 4, 4, 9]))
    expected = tf.Variable(np.asarray(table))
    getattr(expected, op)(delta)
    table.pulls.clear()
    assert getattr(table, op)(delta) is table
    assert table.pulls == ["t/part_0", "t/part_1", "t/part_2"]  # each shard once
    np.testing.assert_allclose(np.asarray(table), expected.numpy(), rtol=1e-6)


def test_integer_scatter_div_truncates_as_tensorflow_and_refuses_zero():
    tf = pytest.importorskip("tensorflow")
    value = np.array([[-7, 7], [9, 3], [5, 5]], np.int32)
    store = {"i": value.copy()}
    var = PSVariable("i", (3, 2), np.int32, True, [Placement(0, "i", 0, 3)],
                     lambda v: store["i"].copy(), lambda v, x: store.update(i=np.array(x)))
    delta = tf.IndexedSlices(values=tf.constant([[2, -2], [2, 2], [1, 3]]),
                             indices=tf.constant([0, 1, 1]))
    expected = tf.Variable(value)
    expected.scatter_div(delta)
    var.scatter_div(delta)
    assert store["i"].tolist() == expected.numpy().tolist() == [[-3, -3], [4, 0], [5, 5]]
    with pytest.raises(ValueError, match=r"scatter_div on 'i': sparse_delta\.values holds a zero"):
        var.scatter_div(slices([2, 0], [[1, 1], [0, 1]]))
    assert store["i"].tolist() == [[-3, -3], [4, 0], [5, 5]]   # no row changed


def test_reads_and_operators_pull_the_value(table):
    assert table.sparse_read([[9, 0], [4, 4]]).shape == (2, 2, 2)
    assert table.sparse_read([9, 0])[:, 0].tolist() == [18.0, 0.0]
    assert (table + 1)[0].tolist() == [1.0, 2.0] and (1 - table)[1].tolist() == [-1.0, -2.0]
    assert (table * 2)[1, 1] == 6.0 and (-table)[0, 1] == -1.0 and int((table > 9).sum()) == 10
    assert table[2:4].tolist() == [[4.0, 5.0], [6.0, 7.0]]
    assert table.assign_add(np.ones((10, 2))) is table and table[0, 0] == 1.0
    assert table.variables[1].device == "/job:ps/replica:0/task:1/device:CPU:0"
    assert len({table, table}) == 1 and {table: 1}[table] == 1   # hashed by identity


def test_equality_is_elementwise_as_tensorflows(table):
    # TensorFlow's sharded_variable_test.test_operator_overload: two ShardedVariables compare
    # elementwise ([True, True]), as their sum adds.
    tf = pytest.importorskip("tensorflow")
    store = {}
    placements = [Placement(0, "a/part_0", 0, 1), Placement(1, "a/part_1", 1, 1)]

    def sharded(name, value):
        for p in placements:
            store[name, p.key] = np.float32(value[p.start:p.start + p.rows])
        return ShardedVariable(
            name, (2,), np.float32, True, placements,
            lambda v: np.concatenate([store[name, p.key] for p in v.placements]),
            lambda v, x: None)

    sv1, sv2 = sharded("sv1", [1.0, 2.0]), sharded("sv2", [1.0, 2.0])
    assert (sv1 == sv2).tolist() == [True, True] and (sv1 != sv2).tolist() == [False, False]
    assert (sv1 + sv2).tolist() == [2.0, 4.0]
    assert (sv1 == [1.0, 3.0]).tolist() == [True, False] and (sv1 == 2.0).tolist() == [False, True]
    assert (sv1 == None) is False and (sv1 != None) is True  # noqa: E711 - TF's == on None
    assert (sv1 == np.ones(3)) is False and (sv1 != np.ones(3)) is True  # shapes that differ
    assert (table == sv1).shape == (10, 2)                                  # ... or broadcast
    tf_sharded = tf.Variable([1.0, 2.0]) == tf.Variable([1.0, 3.0])
    assert (sv1 == sharded("sv3", [1.0, 3.0])).tolist() == tf_sharded.numpy().tolist()
    assert not any(sv1 is v for v in [sv2])   # how stratax looks a variable up in a list


def test_bad_row_updates_are_errors_naming_the_variable(table):
    with pytest.raises(IndexError, match=r"'t' must be in \[0, 10\), got 3..10"):
        table.scatter_add(slices([3, 10], np.ones((2, 2))))
    with pytest.raises(TypeError, match=r"\.indices and \.values"):
        table.scatter_update(np.ones((2, 2)))
    scalar = PSVariable("s", (), np.float32, True, [Placement(0, "s", 0, 1)],
                        lambda v: np.float32(2.0), lambda v, x: None)
    with pytest.raises(ValueError, match="'s' is a scalar"):
        scalar.sparse_read([0])
