"""One program for every role of a parameter-server test cluster (chief, worker, ps).

Run by ``test_cluster.py`` with a TF_CONFIG per task; the chief runs the scenarios named in
argv[1:] (all by default) and prints one JSON line ``RESULT {...}``.
"""

import collections
import json
import sys
import time

import numpy as np

import stratax as sx

ROWS, DIM, BATCH = 50, 4, 16
TRUE_W = np.arange(8, dtype=np.float32).reshape(8, 1) / 8.0


def regression_dataset(ctx):
    rng = np.random.default_rng(ctx.input_pipeline_id)
    while True:
        x = rng.normal(size=(BATCH, 8)).astype(np.float32)
        yield x, x @ TRUE_W


def embedding_batches(seed, steps):
    rng = np.random.default_rng(seed)
    return [(rng.integers(0, ROWS, size=(BATCH, 3)).astype(np.int32),
             rng.normal(size=(BATCH, 1)).astype(np.float32)) for _ in range(steps)]


def embedding_dataset(ctx):
    yield from embedding_batches(0, 1000)


def failing_dataset(ctx):
    rng = np.random.default_rng(0)
    for step in range(1000):
        if step == 3:
            raise ValueError(f"dataset of pipeline {ctx.input_pipeline_id} broke at step 3")
        yield rng.normal(size=(BATCH, 8)).astype(np.float32), np.zeros((BATCH, 1), np.float32)


def embedding_loss(table_rows, positions, w, y):
    import jax.numpy as jnp

    emb = jnp.take(table_rows, positions, axis=0).mean(axis=1)
    pred = emb @ w
    return jnp.mean((pred - y) ** 2)


def converge(strategy, coordinator):
    """Keras model + stateless_call + jax.grad, 5 steps per scheduled call, on both workers."""
    import jax
    import jax.numpy as jnp
    import keras

    with strategy.scope():
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(1)])
    optimizer = keras.optimizers.Adam(0.05)
    variables = model.trainable_variables  # placed on the ps when a step first uses them
    probe = next(regression_dataset(type("Ctx", (), {"input_pipeline_id": 7})()))

    def probe_loss():
        return float(np.mean((model.predict_on_batch(probe[0]) - probe[1]) ** 2))

    initial = probe_loss()

    def replica_fn(x, y):
        def loss_fn(trainable):
            pred, _ = model.stateless_call(trainable, [], x)
            return jnp.mean((pred - y) ** 2)
        loss, grads = jax.value_and_grad(loss_fn)(strategy.read(variables))
        strategy.apply_gradients(zip(grads, variables, strict=False), optimizer)
        return loss

    def step_fn(iterator):
        losses = [strategy.run(replica_fn, args=next(iterator)) for _ in range(5)]
        return strategy.reduce(sx.ReduceOp.SUM, losses[-1], axis=None)

    iterator = iter(coordinator.create_per_worker_dataset(regression_dataset))
    values = [coordinator.schedule(step_fn, args=(iterator,)) for _ in range(40)]
    coordinator.join()
    kernel = strategy.variables[-2]  # the Keras kernel's PSVariable (created by the first step)
    before = model.get_weights()[0].copy()
    strategy.refresh_keras_variables()
    # Asynchronous steps make the first call's loss depend on timing: the probe batch does not.
    return {"initial": initial, "final": probe_loss(), "last": float(values[-1].fetch()),
            "iterations": strategy.optimizer_iterations(kernel),
            "kernel_name": kernel.name,
            "keras_refreshed": bool(np.array_equal(model.get_weights()[0], kernel.numpy())),
            "keras_was_stale": bool(not np.array_equal(before, kernel.numpy())),
            "stats": coordinator.stats()}


def sparse(strategy, coordinator):
    """Row-sparse SGD on a table sharded over both ps equals dense SGD in one process.

    One step at a time (join after each), so the order is deterministic; each step returns the
    batch it used, and the reference replays those batches.
    """
    import jax
    import jax.numpy as jnp

    rng = np.random.default_rng(1)
    table0 = rng.normal(size=(ROWS, DIM)).astype(np.float32)
    w0 = rng.normal(size=(DIM, 1)).astype(np.float32)
    table = strategy.create_variable(table0, name="table")
    w = strategy.create_variable(w0, name="w")
    optimizer = {"class_name": "SGD", "config": {"learning_rate": 0.5}}

    def replica_fn(ids, y):
        rows, positions = strategy.read_rows(table, ids)
        loss, (g_rows, g_w) = jax.value_and_grad(embedding_loss, argnums=(0, 2))(
            rows, positions, strategy.read(w), y)
        strategy.apply_gradients([(g_rows, table), (g_w, w)], optimizer)
        return loss, ids, y

    def step_fn(iterator):
        return strategy.run(replica_fn, args=next(iterator))

    iterator = iter(coordinator.create_per_worker_dataset(embedding_dataset))
    used = []
    for _ in range(12):
        value = coordinator.schedule(step_fn, args=(iterator,))
        coordinator.join()
        used.append(value.fetch()[1:])
    ref_table, ref_w = jnp.asarray(table0), jnp.asarray(w0)
    full = jax.jit(jax.grad(lambda t, w, ids, y: embedding_loss(t, ids, w, y), argnums=(0, 1)))
    for ids, y in used:
        g_t, g_w = full(ref_table, ref_w, ids, y)
        ref_table, ref_w = ref_table - 0.5 * g_t, ref_w - 0.5 * g_w
    return {
        "shards": [v.shape[0] for v in table.variables],
        "ps": [p.ps for p in table.placements],
        "table_err": float(np.abs(table.numpy() - np.asarray(ref_table)).max()),
        "w_err": float(np.abs(w.numpy() - np.asarray(ref_w)).max()),
        "moved": float(np.abs(table.numpy() - table0).max()),
        "iterations": strategy.optimizer_iterations(w),
        "table": strategy.describe_variables(),
    }


