"""Parameter-server optimizer updates equal Keras' own; lazy and dense row-sparse semantics."""

import keras
import numpy as np
import pytest

from stratax._src.parameter_server.program import optimizer_spec
from stratax._src.parameter_server.tasks.optimizers import ShardOptimizer

CASES = [
    keras.optimizers.SGD(0.1),
    keras.optimizers.SGD(0.1, momentum=0.9),
    keras.optimizers.SGD(0.1, momentum=0.9, nesterov=True),
    keras.optimizers.Adam(0.01),
]


@pytest.mark.parametrize("shape", [(5, 3), ()], ids=["matrix", "scalar"])
@pytest.mark.parametrize("optimizer", CASES, ids=lambda o: str(o.get_config()))
def test_dense_updates_equal_keras(optimizer, shape):
    optimizer = optimizer.from_config(optimizer.get_config())  # fresh slots for each shape
    rng = np.random.default_rng(0)
    start = np.asarray(rng.normal(size=shape), np.float32)
    grads = [np.asarray(rng.normal(size=shape), np.float32) for _ in range(4)]
    var = keras.Variable(start)
    ours = start.copy()
    shard = ShardOptimizer(optimizer_spec(optimizer), ours)
    for g in grads:
        optimizer.apply_gradients([(g, var)])
        shard.apply_dense(ours, g)
    np.testing.assert_allclose(ours, var.numpy(), rtol=1e-5, atol=1e-6)
    assert shard.iterations == 4


@pytest.mark.parametrize("name", ["SGD", "Adam"])
def test_dense_mode_rows_equal_dense_update(name):
    spec = {"class_name": name, "config": {"learning_rate": 0.1, "momentum": 0.5}}
    rng = np.random.default_rng(1)
    a = rng.normal(size=(6, 2)).astype(np.float32)
    b = a.copy()
    dense_opt, rows_opt = ShardOptimizer(spec, a), ShardOptimizer(spec, b, "dense")
    for _ in range(3):
        rows = np.array([1, 4])
        g = rng.normal(size=(2, 2)).astype(np.float32)
        full = np.zeros_like(a)
        full[rows] = g
        dense_opt.apply_dense(a, full)
        rows_opt.apply_rows(b, rows, g)
    np.testing.assert_allclose(a, b, rtol=1e-6)


@pytest.mark.parametrize("shape", [(20_000, 8), (37, 5), (300,)])
def test_dense_rule_adam_on_rows_is_bitwise_the_scattered_dense_update(shape):
    """Keras' rule for a row-sparse Adam gradient runs a block of rows at a time without
    building the dense gradient (the 20,000-row table spans several blocks); it must give the
    very bits of the dense update of the scattered gradient."""
    spec = {"class_name": "Adam", "config": {"learning_rate": 0.01}}
    rng = np.random.default_rng(2)
    a = rng.normal(size=shape).astype(np.float32)
    b = a.copy()
    dense_opt, rows_opt = ShardOptimizer(spec, a), ShardOptimizer(spec, b, "dense")
    for _ in range(3):
        rows = np.unique(rng.integers(0, shape[0], size=min(40, shape[0])))
        g = rng.normal(size=(rows.size, *shape[1:])).astype(np.float32)
        full = np.zeros_like(a)
        full[rows] = g
        dense_opt.apply_dense(a, full)
        rows_opt.apply_rows(b, rows, g)
    assert np.array_equal(a, b)
    assert all(np.array_equal(dense_opt.slots[k], rows_opt.slots[k]) for k in ("m", "v"))
    assert rows_opt.iterations == 3


def test_lazy_adam_touches_only_rows():
    spec = {"class_name": "Adam", "config": {"learning_rate": 0.1}}
    value = np.ones((4, 2), np.float32)
    opt = ShardOptimizer(spec, value, "lazy")
    opt.apply_rows(value, np.array([0]), np.ones((1, 2), np.float32))
    opt.apply_rows(value, np.array([2]), np.ones((1, 2), np.float32))
    np.testing.assert_array_equal(value[[1, 3]], 1.0)
    assert (value[[0, 2]] < 1.0).all()
    # Row 0 was not touched by the second step: its moments did not decay (lazy semantics).
    assert opt.slots["m"][0, 0] == pytest.approx(0.1)


def test_unsupported_optimizer_is_named():
    with pytest.raises(ValueError, match="RMSprop"):
        ShardOptimizer({"class_name": "RMSprop", "config": {}}, np.zeros(2, np.float32))
    with pytest.raises(TypeError, match="learning_rate"):
        ShardOptimizer({"class_name": "SGD", "config": {"learning_rate": {"class_name": "X"}}},
                       np.zeros(2, np.float32))


def test_options_not_applied_are_refused():
    spec = optimizer_spec(keras.optimizers.Adam(0.1, clipnorm=1.0))
    with pytest.raises(ValueError, match="clipnorm"):
        ShardOptimizer(spec, np.zeros(2, np.float32))
