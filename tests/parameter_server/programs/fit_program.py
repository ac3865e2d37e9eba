"""Keras fit/evaluate/predict under ParameterServerStrategy: one program for every role.

Run by ``test_keras_fit.py`` on chief + 2 workers + 2 ps; the chief runs the scenarios named in
argv[1:] (``sync_*`` ones under ``mode="sync"``) and prints one JSON line ``RESULT {...}``.
"""

import json
import sys
import tempfile
import time

import numpy as np

import stratax as sx

VOCAB, SEQ = 1000, 5


def guide_dataset_fn(input_context):
    """Per-worker data of the guide model: the label is the last token mod 10."""
    rng = np.random.default_rng(100 + input_context.input_pipeline_id)
    while True:
        x = rng.integers(0, VOCAB, size=(32, SEQ)).astype(np.int32)
        yield x, (x[:, -1] % 10).astype(np.int32)


def regression_dataset_fn(input_context):
    rng = np.random.default_rng(200 + input_context.input_pipeline_id)
    while True:
        x = rng.normal(size=(16, 3)).astype(np.float32)
        yield x, x @ np.array([[1.0], [-2.0], [0.5]], np.float32)


def _regression_rows(input_context):
    rng = np.random.default_rng(300 + input_context.input_pipeline_id)
    x = rng.normal(size=(256, 3)).astype(np.float32)
    return x, x @ np.array([[1.0], [-2.0], [0.5]], np.float32)


def tf_data_dataset_fn(input_context):
    """The guide's kind of dataset_fn: a tf.data pipeline built on the worker."""
    import tensorflow as tf

    return tf.data.Dataset.from_tensor_slices(_regression_rows(input_context)).shuffle(
        256, seed=input_context.input_pipeline_id).repeat().batch(16)


def grain_dataset_fn(input_context):
    import grain

    x, y = _regression_rows(input_context)
    return grain.MapDataset.source(list(zip(x, y, strict=True))).repeat().batch(16)


def guide_arrays(n, seed):
    rng = np.random.default_rng(seed)
    x = rng.integers(0, VOCAB, size=(n, SEQ)).astype(np.int32)
    return x, (x[:, -1] % 10).astype(np.int32)


def binary_data(n):
    rng = np.random.default_rng(5)
    x = rng.normal(size=(n, 4)).astype(np.float32)
    return x, (x[:, :1] > 0).astype(np.float32)


def binary_model(scope_strategy, steps_per_execution=3):
    import keras

    with scope_strategy.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1, activation="sigmoid")])
        model.compile(optimizer="adam", loss="binary_crossentropy",
                      steps_per_execution=steps_per_execution,
                      metrics=[keras.metrics.TruePositives(), keras.metrics.FalsePositives(),
                               keras.metrics.TrueNegatives(), keras.metrics.FalseNegatives()])
    return model


def confusion(probabilities, y):
    """[tp, fp, tn, fn] of thresholded probabilities (as Keras' metrics count them)."""
    positive = (probabilities[:, 0] > 0.5).astype(np.float32)
    return [float(((positive == p) & (y[:, 0] == t)).sum())
            for p, t in [(1, 1), (1, 0), (0, 0), (0, 1)]]


def max_abs_diff(a, b):
    return max(float(np.abs(x - y).max()) for x, y in zip(a, b, strict=True))


