"""Worker program for the fault-tolerance tests: multi-worker fit with step-level backups.

Usage: python mwms_backup_program.py OUT_DIR BACKUP_DIR MODE STEP
MODE: "none" (uninterrupted), "kill9" (worker 1 is SIGKILLed at its STEP-th step of the first
start), "sigterm" (worker 1 receives SIGTERM at that step: a preemption), a fault with "@N" to
strike worker N instead ("kill9@0"), or faults joined by "+" ("kill9+sigterm"): the first on the
first start, the second on the first restart, ...
Each worker writes OUT_DIR/weights_<worker>.npz when training completes.
"""

import os
import signal
import sys
import time

import stratax as sx

strategy = sx.MultiWorkerMirroredStrategy(
    communication_options=sx.CommunicationOptions(timeout_seconds=30))

import keras  # noqa: E402
import numpy as np  # noqa: E402
from data import GLOBAL_BATCH, make_data  # noqa: E402

out_dir, backup_dir, mode, step = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
restart = int(os.environ.get("STRATAX_RESTART_COUNT", "0"))
faults = mode.split("+")
fault, _, victim = (faults[restart] if restart < len(faults) else "none").partition("@")
victim = int(victim or 1)


class Fault(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.seen = 0

    def on_train_batch_end(self, batch, logs=None):
        self.seen += 1
        if strategy.worker_index != victim or self.seen != step:
            return
        if fault == "kill9":
            os.kill(os.getpid(), signal.SIGKILL)
        if fault == "sigterm":
            os.kill(os.getpid(), signal.SIGTERM)
            # JAX's notifier looks at its SIGTERM flag once a second: without this pause the
            # rest of this short run can end before the workers agree on a step to save at.
            time.sleep(3)


x, y = make_data(n=300)
keras.utils.set_random_seed(21)
with strategy.scope():
    model = keras.Sequential([keras.Input((10,)), keras.layers.Dense(32, activation="relu"),
                              keras.layers.Dropout(0.2), keras.layers.Dense(4)])
    model.compile(optimizer="adam", metrics=["accuracy"],
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
backup = sx.BackupAndRestore(backup_dir, save_freq=3)
model.fit(x, y, epochs=3, batch_size=GLOBAL_BATCH, verbose=0, callbacks=[backup, Fault()])
np.savez(os.path.join(out_dir, f"weights_{strategy.worker_index}.npz"), *model.get_weights())
print("completed", strategy.worker_index, flush=True)
