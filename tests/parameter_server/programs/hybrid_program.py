"""Hybrid mode (``dense_variables="workers"``): one program for every role of chief + 2 workers
+ 2 ps. argv[1] is the scenario, ``all`` (the first four below, one cluster) or ``kill``; the
chief prints one JSON line ``RESULT {...}``.

- ``sync``: tables updated synchronously; fit/evaluate/predict equal one-process Keras on the
  same global batches, the dense variables trained on the workers (the servers applied none of
  their updates), Adam's state back in the model, a saved model resumed.
- ``async``: tables updated by each worker's rows as they arrive (``max_staleness=0``): every
  update counted once, the dense variables still synchronous.
- ``kill``: ``sync`` on more data with a callback that prints KILL_NOW mid-fit; the test
  SIGKILLs worker 1 and starts it again, and the run ends equal to one process.
- ``gone``: ``kill`` with ``timeout_seconds=GONE_TIMEOUT_S``, the worker not restarted: fit
  fails with ``sx.WorkerUnavailableError`` naming it (its message and the time it was raised).
- ``no_tables``: a model without an Embedding is refused with a clear error.
"""

import json
import sys
import tempfile
import time

import numpy as np

import stratax as sx

VOCAB = 60
GONE_TIMEOUT_S = 4.0


def data(n=96):
    rng = np.random.default_rng(12)
    ids = rng.integers(0, VOCAB, size=(n, 3)).astype(np.int32)
    return ids, (ids.sum(axis=1, keepdims=True) % 2).astype(np.float32)


def build(optimizer):
    import keras

    model = keras.Sequential([keras.Input((3,), dtype="int32"), keras.layers.Embedding(VOCAB, 8),
                              keras.layers.GlobalAveragePooling1D(),
                              keras.layers.Dense(16, activation="relu"),
                              keras.layers.Dense(1, activation="sigmoid")])
    model.compile(optimizer=optimizer(), loss="binary_crossentropy", metrics=["accuracy"],
                  steps_per_execution=2)
    return model


def max_abs_diff(a, b):
    return max(float(np.max(np.abs(np.asarray(x) - np.asarray(y)))) for x, y in zip(a, b,
                                                                                   strict=True))


def relative(a, b):
    return max(abs(x - y) / max(abs(y), 1e-6) for x, y in zip(a, b, strict=True))


def compare(strategy, optimizer, n=96, callbacks=()):
    """Trains 2 epochs on ``n`` examples under ``strategy`` and in this process from the same
    weights; the differences."""
    x, y = data(n)
    reference = build(optimizer)
    initial = reference.get_weights()
    with strategy.scope():
        model = build(optimizer)
    model.set_weights(initial)
    history = model.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0,
                        callbacks=list(callbacks))
    ref_history = reference.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0)
    dense_kernel = model.layers[-2].kernel
    return model, initial, {
        "weights_err": max_abs_diff(model.get_weights(), reference.get_weights()),
        "variable_errs": [max_abs_diff([a], [b]) for a, b in zip(
            model.get_weights(), reference.get_weights(), strict=True)],
        "losses": history.history["loss"],
        "history_err": max(relative(history.history[k], ref_history.history[k])
                           for k in ref_history.history),
        "evaluate_err": relative(model.evaluate(x, y, batch_size=16, verbose=0),
                                 reference.evaluate(x, y, batch_size=16, verbose=0)),
        "predict_err": float(np.abs(model.predict(x, batch_size=16, verbose=0)
                                    - reference.predict(x, batch_size=16, verbose=0)).max()),
        "iterations": int(model.optimizer.iterations.numpy()),
        "optimizer_err": max_abs_diff([v.numpy() for v in model.optimizer.variables],
                                      [v.numpy() for v in reference.optimizer.variables]),
        # The servers applied no update of a dense variable: its shards' ledgers are empty,
        # while its update count came back from the workers' replicas.
        "dense_ledger": sum(len(s) for s in strategy.applied_steps(
            strategy.place_variables(dense_kernel))),
        "dense_iterations": strategy.optimizer_iterations(strategy.place_variables(dense_kernel)),
        "table_ledger": [len(s) for s in strategy.applied_steps(
            strategy.place_variables(model.layers[0].embeddings))],
        "worker_steps": {w: s.get("steps", 0)
                         for w, s in strategy.cluster_coordinator().stats().items()},
    }


