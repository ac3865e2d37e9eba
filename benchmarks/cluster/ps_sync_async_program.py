"""One program for every task of the sync-vs-async comparison (see
``benchmarks/workloads/ps_sync_async.py``).

argv: task (``digits`` | ``embedding``), mode (``sync`` | ``async``), batches (the budget: how
many per-worker batches of ``BATCH`` examples are trained on, whatever the mode), sample period
(seconds). A worker whose environment has ``SX_BENCH_SLEEP_S`` sleeps that long before each of
its batches (the deliberate straggler). The chief prints ``RESULT {json}`` with the trace
``[[seconds, updates applied, held-out loss], ...]``.

Both modes train the same model from the same initial values with the same optimizer (plain
SGD), on the same per-worker data. Asynchronous: every batch is one update. Synchronous: one
update per global step, from the sum of the workers' gradients of a loss scaled by the global
batch (so the update is the mean gradient over W x BATCH examples). Before the clock starts,
every worker runs the compiled step once (warm-up) and the variables are reset to their
initial values (SGD keeps no other state), so compilation is left out of both.
"""

import json
import os
import sys
import threading
import time

import numpy as np

import stratax as sx

BATCH = 32
HIDDEN = 64
VOCAB, IDS, DIM = 5000, 8, 8
LEARNING_RATE = {"digits": 0.2, "embedding": 0.2}


def _straggle():
    seconds = float(os.environ.get("SX_BENCH_SLEEP_S", "0"))
    if seconds:
        time.sleep(seconds)


def digits_data(ctx):
    (x, y), _ = sx.datasets.load_digits()
    x, y = x[ctx.input_pipeline_id::ctx.num_input_pipelines], y[ctx.input_pipeline_id::
                                                                   ctx.num_input_pipelines]
    rng = np.random.default_rng(ctx.input_pipeline_id)
    while True:
        order = rng.permutation(len(x))
        for start in range(0, len(order) - BATCH + 1, BATCH):
            _straggle()
            take = order[start:start + BATCH]
            yield x[take], y[take]


def embedding_examples(rng, count):
    """Synthetic recommender-like data: Zipf ids, target = mean of a hidden score per id."""
    truth = np.random.default_rng(1234).normal(size=(VOCAB,)).astype(np.float32)
    ids = ((rng.zipf(1.3, size=(count, IDS)) - 1) % VOCAB).astype(np.int32)
    y = truth[ids].mean(axis=1, keepdims=True) + 0.01 * rng.normal(size=(count, 1))
    return ids, y.astype(np.float32)


def embedding_data(ctx):
    rng = np.random.default_rng(100 + ctx.input_pipeline_id)
    while True:
        _straggle()
        yield embedding_examples(rng, BATCH)


def _digits(strategy, rng):
    import jax
    import jax.numpy as jnp

    shapes = {"w1": (64, HIDDEN), "b1": (HIDDEN,), "w2": (HIDDEN, 10), "b2": (10,)}
    init = {n: (rng.normal(scale=(1 / s[0]) ** 0.5, size=s) if n[0] == "w" else np.zeros(s))
            .astype(np.float32) for n, s in shapes.items()}
    _, (x_test, y_test) = sx.datasets.load_digits()

    def per_example(params, x, y):
        w1, b1, w2, b2 = params
        logits = jax.nn.relu(x @ w1 + b1) @ w2 + b2
        return -jnp.take_along_axis(jax.nn.log_softmax(logits), y[:, None], axis=1)[:, 0]

    def evaluate(values):
        w1, b1, w2, b2 = values
        logits = np.maximum(x_test @ w1 + b1, 0) @ w2 + b2
        logits -= logits.max(axis=1, keepdims=True)
        log_p = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
        return float(-log_p[np.arange(len(y_test)), y_test].mean())

    return init, per_example, None, evaluate, digits_data


