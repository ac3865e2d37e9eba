"""Batch statistics: per replica in ``strategy.run`` (as TensorFlow), global with SyncBatchNorm."""

import jax
import jax.numpy as jnp
import keras
import numpy as np
import pytest

import stratax as sx


def _normalized(layer_class, replicas, x):
    """Runs one training-mode call of the layer in ``strategy.run``; returns the outputs."""
    strategy = sx.MirroredStrategy([f"cpu:{i}" for i in range(replicas)])
    with strategy.scope():
        layer = layer_class(momentum=0.5)
        layer.build(x.shape)
    trainable = [v.value for v in layer.trainable_variables]
    non_trainable = [v.value for v in layer.non_trainable_variables]

    def step(trainable, non_trainable, batch):
        return layer.stateless_call(trainable, non_trainable, batch, training=True)

    batch = next(iter(strategy.experimental_distribute_dataset([x])))
    out, moving = strategy.run(step, args=(trainable, non_trainable, batch))
    return np.asarray(strategy.gather(out, axis=0)), moving


@pytest.fixture
def x():
    rng = np.random.default_rng(0)
    # Replicas see rows with different means, so per-replica and global statistics differ.
    return (rng.normal(size=(16, 3)) + np.repeat(np.arange(4), 4)[:, None]).astype(np.float32)


def test_sync_batch_normalization_uses_the_global_batch(x):
    one, _ = _normalized(sx.SyncBatchNormalization, 1, x)
    many, moving = _normalized(sx.SyncBatchNormalization, 4, x)
    np.testing.assert_allclose(many, one, atol=1e-5)
    # The moving statistics were updated identically on every replica (returned mirrored).
    assert all(isinstance(m, jax.Array) for m in moving)


def test_batch_normalization_in_run_is_per_replica_as_in_tensorflow(x):
    one, _ = _normalized(keras.layers.BatchNormalization, 1, x)
    many, _ = _normalized(keras.layers.BatchNormalization, 4, x)
    assert not np.allclose(many, one, atol=1e-3)
    # Each replica normalised its own 4 rows: every replica's output has mean ~0.
    per_replica_means = np.asarray(many).reshape(4, 4, 3).mean(axis=1)
    np.testing.assert_allclose(per_replica_means, 0.0, atol=1e-4)


def test_sync_batch_normalization_in_fit_equals_batch_normalization():
    rng = np.random.default_rng(1)
    data = rng.normal(size=(64, 5)).astype(np.float32), rng.integers(0, 2, 64)
    weights = []
    for layer in (keras.layers.BatchNormalization, sx.SyncBatchNormalization):
        keras.utils.set_random_seed(5)
        with sx.MirroredStrategy(["cpu:0", "cpu:1"]).scope():
            model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(4), layer(),
                                      keras.layers.Dense(2)])
            model.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(
                from_logits=True))
        model.fit(*data, batch_size=16, epochs=1, shuffle=False, verbose=0)
        weights.append(model.get_weights())
    for a, b in zip(*weights, strict=True):
        np.testing.assert_allclose(a, b, atol=1e-6)
    assert jnp.isfinite(weights[0][0]).all()
