"""Chief + 2 workers + 1 ps; the test SIGKILLs worker 1 once "STARTED" is printed, then
restarts it; the chief checks that it rejoins and gets work."""

import json
import logging
import time

import numpy as np

import stratax as sx


def dataset_fn(ctx):
    rng = np.random.default_rng(ctx.input_pipeline_id)
    while True:
        x = rng.normal(size=(64, 32)).astype(np.float32)
        yield x, x.sum(axis=1, keepdims=True)


def main():
    logging.basicConfig(level=logging.WARNING)
    strategy = sx.ParameterServerStrategy(timeout_seconds=30)
    import jax
    import jax.numpy as jnp

    coordinator = sx.coordinator.ClusterCoordinator(strategy)
    w = strategy.create_variable(np.zeros((32, 1), np.float32), name="w")

    def replica_fn(x, y):
        loss, g = jax.value_and_grad(lambda w: jnp.mean((x @ w - y) ** 2))(strategy.read(w))
        strategy.apply_gradients([(g, w)], {"class_name": "SGD", "config": {"learning_rate": 0.01}})
        return loss

    def step_fn(iterator):
        return [strategy.run(replica_fn, args=next(iterator)) for _ in range(3)]

    iterator = iter(coordinator.create_per_worker_dataset(dataset_fn))
    for _ in range(4):
        coordinator.schedule(step_fn, args=(iterator,))
    coordinator.join()
    print("STARTED", flush=True)
    for _ in range(150):
        coordinator.schedule(step_fn, args=(iterator,))
    coordinator.join()
    # The test restarts worker 1 at once; wait (bounded) until the coordinator takes it back.
    deadline = time.monotonic() + 90
    while not coordinator.stats()["worker 1"].get("rejoined") and time.monotonic() < deadline:
        time.sleep(0.2)
    before = coordinator.stats()["worker 1"].get("steps", 0)
    for _ in range(60):
        coordinator.schedule(step_fn, args=(iterator,))
    coordinator.join()
    calls = 4 + 150 + 60
    stats = strategy._ps.clients[0].call("stats", {"names": ["w"]}).meta["stats"]["w"]
    print("RESULT " + json.dumps({"scheduled": 3 * calls,
                                  "iterations": strategy.optimizer_iterations(w),
                                  "duplicates_skipped": stats["duplicates"],
                                  "rejoined": coordinator.stats()["worker 1"].get("rejoined", 0),
                                  "worker1_steps_after_rejoin":
                                      coordinator.stats()["worker 1"].get("steps", 0) - before,
                                  "stats": coordinator.stats()}), flush=True)


if __name__ == "__main__":
    main()
