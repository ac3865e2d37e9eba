"""One kill trial: chief + 2 workers + 1 ps, ``sync`` or ``async`` (argv[1]).

The chief prints STARTED once the programs are compiled; the test then SIGKILLs a random
worker at a random moment and restarts it (or, with ``KILL_ONCE_MARKER`` set, worker 1 kills
itself once at its 200th batch and ``stratax launch --max-restarts`` restarts it). The chief
trains PHASE1[mode] calls, and more in groups of a quarter of that until PHASE1_MIN_S have passed
(so the kill lands in them however fast the transport is), waits (bounded) for the
restarted worker to rejoin, trains PHASE2 more calls, and prints a RESULT line: the ps ledger,
``optimizer.iterations``, and in sync mode the largest difference from the same SGD steps
computed in this process on the same global batches (what a run without a kill gives).
"""

import itertools
import json
import os
import signal
import sys
import time
import types

import numpy as np

import stratax as sx

BATCH, DIM, STEPS, PHASE2, LR = 16, 8, 4, 6, 0.02
PHASE1 = {"sync": 150, "async": 600}  # asynchronous calls are ~4x quicker
PHASE1_MIN_S = 1.6  # the test kills a worker within 1 s of STARTED


def dataset_fn(ctx):
    rng = np.random.default_rng(7 + ctx.input_pipeline_id)
    marker = os.environ.get("KILL_ONCE_MARKER")  # `stratax launch` test: worker 1 dies once
    on_worker = json.loads(os.environ.get("TF_CONFIG", "{}")).get("task", {}).get("type")
    marker = marker if on_worker == "worker" else None
    for step in itertools.count():
        if marker and ctx.input_pipeline_id == 1 and step == 200 and not os.path.exists(marker):
            open(marker, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)
        x = rng.normal(size=(BATCH, DIM)).astype(np.float32)
        yield x, x @ np.linspace(-1, 1, DIM, dtype=np.float32)[:, None] + 0.5


def main():
    mode, timeout = sys.argv[1], float(sys.argv[2]) if len(sys.argv) > 2 else 60.0
    strategy = sx.ParameterServerStrategy(mode=mode, timeout_seconds=timeout)
    import jax
    import jax.numpy as jnp

    coordinator = sx.coordinator.ClusterCoordinator(strategy)
    w0 = np.zeros((DIM, 1), np.float32)
    w = strategy.create_variable(w0, name="w")
    global_batch = BATCH * strategy.num_replicas_in_sync

    def loss_fn(w, x, y):
        return sx.compute_average_loss(jnp.mean((x @ w + 0.5 - y) ** 2, axis=1),
                                       global_batch_size=global_batch)

    def replica_fn(x, y):
        loss, g = jax.value_and_grad(loss_fn)(strategy.read(w), x, y)
        strategy.apply_gradients([(g, w)], {"class_name": "SGD", "config": {"learning_rate": LR}})
        return loss

    def step_fn(iterator):
        return [strategy.run(replica_fn, args=next(iterator)) for _ in range(STEPS)]

    iterator = iter(coordinator.create_per_worker_dataset(dataset_fn))
    coordinator.schedule(step_fn, args=(iterator,))
    coordinator.join()
    print("STARTED", flush=True)
    start = time.monotonic()
    calls, more = 1, PHASE1[mode] - 1
    while more:
        for _ in range(more):
            coordinator.schedule(step_fn, args=(iterator,))
        calls += more
        try:
            coordinator.join()
        except sx.WorkerUnavailableError as err:   # the victim was not restarted
            print("RESULT " + json.dumps({"error": str(err),
                                          "after_s": time.monotonic() - start}), flush=True)
            return
        more = PHASE1[mode] // 4 if time.monotonic() - start < PHASE1_MIN_S else 0
    phase1_s = time.monotonic() - start
    deadline = time.monotonic() + 60
    rejoined = lambda: sum(s.get("rejoined", 0) for s in coordinator.stats().values())  # noqa: E731
    while not rejoined() and time.monotonic() < deadline:
        time.sleep(0.2)
    before = {k: s.get("steps", 0) for k, s in coordinator.stats().items()}
    for _ in range(PHASE2):
        coordinator.schedule(step_fn, args=(iterator,))
    coordinator.join()
    result = {"scheduled": (calls + PHASE2) * STEPS,
              "iterations": strategy.optimizer_iterations(w),
              "ledger": strategy.applied_steps(w)[0], "rejoined": rejoined(), "phase1_s": phase1_s,
              "steps_after_rejoin": {k: s.get("steps", 0) - before[k]
                                     for k, s in coordinator.stats().items()}}
    if mode == "sync":
        # The same steps in one process: the global batch of step k is every worker's k-th batch.
        streams = [dataset_fn(types.SimpleNamespace(input_pipeline_id=i))
                   for i in range(strategy.num_replicas_in_sync)]
        ref = w0.copy()
        grad = jax.jit(jax.grad(loss_fn))
        for _ in range(result["scheduled"]):
            batches = [next(s) for s in streams]
            x = np.concatenate([b[0] for b in batches])
            y = np.concatenate([b[1] for b in batches])
            ref = ref - LR * np.asarray(grad(ref, x, y))
        result["max_abs_diff"] = float(np.abs(w.numpy() - ref).max())
        result["moved"] = float(np.abs(ref - w0).max())
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
