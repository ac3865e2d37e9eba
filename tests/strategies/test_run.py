"""``strategy.run`` and the cross-replica API on known values."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import stratax as sx


@pytest.fixture(params=[1, 2, 4, 8], ids=lambda n: f"{n}rep")
def strategy(request):
    return sx.MirroredStrategy([f"cpu:{i}" for i in range(request.param)])


def _ids(strategy):
    """A PerReplica value holding each replica's id as float32[2]."""
    return strategy.experimental_distribute_values_from_function(
        lambda ctx: np.full((2,), ctx.replica_id_in_sync_group, np.float32)
    )


def test_all_reduce_ops_on_known_values(strategy):
    n = strategy.num_replicas_in_sync

    def fn(x):
        ctx = sx.get_replica_context()
        return {op.name: ctx.all_reduce(op, x) for op in sx.ReduceOp}

    out = strategy.run(fn, args=(_ids(strategy),))
    ids = np.arange(n, dtype=np.float32)
    np.testing.assert_allclose(out["SUM"], [ids.sum()] * 2)
    np.testing.assert_allclose(out["MEAN"], [ids.mean()] * 2)
    np.testing.assert_allclose(out["MAX"], [n - 1] * 2)
    np.testing.assert_allclose(out["MIN"], [0] * 2)
    # All-reduced values are identical everywhere: returned as replicated arrays.
    assert all(isinstance(v, jax.Array) for v in out.values())


def test_all_gather_concatenates_in_replica_order(strategy):
    n = strategy.num_replicas_in_sync
    out = strategy.run(lambda x: sx.get_replica_context().all_gather(x, axis=0),
                       args=(_ids(strategy),))
    np.testing.assert_array_equal(out, np.repeat(np.arange(n), 2))


def test_per_replica_outputs_reduce_and_gather(strategy):
    n = strategy.num_replicas_in_sync
    per_replica = strategy.run(lambda x: x * 2.0, args=(_ids(strategy),))
    expected = [np.full((2,), 2.0 * i) for i in range(n)]
    for got, want in zip(strategy.experimental_local_results(per_replica), expected, strict=True):
        np.testing.assert_array_equal(got, want)
    assert float(strategy.reduce("sum", per_replica, axis=None).sum()) == pytest.approx(
        sum(w.sum() for w in expected))
    np.testing.assert_allclose(strategy.reduce("mean", per_replica, axis=0),
                               np.mean(np.concatenate(expected)))
    np.testing.assert_allclose(strategy.reduce("max", per_replica, axis=None), expected[-1])
    np.testing.assert_array_equal(strategy.gather(per_replica, axis=0), np.concatenate(expected))


def test_gather_along_inner_axis():
    strategy = sx.MirroredStrategy(["cpu:0", "cpu:1"])
    value = strategy.experimental_distribute_values_from_function(
        lambda ctx: np.arange(6, dtype=np.float32).reshape(2, 3) + 10 * ctx.replica_id_in_sync_group
    )
    parts = [np.arange(6).reshape(2, 3), np.arange(6).reshape(2, 3) + 10]
    np.testing.assert_array_equal(strategy.gather(value, axis=1), np.concatenate(parts, axis=1))
    np.testing.assert_array_equal(strategy.gather(value, axis=-1), np.concatenate(parts, axis=1))
    with pytest.raises(ValueError, match="out of range"):
        strategy.gather(value, axis=2)


def test_replicated_values_count_once_per_replica(strategy):
    n = strategy.num_replicas_in_sync
    x = jnp.arange(3.0)
    np.testing.assert_allclose(strategy.reduce(sx.ReduceOp.SUM, x, axis=None), n * np.arange(3.0))
    np.testing.assert_allclose(strategy.reduce(sx.ReduceOp.MEAN, sx.Mirrored(x), axis=None),
                               np.arange(3.0))
    grid = np.arange(6.0, dtype=np.float32).reshape(2, 3)  # host values, reduced along an axis
    np.testing.assert_allclose(strategy.reduce("sum", grid, axis=0), n * grid.sum(0))
    np.testing.assert_allclose(strategy.reduce("sum", grid, axis=-1), n * grid.sum(1))
    np.testing.assert_allclose(strategy.reduce("max", grid, axis=None), grid)
    assert float(strategy.reduce("sum", 2.5, axis=None)) == 2.5 * n
    assert len(strategy.experimental_local_results(x)) == n


def test_local_gradients_stay_per_replica_until_all_reduced():
    """Gradients are per replica, as in TensorFlow: no implicit all-reduce, no double count."""
    strategy = sx.MirroredStrategy(["cpu:0", "cpu:1", "cpu:2"])
    w = jnp.ones((2,))

    def fn(x, w):
        grads = jax.grad(lambda w: jnp.sum(x * w))(w)
        summed = sx.get_replica_context().all_reduce("sum", grads)
        return grads, summed, w - 0.5 * summed

    local, summed, new_w = strategy.run(fn, args=(_ids(strategy), w))
    assert isinstance(local, sx.PerReplica)
    np.testing.assert_array_equal(strategy.experimental_local_results(local)[2], [2.0, 2.0])
    np.testing.assert_array_equal(summed, [3.0, 3.0])
    assert not isinstance(new_w, sx.PerReplica)
    np.testing.assert_array_equal(new_w, [-0.5, -0.5])


