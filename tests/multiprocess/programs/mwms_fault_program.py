"""Worker program for the failure tests: one worker fails in a chosen way, the others train on.

Usage: python mwms_fault_program.py OUT_DIR MODE
MODE: "raise_at_batch" (worker 1 raises RuntimeError from a callback at batch 20),
"raise_after_strategy" (worker 1 raises right after creating the strategy),
"sigterm" (worker 1 receives SIGTERM at batch 20; no BackupAndRestore is used),
"sigstop" (worker 1 stops itself with SIGSTOP at batch 20: a hung worker; 10 s timeout),
"none" (no fault: trains for minutes, for tests that signal from outside).
Worker 1 writes OUT_DIR/event.time (``time.time()``) just before the fault, so a test can
measure the seconds from the fault to the end of the group; every worker writes
OUT_DIR/training_<worker> once it has trained 5 steps.
"""

import os
import signal
import sys
import time

import stratax as sx

out_dir, mode = sys.argv[1], sys.argv[2]
strategy = sx.MultiWorkerMirroredStrategy(
    communication_options=sx.CommunicationOptions(timeout_seconds=10 if mode == "sigstop" else 60))


def mark_event() -> None:
    with open(os.path.join(out_dir, "event.time.tmp"), "w") as f:
        f.write(repr(time.time()))
    os.replace(os.path.join(out_dir, "event.time.tmp"), os.path.join(out_dir, "event.time"))


if mode == "raise_after_strategy" and strategy.worker_index == 1:
    mark_event()
    raise RuntimeError("worker one failed right after creating the strategy")

import keras  # noqa: E402
from data import GLOBAL_BATCH, make_data, make_model  # noqa: E402


class Fault(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.seen = 0

    def on_train_batch_end(self, batch, logs=None):
        self.seen += 1
        if self.seen == 5:
            open(os.path.join(out_dir, f"training_{strategy.worker_index}"), "w").close()
        if self.seen != 20 or strategy.worker_index != 1:
            return
        mark_event()
        if mode == "raise_at_batch":
            raise RuntimeError("worker one failed at batch 20")
        if mode in ("sigterm", "sigstop"):
            os.kill(os.getpid(), signal.SIGTERM if mode == "sigterm" else signal.SIGSTOP)


x, y = make_data(n=800)
with strategy.scope():
    model = make_model()
model.fit(x, y, epochs=200, batch_size=GLOBAL_BATCH, verbose=0, callbacks=[Fault()])
print("training ended normally", strategy.worker_index, flush=True)
