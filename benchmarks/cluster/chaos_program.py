"""One chaos trial's training program: ``fit`` with ``sx.BackupAndRestore``, under
``MultiWorkerMirroredStrategy`` or ``ParameterServerStrategy`` (sync, async, hybrid: sync
tables on the servers, the dense layers replicated on the workers, or ps-table: sync, with an
embedding table and its Adam slots built by the servers, never held by the chief, so its
backup is the servers' sharded checkpoint).

Usage (every task of the launch runs it)::

    stratax launch --nproc-per-node 2 --max-restarts 3 chaos_program.py mwms OUT_DIR
    stratax launch --workers 2 --ps 1 --max-restarts 3 chaos_program.py ps-async OUT_DIR

The chief writes ``OUT_DIR/progress`` (the global step) after every step, so the harness
(``benchmarks/workloads/chaos.py``) can strike at a chosen step, and at the end
``OUT_DIR/result.json``: ``optimizer.iterations``, the steps the run should have trained, the step
this run resumed at, every parameter-server shard's ledger (the ids of the steps applied to it),
update count and skipped re-sent steps, and the final weights by variable path
(``OUT_DIR/weights.npz``).
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np

import stratax as sx

EPOCHS, STEPS_PER_EPOCH, GLOBAL_BATCH, FEATURES = 4, 12, 32, 16
VOCAB = {"hybrid": 50, "ps-table": 1000}  # rows of the table, in the modes that have one
TABLE_BYTES = 8192  # ps-table: variables this large (the table: 16 KB) are built by the servers
BACKUP_EVERY = 4          # steps between backups
TIMEOUT_SECONDS = 10.0    # every wait on a peer (the strategy's timeout_seconds)
MULTI_WORKER = ("mwms", "elastic")  # MultiWorkerMirrored; elastic: under --nproc-per-node 1:2


def _strategy(mode: str):
    if mode in MULTI_WORKER:
        return sx.MultiWorkerMirroredStrategy(
            communication_options=sx.CommunicationOptions(timeout_seconds=TIMEOUT_SECONDS))
    if mode == "hybrid":
        return sx.ParameterServerStrategy(mode="sync", dense_variables="workers",
                                          timeout_seconds=TIMEOUT_SECONDS)
    return sx.ParameterServerStrategy(mode="sync" if mode == "ps-table" else mode[3:],
                                      timeout_seconds=TIMEOUT_SECONDS)


def _data(mode: str) -> tuple[object, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(STEPS_PER_EPOCH * GLOBAL_BATCH, FEATURES)).astype(np.float32)
    teacher = rng.normal(size=(FEATURES, 1)).astype(np.float32)
    y = np.tanh(x @ teacher) + 0.1 * x[:, :1]
    if mode not in VOCAB:
        return x, y
    # A table on the servers: ids that carry part of the signal.
    ids = (np.abs(x[:, :2]) * 20).astype(np.int32) % VOCAB[mode]
    return {"ids": ids, "features": x}, y


def _model(mode: str):
    import keras

    if mode not in VOCAB:
        return keras.Sequential([keras.Input((FEATURES,)),
                                 keras.layers.Dense(32, activation="relu"),
                                 keras.layers.Dense(1)])
    ids = keras.Input((2,), dtype="int32", name="ids")
    features = keras.Input((FEATURES,), name="features")
    rows = keras.layers.Flatten()(keras.layers.Embedding(VOCAB[mode], 4)(ids))
    hidden = keras.layers.Dense(32, activation="relu")(
        keras.layers.Concatenate()([rows, features]))
    return keras.Model({"ids": ids, "features": features}, keras.layers.Dense(1)(hidden))


def _write_atomically(path: str, text: str) -> None:
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)


def main() -> None:
    mode, out_dir = sys.argv[1], sys.argv[2]
    strategy = _strategy(mode)     # on a ps-mode worker or ps task: serves, then exits
    import keras

    is_chief = mode not in MULTI_WORKER or strategy.worker_index == 0

    class Progress(keras.callbacks.Callback):
        def __init__(self) -> None:
            super().__init__()
            self.step = 0

        def on_train_begin(self, logs=None) -> None:
            self.step = self.resumed_at = int(self.model.optimizer.iterations.numpy())

        def on_train_batch_end(self, batch, logs=None) -> None:
            self.step += 1
            if is_chief:
                _write_atomically(os.path.join(out_dir, "progress"), str(self.step))

    x, y = _data(mode)
    keras.utils.set_random_seed(7)
    if mode == "ps-table":
        sx.config.update("ps_build_on_servers_bytes", TABLE_BYTES)
    with strategy.scope():
        model = _model(mode)
        model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    backup = sx.BackupAndRestore(os.path.join(out_dir, "backup"), save_freq=BACKUP_EVERY,
                                 delete_checkpoint=False)
    progress = Progress()
    model.fit(x, y, batch_size=GLOBAL_BATCH, epochs=EPOCHS, shuffle=False, verbose=0,
              callbacks=[backup, progress])
    if not is_chief:
        return
    result = {"iterations": int(model.optimizer.iterations.numpy()),
              "expected": EPOCHS * STEPS_PER_EPOCH, "resumed_at": progress.resumed_at,
              "restart": int(os.environ.get("STRATAX_RESTART_COUNT", "0"))}
    if mode not in MULTI_WORKER:
        # Each shard's ledger: the ids of the steps applied to it since this run began, its
        # optimizer's update count and the re-sent steps it skipped.
        shards = []
        for v in strategy.place_variables(model.trainable_variables):
            # Hybrid mode: the dense variables' ledgers lived in the workers' replicas, which
            # give back only values and slots at the end; their weights are the check.
            on_workers = mode == "hybrid" and not v.name.startswith("embedding")
            for stats, ledger in zip(strategy.shard_stats(v), strategy.applied_steps(v),
                                     strict=True):
                shards.append({"variable": v.name, "iterations": stats["iterations"],
                               "duplicates": stats["duplicates"],
                               "ledger": None if on_workers else ledger})
        result["shards"] = shards
    # The servers' values (a table they built is never whole on the chief: read it from them).
    weights = ({v.name: np.asarray(v.numpy()) for v in strategy.place_variables(model.variables)}
               if mode == "ps-table" else
               {v.path: np.asarray(v.numpy()) for v in model.weights})
    np.savez(os.path.join(out_dir, "weights.npz"), **weights)
    _write_atomically(os.path.join(out_dir, "result.json"), json.dumps(result))


if __name__ == "__main__":
    main()
