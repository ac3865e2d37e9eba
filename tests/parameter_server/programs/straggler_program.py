"""A straggler: chief + 2 workers + 1 ps, async; worker 1's dataset_fn sleeps per batch.

The coordinator reports every 0.5 s; with ``STRATAX_RUN_DIR`` (argv[1]) its records go there.
The result names the wall-clock span of the timed phase (after the step compiled), so a test
can judge the windows that lie inside it: the compile window and the short last window at
shutdown may have no step of worker 1.
"""

import json
import os
import sys
import time

import numpy as np

import stratax as sx

SLOW_SECONDS = 0.04


def dataset_fn(ctx):
    rng = np.random.default_rng(ctx.input_pipeline_id)
    while True:
        if ctx.input_pipeline_id == 1:  # the deliberate straggler
            time.sleep(SLOW_SECONDS)
        x = rng.normal(size=(16, 4)).astype(np.float32)
        yield x, x.sum(axis=1, keepdims=True)


def main():
    os.environ["STRATAX_RUN_DIR"] = sys.argv[1]
    strategy = sx.ParameterServerStrategy(timeout_seconds=30)
    import jax
    import jax.numpy as jnp
    import keras

    coordinator = sx.coordinator.ClusterCoordinator(strategy, progress_seconds=0.5)
    w = strategy.create_variable(np.zeros((4, 1), np.float32), name="w")
    optimizer = keras.optimizers.SGD(0.01)

    def replica_fn(x, y):
        loss, grad = jax.value_and_grad(lambda v: jnp.mean((x @ v - y) ** 2))(strategy.read(w))
        strategy.apply_gradients([(grad, w)], optimizer)
        return loss

    iterator = iter(coordinator.create_per_worker_dataset(dataset_fn))
    coordinator.schedule(lambda it: strategy.run(replica_fn, args=next(it)), args=(iterator,))
    coordinator.join()  # compiled and registered on one worker: time the rest
    timed_from = time.time()
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline:
        for _ in range(20):
            coordinator.schedule(lambda it: strategy.run(replica_fn, args=next(it)),
                                 args=(iterator,))
        coordinator.join()
    window = coordinator.progress.last_window
    print("RESULT " + json.dumps({
        "slowest": window.slowest.name if window and window.slowest else None,
        "straggler": bool(window and window.slowest and window.slowest.straggler),
        "stats": coordinator.stats(),
        "timed": [timed_from, time.time()],
    }), flush=True)


if __name__ == "__main__":
    main()