def resumed(strategy, optimizer, initial, uninterrupted):
    """One epoch, model.save, load_model under the strategy, one more epoch: the weights of
    the ``uninterrupted`` two epochs under the strategy from the same ``initial`` weights."""
    import keras

    x, y = data()
    with strategy.scope():
        first = build(optimizer)
    first.set_weights(initial)
    first.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0)
    with tempfile.TemporaryDirectory() as tmp:
        first.save(f"{tmp}/hybrid.keras")
        with strategy.scope():
            second = keras.models.load_model(f"{tmp}/hybrid.keras")
    second.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0)
    return max_abs_diff(second.get_weights(), uninterrupted.get_weights())


def adam():
    import keras

    return keras.optimizers.Adam(0.05)


def make_strategy(mode, dense_variables, timeout_seconds=20.0):
    return sx.ParameterServerStrategy(
        variable_partitioner=sx.partitioners.MinSizePartitioner(min_shard_bytes=256,
                                                                max_shards=2),
        mode=mode, dense_variables=dense_variables, timeout_seconds=timeout_seconds)


def sync(strategy):
    model, initial, result = compare(strategy, adam)
    # The same training with every variable on the servers (mode="sync"), by a second
    # strategy of this chief on the same cluster: the same bits.
    servers = make_strategy("sync", "ps")
    with servers.scope():
        on_servers = build(adam)
    on_servers.set_weights(initial)
    x, y = data()
    on_servers.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0)
    return {**result, "replicas": strategy.num_replicas_in_sync,
            "servers_err": max_abs_diff(model.get_weights(), on_servers.get_weights()),
            "resumed_err": resumed(strategy, adam, initial, model)}


def asynchronous(strategy):
    return compare(strategy, adam)[2]


def kill_now():
    """A callback that prints KILL_NOW once, mid-fit (the test kills a worker on it)."""
    import keras

    class KillWorker(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch >= 10 and not hasattr(self, "sent"):
                self.sent = True
                print("KILL_NOW", flush=True)

    return KillWorker()


def kill(strategy):
    _, _, result = compare(strategy, adam, n=768, callbacks=[kill_now()])
    stats = strategy.cluster_coordinator().stats()
    return {**result, "rejoined": sum(s.get("rejoined", 0) for s in stats.values())}


def gone(strategy):
    x, y = data(768)
    with strategy.scope():
        model = build(adam)
    try:
        model.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0,
                  callbacks=[kill_now()])
    except sx.WorkerUnavailableError as err:
        return {"error": str(err), "error_at": time.time()}
    return {"error": None}


def no_tables(strategy):
    import keras

    with strategy.scope():
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse")
    try:
        model.fit(np.zeros((16, 3), "float32"), np.zeros((16, 1), "float32"), batch_size=8,
                  verbose=0)
    except ValueError as err:
        return {"error": str(err)}
    return {"error": None}


def everything(strategy):
    """``sync`` and ``no_tables`` under ``strategy``, then ``async`` under a second strategy
    of this chief on the same cluster (one cluster start for the three)."""
    return {"sync": sync(strategy), "no_tables": no_tables(strategy),
            "async": asynchronous(make_strategy("async", "workers"))}


SCENARIOS = {"all": everything, "kill": kill, "gone": gone}


def main():
    name = sys.argv[1]
    strategy = make_strategy("sync", "workers", GONE_TIMEOUT_S if name == "gone" else 20.0)
    import keras

    keras.utils.set_random_seed(0)
    start = time.monotonic()
    result = SCENARIOS[name](strategy)
    result["seconds"] = round(time.monotonic() - start, 1)
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