def fail(strategy, coordinator):
    """A step that raises on a worker (its 4th batch) reaches join(), naming the worker."""
    import jax
    import jax.numpy as jnp

    w = strategy.create_variable(np.zeros((8, 1), np.float32), name="w_fail")

    def replica_fn(x, y):
        loss, g = jax.value_and_grad(lambda w: jnp.mean((x @ w - y) ** 2))(strategy.read(w))
        strategy.apply_gradients([(g, w)], {"class_name": "SGD", "config": {}})
        return loss

    iterator = iter(coordinator.create_per_worker_dataset(failing_dataset))
    values = [coordinator.schedule(lambda it: strategy.run(replica_fn, args=next(it)),
                                   args=(iterator,)) for _ in range(20)]
    try:
        coordinator.join()
    except sx.StrataxError as err:
        raised, value_error = str(err), isinstance(err, ValueError)  # TF re-raises the type
    else:
        return {"raised": None}
    # The closure the other worker was running is cancelled (its pipeline breaks as well, but
    # that late error is not reported): done() raises nothing more.
    deadline = time.monotonic() + 30
    while not coordinator.done() and time.monotonic() < deadline:
        time.sleep(0.05)
    outcomes = collections.Counter()
    for value in values:
        try:
            value.fetch()
            outcomes["succeeded"] += 1
        except sx.coordinator.StepCancelledError:
            outcomes["cancelled"] += 1
        except ValueError:
            outcomes["ValueError"] += 1
    # An error is reported once, by whichever of schedule/join/done comes first (TensorFlow):
    # one step at a time until one fails, then schedule() raises it and join() does not.
    iterator = iter(coordinator.create_per_worker_dataset(failing_dataset))
    for _ in range(20):
        value = coordinator.schedule(lambda it: strategy.run(replica_fn, args=next(it)),
                                     args=(iterator,))
        while value.status.name == "PENDING":
            time.sleep(0.01)
        if value.status.name == "FAILED":
            break
    try:
        coordinator.schedule(lambda: 1)
        schedule_raised = False
    except sx.StrataxError:
        schedule_raised = True
    coordinator.join()  # the error was reported: nothing to raise again
    return {"raised": raised, "value_error": value_error, "outcomes": outcomes,
            "failed_step": value.status.name, "schedule_raised": schedule_raised,
            "done_after": coordinator.done()}


def scalar(strategy, coordinator):
    """Scalar variables take gradient pushes (SGD and Adam), as in TensorFlow's tests."""
    sgd = strategy.create_variable(np.float32(2.0), name="scalar_sgd")
    adam = strategy.create_variable(np.float32(2.0), name="scalar_adam")

    seen = {}

    def replica_fn():
        # TensorFlow's replica context inside run (traced on the chief: Python values).
        ctx = sx.get_replica_context()
        seen.update(id=ctx.replica_id_in_sync_group, replicas=ctx.num_replicas_in_sync,
                    cross=sx.in_cross_replica_context(),
                    summed=float(ctx.all_reduce(sx.ReduceOp.SUM, np.float32(2.0))))
        strategy.apply_gradients([(np.float32(0.5), sgd)],
                                 {"class_name": "SGD", "config": {"learning_rate": 0.1}})
        strategy.apply_gradients([(np.float32(0.5), adam)],
                                 {"class_name": "Adam", "config": {"learning_rate": 0.1}})
        return strategy.read(sgd)

    for _ in range(3):
        remote = coordinator.schedule(lambda: strategy.run(replica_fn))
        coordinator.join()
    try:
        coordinator.schedule(lambda value: value, args=([remote],))
        refused = ""
    except ValueError as err:  # as in TensorFlow: fetch() first
        refused = str(err)
    # A shard of a ShardedVariable assigned through ``variables[i]`` (its rows only), and
    # ``assign`` returning the variable, as in TensorFlow.
    table = strategy.create_variable(np.zeros((10, 2), np.float32), name="assigned")
    returned = table.assign(np.full((10, 2), 3.0, np.float32)) is table
    table.variables[1].assign(np.ones(table.variables[1].shape, np.float32))
    return {"sgd": float(sgd.numpy()), "adam": float(adam.numpy()),
            "shape": list(sgd.shape), "iterations": strategy.optimizer_iterations(adam),
            "assign_returns_variable": returned, "table": table.numpy()[:, 0].tolist(),
            "shard_rows": [v.shape[0] for v in table.variables], "refused": refused,
            "replica_context": seen}