def guide_model(strategy):
    import keras

    with strategy.scope():
        model = keras.Sequential([keras.layers.Embedding(VOCAB, 64), keras.layers.LSTM(64),
                                  keras.layers.Dense(10)])
        model.compile(optimizer=keras.optimizers.Adam(0.01),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"], steps_per_execution=10)
    return model


class GroupCounter:
    """Per-batch callback: records every group Keras reports (TF refuses these under PSS)."""

    def __init__(self):
        import keras

        class Counter(keras.callbacks.Callback):
            def __init__(self):
                super().__init__()
                self.ends, self.epochs = [], []

            def on_train_batch_end(self, batch, logs=None):
                self.ends.append((batch, float(logs["loss"])))

            def on_epoch_end(self, epoch, logs=None):
                self.epochs.append(dict(logs))

        self.callback = Counter()


def guide(strategy):
    """The issue's guide program, on arrays and with a DatasetCreator; a per-batch callback."""
    x, y = guide_arrays(3200, 0)
    model = guide_model(strategy)
    counter = GroupCounter().callback
    history = model.fit(x, y, batch_size=32, epochs=3, steps_per_epoch=40, callbacks=[counter],
                        verbose=0)
    creator_model = guide_model(strategy)
    creator_history = creator_model.fit(sx.DatasetCreator(guide_dataset_fn), epochs=3,
                                        steps_per_epoch=40, verbose=0)
    return {
        "loss": history.history["loss"], "accuracy": history.history["accuracy"],
        "creator_loss": creator_history.history["loss"],
        "creator_accuracy": creator_history.history["accuracy"],
        "batch_ends": [b for b, _ in counter.ends],
        "epoch_logs": counter.epochs,
        "iterations": int(model.optimizer.iterations.numpy()),
        "creator_iterations": int(creator_model.optimizer.iterations.numpy()),
        "describe": strategy.describe_variables(),
    }


def exact(strategy):
    """One group per epoch (steps_per_execution = steps per epoch), so groups run one after
    another: SGD must equal a one-process Keras fit on the same batches."""
    import keras

    rng = np.random.default_rng(3)
    x = rng.normal(size=(96, 6)).astype(np.float32)
    y = (x @ rng.normal(size=(6, 2))).astype(np.float32)
    w = rng.normal(size=(96,)).astype(np.float32) ** 2

    def build():
        model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="tanh"),
                                  keras.layers.Dense(2)])
        model.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9), loss="mse",
                      metrics=["mae"], steps_per_execution=6)
        return model

    reference = build()
    initial = reference.get_weights()
    with strategy.scope():
        model = build()
    model.set_weights(initial)
    history = model.fit(x, y, sample_weight=w, batch_size=16, epochs=3, shuffle=False,
                        validation_data=(x[:40], y[:40]), verbose=0)
    ref_history = reference.fit(x, y, sample_weight=w, batch_size=16, epochs=3, shuffle=False,
                                validation_data=(x[:40], y[:40]), verbose=0)
    evaluated = model.evaluate(x, y, batch_size=20, return_dict=True, verbose=0)
    ref_evaluated = reference.evaluate(x, y, batch_size=20, return_dict=True, verbose=0)
    return {
        "weights_err": max_abs_diff(model.get_weights(), reference.get_weights()),
        "history_err": max(abs(a - b) / max(abs(b), 1e-6) for k in ref_history.history
                           for a, b in zip(history.history[k], ref_history.history[k],
                                           strict=True)),
        "evaluate_err": max(abs(evaluated[k] - ref_evaluated[k]) / max(abs(ref_evaluated[k]), 1e-6)
                            for k in ref_evaluated),
        "iterations": int(model.optimizer.iterations.numpy()),
        "ref_iterations": int(reference.optimizer.iterations.numpy()),
        "history_keys": sorted(history.history),
        "plan": model.train_function.plan.describe(),
    }


def state(strategy):
    """BatchNorm statistics and the dropout seed written back by each step (strategy.assign):
    one group per epoch, so the steps chain as in one process; equals one-process Keras."""
    import keras

    rng = np.random.default_rng(4)
    x = rng.normal(size=(96, 6)).astype(np.float32) * 3 + 1
    y = (x @ rng.normal(size=(6, 2))).astype(np.float32)

    def build():
        model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8),
                                  keras.layers.BatchNormalization(),
                                  keras.layers.Dropout(0.3, seed=7), keras.layers.Dense(2)])
        model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse", steps_per_execution=6)
        return model

    reference = build()
    with strategy.scope():
        model = build()
    initial = reference.get_weights()
    model.set_weights(initial)
    history = model.fit(x, y, batch_size=16, epochs=3, shuffle=False, verbose=0)
    ref_history = reference.fit(x, y, batch_size=16, epochs=3, shuffle=False, verbose=0)
    moving_mean = model.layers[1].moving_mean.numpy()
    return {
        "weights_err": max_abs_diff(model.get_weights(), reference.get_weights()),
        "moving_mean_moved": float(np.abs(moving_mean - initial[4]).max()),
        "loss_err": max(abs(a - b) / abs(b) for a, b in zip(history.history["loss"],
                                                            ref_history.history["loss"],
                                                            strict=True)),
        "evaluate_err": abs(model.evaluate(x, y, verbose=0) / reference.evaluate(x, y, verbose=0)
                            - 1),
    }


