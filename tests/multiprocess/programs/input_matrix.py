"""One training program per input kind, run the same way in one process and in many.

Each variant builds a binary classifier, trains it under the given strategy and returns what a
test compares: final weights, the loss history, evaluation counts (true positives and false
negatives, which a mean would hide when examples are double counted), predictions, and how many
times ``fit`` placed its arrays on the devices (``keras.steps.device_rows``: once for array input,
under every strategy).
"""

import grain
import jax
import keras
import numpy as np
import tensorflow as tf

import stratax as sx
from stratax._src.keras.steps import device_rows

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


class Reiterable:
    """A re-iterable of global batches that is neither a dataset nor a sequence (as a user's
    loader class): iterated afresh each epoch."""

    def __init__(self, x, y):
        self.x, self.y = x, y

    def __iter__(self):
        return _generator(self.x, self.y)


def _grain_map(x, y):
    return grain.MapDataset.source([(a, b) for a, b in zip(x, y, strict=True)]).batch(
        GLOBAL_BATCH)


def _tf_data(x, y):
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL_BATCH)


def _tf_data_by_worker(x, y):
    """Each worker's own half (elements ``i::2``) in batches of half the global batch: the
    union of the workers' k-th batches is the k-th global batch of one process."""
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    dataset = tf.data.Dataset.from_tensor_slices((x, y))
    workers = jax.process_count()
    return dataset.shard(workers, jax.process_index()).batch(
        GLOBAL_BATCH // workers).with_options(options)


# What users bring, each read anew every epoch: (fit's x, the same kind for evaluate/predict).
PIPELINES = {
    "tf_data": _tf_data,
    "tf_data_dict": lambda x, y: tf.data.Dataset.from_tensor_slices(
        ({"features": x}, y)).batch(GLOBAL_BATCH),
    "tf_data_off": _tf_data_by_worker,
    "grain_map": _grain_map,
    "grain_iter": lambda x, y: _grain_map(x, y).to_iter_dataset(),
    "grain_loader": lambda x, y: grain.DataLoader(
        data_source=[(a, b) for a, b in zip(x, y, strict=True)],
        sampler=grain.samplers.IndexSampler(len(x), shuffle=False, num_epochs=1),
        operations=[grain.transforms.Batch(GLOBAL_BATCH)], worker_count=0),
    "reiterable": Reiterable,
}


def _fit_kwargs(variant, x, y):
    if variant in PIPELINES:
        return {"x": PIPELINES[variant](x, y)}
    if variant == "tf_data_repeat":  # endless: steps_per_epoch says where an epoch ends
        return {"x": _tf_data(x, y).repeat(), "steps_per_epoch": -(-len(x) // GLOBAL_BATCH)}
    if variant == "tf_data_validation":
        return {"x": _tf_data(x, y), "validation_data": _tf_data(x[:40], y[:40])}
    if variant == "class_weight":
        return {"x": x, "y": y, "batch_size": GLOBAL_BATCH, "shuffle": False,
                "class_weight": {0: 1.0, 1: 3.0}}
    if variant == "shuffled_arrays":
        return {"x": x, "y": y, "batch_size": GLOBAL_BATCH, "shuffle": True}
    if variant == "shuffled_pydataset":
        return {"x": Batches(x, y), "shuffle": True}
    if variant == "generator":
        return {"x": _generator(x, y, passes=2), "steps_per_epoch": -(-len(x) // GLOBAL_BATCH)}
    # Unshuffled: Keras alone draws its shuffled order elsewhere (docs/fit.md); it is the reference.
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
# The pipelines users bring (issue 32): tf.data, grain, re-iterables, each epoch counted.
USER_VARIANTS = (*PIPELINES, "tf_data_repeat", "tf_data_validation", "tf_data_distributed")
# fit's options on array input (the kept path of keras.steps.device_rows, and its row order).
OPTION_VARIANTS = ("steps_per_epoch", "validation_split", "initial_epoch", "fit_twice")


class BatchCounter(keras.callbacks.Callback):
    """The batches ``fit`` trains in each epoch (an input read once trains epoch 0 only)."""

    def __init__(self):
        super().__init__()
        self.counts = []

    def on_epoch_begin(self, epoch, logs=None):
        self.counts.append(0)

    def on_train_batch_end(self, batch, logs=None):
        self.counts[-1] += 1


def _features_named(model):
    """``model`` taking its input as ``{"features": x}`` (the dict variant's batches)."""
    inputs = {"features": keras.Input((6,), name="features")}
    return keras.Model(inputs, model(inputs["features"]))


def run_variant(strategy, variant, backup_dir=None):
    """Trains ``variant`` for 2 epochs; returns a dict of arrays to compare."""
    x, y = make_data()
    model = make_model(strategy)
    if variant == "tf_data_dict":
        with strategy.scope():
            model = _features_named(model)
            model.compile(optimizer=keras.optimizers.Adam(0.02), loss="binary_crossentropy",
                          metrics=[keras.metrics.TruePositives(name="tp"),
                                   keras.metrics.FalseNegatives(name="fn")])
    counter = BatchCounter()
    callbacks = [counter, *([sx.BackupAndRestore(backup_dir, save_freq=3)] if backup_dir else [])]
    kept = []
    original = device_rows.Resident.__init__

    def counted(self, *args, **kwargs):
        kept.append(self)
        original(self, *args, **kwargs)

    device_rows.Resident.__init__ = counted
    if variant == "tf_data_distributed":  # as TensorFlow's fit takes it, too
        kwargs = {"epochs": 2, "x": strategy.experimental_distribute_dataset(_tf_data(x, y))}
    else:
        kwargs = {"epochs": 2, **_fit_kwargs(variant, x, y)}
    try:
        if variant == "fit_twice":
            model.fit(x[::-1], y[::-1], batch_size=GLOBAL_BATCH, epochs=1, verbose=0,
                      shuffle=False)
        history = model.fit(verbose=0, callbacks=callbacks, **kwargs)
    finally:
        device_rows.Resident.__init__ = original
    if variant in PIPELINES:  # evaluate and predict on the same kind of input
        counts = model.evaluate(PIPELINES[variant](x, y), verbose=0, return_dict=True)
        # Each worker predicts what its own pipeline gives; the others all rows.
        data = _tf_data(x, y) if variant == "tf_data_off" else PIPELINES[variant](x, y)
        predictions = model.predict(data, verbose=0)
    else:
        counts = model.evaluate(_generator(x, y), steps=-(-len(x) // GLOBAL_BATCH), verbose=0,
                                return_dict=True)
        predictions = model.predict(_generator(x, y), steps=-(-len(x) // GLOBAL_BATCH),
                                    verbose=0)
    return {**{key: np.asarray(values) for key, values in history.history.items()},
            "batches_per_epoch": np.asarray(counter.counts),
            "counts": np.asarray([counts["tp"], counts["fn"]]),
            "predictions": np.asarray(predictions),
            "kept_on_devices": np.asarray(len(kept)),
            **{f"w{i}": w for i, w in enumerate(model.get_weights())}}
