"""Worker program whose worker 1 is killed with SIGKILL in the middle of an epoch.

Worker 0 must fail with WorkerUnavailableError naming worker 1, within the timeout.
"""

import os
import signal
import sys
import time

import stratax as sx

strategy = sx.MultiWorkerMirroredStrategy(
    communication_options=sx.CommunicationOptions(timeout_seconds=float(sys.argv[1])))

import keras  # noqa: E402
from data import GLOBAL_BATCH, make_data, make_model  # noqa: E402


class KillWorkerOne(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        if batch == 3 and strategy.worker_index == 1:
            os.kill(os.getpid(), signal.SIGKILL)


x, y = make_data(n=800)
with strategy.scope():
    model = make_model()
start = time.monotonic()
try:
    model.fit(x, y, epochs=50, batch_size=GLOBAL_BATCH, verbose=0, callbacks=[KillWorkerOne()])
except sx.WorkerUnavailableError as error:
    print(f"caught after {time.monotonic() - start:.1f}s: {error}", flush=True)
    raise
