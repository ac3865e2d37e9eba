"""The linear model that the failure programs (``ps_snapshot``, ``ps_lifecycle``) train: one
``w`` (DIM x 1), mean squared error on ``y = sum(x)``, ``steps`` runs per scheduled call."""

import numpy as np

BATCH, DIM = 16, 8


def dataset_fn(ctx):
    """Each worker's endless batches (seeded by its pipeline id)."""
    rng = np.random.default_rng(ctx.input_pipeline_id)
    while True:
        x = rng.normal(size=(BATCH, DIM)).astype(np.float32)
        yield x, x.sum(axis=1, keepdims=True)


def start(strategy, coordinator, optimizer, steps):
    """Creates ``w`` (zeros), runs one call (traced, compiled, registered), prints
    STARTED and returns ``(w, step_fn, iterator)``."""
    import jax
    import jax.numpy as jnp

    w = strategy.create_variable(np.zeros((DIM, 1), np.float32), name="w")

    def replica_fn(x, y):
        loss, g = jax.value_and_grad(lambda v: jnp.mean((x @ v - y) ** 2))(strategy.read(w))
        strategy.apply_gradients([(g, w)], optimizer)
        return loss

    def step_fn(iterator):
        return [strategy.run(replica_fn, args=next(iterator)) for _ in range(steps)]

    iterator = iter(coordinator.create_per_worker_dataset(dataset_fn))
    coordinator.schedule(step_fn, args=(iterator,))
    coordinator.join()
    print("STARTED", flush=True)
    return w, step_fn, iterator
