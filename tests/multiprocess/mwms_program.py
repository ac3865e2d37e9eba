"""The MultiWorkerMirroredStrategy guide program, as each worker runs it in the tests.

Usage: python mwms_program.py OUT_DIR [EPOCHS]. Writes OUT_DIR/weights_<worker>.npz and prints
"done <worker> <num_replicas>". The data is the same on every worker (auto-shard by data).
"""

import os
import sys

import stratax as sx

strategy = sx.MultiWorkerMirroredStrategy(
    communication_options=sx.CommunicationOptions(timeout_seconds=60))

import keras  # noqa: E402
import numpy as np  # noqa: E402

from data import GLOBAL_BATCH, make_data, make_model  # noqa: E402

out_dir = sys.argv[1]
epochs = int(sys.argv[2]) if len(sys.argv) > 2 else 2
x, y = make_data()
keras.utils.set_random_seed(11)
with strategy.scope():
    model = make_model()
history = model.fit(x, y, epochs=epochs, batch_size=GLOBAL_BATCH, shuffle=False, verbose=0)
loss, accuracy = model.evaluate(x, y, batch_size=GLOBAL_BATCH, verbose=0)
np.savez(os.path.join(out_dir, f"weights_{strategy.worker_index}.npz"), *model.get_weights(),
         history=np.asarray(history.history["loss"]), evaluation=np.asarray([loss, accuracy]))
print("done", strategy.worker_index, strategy.num_replicas_in_sync, flush=True)