def shard_init(strategy, coordinator):
    """A partition-aware initializer is called once per shard (TensorFlow's ShardInfo)."""
    calls = []

    def init(shard_info):
        calls.append([list(shard_info.shape), list(shard_info.offset)])
        start = shard_info.offset[0]
        rows = np.arange(start, start + shard_info.shape[0], dtype=np.float32)
        return np.repeat(rows[:, None], shard_info.shape[1], axis=1)

    table = strategy.create_variable(init, shape=(11, 3), name="per_shard")
    try:
        strategy.create_variable(init, name="no_shape")
        missing_shape = ""
    except ValueError as err:
        missing_shape = str(err)
    created = table.numpy()[:, 0].tolist()
    # TensorFlow's variable API on the chief, outside steps: each row-wise op touches the
    # shards that hold its rows (rows 3 and 9 sit on shards 0 and 2, row 9 twice).
    delta = type("IndexedSlices", (), {"indices": np.array([3, 9, 9]),
                                       "values": np.full((3, 3), 10.0, np.float32)})()
    table.scatter_add(delta)
    table.assign_sub(np.ones((11, 3), np.float32))
    result = {"calls": calls, "table": created,
            "shards": [v.shape[0] for v in table.variables], "dtype": str(table.dtype),
            "missing_shape": missing_shape,
            "after": np.asarray(table)[:, 0].tolist(), "slice": table[2:4, 1].tolist(),
            "sparse_read": table.sparse_read([[9, 0]])[..., 2].tolist(),
            "plus_one": (table + 1)[10, 0].item(), "device": table.variables[2].device}
    # scatter_mul/div (row 9 twice: repeats compound), and == elementwise against a copy.
    table.scatter_mul(type("IndexedSlices", (), {"indices": np.array([3, 9, 9]),
                                                 "values": np.full((3, 3), 2.0, np.float32)})())
    table.scatter_div(type("IndexedSlices", (), {"indices": np.array([3]),
                                                 "values": np.full((1, 3), 4.0, np.float32)})())
    copy = strategy.create_variable(np.asarray(table), name="per_shard_copy")
    copy.scatter_update(type("IndexedSlices", (), {"indices": np.array([10]),
                                                   "values": np.zeros((1, 3), np.float32)})())
    return {**result, "scaled": np.asarray(table)[:, 0].tolist(),
            "equal_rows": (table == copy).all(axis=1).tolist()}


def second(strategy, coordinator):
    """A second strategy on the cluster, in this process (TensorFlow: side by side): its
    same-named variable and its programs are its own, and the first goes on after it ends."""
    other = sx.ParameterServerStrategy(timeout_seconds=30)
    other_coordinator = sx.coordinator.ClusterCoordinator(other)
    mine = strategy.create_variable(np.arange(4, dtype=np.float32), name="twin")
    theirs = other.create_variable(np.arange(4, 8, dtype=np.float32), name="twin")

    def step(owner, variable):
        def replica_fn():
            owner.apply_gradients([(np.ones(4, np.float32), variable)],
                                  {"class_name": "SGD", "config": {"learning_rate": 1.0}})
            return owner.read(variable)  # this step's value, before its update

        return lambda: owner.run(replica_fn)

    read = {"theirs": other_coordinator.schedule(step(other, theirs)).fetch().tolist(),
            "mine": coordinator.schedule(step(strategy, mine)).fetch().tolist()}
    other_coordinator.join()
    after = {"theirs": theirs.numpy().tolist(), "mine": mine.numpy().tolist()}
    other.shutdown()  # the tasks stay with the first strategy
    coordinator.schedule(step(strategy, mine))
    coordinator.join()
    return {"read": read, "after": after, "mine_last": mine.numpy().tolist(),
            "coordinators_differ": other_coordinator is not coordinator,
            "is_strategy": isinstance(other, sx.Strategy),
            "outside": float(strategy.reduce("SUM", strategy.run(lambda: mine[0] + 1))),
            "outside_read": strategy.run(lambda: strategy.read(mine) * 2).tolist()}


def main():
    strategy = sx.ParameterServerStrategy(
        variable_partitioner=sx.partitioners.FixedShardsPartitioner(3), timeout_seconds=30)
    coordinator = sx.coordinator.ClusterCoordinator(strategy)
    chosen = sys.argv[1:]  # the scenarios to run; all of them by default
    result = {name: fn(strategy, coordinator) for name, fn in
              [("sparse", sparse), ("converge", converge), ("scalar", scalar),
               ("shard_init", shard_init), ("fail", fail), ("second", second)]
              if not chosen or name in chosen}
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
