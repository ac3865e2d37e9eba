"""``strategy.run``'s compiler: one Python trace per argument structure; closures over values."""

import functools

import jax
import jax.numpy as jnp
import keras
import numpy as np
import pytest

import stratax as sx
from stratax._src.strategies import run_compiler
from stratax._src.strategies.run_compiler import RunCompiler


def _strategy(n):
    return sx.MirroredStrategy([f"cpu:{i}" for i in range(n)])


def _rows(strategy, rows_per_replica=2, width=4):
    """A PerReplica batch: replica r holds rows r*k .. r*k+k-1 of arange(n*k*width)."""
    n = strategy.num_replicas_in_sync
    full = np.arange(n * rows_per_replica * width, dtype=np.float32).reshape(-1, width) / 10
    (batch,) = strategy.experimental_distribute_dataset([full])
    return full, batch


@pytest.mark.parametrize("n", [1, 2, 4])
def test_replica_function_is_traced_once_per_structure(n):
    strategy = _strategy(n)
    traces = []

    def fn(x, scale):
        traces.append(1)
        ctx = sx.get_replica_context()
        return ctx.all_reduce("sum", x * scale), x + 1.0

    _, batch = _rows(strategy)
    strategy.run(fn, args=(batch, jnp.float32(2)))
    assert len(traces) == 1  # first call: exactly one trace (no probe trace)
    strategy.run(fn, args=(batch, jnp.float32(3)))
    assert len(traces) == 1  # same structure and shapes: compiled step reused
    _, wider = _rows(strategy, width=6)
    strategy.run(fn, args=(wider, jnp.float32(2)))
    assert len(traces) == 2  # a new shape: one more trace
    strategy.run(fn, args=(batch, jnp.float32(2)))
    assert len(traces) == 2  # the first structure is still cached


def test_compile_cache_is_bounded_lru():
    strategy = _strategy(2)
    to_global = functools.partial(jax.device_put, device=strategy.batch_sharding())
    runner = RunCompiler(strategy, strategy.mesh, to_global, cache_size=3)
    traces = []

    def fn(x):
        traces.append(x.shape)
        return x * 2

    for k in range(1, 5):
        np.testing.assert_array_equal(runner.run(fn, (jnp.ones((2, k)),), {}), np.full((2, k), 2))
    assert runner.cache_info() == 3 and len(traces) == 4
    runner.run(fn, (jnp.ones((2, 4)),), {})  # recent: cached
    runner.run(fn, (jnp.ones((2, 2)),), {})  # still cached; now the most recent
    assert len(traces) == 4
    runner.run(fn, (jnp.ones((2, 1)),), {})  # evicted first: traced again
    runner.run(fn, (jnp.ones((2, 2)),), {})  # kept, as recently used
    assert traces[4:] == [(2, 1)]


@pytest.mark.parametrize("n", [2, 4])
def test_closure_over_jax_and_numpy_arrays(n):
    strategy = _strategy(n)
    full, batch = _rows(strategy)
    w = jnp.linspace(0.5, 2.0, 4)
    b = np.arange(4, dtype=np.float32)

    def fn(t):
        local = t * w + b
        return {"local": local, "total": sx.get_replica_context().all_reduce("sum", local.sum())}

    out = strategy.run(fn, args=(batch,))
    assert isinstance(out["local"], sx.PerReplica)
    assert not isinstance(out["total"], sx.PerReplica)  # all-reduced: replicated
    np.testing.assert_allclose(strategy.gather(out["local"], axis=0), full * w + b, rtol=1e-6)
    np.testing.assert_allclose(out["total"], (full * w + b).sum(), rtol=1e-5)
    # The closed-over array alone is the same on every replica: a replicated result.
    assert not isinstance(strategy.run(lambda t: w * 2, args=(batch,)), sx.PerReplica)


