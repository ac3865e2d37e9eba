"""One program for every task of the parameter-server benchmark (see
``benchmarks/workloads/ps.py``).

argv: workload (mlp_adam | emb_sgd | emb_lazy_adam | emb_dense_adam), steps per scheduled call,
number of timed calls. The chief prints ``RESULT {json}``.
"""

import json
import sys
import time

import numpy as np

import stratax as sx

BATCH, IDS_PER_EXAMPLE, VOCAB, DIM = 256, 20, 100_000, 64


def mlp_data(ctx):
    rng = np.random.default_rng(ctx.input_pipeline_id)
    x = rng.normal(size=(BATCH, 784)).astype(np.float32)
    y = rng.integers(0, 10, size=(BATCH,)).astype(np.int32)
    while True:
        yield x, y


def embedding_data(ctx):
    rng = np.random.default_rng(ctx.input_pipeline_id)
    batches = [(rng.integers(0, VOCAB, size=(BATCH, IDS_PER_EXAMPLE)).astype(np.int32),
                rng.normal(size=(BATCH, 1)).astype(np.float32)) for _ in range(16)]
    step = 0
    while True:
        yield batches[step % len(batches)]
        step += 1


def main():
    workload, spe, calls = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    strategy = sx.ParameterServerStrategy(timeout_seconds=120)
    import jax
    import jax.numpy as jnp
    import keras

    coordinator = sx.coordinator.ClusterCoordinator(strategy)
    rng = np.random.default_rng(0)
    if workload == "mlp_adam":
        model = keras.Sequential([keras.Input((784,)), keras.layers.Dense(128, activation="relu"),
                                  keras.layers.Dense(10)])
        variables = [strategy.create_variable(v.numpy(), name=v.path)
                     for v in model.trainable_variables]
        optimizer = keras.optimizers.Adam(1e-3)
        loss_obj = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

        def replica_fn(x, y):
            def loss_fn(trainable):
                logits, _ = model.stateless_call(trainable, [], x, training=True)
                return loss_obj(y, logits)
            loss, grads = jax.value_and_grad(loss_fn)(strategy.read(variables))
            strategy.apply_gradients(zip(grads, variables, strict=False), optimizer)
            return loss

        dataset_fn = mlp_data
        table = variables[0]
    else:
        table = strategy.create_variable(
            rng.normal(scale=0.05, size=(VOCAB, DIM)).astype(np.float32), name="embedding")
        dense = [strategy.create_variable(rng.normal(scale=0.1, size=s).astype(np.float32), name=n)
                 for n, s in [("d1/kernel", (DIM, 64)), ("d1/bias", (64,)),
                              ("d2/kernel", (64, 1)), ("d2/bias", (1,))]]
        if workload == "emb_sgd":
            optimizer, sparse = keras.optimizers.SGD(0.01), "lazy"
        else:
            optimizer = keras.optimizers.Adam(1e-3)
            sparse = "lazy" if workload == "emb_lazy_adam" else "dense"

        def loss_fn(rows, params, positions, y):
            k1, b1, k2, b2 = params
            h = jnp.take(rows, positions, axis=0).mean(axis=1)
            h = jax.nn.relu(h @ k1 + b1)
            return jnp.mean((h @ k2 + b2 - y) ** 2)

        def replica_fn(ids, y):
            rows, positions = strategy.read_rows(table, ids)
            loss, (g_rows, g_dense) = jax.value_and_grad(loss_fn, argnums=(0, 1))(
                rows, strategy.read(dense), positions, y)
            strategy.apply_gradients([(g_rows, table), *zip(g_dense, dense, strict=False)],
                                     optimizer, sparse_updates=sparse)
            return loss

        dataset_fn = embedding_data

    def step_fn(iterator):
        return [strategy.run(replica_fn, args=next(iterator)) for _ in range(spe)][-1]

    iterator = iter(coordinator.create_per_worker_dataset(dataset_fn))
    for _ in range(4):  # warm-up: compile on every worker
        coordinator.schedule(step_fn, args=(iterator,))
    coordinator.join()
    before = coordinator.stats()
    ps_before = _apply_seconds(strategy)
    start = time.perf_counter()
    for _ in range(calls):
        coordinator.schedule(step_fn, args=(iterator,))
    coordinator.join()
    wall = time.perf_counter() - start
    after = coordinator.stats()
    steps = calls * spe
    breakdown = {}
    for key in ("data", "pull", "compute", "push"):
        total = sum(after[w].get(key, 0) - before[w].get(key, 0) for w in after)
        breakdown[key] = 1000 * total / steps
    breakdown["ps_apply"] = 1000 * (_apply_seconds(strategy) - ps_before) / steps
    print("RESULT " + json.dumps({"workload": workload, "spe": spe, "steps": steps, "wall": wall,
                                  "steps_per_s": steps / wall, "ms_per_step": breakdown,
                                  "per_worker_steps": {
                                      w: after[w]["steps"] - before[w].get("steps", 0)
                                      for w in after},
                                  "table": table.name}), flush=True)


def _apply_seconds(strategy):
    """Seconds the parameter servers spent applying updates to every shard of every variable
    (their ``apply_seconds`` counters, from ``strategy.shard_stats``)."""
    return sum(stats["apply_seconds"] for var in strategy.variables
               for stats in strategy.shard_stats(var))


if __name__ == "__main__":
    main()
