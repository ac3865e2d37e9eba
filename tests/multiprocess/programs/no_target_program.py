"""tf-keras' ``test_no_target_model`` sequence in a one-worker MultiWorkerMirrored job (#49.8).

Usage: python no_target_program.py (TF_CONFIG names one worker). Runs fit (2 steps, no
targets: the only loss is a layer's ``add_loss``), predict (1 step), evaluate (1 step) under
MultiWorkerMirroredStrategy, OneDeviceStrategy and plain Keras, each with fit's default
``shuffle=True`` and with ``shuffle=False``, and plain Keras once more on the rows in stratax's
epoch-0 order; prints one JSON line of their results.
"""

import contextlib
import json

import stratax as sx

strategy = sx.MultiWorkerMirroredStrategy(
    communication_options=sx.CommunicationOptions(timeout_seconds=60))

import keras  # noqa: E402
import numpy as np  # noqa: E402

SEED = 1


class SumOfInputs(keras.layers.Layer):
    """tf-keras' ``test_no_target_model`` layer: its inputs' sum is the model's only loss."""

    def call(self, inputs):
        self.add_loss(keras.ops.sum(inputs))
        return inputs


def sequence(scope, x, shuffle, fit_x=None):
    """fit 2 steps (on ``fit_x`` if given), predict 1, evaluate 1 (the issue's order), from
    Keras seed ``SEED``."""
    keras.utils.set_random_seed(SEED)
    with scope:
        model = keras.Sequential([keras.Input((10,)), keras.layers.Dense(16, activation="relu"),
                                  SumOfInputs(), keras.layers.Dense(2, activation="softmax")])
        model.compile(keras.optimizers.SGD(0.001))
    history = model.fit(x if fit_x is None else fit_x, epochs=1, steps_per_epoch=2,
                        shuffle=shuffle, verbose=0)
    predictions = model.predict(x, steps=1, verbose=0)
    return {"loss": history.history["loss"], "predict": predictions.tolist(),
            "evaluate": model.evaluate(x, steps=1, verbose=0)}


if __name__ == "__main__":
    x = np.random.default_rng(0).random((20, 10)).astype(np.float32)
    results = {}
    for shuffle in (True, False):
        results[f"mwms_{shuffle}"] = sequence(strategy.scope(), x, shuffle)
        results[f"one_device_{shuffle}"] = sequence(sx.OneDeviceStrategy("cpu:0").scope(), x,
                                                    shuffle)
        results[f"plain_{shuffle}"] = sequence(contextlib.nullcontext(), x, shuffle)
    # stratax's epoch e visits the rows in np.random.default_rng((seed, e)).permutation order
    # (docs/fit.md), Keras' seed being the seed: plain Keras unshuffled on that order.
    order = np.random.default_rng((SEED, 0)).permutation(len(x))
    results["plain_in_stratax_order"] = sequence(contextlib.nullcontext(), x, False,
                                                 fit_x=x[order])
    results["workers"] = strategy.num_workers
    print(json.dumps(results), flush=True)
