"""Synchronous equivalence: N replicas train exactly what one device trains (same global batch,
seed and data order), for Keras ``fit`` and for a custom loop with ``strategy.run``."""

import jax
import jax.numpy as jnp
import keras
import numpy as np
import pytest

import stratax as sx

GLOBAL_BATCH = 32
TOLERANCE = 2e-5


def _data(n=200, features=12, classes=5, seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, features)).astype(np.float32), rng.integers(0, classes, n)


def _model():
    return keras.Sequential([
        keras.Input((12,)),
        keras.layers.Dense(16, activation="relu"),
        keras.layers.Dropout(0.0),
        keras.layers.Dense(5),
    ])


def _strategy(replicas):
    if replicas == 0:
        return sx.OneDeviceStrategy("cpu:0")
    return sx.MirroredStrategy([f"cpu:{i}" for i in range(replicas)])


def _fit(replicas, steps_per_execution=1):
    x, y = _data()
    keras.utils.set_random_seed(7)
    strategy = _strategy(replicas)
    with strategy.scope():
        model = _model()
        model.compile(optimizer=keras.optimizers.Adam(0.01),
                      steps_per_execution=steps_per_execution,
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"])
    history = model.fit(x, y, batch_size=GLOBAL_BATCH, epochs=3, shuffle=False, verbose=0)
    return model.get_weights(), history.history


@pytest.fixture(scope="module")
def reference_fit():
    return _fit(0)


@pytest.mark.parametrize("replicas", [1, 2, 4, 8])
def test_fit_matches_one_device(reference_fit, replicas):
    ref_weights, ref_history = reference_fit
    weights, history = _fit(replicas)
    for got, want in zip(weights, ref_weights, strict=True):
        np.testing.assert_allclose(got, want, atol=TOLERANCE, rtol=TOLERANCE)
    np.testing.assert_allclose(history["loss"], ref_history["loss"], rtol=1e-5)
    np.testing.assert_allclose(history["accuracy"], ref_history["accuracy"], rtol=1e-6)


def test_fit_with_steps_per_execution_matches_one_device(reference_fit):
    weights, _ = _fit(4, steps_per_execution=4)
    for got, want in zip(weights, reference_fit[0], strict=True):
        np.testing.assert_allclose(got, want, atol=TOLERANCE, rtol=TOLERANCE)


def _custom_loop(replicas, steps=12):
    """The TensorFlow custom-training tutorial, the JAX way (Keras stateless API)."""
    x, y = _data()
    keras.utils.set_random_seed(7)
    strategy = _strategy(replicas)
    with strategy.scope():
        model = _model()
        optimizer = keras.optimizers.SGD(0.1, momentum=0.9)
        optimizer.build(model.trainable_variables)
    loss_obj = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)

    def train_step(state, batch):
        trainable, non_trainable, opt_vars = state
        inputs, labels = batch

        def loss_fn(trainable):
            logits, non_trainable_new = model.stateless_call(trainable, non_trainable, inputs,
                                                             training=True)
            loss = sx.compute_average_loss(loss_obj(labels, logits), global_batch_size=GLOBAL_BATCH)
            return loss, non_trainable_new

        (loss, non_trainable), grads = jax.value_and_grad(loss_fn, has_aux=True)(trainable)
        grads = sx.get_replica_context().all_reduce(sx.ReduceOp.SUM, grads)
        trainable, opt_vars = optimizer.stateless_apply(opt_vars, grads, trainable)
        return loss, (trainable, non_trainable, opt_vars)

    state = ([v.value for v in model.trainable_variables],
             [v.value for v in model.non_trainable_variables],
             [v.value for v in optimizer.variables])
    batches = [(x[i:i + GLOBAL_BATCH], y[i:i + GLOBAL_BATCH])
               for i in range(0, steps * GLOBAL_BATCH, GLOBAL_BATCH)]
    losses = []
    for batch in strategy.experimental_distribute_dataset(batches):
        per_replica_loss, state = strategy.run(train_step, args=(state, batch))
        losses.append(float(strategy.reduce(sx.ReduceOp.SUM, per_replica_loss, axis=None)))
    assert not any(isinstance(v, sx.PerReplica) for v in jax.tree.leaves(
        state, is_leaf=lambda v: isinstance(v, sx.PerReplica)))
    return [np.asarray(w) for w in state[0]], losses


@pytest.fixture(scope="module")
def reference_loop():
    return _custom_loop(0)


@pytest.mark.parametrize("replicas", [1, 2, 4, 8])
def test_custom_loop_matches_one_device(reference_loop, replicas):
    weights, losses = _custom_loop(replicas)
    for got, want in zip(weights, reference_loop[0], strict=True):
        np.testing.assert_allclose(got, want, atol=TOLERANCE, rtol=TOLERANCE)
    np.testing.assert_allclose(losses, reference_loop[1], rtol=1e-5)
    assert losses[-1] < losses[0]


def test_custom_loop_on_plain_jax_pytrees():
    """No Keras at all: a linear model as a dict pytree, gradients all-reduced by hand."""
    x, y = _data(n=64)
    targets = jnp.asarray(y, jnp.float32)

    def run(strategy):
        params = {"w": jnp.zeros((12,)), "b": jnp.zeros(())}

        def step(params, batch):
            xb, yb = batch

            def loss_fn(p):
                return sx.compute_average_loss((xb @ p["w"] + p["b"] - yb) ** 2,
                                               global_batch_size=16)

            loss, grads = jax.value_and_grad(loss_fn)(params)
            grads = sx.get_replica_context().all_reduce("sum", grads)
            return loss, jax.tree.map(lambda p, g: p - 0.05 * g, params, grads)

        batches = [(x[i:i + 16], targets[i:i + 16]) for i in range(0, 64, 16)]
        for batch in strategy.experimental_distribute_dataset(batches):
            _, params = strategy.run(step, args=(params, batch))
        return params

    one = run(sx.OneDeviceStrategy("cpu:0"))
    four = run(sx.MirroredStrategy(["cpu:0", "cpu:1", "cpu:2", "cpu:3"]))
    np.testing.assert_allclose(four["w"], one["w"], atol=1e-6)
    np.testing.assert_allclose(four["b"], one["b"], atol=1e-6)
