"""A model resumed through a ``.keras`` file and a checkpoint under ParameterServerStrategy.

Run by ``test_resume.py``. ``resume`` (chief + 1 worker + 1 ps): the chief trains a
Sequential built in code for one epoch, saves it (``.keras``) and a checkpoint of its variables,
loads the file under the strategy, evaluates it (which places its variables on the ps before any
fit), trains one more epoch, then restores the first model's checkpoint into it. ``snapshot
GO_FILE`` (chief + 1 worker + 2 snapshotting ps): 3 epochs, ``FIT1_DONE``, then (once the test
restarted ps 1 from its snapshot and created GO_FILE) one more. Prints ``RESULT {...}``.
"""

import json
import os
import sys
import tempfile
import time

import numpy as np

import stratax as sx


def _model(strategy):
    import keras

    with strategy.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3),
                                  keras.layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    return model


def _data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 4)).astype(np.float32)
    return x, x @ np.array([[1.0], [-2.0], [0.5], [3.0]], np.float32)


def snapshot(strategy, go_file):
    model = _model(strategy)
    x, y = _data()
    model.fit(x, y, batch_size=16, epochs=3, shuffle=False, verbose=0)        # 12 steps
    print("FIT1_DONE", flush=True)
    deadline = time.monotonic() + 120
    while not os.path.exists(go_file):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{go_file} was not created")
        time.sleep(0.05)
    model.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0)        # 4 more
    placed = strategy.place_variables(model.trainable_variables)
    return {"iterations": int(model.optimizer.iterations.numpy()),
            "shards": [[[p.key, p.ps, n] for p, n in zip(v.placements,
                                                        strategy.optimizer_iterations(v),
                                                        strict=True)] for v in placed]}


def resume(strategy):
    import keras

    x, y = _data()
    model = _model(strategy)
    model.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0)        # 4 steps
    result = {"built_paths": [v.path for v in model.trainable_variables]}
    with tempfile.TemporaryDirectory() as tmp:
        model.save(f"{tmp}/model.keras")
        saved = model.get_weights()
        strategy.save_checkpoint(f"{tmp}/ckpt.npz", model.trainable_variables)
        with np.load(f"{tmp}/ckpt.npz") as data:
            header = json.loads(data["header"].tobytes())
        result["entries"] = [entry["name"] for entry in header["variables"]]
        with strategy.scope():
            loaded = keras.models.load_model(f"{tmp}/model.keras")
        result["loaded_paths"] = [v.path for v in loaded.trainable_variables]
        result["loaded_iterations"] = int(loaded.optimizer.iterations.numpy())
        loaded.evaluate(x, y, batch_size=16, verbose=0)
        loaded.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0)   # 4 more
        result["resumed_iterations"] = int(loaded.optimizer.iterations.numpy())
        result["ps_iterations"] = strategy.optimizer_iterations(
            strategy.place_variables(loaded.trainable_variables[0]))
        try:
            result["restored"] = strategy.restore_checkpoint(f"{tmp}/ckpt.npz",
                                                             loaded.trainable_variables)
        except ValueError as err:
            result["restore_error"] = str(err)
        else:
            strategy.refresh_keras_variables()
            result["restore_err"] = max(float(np.max(np.abs(a - b)))
                                        for a, b in zip(loaded.get_weights(), saved,
                                                        strict=True))
            # The restore set every shard's count to the file's 4; 4 steps make them 8. Then
            # the shards disagree: the first variable's back at 4 (restored alone), the others
            # at 8; 4 more steps make it 8 against 12.
            loaded.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0)
            strategy.restore_checkpoint(f"{tmp}/ckpt.npz", loaded.trainable_variables[:1])
            loaded.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0)
            result["uneven_iterations"] = int(loaded.optimizer.iterations.numpy())
            result["uneven_shards"] = [strategy.optimizer_iterations(v) for v in
                                       strategy.place_variables(loaded.trainable_variables)]
    return result


def main():
    strategy = sx.ParameterServerStrategy(timeout_seconds=30)
    import keras

    keras.utils.set_random_seed(0)
    result = resume(strategy) if sys.argv[1] == "resume" else snapshot(strategy, sys.argv[2])
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
