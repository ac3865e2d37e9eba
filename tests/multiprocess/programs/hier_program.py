"""What each worker runs in tests/multiprocess/test_hierarchical.py (2 hosts x 2 processes).

Usage: python hier_program.py OUT_DIR. Trains the suite's MLP with ``fit`` (2 epochs, arrays)
and writes OUT_DIR/arrays_weights_<worker>.npz (weights and loss history); then sums, in one
``strategy.run`` program with two ``ctx.all_reduce`` calls, tensors of sizes that do not split
over the processes of a host and one larger than a shared-memory slot, whose exact sums numpy
knows (small integers). Prints "hierarchical <bool> hosts <members>", "sum mismatches N",
"hierarchical traced N" and "done <worker>".
"""

import logging
import os
import sys

import stratax as sx

logging.basicConfig(format="%(levelname)s %(name)s: %(message)s")
logging.getLogger("stratax").setLevel(logging.INFO)

strategy = sx.MultiWorkerMirroredStrategy(
    communication_options=sx.CommunicationOptions(timeout_seconds=60))

import keras  # noqa: E402
import numpy as np  # noqa: E402
from data import GLOBAL_BATCH, make_data, make_model  # noqa: E402

from stratax._src.runtime import shm_collectives  # noqa: E402

out_dir = sys.argv[1]
worker = strategy.worker_index
state = shm_collectives.state
print("hierarchical", state.hierarchical, "hosts", state.hosts.members, flush=True)

x, y = make_data()
keras.utils.set_random_seed(11)
with strategy.scope():
    model = make_model()
history = model.fit(x, y, epochs=2, batch_size=GLOBAL_BATCH, shuffle=False, verbose=0)
np.savez(os.path.join(out_dir, f"arrays_weights_{worker}.npz"), *model.get_weights(),
         history=np.asarray(history.history["loss"]))

SIZES = {"odd": (3, 5), "one": (1,), "big": (70_001,)}


def values(replica):
    rng = np.random.default_rng(replica)
    out = {k: rng.integers(-50, 50, size=s).astype(np.float32) for k, s in SIZES.items()}
    out["i32"] = rng.integers(-50, 50, size=(7,)).astype(np.int32)
    return out


def step(tree):
    ctx = sx.get_replica_context()
    return ctx.all_reduce("sum", tree), ctx.all_reduce("mean", {"twice": tree["odd"] * 2})


tree = strategy.experimental_distribute_values_from_function(
    lambda ctx: values(ctx.replica_id_in_sync_group))
replicas = strategy.num_replicas_in_sync
expected = {k: sum(values(r)[k] for r in range(replicas)) for k in (*SIZES, "i32")}
mismatches = 0
for _ in range(5):  # several rounds: both buffers of each host's segment in use
    summed, mean = strategy.run(step, args=(tree,))
    local = {k: np.asarray(strategy.experimental_local_results(v)[0]) for k, v in summed.items()}
    mismatches += sum(not np.array_equal(local[k], expected[k]) for k in expected)
    twice = np.asarray(strategy.experimental_local_results(mean["twice"])[0])
    mismatches += not np.array_equal(twice, expected["odd"] * 2 / replicas)
print("sum mismatches", mismatches, flush=True)
print("hierarchical traced", state.hierarchical_traced, flush=True)
print("done", worker, flush=True)
