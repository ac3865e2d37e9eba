"""A custom loop under PreemptionCheckpointHandler on the workers of a MultiWorkerMirrored job.

Usage: python preemption_program.py CKPT_DIR OUT_DIR STEPS [PREEMPT_AT]. Trains with
``handler.run(model.train_on_batch, x, y)`` from ``handler.total_run_calls`` to STEPS; on the
first start worker 1 gets a SIGTERM (a preemption notice) before step PREEMPT_AT. Writes
OUT_DIR/weights_<worker>.npz (the final weights, the run call the start resumed at) and prints
"done <worker>".
"""

import os
import signal
import sys
import time

import stratax as sx

if __name__ == "__main__":
    strategy = sx.MultiWorkerMirroredStrategy(
        communication_options=sx.CommunicationOptions(timeout_seconds=60))

import keras
import numpy as np


def make_model(under):
    """The model, its optimizer built and its weights fixed (the test builds the same)."""
    with under.scope():
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, activation="tanh"),
                                  keras.layers.Dense(1)])
        model.compile(keras.optimizers.Adam(0.05), "mse")
        model.optimizer.build(model.trainable_variables)
    model.set_weights([np.linspace(-1, 1, w.size, dtype="float32").reshape(w.shape)
                       for w in model.get_weights()])
    return model


def batch(step):
    """Global batch ``step`` (8 rows; each worker feeds its half)."""
    x = np.linspace(-1, 1, 24, dtype="float32").reshape(8, 3) * (1 + step % 5)
    return x, np.sin(x.sum(axis=1, keepdims=True))


if __name__ == "__main__":
    ckpt_dir, out_dir, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
    preempt_at = int(sys.argv[4]) if len(sys.argv) > 4 else None
    first_start = os.environ.get("STRATAX_RESTART_COUNT", "0") == "0"
    model = make_model(strategy)
    handler = sx.experimental.PreemptionCheckpointHandler(
        strategy.cluster_resolver, {"model": model, "optimizer": model.optimizer}, ckpt_dir)
    resumed_at = handler.total_run_calls
    for step in range(handler.total_run_calls, steps):
        if first_start and step == preempt_at and strategy.worker_index == 1:
            os.kill(os.getpid(), signal.SIGTERM)
        handler.run(model.train_on_batch, *batch(step))
        time.sleep(0.05)  # a step's work: JAX's preemption service agrees within a few steps
    np.savez(os.path.join(out_dir, f"weights_{strategy.worker_index}.npz"),
             *model.get_weights(), resumed_at=resumed_at)
    print("done", strategy.worker_index, flush=True)
