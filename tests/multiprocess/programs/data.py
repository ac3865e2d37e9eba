"""Data and model shared by the multi-process test programs and the single-process reference."""

import keras
import numpy as np

GLOBAL_BATCH = 16


def make_data(n=150, seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, 10)).astype(np.float32), rng.integers(0, 4, n)


def make_model():
    model = keras.Sequential([keras.Input((10,)), keras.layers.Dense(16, activation="relu"),
                              keras.layers.Dense(4)])
    model.compile(optimizer=keras.optimizers.Adam(0.01), metrics=["accuracy"],
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model