def sparse(strategy):
    """A Keras Embedding (5000 x 8, two shards) on the row-sparse path: SGD equals one-process
    Keras, and the ps sent only the looked-up rows (its counters), never the whole table but
    for the chief's one refresh at the end of fit."""
    import keras

    rng = np.random.default_rng(7)
    ids = rng.integers(0, 5000, size=(64, 4)).astype(np.int32)
    y = rng.normal(size=(64, 1)).astype(np.float32)

    def build():
        model = keras.Sequential([keras.Input((4,), dtype="int32"),
                                  keras.layers.Embedding(5000, 8),
                                  keras.layers.GlobalAveragePooling1D(), keras.layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.SGD(0.5), loss="mse", steps_per_execution=4)
        return model

    reference = build()
    with strategy.scope():
        model = build()
    initial = reference.get_weights()
    model.set_weights(initial)
    model.fit(ids, y, batch_size=16, epochs=2, shuffle=False, verbose=0)
    reference.fit(ids, y, batch_size=16, epochs=2, shuffle=False, verbose=0)
    loss = model.evaluate(ids, y, batch_size=16, verbose=0)
    ref_loss = reference.evaluate(ids, y, batch_size=16, verbose=0)
    table = model.layers[0].embeddings
    stats = strategy.shard_stats(table)
    # Rows a batch pulls from each shard: its distinct ids in that shard's block.
    batches = [ids[i:i + 16] for i in range(0, 64, 16)] * 3    # 2 epochs of fit, 1 evaluate
    expected = [int(sum(((np.unique(b) >= lo) & (np.unique(b) < hi)).sum() for b in batches))
                for lo, hi in [(0, 2500), (2500, 5000)]]
    return {"weights_err": max_abs_diff(model.get_weights(), reference.get_weights()),
            "moved": max_abs_diff(model.get_weights(), initial),
            "loss_err": abs(loss - ref_loss) / abs(ref_loss),
            "rows_pulled": [s["rows_pulled"] for s in stats], "expected_rows": expected,
            "whole_pulls": [s["whole_pulls"] for s in stats],
            "iterations": [s["iterations"] for s in stats]}


def sync_exact(strategy):
    """mode="sync": every group runs on both workers, each on its half of every global batch of
    16; the servers average the two gradients. Equals one-process Keras with batch 16 (Adam,
    several groups in flight), and evaluate/predict cover every row once, in order."""
    import keras

    rng = np.random.default_rng(11)
    x = rng.normal(size=(96, 5)).astype(np.float32)
    y = (x @ rng.normal(size=(5, 1)) > 0).astype(np.float32)

    def build():
        model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(4, activation="relu"),
                                  keras.layers.Dense(1, activation="sigmoid")])
        model.compile(optimizer=keras.optimizers.Adam(0.05), loss="binary_crossentropy",
                      metrics=["accuracy"], steps_per_execution=2)
        return model

    reference = build()
    with strategy.scope():
        model = build()
    model.set_weights(reference.get_weights())
    history = model.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0)
    ref_history = reference.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0)
    got = model.evaluate(x, y, batch_size=16, verbose=0)
    ref_got = reference.evaluate(x, y, batch_size=16, verbose=0)
    return {
        "replicas": strategy.num_replicas_in_sync,
        "weights_err": max_abs_diff(model.get_weights(), reference.get_weights()),
        "history_err": max(abs(a - b) / max(abs(b), 1e-6) for k in ref_history.history
                           for a, b in zip(history.history[k], ref_history.history[k],
                                           strict=True)),
        "evaluate_err": max(abs(a - b) / max(abs(b), 1e-6) for a, b in zip(got, ref_got,
                                                                             strict=True)),
        "predict_err": float(np.abs(model.predict(x, batch_size=16, verbose=0)
                                    - reference.predict(x, batch_size=16, verbose=0)).max()),
        "iterations": int(model.optimizer.iterations.numpy()),
        # Adam's moments come back from the servers (the file of model.save holds them).
        "optimizer_err": max_abs_diff([v.numpy() for v in model.optimizer.variables],
                                      [v.numpy() for v in reference.optimizer.variables]),
        "resumed_err": _resumed_from_a_saved_model(strategy, build, x, y),
        **_embedding_adam_errors(strategy),
    }


