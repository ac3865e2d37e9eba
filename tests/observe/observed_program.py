"""A tiny multi-worker training run for the dashboard test (started by ``stratax launch``).

Trains under MultiWorkerMirroredStrategy with ``sx.callbacks.WorkerMetrics`` and
``sx.callbacks.TensorBoard`` until the file ``argv[1]`` exists (all workers agree on the epoch
through an all-reduce, so none waits for a peer that stopped) or ``argv[2]`` epochs passed.
"""

import os
import sys

import keras
import numpy as np

import stratax as sx

STOP_FILE, MAX_EPOCHS, TB_DIR = sys.argv[1], int(sys.argv[2]), sys.argv[3]

strategy = sx.MultiWorkerMirroredStrategy(
    communication_options=sx.CommunicationOptions(timeout_seconds=60))


class StopWhenAsked(keras.callbacks.Callback):
    """Stops every worker at the same epoch end once the stop file exists on any of them."""

    def on_epoch_end(self, epoch, logs=None):
        flag = float(os.path.exists(STOP_FILE))
        value = strategy.experimental_distribute_values_from_function(
            lambda ctx: np.array([flag], np.float32))
        agreed = strategy.run(
            lambda v: sx.get_replica_context().all_reduce(sx.ReduceOp.MAX, v), args=(value,))
        if float(np.asarray(agreed)[0]) > 0:
            self.model.stop_training = True


rng = np.random.default_rng(0)
x = rng.normal(size=(2048, 32)).astype(np.float32)
y = (x[:, :4].sum(axis=1) > 0).astype(np.int32)
with strategy.scope():
    model = keras.Sequential([keras.Input((32,)), keras.layers.Dense(64, activation="relu"),
                              keras.layers.Dense(2)])
    model.compile(optimizer=keras.optimizers.SGD(0.05),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
model.fit(x, y, batch_size=64, epochs=MAX_EPOCHS, verbose=0,
          callbacks=[sx.callbacks.WorkerMetrics(every_seconds=0.5),
                     sx.callbacks.TensorBoard(TB_DIR), StopWhenAsked()])
print(f"worker {strategy.worker_index}: trained {len(model.history.epoch)} epochs", flush=True)