def _embedding(strategy, rng):
    import jax.numpy as jnp

    init = {"table": rng.normal(scale=0.1, size=(VOCAB, DIM)).astype(np.float32),
            "w": rng.normal(scale=0.5, size=(DIM, 1)).astype(np.float32),
            "b": np.zeros((1,), np.float32)}
    ids_test, y_test = embedding_examples(np.random.default_rng(999), 4096)

    def per_example(params, rows, positions, y):
        w, b = params
        pred = jnp.take(rows, positions, axis=0).mean(axis=1) @ w + b
        return ((pred - y) ** 2)[:, 0]

    def evaluate(values):
        table, w, b = values
        return float(((table[ids_test].mean(axis=1) @ w + b - y_test) ** 2).mean())

    return init, per_example, "table", evaluate, embedding_data


def main():
    task, mode, batches, period = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
    strategy = sx.ParameterServerStrategy(mode=mode, timeout_seconds=120)
    import jax
    import keras

    workers = len(strategy.cluster_resolver.cluster_spec().job_tasks("worker"))
    coordinator = sx.coordinator.ClusterCoordinator(strategy, progress_seconds=1.0)
    init, per_example, sparse, evaluate, dataset_fn = {"digits": _digits,
                                                       "embedding": _embedding}[task](
        strategy, np.random.default_rng(0))
    variables = {n: strategy.create_variable(v, name=n) for n, v in init.items()}
    dense = [variables[n] for n in init if n != sparse]
    optimizer = keras.optimizers.SGD(LEARNING_RATE[task])
    global_batch = BATCH * strategy.num_replicas_in_sync

    def loss_of(per):
        return sx.compute_average_loss(per, global_batch_size=global_batch)

    if sparse is None:
        def replica_fn(x, y):
            loss, grads = jax.value_and_grad(lambda p: loss_of(per_example(p, x, y)))(
                strategy.read(dense))
            strategy.apply_gradients(zip(grads, dense, strict=True), optimizer)
            return loss
    else:
        table = variables[sparse]

        def replica_fn(ids, y):
            rows, positions = strategy.read_rows(table, ids)
            loss, (g_rows, g_dense) = jax.value_and_grad(
                lambda r, p: loss_of(per_example(p, r, positions, y)), argnums=(0, 1))(
                    rows, strategy.read(dense))
            strategy.apply_gradients([(g_rows, table), *zip(g_dense, dense, strict=True)],
                                     optimizer)
            return loss

    def step_fn(iterator):
        return strategy.run(replica_fn, args=next(iterator))

    iterator = iter(coordinator.create_per_worker_dataset(dataset_fn))
    # Warm-up: until every worker has compiled and run the step (sync: one step does).
    for _ in range(50):
        for _ in range(1 if mode == "sync" else workers):
            coordinator.schedule(step_fn, args=(iterator,))
        coordinator.join()
        if all(s.get("steps", 0) > 0 for s in coordinator.stats().values()):
            break
    for name, value in init.items():
        variables[name].assign(value)
    probe = dense[0]
    base = strategy.optimizer_iterations(probe)[0]
    ordered = [variables[n] for n in init]

    trace = []
    stop = threading.Event()

    def sample(now):
        updates = strategy.optimizer_iterations(probe)[0] - base
        trace.append([now, updates, evaluate([v.numpy() for v in ordered])])

    def monitor():
        while not stop.wait(period):
            sample(time.perf_counter() - start)

    before = coordinator.stats()
    trace.append([0.0, 0, evaluate(list(init.values()))])
    start = time.perf_counter()
    thread = threading.Thread(target=monitor, daemon=True)
    thread.start()
    calls = batches // workers if mode == "sync" else batches
    for _ in range(calls):
        coordinator.schedule(step_fn, args=(iterator,))
    coordinator.join()
    wall = time.perf_counter() - start
    stop.set()
    thread.join()
    sample(wall)
    after = coordinator.stats()
    window = coordinator.progress.last_window
    print("RESULT " + json.dumps({
        "task": task, "mode": mode, "workers": workers, "batches": batches, "wall": wall,
        "updates": trace[-1][1], "examples": calls * BATCH * (workers if mode == "sync" else 1),
        "trace": trace,
        "per_worker_steps": {w: after[w]["steps"] - before[w].get("steps", 0) for w in after},
        "slowest": window.slowest.name if window and window.slowest else None,
        "straggler_flagged": bool(window and window.slowest and window.slowest.straggler),
    }), flush=True)


if __name__ == "__main__":
    main()
