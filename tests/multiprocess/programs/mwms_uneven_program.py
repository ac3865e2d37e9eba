"""Custom loop over uneven batches on every worker; prints one JSON line of results per worker.

Usage: python mwms_uneven_program.py. Three inputs: global batches read by every worker (auto-shard
by data, last batch 6 rows over the replicas), per-worker batches (``AutoShardPolicy.OFF``) where
worker 1 has fewer and shorter batches, and ``distribute_datasets_from_function`` where worker 1's
pipeline ends steps before worker 0's. Every step sums the batch with an all-reduce, counts real
rows, and gathers the batch.
"""

import json

import stratax as sx

strategy = sx.MultiWorkerMirroredStrategy(
    communication_options=sx.CommunicationOptions(timeout_seconds=60))

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

worker = strategy.worker_index


def step(x):
    ctx = sx.get_replica_context()
    loss = sx.compute_average_loss((x + 1.0) ** 2)
    return (ctx.all_reduce("sum", jnp.sum(x)), ctx.all_reduce("sum", ctx.num_valid_rows),
            ctx.all_reduce("sum", loss))


def summarize(dist):
    total, rows, losses, gathered, steps = 0.0, 0, [], [], 0
    for batch in dist:
        summed, count, loss = strategy.run(step, args=(batch,))
        total += float(summed)
        rows += int(count)
        losses.append(float(loss))
        gathered.extend(np.asarray(strategy.gather(batch, axis=0)).tolist())
        steps += 1
    return {"sum": total, "rows": rows, "losses": losses, "gathered": gathered, "steps": steps}


data = np.arange(22, dtype=np.float32)
own = {0: [np.arange(0, 8, dtype=np.float32), np.arange(8, 14, dtype=np.float32),
           np.arange(14, 16, dtype=np.float32)],
       1: [np.arange(100, 104, dtype=np.float32), np.arange(104, 105, dtype=np.float32)]}


def dataset_fn(ctx):
    x = np.arange(9, dtype=np.float32) if ctx.input_pipeline_id == 0 else np.arange(
        100, 103, dtype=np.float32)
    return [x[i:i + 2] for i in range(0, len(x), 2)]


results = {
    "data": summarize(strategy.experimental_distribute_dataset(
        [data[i:i + 8] for i in range(0, len(data), 8)])),
    "off": summarize(strategy.experimental_distribute_dataset(
        own[worker], options=sx.InputOptions(auto_shard_policy=sx.AutoShardPolicy.OFF))),
    "from_function": summarize(strategy.distribute_datasets_from_function(dataset_fn)),
}
print("RESULT", worker, strategy.num_replicas_in_sync, json.dumps(results), flush=True)
