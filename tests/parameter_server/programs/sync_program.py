"""Synchronous mode: chief + 2 workers + 1 ps; must equal one process on the global batches."""

import json

import numpy as np

import stratax as sx

BATCH, STEPS_PER_CALL, CALLS = 8, 3, 4


def dataset_fn(ctx):
    rng = np.random.default_rng(100 + ctx.input_pipeline_id)
    while True:
        x = rng.normal(size=(BATCH, 5)).astype(np.float32)
        yield x, (x @ np.arange(5, dtype=np.float32)[:, None]) + 1.0


def main():
    strategy = sx.ParameterServerStrategy(mode="sync", timeout_seconds=30)
    import jax
    import jax.numpy as jnp
    import keras

    coordinator = sx.coordinator.ClusterCoordinator(strategy)
    global_batch = BATCH * strategy.num_replicas_in_sync
    rng = np.random.default_rng(0)
    w0, b0 = rng.normal(size=(5, 1)).astype(np.float32), np.zeros((1,), np.float32)
    w = strategy.create_variable(w0, name="w")
    b = strategy.create_variable(b0, name="b")
    optimizer = keras.optimizers.Adam(0.1)

    def loss_fn(params, x, y):
        per_example = jnp.mean((x @ params[0] + params[1] - y) ** 2, axis=1)
        return sx.compute_average_loss(per_example, global_batch_size=global_batch)

    def replica_fn(x, y):
        loss, grads = jax.value_and_grad(loss_fn)(strategy.read([w, b]), x, y)
        strategy.apply_gradients(zip(grads, [w, b], strict=False), optimizer)
        return loss, x, y

    def step_fn(iterator):
        results = [strategy.run(replica_fn, args=next(iterator)) for _ in range(STEPS_PER_CALL)]
        return [(strategy.reduce(sx.ReduceOp.SUM, loss, axis=None), x, y) for loss, x, y in results]

    iterator = iter(coordinator.create_per_worker_dataset(dataset_fn))
    calls = [coordinator.schedule(step_fn, args=(iterator,)) for _ in range(CALLS)]
    coordinator.join()

    # The same global batches (worker 0's rows, then worker 1's) in one process, Keras' Adam.
    kw, kb = keras.Variable(w0), keras.Variable(b0)
    reference = keras.optimizers.Adam(0.1)
    losses, ref_losses = [], []
    for call in calls:
        for loss, xs, ys in call.fetch():
            x = np.concatenate(list(xs))
            y = np.concatenate(list(ys))
            ref_loss, grads = jax.value_and_grad(loss_fn)([kw.value, kb.value], x, y)
            reference.apply_gradients(zip(grads, [kw, kb], strict=False))
            losses.append(float(loss))
            ref_losses.append(float(ref_loss))
    print("RESULT " + json.dumps({
        "replicas": strategy.num_replicas_in_sync,
        "w_err": float(np.abs(w.numpy() - kw.numpy()).max()),
        "b_err": float(np.abs(b.numpy() - kb.numpy()).max()),
        "loss_rel_err": float((np.abs(np.array(losses) - np.array(ref_losses))
                               / np.abs(np.array(ref_losses))).max()),
        "loss_first_last": [losses[0], losses[-1]],
        "iterations": strategy.optimizer_iterations(w),
        "stats": coordinator.stats(),
    }), flush=True)


if __name__ == "__main__":
    main()
