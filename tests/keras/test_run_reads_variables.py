"""A Keras variable closed over by a replica function is read at every ``run``, as TF reads it."""

import keras
import numpy as np

import stratax as sx


def test_assignment_between_run_calls_is_seen():
    strategy = sx.MirroredStrategy(["cpu:0", "cpu:1"])
    with strategy.scope():
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1, use_bias=False)])
    batch = next(iter(strategy.experimental_distribute_dataset([np.ones((4, 3), np.float32)])))

    def forward(rows):
        return model(rows)

    before = strategy.gather(strategy.run(forward, args=(batch,)), axis=0)
    np.testing.assert_allclose(before, np.ones((4, 3)) @ model.get_weights()[0], rtol=1e-6)
    model.layers[0].kernel.assign(np.full((3, 1), 5.0, np.float32))
    after = strategy.gather(strategy.run(forward, args=(batch,)), axis=0)
    np.testing.assert_allclose(after, np.full((4, 1), 15.0))