def _resumed_from_a_saved_model(strategy, build, x, y):
    """One epoch, model.save, keras.models.load_model under the strategy, one more epoch:
    the weights of two uninterrupted epochs (the loaded Adam state goes to the servers)."""
    import keras

    reference = build()
    initial = reference.get_weights()
    reference.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0)
    with strategy.scope():
        first = build()
    first.set_weights(initial)
    first.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0)
    with tempfile.TemporaryDirectory() as tmp:
        first.save(f"{tmp}/resume.keras")
        with strategy.scope():
            resumed = keras.models.load_model(f"{tmp}/resume.keras")
    resumed.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0)
    assert int(resumed.optimizer.iterations.numpy()) == 12, resumed.optimizer.iterations
    return max_abs_diff(resumed.get_weights(), reference.get_weights())


def _embedding_adam_errors(strategy):
    """An Embedding trained with Adam, its gradients row-sparse on the servers: by default with
    Keras' rule (every row's moments decay each step), so equal to one process; the lazy rule
    (only the looked-up rows change) is an opt-in that differs."""
    import keras

    rng = np.random.default_rng(12)
    ids = rng.integers(0, 60, size=(96, 3)).astype(np.int32)
    y = (ids.sum(axis=1, keepdims=True) % 2).astype(np.float32)

    def build():
        model = keras.Sequential([keras.Input((3,), dtype="int32"), keras.layers.Embedding(60, 4),
                                  keras.layers.GlobalAveragePooling1D(),
                                  keras.layers.Dense(1, activation="sigmoid")])
        model.compile(optimizer=keras.optimizers.Adam(0.05), loss="binary_crossentropy")
        return model

    reference = build()
    initial = reference.get_weights()
    reference.fit(ids, y, batch_size=16, epochs=2, shuffle=False, verbose=0)
    errors = {}
    for rule in ("default", "lazy"):
        with strategy.scope():
            model = build()
        if rule == "lazy":
            model.optimizer.stratax_sparse_updates = "lazy"
        model.set_weights(initial)
        model.fit(ids, y, batch_size=16, epochs=2, shuffle=False, verbose=0)
        errors[f"embedding_{rule}_err"] = max_abs_diff(model.get_weights(),
                                                       reference.get_weights())
    return errors


def counts(strategy):
    """evaluate visits every example once (confusion counts exact); predict in input order;
    save under PSS -> load under Mirrored -> load back under PSS."""
    x, y = binary_data(250)
    build = binary_model

    model = build(strategy)
    counter = GroupCounter().callback
    model.fit(x, y, batch_size=25, epochs=2, verbose=0, callbacks=[counter])
    got = model.evaluate(x, y, batch_size=16, verbose=0)  # loss, tp, fp, tn, fn
    predicted = model.predict(x, batch_size=16, verbose=0)
    local = np.asarray(model(x))                  # the chief's copy: refreshed after fit
    expected = confusion(local, y)
    with tempfile.TemporaryDirectory() as tmp:
        model.save(f"{tmp}/m.keras")
        mirrored = build(sx.MirroredStrategy())
        mirrored.load_weights(f"{tmp}/m.keras")
        mirrored_err = max_abs_diff(mirrored.get_weights(), model.get_weights())
        mirrored.save_weights(f"{tmp}/mirrored.weights.h5")
        back = build(strategy)
        back.load_weights(f"{tmp}/mirrored.weights.h5")
        back_got = back.evaluate(x, y, batch_size=16, verbose=0)
    return {
        "evaluated": got[1:], "expected": expected, "n": len(x), "loss": got[0],
        "predict_err": float(np.abs(predicted - local).max()), "predict_rows": len(predicted),
        "mirrored_err": mirrored_err,
        "back_counts": back_got[1:], "back_loss": back_got[0],
        "batch_ends": [b for b, _ in counter.ends], "epoch_logs": counter.epochs,
    }