def test_python_values_are_constants_and_kwargs_work():
    strategy = sx.MirroredStrategy(["cpu:0", "cpu:1"])

    def fn(x, scale, training=False):
        return x * scale if training else x

    x = _ids(strategy)
    out = strategy.run(fn, args=(x, 3.0), kwargs={"training": True})
    np.testing.assert_array_equal(strategy.experimental_local_results(out)[1], [3.0, 3.0])
    out = strategy.run(fn, args=(x, 3.0))
    np.testing.assert_array_equal(strategy.experimental_local_results(out)[1], [1.0, 1.0])


def test_replica_id_and_random_numbers():
    strategy = sx.MirroredStrategy(["cpu:0", "cpu:1"])

    def fn(key):
        ctx = sx.get_replica_context()
        same = jax.random.normal(key, (3,))
        own = jax.random.normal(jax.random.fold_in(key, ctx.replica_id_in_sync_group), (3,))
        return same, own

    same, own = strategy.run(fn, args=(jax.random.key_data(jax.random.key(0)),))
    assert not isinstance(same, sx.PerReplica)  # same key everywhere: same numbers
    first, second = strategy.experimental_local_results(own)
    assert not np.allclose(first, second)


def test_run_errors():
    strategy = sx.MirroredStrategy(["cpu:0", "cpu:1"])
    other = sx.MirroredStrategy(["cpu:0", "cpu:1", "cpu:2"])
    with pytest.raises(ValueError, match="has 3 components"):
        strategy.run(lambda x: x, args=(_ids(other),))
    with pytest.raises(RuntimeError, match="inside a replica function"):
        strategy.run(lambda: strategy.run(lambda: 1.0))


def test_run_compiles_once_per_structure():
    strategy = sx.MirroredStrategy(["cpu:0", "cpu:1"])
    traces = []

    def fn(x):
        traces.append(1)
        return x + 1

    for _ in range(3):
        strategy.run(fn, args=(_ids(strategy),))
    first = len(traces)
    for _ in range(3):
        strategy.run(fn, args=(_ids(strategy),))
    assert len(traces) == first  # no retrace for the same structure and shapes


@pytest.mark.parametrize("tpu", [False, True], ids=["mirrored", "tpu"])
def test_run_inside_jit_trains_as_one_device(tpu):
    """The guide's multi-step ``@tf.function`` loop in JAX form: ``strategy.run`` and
    ``strategy.reduce`` inside the user's ``jax.jit``, over several distributed batches."""
    if tpu:
        resolver = sx.cluster_resolver.TPUClusterResolver(tpu="", emulation_cores=8)
        sx.tpu.experimental.initialize_tpu_system(resolver)
        strategy = sx.TPUStrategy(resolver)
    else:
        strategy = sx.MirroredStrategy([f"cpu:{i}" for i in range(4)])
    rng = np.random.default_rng(0)
    x = rng.random((48, 3), np.float32)
    y = x @ np.array([1.0, -2.0, 0.5], np.float32)

    def loss(w, bx, by):
        return jnp.sum((bx @ w - by) ** 2) / 16.0  # the global batch: 16 rows

    def grad_step(w, batch):
        return jax.grad(loss)(w, *batch)

    def train(w, batches):
        for batch in batches:
            gradient = strategy.reduce("SUM", strategy.run(grad_step, args=(w, batch)),
                                       axis=None)
            w = w - 0.1 * gradient
        return w

    batches = list(strategy.experimental_distribute_dataset(
        [(x[i:i + 16], y[i:i + 16]) for i in range(0, 48, 16)]))
    w = jnp.zeros(3)
    for i in range(0, 48, 16):  # one device
        w = w - 0.1 * jax.grad(loss)(w, x[i:i + 16], y[i:i + 16])
    jitted = jax.jit(train)(jnp.zeros(3), batches)
    assert not np.allclose(jitted, 0.0)
    np.testing.assert_allclose(jitted, w, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(jitted, train(jnp.zeros(3), batches), rtol=1e-6, atol=1e-7)


def test_compute_average_loss_uses_global_batch():
    per_example = jnp.array([1.0, 2.0, 3.0, 4.0])
    assert float(sx.compute_average_loss(per_example, global_batch_size=8)) == pytest.approx(1.25)
    assert float(sx.compute_average_loss(per_example, sample_weight=jnp.array([1, 0, 1, 0]),
                                         global_batch_size=4)) == pytest.approx(1.0)
    strategy = sx.MirroredStrategy(["cpu:0", "cpu:1"])
    batch = strategy.experimental_distribute_values_from_function(
        lambda ctx: np.ones((4,), np.float32))
    # Default global batch = per-replica batch * replicas = 8.
    out = strategy.run(lambda x: sx.compute_average_loss(x), args=(batch,))
    assert float(strategy.reduce("sum", out, axis=None)) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="positive"):
        sx.compute_average_loss(per_example, global_batch_size=0)


def test_default_strategy_run_calls_function_directly():
    strategy = sx.get_strategy()
    assert strategy.run(lambda x: x + 1, args=(1,)) == 2
