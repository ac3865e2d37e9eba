"""Parameter-server failure: chief + 2 workers + 1 ps snapshotting every EVERY pushes.

After STARTED the test SIGKILLs ps 0 and restarts it (same address and snapshot directory);
training continues without restarting the chief. Then, after PHASE2, the test kills ps 0 for
good and the chief times how long the error naming it takes to reach ``join()``.
"""

import json
import time

import numpy as np

import stratax as sx

BATCH, DIM, STEPS, CALLS, TIMEOUT = 16, 8, 2, 1000, 10


def dataset_fn(ctx):
    rng = np.random.default_rng(ctx.input_pipeline_id)
    while True:
        x = rng.normal(size=(BATCH, DIM)).astype(np.float32)
        yield x, x.sum(axis=1, keepdims=True)


def main():
    strategy = sx.ParameterServerStrategy(timeout_seconds=TIMEOUT)
    import jax
    import jax.numpy as jnp

    coordinator = sx.coordinator.ClusterCoordinator(strategy)
    w = strategy.create_variable(np.zeros((DIM, 1), np.float32), name="w")

    def replica_fn(x, y):
        loss, g = jax.value_and_grad(lambda w: jnp.mean((x @ w - y) ** 2))(strategy.read(w))
        strategy.apply_gradients([(g, w)], {"class_name": "Adam",
                                            "config": {"learning_rate": 0.01}})
        return loss

    def step_fn(iterator):
        return [strategy.run(replica_fn, args=next(iterator)) for _ in range(STEPS)]

    iterator = iter(coordinator.create_per_worker_dataset(dataset_fn))
    coordinator.schedule(step_fn, args=(iterator,))
    coordinator.join()
    print("STARTED", flush=True)
    remotes = [coordinator.schedule(step_fn, args=(iterator,)) for _ in range(CALLS - 1)]
    done = [time.monotonic()]
    for remote in remotes:            # completion times in order: the largest gap is the stall
        remote.fetch(timeout=120)
        done.append(time.monotonic())
    coordinator.join()
    result = {"scheduled": CALLS * STEPS, "iterations": strategy.optimizer_iterations(w),
              "ledger": strategy.applied_steps(w)[0], "stall_s": float(np.diff(done).max()),
              "phase1_s": done[-1] - done[0]}
    print("PHASE2", flush=True)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:   # until the test has killed ps 0 for good
        try:
            strategy._ps.clients[0].call("ping", timeout=1)
        except sx.WorkerUnavailableError:
            break
        time.sleep(0.1)
    start = time.monotonic()
    coordinator.schedule(step_fn, args=(iterator,))
    try:
        coordinator.join()
        result["error"] = None
    except Exception as err:
        result["error"] = str(err)
    result["error_s"] = time.monotonic() - start
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