def creator(strategy):
    """DatasetCreator: each worker reads its own dataset_fn; evaluate with steps."""
    import keras

    with strategy.scope():
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.Adam(0.1), loss="mse", steps_per_execution=5)
    history = model.fit(sx.DatasetCreator(regression_dataset_fn), epochs=3, steps_per_epoch=20,
                        verbose=0)
    evaluated = model.evaluate(sx.DatasetCreator(regression_dataset_fn), steps=10, verbose=0)
    stats = strategy.cluster_coordinator().stats()
    pipelines = {}
    for name, dataset_fn in (("tf_data", tf_data_dataset_fn), ("grain", grain_dataset_fn)):
        with strategy.scope():
            other = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
            other.compile(optimizer=keras.optimizers.Adam(0.1), loss="mse", steps_per_execution=5)
        trained = other.fit(sx.DatasetCreator(dataset_fn), epochs=3, steps_per_epoch=20,
                            verbose=0)
        pipelines[name] = {
            "loss": trained.history["loss"],
            "evaluate_loss": float(other.evaluate(sx.DatasetCreator(dataset_fn), steps=10,
                                                  verbose=0)),
            "iterations": int(other.optimizer.iterations.numpy())}
    return {"loss": history.history["loss"], "evaluate_loss": float(evaluated),
            "pipelines": pipelines,
            "iterations": int(model.optimizer.iterations.numpy()),
            "worker_steps": [stats[w].get("steps", 0) for w in sorted(stats)],
            "one_coordinator": sx.coordinator.ClusterCoordinator(strategy)
            is strategy.cluster_coordinator()}


def errors(strategy):
    """Inputs the runner does not accept fail at once, saying what is accepted."""
    import keras

    with strategy.scope():
        model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse")
    out = {}

    def generator():
        while True:
            yield np.zeros((4, 2), np.float32), np.zeros((4, 1), np.float32)

    class OwnStep(keras.Sequential):
        def train_step(self, state, data):
            raise AssertionError("never called under ParameterServerStrategy")

    with strategy.scope():
        own = OwnStep([keras.Input((2,)), keras.layers.Dense(1)])
        own.compile(optimizer="sgd", loss="mse")
    x2, y2 = np.zeros((4, 2), np.float32), np.zeros((4, 1), np.float32)
    for name, call in [("generator", lambda: model.fit(generator(), steps_per_epoch=2)),
                       ("own_train_step", lambda: own.fit(x2, y2, verbose=0)),
                       ("creator_no_steps", lambda: model.fit(sx.DatasetCreator(guide_dataset_fn))),
                       ("train_on_batch", lambda: model.train_on_batch(
                           np.zeros((4, 2), np.float32), np.zeros((4, 1), np.float32)))]:
        try:
            call()
            out[name] = None
        except (TypeError, ValueError) as err:
            out[name] = str(err)
    return out


def evaluate_kill(strategy):
    """The test SIGKILLs worker 1 after "KILL_NOW": evaluate still counts every example once
    (a closure that could not finish there runs again elsewhere, on the same rows)."""
    import keras

    x, y = binary_data(3000)
    model = binary_model(strategy, steps_per_execution=1)

    class Pause(keras.callbacks.Callback):
        def on_test_batch_end(self, batch, logs=None):
            if batch == 20:
                print("KILL_NOW", flush=True)
                time.sleep(1.5)

    got = model.evaluate(x, y, batch_size=10, callbacks=[Pause()], verbose=0)
    stats = strategy.cluster_coordinator().stats()
    return {"evaluated": got[1:], "expected": confusion(np.asarray(model(x)), y), "n": len(x),
            "worker_steps": {w: s.get("steps", 0) for w, s in stats.items()}}


SCENARIOS = {"exact": exact, "state": state, "sparse": sparse, "counts": counts, "creator": creator,
             "errors": errors, "guide": guide, "evaluate_kill": evaluate_kill,
             "sync_exact": sync_exact}


def main():
    names = sys.argv[1:]
    strategy = sx.ParameterServerStrategy(
        variable_partitioner=sx.partitioners.MinSizePartitioner(min_shard_bytes=64 << 10,
                                                                max_shards=2),
        mode="sync" if any(n.startswith("sync") for n in names) else "async",
        timeout_seconds=30)
    import keras

    keras.utils.set_random_seed(0)
    result, seconds = {}, {}
    for name in names:
        start = time.monotonic()
        result[name] = SCENARIOS[name](strategy)
        seconds[name] = round(time.monotonic() - start, 1)
    result["seconds"] = seconds
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
