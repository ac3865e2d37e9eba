"""What a TensorFlow user tries on two MultiWorkerMirrored workers (issue 49), one case each.

Usage: python tf_user_program.py OUT_DIR CASE [CASE ...]. Writes OUT_DIR/<case>_<worker>.json
and prints "done <worker>". Each case is a few lines of a user's program; the test compares what
it records with plain Keras or TensorFlow's documented behaviour.
"""

import json
import os
import sys

import stratax as sx

if __name__ == "__main__":  # first, before JAX starts; the test imports the helpers alone
    strategy = sx.MultiWorkerMirroredStrategy(
        communication_options=sx.CommunicationOptions(timeout_seconds=60))

import keras
import numpy as np


def wrong_width():
    """A global batch of (64, 19) into a model that takes 20 features: Keras' error."""
    with strategy.scope():
        model = keras.Sequential([keras.Input((20,)), keras.layers.Dense(1)])
        model.compile("sgd", "mse")
    x, y = np.zeros((64, 19), "float32"), np.zeros((64, 1), "float32")
    try:
        model.fit(x, y, batch_size=64, epochs=1, verbose=0)
    except ValueError as error:
        return {"error": str(error)}
    return {"error": None}


def seeded_shuffle():
    """No seed set; a model built in the scope; then a seeded tf.data shuffle (issue 49 #1)."""
    import hashlib
    import random

    import tensorflow as tf

    def digest(state):
        return hashlib.sha256(repr(state).encode()).hexdigest()

    before = {"numpy": digest(np.random.get_state()), "python": digest(random.getstate())}
    with strategy.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3),
                                  keras.layers.Dropout(0.5), keras.layers.Dense(1)])
    after = {"numpy": digest(np.random.get_state()), "python": digest(random.getstate())}
    order = [int(i) for i in tf.data.Dataset.range(64).shuffle(64, seed=1)]
    return {"order": order, "before": before, "after": after,
            "weights": [w.tolist() for w in model.get_weights()]}


def shuffle_model(under):
    """A small model with fixed initial weights (the test builds the same one)."""
    with under.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="tanh"),
                                  keras.layers.Dense(1)])
        model.compile(keras.optimizers.SGD(0.1), "mse")
    model.set_weights([np.linspace(-1, 1, w.size, dtype="float32").reshape(w.shape)
                       for w in model.get_weights()])
    return model


def shuffle_data():
    x = np.linspace(-2, 2, 4 * 48, dtype="float32").reshape(48, 4) ** 3
    return x, np.sin(x.sum(axis=1, keepdims=True))


def unseeded_shuffled_fit():
    """No Keras seed; numpy seeded differently on each worker; fit(shuffle=True) on arrays.
    The order must be one permutation for all workers: worker 0's."""
    model = shuffle_model(strategy)
    np.random.seed(100 + strategy.worker_index)
    x, y = shuffle_data()
    history = model.fit(x, y, batch_size=8, epochs=2, shuffle=True, verbose=0)
    return {"loss": history.history["loss"],
            "weights": [w.tolist() for w in model.get_weights()]}


def tensorboard_and_checkpoint():
    """Keras' TensorBoard and ModelCheckpoint in fit (issue 49 #6): where each worker wrote."""
    model = shuffle_model(strategy)
    x, y = shuffle_data()
    root = os.path.join(out_dir, "callbacks")
    callbacks = [keras.callbacks.TensorBoard(log_dir=os.path.join(root, "logs")),
                 keras.callbacks.ModelCheckpoint(os.path.join(root, "ckpt.weights.h5"),
                                                 save_weights_only=True)]
    model.fit(x, y, batch_size=8, epochs=2, callbacks=callbacks, verbose=0)
    return {"log_dir": callbacks[0].log_dir}


CASES = {"wrong_width": wrong_width, "seeded_shuffle": seeded_shuffle,
         "unseeded_shuffled_fit": unseeded_shuffled_fit,
         "tensorboard_and_checkpoint": tensorboard_and_checkpoint}

if __name__ == "__main__":
    out_dir = sys.argv[1]  # a global the cases read
    for case in sys.argv[2:]:
        with open(os.path.join(out_dir, f"{case}_{strategy.worker_index}.json"), "w") as f:
            json.dump(CASES[case](), f)
    print("done", strategy.worker_index, flush=True)