@pytest.mark.parametrize("n", [2, 4])
def test_closure_over_keras_model_and_layer(n):
    strategy = _strategy(n)
    full, batch = _rows(strategy)
    keras.utils.set_random_seed(3)
    with strategy.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(5, activation="tanh"),
                                  keras.layers.Dense(3)])
        layer = keras.layers.Dense(2)
        layer.build((None, 3))

    def fn(t):
        logits = model(t)
        return logits, layer(logits)

    logits, projected = strategy.run(fn, args=(batch,))
    expected = np.asarray(model(full))
    np.testing.assert_allclose(strategy.gather(logits, axis=0), expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(strategy.gather(projected, axis=0), np.asarray(layer(expected)),
                               rtol=1e-5, atol=1e-6)
    one = _strategy(1)
    (one_batch,) = one.experimental_distribute_dataset([full])
    np.testing.assert_allclose(one.gather(one.run(fn, args=(one_batch,))[0], axis=0), expected,
                               rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("n", [2, 4])
def test_closure_over_keras_variables_returns_tuples(n):
    strategy = _strategy(n)
    full, batch = _rows(strategy)
    with strategy.scope():
        kernel = keras.Variable(np.full((4, 2), 0.5, np.float32), name="kernel")
        bias = keras.Variable(np.array([1.0, -1.0], np.float32), name="bias")

    def fn(t):
        ctx = sx.get_replica_context()
        y = t @ kernel.value + bias.value
        return y, ctx.all_reduce("mean", jnp.sum(y)), ctx.replica_id_in_sync_group

    y, mean_sum, ids = strategy.run(fn, args=(batch,))
    expected = full @ np.full((4, 2), 0.5) + np.array([1.0, -1.0])
    np.testing.assert_allclose(strategy.gather(y, axis=0), expected, rtol=1e-6)
    np.testing.assert_allclose(mean_sum, expected.sum() / n, rtol=1e-5)
    assert [int(i) for i in strategy.experimental_local_results(ids)] == list(range(n))


def test_closure_with_gradient_and_all_reduce_matches_one_device():
    w0 = jnp.array([0.3, -0.2, 0.1, 0.4])
    data = np.arange(32, dtype=np.float32).reshape(8, 4) / 8
    target = np.linspace(-1, 1, 8).astype(np.float32)

    def grads_on(strategy):
        (batch,) = strategy.experimental_distribute_dataset([(data, target)])

        def fn(xy):
            x, y = xy
            def loss(w):
                return sx.compute_average_loss((x @ w - y) ** 2)

            return sx.get_replica_context().all_reduce("sum", jax.grad(loss)(w0))

        return np.asarray(strategy.run(fn, args=(batch,)))

    reference = grads_on(_strategy(1))
    for n in (2, 4):
        np.testing.assert_allclose(grads_on(_strategy(n)), reference, rtol=1e-5, atol=1e-7)


def test_indexing_a_closed_over_mesh_array_is_explained_and_arguments_work():
    """JAX cannot index a mesh-placed array closed over in shard_map (jax-ml/jax#29162)."""
    strategy = _strategy(2)
    full, batch = _rows(strategy)
    placed = jax.device_put(np.arange(4, dtype=np.float32), strategy.replicated_sharding())
    with pytest.raises(ValueError, match=r"closes over an array placed on the strategy's devices"):
        strategy.run(lambda t: t + placed[1], args=(batch,))
    out = strategy.run(lambda t, w: t + w[1], args=(batch, placed))
    np.testing.assert_allclose(strategy.gather(out, axis=0), full + 1.0)
    host = np.asarray(placed)
    np.testing.assert_allclose(strategy.gather(strategy.run(lambda t: t + host[1], args=(batch,)),
                                               axis=0), full + 1.0)


def test_registered_variables_are_read_at_every_call(monkeypatch):
    """Closed-over values are captured at compile time, except variables a source lists."""
    monkeypatch.setattr(run_compiler, "_variable_sources", [])
    strategy = _strategy(2)
    full, batch = _rows(strategy)
    with strategy.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1, use_bias=False)])
    kernel = model.layers[0].kernel

    def predict(t):
        return model(t)

    kernel.assign(np.ones((4, 1), np.float32))
    before = strategy.gather(strategy.run(predict, args=(batch,)), axis=0)
    kernel.assign(np.full((4, 1), 3.0, np.float32))
    captured = strategy.gather(strategy.run(predict, args=(batch,)), axis=0)
    np.testing.assert_allclose(captured, before)  # jax.jit semantics: the value at compile time

    run_compiler.register_variable_source(lambda: model.variables)

    def fresh(t):  # a new function: compiled with the source active
        return model(t)

    np.testing.assert_allclose(strategy.gather(strategy.run(fresh, args=(batch,)), axis=0),
                               full.sum(axis=1, keepdims=True) * 3.0, rtol=1e-6)
    kernel.assign(np.full((4, 1), -2.0, np.float32))
    np.testing.assert_allclose(strategy.gather(strategy.run(fresh, args=(batch,)), axis=0),
                               full.sum(axis=1, keepdims=True) * -2.0, rtol=1e-6)


def test_results_passed_back_are_not_placed_again(monkeypatch):
    """A training loop feeds ``run`` its own results; they are already where the step reads
    them, and placing them again costs dispatch time between processes."""
    strategy = _strategy(2)

    def step(w, x):
        ctx = sx.get_replica_context()
        return w + ctx.all_reduce("sum", x).sum(), x * 2.0

    _, batch = _rows(strategy)
    w, x = strategy.run(step, args=(jnp.zeros(3), batch))  # replicated and PerReplica results
    placements = []
    original = jax.device_put
    monkeypatch.setattr(jax, "device_put",
                        lambda *a, **k: placements.append(a) or original(*a, **k))
    w2, _ = strategy.run(step, args=(w, x))
    assert placements == []
    np.testing.assert_allclose(np.asarray(w2),
                               np.asarray(w) + float(np.sum(strategy.gather(x, axis=0))))
