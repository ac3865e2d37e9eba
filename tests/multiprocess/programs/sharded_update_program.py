"""What each worker runs in tests/multiprocess/test_sharded_update.py.

Usage: python sharded_update_program.py OUT_DIR. Trains the model of :func:`make` with each
optimizer of :data:`OPTIMIZERS` on numpy arrays (steps_per_execution 4, 150 rows in batches of
16: two groups of four steps, then the last two steps one by one), and saves the weights, the
optimizer's variables and the loss history to OUT_DIR/<name>_<worker>.npz. Prints, per
optimizer, "<name> scatters <n>": the reduce-scatters traced into its programs (0: the update
stayed replicated), then "done <worker>".
"""

import os
import sys

import stratax as sx

if __name__ == "__main__":
    strategy = sx.MultiWorkerMirroredStrategy(
        communication_options=sx.CommunicationOptions(timeout_seconds=60))

import keras
import numpy as np
from data import GLOBAL_BATCH, make_data

from stratax._src.runtime import shm_collectives

OPTIMIZERS = {
    "adam": lambda: keras.optimizers.Adam(0.01),
    "nadam": lambda: keras.optimizers.Nadam(0.01),  # a scalar slot of its own
    "sgd": lambda: keras.optimizers.SGD(0.05, momentum=0.9, nesterov=True),
    "adamw": lambda: keras.optimizers.AdamW(0.01, weight_decay=0.1),
    "clipnorm": lambda: keras.optimizers.Adam(0.01, clipnorm=0.5),  # stays replicated
}


def make(name):
    """A model whose first bias (15) does not split evenly over 2 processes."""
    keras.utils.set_random_seed(5)
    model = keras.Sequential([keras.Input((10,)), keras.layers.Dense(15, activation="relu"),
                              keras.layers.Dense(4)])
    model.compile(optimizer=OPTIMIZERS[name](), metrics=["accuracy"], steps_per_execution=4,
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def train(model, epochs=2):
    x, y = make_data()
    history = model.fit(x, y, batch_size=GLOBAL_BATCH, epochs=epochs, shuffle=False, verbose=0)
    return {"history": np.asarray(history.history["loss"]),
            "accuracy": np.asarray(history.history["accuracy"]),
            **{f"w{i}": w for i, w in enumerate(model.get_weights())},
            **{f"o{i}": np.asarray(v) for i, v in enumerate(model.optimizer.variables)}}


if __name__ == "__main__":
    for name in OPTIMIZERS:
        before = shm_collectives.state.scatters_traced
        with strategy.scope():
            model = make(name)
        saved = train(model)
        np.savez(os.path.join(sys.argv[1], f"{name}_{strategy.worker_index}.npz"), **saved)
        print(name, "scatters", shm_collectives.state.scatters_traced - before, flush=True)
        print(name, "plan", model.train_function.plan.name, flush=True)
    print("done", strategy.worker_index, flush=True)
