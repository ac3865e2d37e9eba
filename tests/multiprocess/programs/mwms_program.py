"""The MultiWorkerMirroredStrategy guide program, as each worker runs it in the tests.

Usage: python mwms_program.py OUT_DIR [EPOCHS] [INPUTS] [GLOBAL_BATCH]. Trains on numpy arrays;
with INPUTS "all" it also trains on a list of global batches (auto-shard by data) and on
per-worker batches (``AutoShardPolicy.OFF``). Writes OUT_DIR/<inputs>_weights_<worker>.npz and
prints "done <worker> <num_replicas>". The data is the same on every worker. The
``distribute_datasets_from_function`` variant's ``dataset_fn`` yields whole batches only, so its
reference is a run on whole batches only. With INPUTS "all", ``sx.callbacks.WorkerMetrics``
writes OUT_DIR/run_<inputs>/metrics/worker<i>.jsonl (see ``reporters``).
"""

import os
import sys

import stratax as sx

strategy = sx.MultiWorkerMirroredStrategy(
    communication_options=sx.CommunicationOptions(timeout_seconds=60))

import keras  # noqa: E402
import numpy as np  # noqa: E402
from data import GLOBAL_BATCH, make_data, make_model  # noqa: E402
from jax.experimental import multihost_utils  # noqa: E402

from stratax._src.runtime import shm_collectives  # noqa: E402

out_dir = sys.argv[1]
epochs = int(sys.argv[2]) if len(sys.argv) > 2 else 2
if len(sys.argv) > 4:
    GLOBAL_BATCH = int(sys.argv[4])
ALL = ["arrays", "batches", "off", "from_function"]
variants = ALL if len(sys.argv) > 3 and sys.argv[3] == "all" else ["arrays"]
x, y = make_data()
batches = [(x[i:i + GLOBAL_BATCH], y[i:i + GLOBAL_BATCH]) for i in range(0, len(x), GLOBAL_BATCH)]
worker, workers = strategy.worker_index, strategy.num_workers


def own_rows(batch):
    share = len(batch[0]) // workers
    return tuple(a[worker * share:(worker + 1) * share] for a in batch)


inputs = {
    "arrays": lambda: {"x": x, "y": y, "batch_size": GLOBAL_BATCH, "shuffle": False},
    "batches": lambda: {"x": strategy.experimental_distribute_dataset(batches)},
    "off": lambda: {"x": strategy.experimental_distribute_dataset(
        [own_rows(b) for b in batches],
        options=sx.InputOptions(auto_shard_policy=sx.AutoShardPolicy.OFF))},
    "from_function": lambda: {"x": strategy.distribute_datasets_from_function(dataset_fn),
                              "steps_per_epoch": len(batches)},
}


def dataset_fn(ctx):
    """Each input pipeline (worker) reads its rows of every global batch, for every epoch."""
    assert (ctx.num_input_pipelines, ctx.input_pipeline_id) == (workers, worker), ctx
    per_replica = ctx.get_per_replica_batch_size(GLOBAL_BATCH)
    full = len(x) // GLOBAL_BATCH * GLOBAL_BATCH  # whole batches only
    for _ in range(epochs):
        for start in range(0, full, GLOBAL_BATCH):
            rows = slice(start + worker * per_replica, start + (worker + 1) * per_replica)
            yield x[rows], y[rows]


def reporters(variant):
    """With INPUTS "all", every worker observes the arrays' fit and worker 0 alone the batches'
    (its estimate of the all-reduce, a collective, must then be skipped, not left unmatched)."""
    if variants != ALL or variant not in ("arrays", "batches") or (variant, worker) == (
            "batches", 1):
        return []
    return [sx.callbacks.WorkerMetrics(os.path.join(out_dir, f"run_{variant}"),
                                       task=f"worker{worker}", every_seconds=0.05)]


for variant in variants:
    keras.utils.set_random_seed(11)
    with strategy.scope():
        model = make_model()
    history = model.fit(epochs=epochs, verbose=0, callbacks=reporters(variant),
                        **inputs[variant]())
    loss, accuracy = model.evaluate(x, y, batch_size=GLOBAL_BATCH, verbose=0)
    predictions = model.predict(x, batch_size=GLOBAL_BATCH, verbose=0)
    np.savez(os.path.join(out_dir, f"{variant}_weights_{worker}.npz"), *model.get_weights(),
             history=np.asarray(history.history["loss"]), evaluation=np.asarray([loss, accuracy]),
             predictions=predictions)

# Keras resets every metric at each epoch start; placing those constants must not cost JAX's
# cross-process equality check (an all-gather per variable), and must still give zeros.
equality_checks = []
check = multihost_utils.assert_equal
multihost_utils.assert_equal = lambda *a, **k: (equality_checks.append(a), check(*a, **k))[1]
model.reset_metrics()
multihost_utils.assert_equal = check
assert all(not np.any(np.asarray(v)) for v in model.metrics_variables), "metrics not reset"
print("equality checks in reset_metrics", len(equality_checks), flush=True)
# TensorFlow's strategy.extended: only the chief (here worker 0) checkpoints and writes
# summaries; reduce_to sums every worker's replicas onto a variable's placement.
extended = strategy.extended
ids = strategy.experimental_distribute_values_from_function(
    lambda ctx: np.float32(ctx.replica_id_in_sync_group + 1))
total = extended.reduce_to(sx.ReduceOp.SUM, ids, model.variables[0])
print("extended", worker, extended.should_checkpoint, extended.should_save_summary,
      len(extended.worker_devices), extended.variable_created_in_scope(model.variables[0]),
      float(np.asarray(total.addressable_data(0))), flush=True)
print("plan", model.train_function.plan.name, flush=True)  # docs/design/step-plan.md
print("done", worker, strategy.num_replicas_in_sync, flush=True)
print("shm all-reduces traced", shm_collectives.state.traced_calls, flush=True)
