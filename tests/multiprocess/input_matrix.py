"""One training program per input kind, run the same way in one process and in many.

Each variant builds a binary classifier, trains it under the given strategy and returns what a
test compares: final weights, the loss history, evaluation counts (true positives and false
negatives, which a mean would hide when examples are double counted), predictions, and how many
times ``fit`` placed its arrays on the devices (``keras.device_rows``: once for array input,
under every strategy).
"""

import keras
import numpy as np

import stratax as sx
from stratax._src.keras import device_rows

GLOBAL_BATCH = 16
SEED = 11


def make_data(n=150, seed=3):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 6)).astype(np.float32)
    y = (x[:, 0] + 0.5 * rng.normal(size=n) > 0.3).astype(np.float32)
    return x, y


def make_model(strategy):
    keras.utils.set_random_seed(SEED)
    with strategy.scope():
        model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="relu"),
                                  keras.layers.Dense(1, activation="sigmoid")])
        model.compile(optimizer=keras.optimizers.Adam(0.02), loss="binary_crossentropy",
                      metrics=[keras.metrics.TruePositives(name="tp"),
                               keras.metrics.FalseNegatives(name="fn")])
    return model


class Batches(keras.utils.PyDataset):
    """Global batches by index, as a user's PyDataset gives them."""

    def __init__(self, x, y):
        super().__init__()
        self.x, self.y = x, y

    def __len__(self):
        return -(-len(self.x) // GLOBAL_BATCH)

    def __getitem__(self, i):
        rows = slice(i * GLOBAL_BATCH, (i + 1) * GLOBAL_BATCH)
        return self.x[rows], self.y[rows]


def _generator(x, y, passes=1):
    for _ in range(passes):
        for i in range(0, len(x), GLOBAL_BATCH):
            yield x[i:i + GLOBAL_BATCH], y[i:i + GLOBAL_BATCH]


def _fit_kwargs(variant, x, y):
    if variant == "class_weight":
        return {"x": x, "y": y, "batch_size": GLOBAL_BATCH, "shuffle": False,
                "class_weight": {0: 1.0, 1: 3.0}}
    if variant == "shuffled_arrays":
        return {"x": x, "y": y, "batch_size": GLOBAL_BATCH, "shuffle": True}
    if variant == "shuffled_pydataset":
        return {"x": Batches(x, y), "shuffle": True}
    if variant == "generator":
        return {"x": _generator(x, y, passes=2), "steps_per_epoch": -(-len(x) // GLOBAL_BATCH)}
    # Unshuffled: Keras alone draws its shuffled order elsewhere (README), and is the reference.
    arrays = {"x": x, "y": y, "batch_size": GLOBAL_BATCH, "shuffle": False}
    if variant == "steps_per_epoch":  # epochs of 4 of the 10 batches: the next picks up there
        return {**arrays, "steps_per_epoch": 4}
    if variant == "validation_split":
        return {**arrays, "validation_split": 0.2}
    if variant == "initial_epoch":
        return {**arrays, "epochs": 3, "initial_epoch": 1}
    if variant == "fit_twice":  # run_variant first fits the arrays reversed, then these
        return arrays
    raise ValueError(variant)


VARIANTS = ("class_weight", "shuffled_arrays", "shuffled_pydataset", "generator")
# fit's options on array input (the kept path of keras.device_rows, and its row order).
OPTION_VARIANTS = ("steps_per_epoch", "validation_split", "initial_epoch", "fit_twice")


def run_variant(strategy, variant, backup_dir=None):
    """Trains ``variant`` for 2 epochs; returns a dict of arrays to compare."""
    x, y = make_data()
    model = make_model(strategy)
    callbacks = [sx.BackupAndRestore(backup_dir, save_freq=3)] if backup_dir else []
    kept = []
    original = device_rows.Resident.__init__

    def counted(self, *args, **kwargs):
        kept.append(self)
        original(self, *args, **kwargs)

    device_rows.Resident.__init__ = counted
    kwargs = {"epochs": 2, **_fit_kwargs(variant, x, y)}
    try:
        if variant == "fit_twice":
            model.fit(x[::-1], y[::-1], batch_size=GLOBAL_BATCH, epochs=1, verbose=0,
                      shuffle=False)
        history = model.fit(verbose=0, callbacks=callbacks, **kwargs)
    finally:
        device_rows.Resident.__init__ = original
    counts = model.evaluate(_generator(x, y), steps=-(-len(x) // GLOBAL_BATCH), verbose=0,
                            return_dict=True)
    predictions = model.predict(_generator(x, y), steps=-(-len(x) // GLOBAL_BATCH), verbose=0)
    return {**{key: np.asarray(values) for key, values in history.history.items()},
            "counts": np.asarray([counts["tp"], counts["fn"]]),
            "predictions": np.asarray(predictions),
            "kept_on_devices": np.asarray(len(kept)),
            **{f"w{i}": w for i, w in enumerate(model.get_weights())}}
