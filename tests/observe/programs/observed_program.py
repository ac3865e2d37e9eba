"""A tiny multi-worker training run for the dashboard test (started by ``stratax launch``).

Trains under MultiWorkerMirroredStrategy with ``sx.callbacks.WorkerMetrics`` and
``sx.callbacks.TensorBoard`` until the file ``argv[1]`` exists (all workers agree on the epoch
through an all-reduce, so none waits for a peer that stopped) or ``argv[2]`` epochs passed.
With ``argv[4]`` (a backup directory) and ``argv[5]`` (a step), it backs up every 20 steps
through ``sx.BackupAndRestore`` and worker 1 kills itself (SIGKILL) at that step of the first
start, so that ``stratax launch --max-restarts 1`` resumes the run from the last backup.
"""

import os
import signal
import sys

import keras
import numpy as np

import stratax as sx

STOP_FILE, MAX_EPOCHS, TB_DIR = sys.argv[1], int(sys.argv[2]), sys.argv[3]
BACKUP_DIR, KILL_AT = (sys.argv[4], int(sys.argv[5])) if len(sys.argv) > 5 else (None, None)

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


class KilledOnce(keras.callbacks.Callback):
    """Worker 1 dies by SIGKILL at step ``KILL_AT`` of the group's first start."""

    def __init__(self):
        super().__init__()
        self.steps = 0

    def on_train_batch_end(self, batch, logs=None):
        self.steps += 1
        if (self.steps == KILL_AT and strategy.worker_index == 1
                and os.environ["STRATAX_RESTART_COUNT"] == "0"):
            os.kill(os.getpid(), signal.SIGKILL)


rng = np.random.default_rng(0)
x = rng.normal(size=(2048, 32)).astype(np.float32)
y = (x[:, :4].sum(axis=1) > 0).astype(np.int32)
with strategy.scope():
    model = keras.Sequential([keras.Input((32,)), keras.layers.Dense(64, activation="relu"),
                              keras.layers.Dense(2)])
    model.compile(optimizer=keras.optimizers.SGD(0.05),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
callbacks = [sx.callbacks.WorkerMetrics(every_seconds=0.5), sx.callbacks.TensorBoard(TB_DIR),
             StopWhenAsked()]
if BACKUP_DIR is not None:
    callbacks += [sx.BackupAndRestore(BACKUP_DIR, save_freq=20), KilledOnce()]
model.fit(x, y, batch_size=64, epochs=MAX_EPOCHS, verbose=0, callbacks=callbacks)
print(f"worker {strategy.worker_index}: trained {len(model.history.epoch)} epochs", flush=True)
