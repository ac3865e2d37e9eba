"""What each worker runs in tests/multiprocess/test_add_loss.py (issue 40).

Usage: python add_loss_program.py OUT_DIR. Trains the models of :data:`CASES` (a layer's
``add_loss``, with and without targets, alone and in groups of steps) under
MultiWorkerMirroredStrategy, and saves each one's history, weights and evaluate results to
OUT_DIR/<case>_<worker>.npz; prints "done <worker>".
"""

import os
import sys

import stratax as sx

if __name__ == "__main__":
    strategy = sx.MultiWorkerMirroredStrategy(
        communication_options=sx.CommunicationOptions(timeout_seconds=60))

import keras
import numpy as np

ROWS, BATCH = 24, 8
# case: (the added term, fit with targets, steps_per_execution)
CASES = {"sum_no_target": ("sum", False, 1), "nonlinear_grouped": ("nonlinear", True, 3)}


class AddLoss(keras.layers.Layer):
    """Adds a sum over the batch's rows, or a term nonlinear in the batch, as a loss."""

    def __init__(self, term, **kwargs):
        super().__init__(**kwargs)
        self.term = term

    def call(self, inputs):
        if self.term == "sum":
            self.add_loss(keras.ops.sum(inputs))
        else:
            self.add_loss(keras.ops.square(keras.ops.mean(inputs)) + keras.ops.max(inputs))
        return inputs


def run(case):
    """fit (3 epochs, no shuffling) and evaluate of ``case``: a dict of arrays to compare."""
    term, with_targets, steps_per_execution = CASES[case]
    rng = np.random.default_rng(0)
    x = rng.random((ROWS, 3)).astype(np.float32)
    y = (x @ np.array([[1.0], [-2.0], [0.5]], np.float32)) if with_targets else None
    keras.utils.set_random_seed(1)
    inputs = keras.Input((3,))
    hidden = keras.layers.Dense(4, kernel_regularizer="l2", activity_regularizer="l1")(inputs)
    model = keras.Model(inputs, keras.layers.Dense(1)(AddLoss(term)(hidden)))
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse" if with_targets else None,
                  steps_per_execution=steps_per_execution)
    history = model.fit(x, y, batch_size=BATCH, epochs=3, shuffle=False, verbose=0)
    return {"loss": np.asarray(history.history["loss"]),
            "evaluate": np.asarray(model.evaluate(x, y, batch_size=BATCH, verbose=0)),
            **{f"w{i}": w for i, w in enumerate(model.get_weights())}}


if __name__ == "__main__":
    for name in CASES:
        with strategy.scope():
            saved = run(name)
        np.savez(os.path.join(sys.argv[1], f"{name}_{strategy.worker_index}.npz"), **saved)
    print("done", strategy.worker_index, flush=True)
