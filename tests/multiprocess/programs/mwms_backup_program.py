"""Worker program for the fault-tolerance tests: multi-worker fit with step-level backups.

Usage: python mwms_backup_program.py OUT_DIR BACKUP_DIR MODE STEP [split] [batch=B]
MODE: "none" (uninterrupted), "kill9" (worker 1 is SIGKILLed at its STEP-th step of the first
start), "kill9w" (the same once its backup writes in flight are committed: the next start
resumes from the last backup at or before that step, whatever the timing), "sigterm" (worker 1
receives SIGTERM at that step: a preemption), "pause" (worker 1 writes OUT_DIR/paused_<restart>
at that step and stops training until it is killed: the test then removes its host, or adds
one), a fault with "@N" to strike worker N instead ("kill9@0"), or faults joined by "+"
("kill9+sigterm"): the first on the first start, the second on the first restart, ...
"split" (2 devices per worker): ``cores_per_replica=2`` and a ``layout_map`` that splits the
first kernel over the workers, so each holds half of it and the backups are written in parts.
"batch=B": a global batch of B rows instead of 16 (24 splits over 1, 2 and 3 workers).
Each worker writes OUT_DIR/weights_<worker>.npz when training completes, and prints
"start iterations <n>" once the backup (if any) is restored.
"""

import os
import signal
import sys
import time

import keras
import numpy as np
from data import GLOBAL_BATCH, make_data

import stratax as sx


def split_layout():
    """The first kernel's rows split over the workers' replicas (FSDP) and its columns over
    each worker's 2 cores; the second kernel's rows over the cores."""
    layout_map = keras.distribution.LayoutMap(None)
    layout_map[".*dense/kernel"] = ("replica", "core")
    layout_map[".*dense_1/kernel"] = ("core", None)
    return layout_map


def train(strategy, callbacks=(), batch=GLOBAL_BATCH):
    """The run every test of this program trains: 3 epochs with dropout (19 steps each with
    the global batch of 16)."""
    x, y = make_data(n=300)
    keras.utils.set_random_seed(21)
    with strategy.scope():
        model = keras.Sequential([keras.Input((10,)), keras.layers.Dense(32, activation="relu"),
                                  keras.layers.Dropout(0.2), keras.layers.Dense(4)])
        model.compile(optimizer="adam", metrics=["accuracy"],
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(x, y, epochs=3, batch_size=batch, verbose=0, callbacks=list(callbacks))
    return model


class Fault(keras.callbacks.Callback):
    def __init__(self, strategy, fault, step, split, out_dir=".", backup_dir=None):
        super().__init__()
        self.strategy, self.step, self.split, self.out_dir = strategy, step, split, out_dir
        self.backup_dir = backup_dir
        self.fault, _, victim = fault.partition("@")
        self.victim = int(victim or 1)
        self.seen = 0

    def on_train_begin(self, logs=None):  # after the backup's: the restored count
        print("start iterations", int(self.model.optimizer.iterations.numpy()), flush=True)
        kernel = self.model.layers[0].kernel.value  # held in parts by the workers, if split
        assert (not kernel.is_fully_addressable and not kernel.is_fully_replicated) \
            == self.split

    def on_train_batch_end(self, batch, logs=None):
        self.seen += 1
        if self.strategy.worker_index != self.victim or self.seen != self.step:
            return
        if self.fault == "kill9w":
            from stratax._src.keras.callbacks.backup import wait_for_writes

            wait_for_writes(self.backup_dir)
        if self.fault in ("kill9", "kill9w"):
            os.kill(os.getpid(), signal.SIGKILL)
        if self.fault == "sigterm":
            os.kill(os.getpid(), signal.SIGTERM)
            # JAX's notifier looks at its SIGTERM flag once a second: without this pause the
            # rest of this short run can end before the workers agree on a step to save at.
            time.sleep(3)
        if self.fault == "pause":
            restart = os.environ.get("STRATAX_RESTART_COUNT", "0")
            with open(os.path.join(self.out_dir, f"paused_{restart}"), "w") as marker:
                marker.write(str(os.getpid()))
            time.sleep(120)


if __name__ == "__main__":
    out_dir, backup_dir, mode, step = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    split = "split" in sys.argv[5:]
    batch = next((int(a[6:]) for a in sys.argv[5:] if a.startswith("batch=")), GLOBAL_BATCH)
    restart = int(os.environ.get("STRATAX_RESTART_COUNT", "0"))
    faults = mode.split("+")
    strategy = sx.MultiWorkerMirroredStrategy(
        cores_per_replica=2 if split else None, layout_map=split_layout() if split else None,
        communication_options=sx.CommunicationOptions(timeout_seconds=30))
    fault = Fault(strategy, faults[restart] if restart < len(faults) else "none", step, split,
                  out_dir, backup_dir)
    model = train(strategy, [sx.BackupAndRestore(backup_dir, save_freq=3), fault], batch)
    np.savez(os.path.join(out_dir, f"weights_{strategy.worker_index}.npz"),
             *model.get_weights())
    print("completed", strategy.worker_index, flush=True)
