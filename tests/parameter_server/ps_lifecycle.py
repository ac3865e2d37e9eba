"""Chief of the lifecycle tests: chief + workers + 1 ps, asynchronous SGD on a linear model.

argv: ``seconds`` to train after STARTED (in rounds of ROUND calls of STEPS steps, each round
joined), ``timeout_seconds`` of the strategy, and optionally ``pause`` seconds to sleep after
STARTED before training (the cluster idle). Prints STARTED once the step is compiled, then a
RESULT line: steps scheduled, the ps' ``iterations``, applied step ids and duplicates, the
longest round (a stall shows there), and the error of a round that raised with the wall-clock
time it was raised (then nothing else: a lost ps has nothing to report).
"""

import json
import sys
import time

import numpy as np

import stratax as sx

BATCH, DIM, STEPS, ROUND = 8, 4, 2, 10


def dataset_fn(ctx):
    rng = np.random.default_rng(ctx.input_pipeline_id)
    while True:
        x = rng.normal(size=(BATCH, DIM)).astype(np.float32)
        yield x, x.sum(axis=1, keepdims=True)


def main():
    seconds, timeout = float(sys.argv[1]), float(sys.argv[2])
    strategy = sx.ParameterServerStrategy(timeout_seconds=timeout)
    import jax
    import jax.numpy as jnp

    coordinator = sx.coordinator.ClusterCoordinator(strategy, progress_seconds=0)
    w = strategy.create_variable(np.zeros((DIM, 1), np.float32), name="w")

    def replica_fn(x, y):
        loss, g = jax.value_and_grad(lambda v: jnp.mean((x @ v - y) ** 2))(strategy.read(w))
        strategy.apply_gradients([(g, w)], {"class_name": "SGD", "config": {"learning_rate": 0.01}})
        return loss

    def step_fn(iterator):
        return [strategy.run(replica_fn, args=next(iterator)) for _ in range(STEPS)]

    iterator = iter(coordinator.create_per_worker_dataset(dataset_fn))
    coordinator.schedule(step_fn, args=(iterator,))
    coordinator.join()
    print("STARTED", flush=True)
    time.sleep(float(sys.argv[3]) if len(sys.argv) > 3 else 0.0)
    calls, longest = 1, 0.0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        start = time.monotonic()
        try:
            for _ in range(ROUND):
                coordinator.schedule(step_fn, args=(iterator,))
                calls += 1
            coordinator.join()
        except sx.StrataxError as err:
            error = str(err)
            print("RESULT " + json.dumps({"error": error, "error_at": time.time()}), flush=True)
            return
        longest = max(longest, time.monotonic() - start)
    stats = strategy.shard_stats(w)[0]
    print("RESULT " + json.dumps({
        "scheduled": calls * STEPS, "iterations": stats["iterations"],
        "applied": stats["applied_steps"], "duplicates": stats["duplicates"],
        "ledger": len(set(strategy.applied_steps(w)[0])), "longest_round_s": longest,
        "stats": coordinator.stats()}), flush=True)


if __name__ == "__main__":
    main()
