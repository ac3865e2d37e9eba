"""What a TensorFlow user tries on two MultiWorkerMirrored workers (issue 49), one case each.

Usage: python tf_user_program.py OUT_DIR CASE [CASE ...]. Writes OUT_DIR/<case>_<worker>.json
and prints "done <worker>". Each case is a few lines of a user's program; the test compares what
it records with plain Keras or TensorFlow's documented behaviour.
"""

import json
import os
import sys

import stratax as sx

strategy = sx.MultiWorkerMirroredStrategy(
    communication_options=sx.CommunicationOptions(timeout_seconds=60))

import keras  # noqa: E402
import numpy as np  # noqa: E402


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


CASES = {"wrong_width": wrong_width}

out_dir = sys.argv[1]
for case in sys.argv[2:]:
    with open(os.path.join(out_dir, f"{case}_{strategy.worker_index}.json"), "w") as f:
        json.dump(CASES[case](), f)
print("done", strategy.worker_index, flush=True)
