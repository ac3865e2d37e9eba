"""Custom-loop throughput with and without the background input prefetcher.

A custom training loop (``strategy.run`` of an MLP 784-1024-10 SGD step with an explicit
gradient all-reduce) iterates ``experimental_distribute_dataset`` over a Python generator that
does typical host work per global batch (gather shuffled rows of uint8 images, convert and
normalise). Three ``InputOptions`` run side by side, interleaved in every repetition:

- ``prefetch=2`` (the default): a background thread prepares and places 2 batches ahead;
- ``prefetch=0``: each batch is prepared and placed when the loop asks for it;
- ``fetch_to_device=False``: the thread prepares host batches, ``strategy.run`` places them.

Reports samples/s (median, min, max over repetitions). Run:
``python -m benchmarks.workloads.input_prefetch [--reps 3] [--steps 60] [--devices N]``; writes
``benchmarks/results/input_prefetch.{json,md}``. ``--devices`` splits the CPU into N replicas
(before JAX starts); on an accelerator machine the local accelerators are used.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time

from benchmarks import RESULTS_DIR

RESULTS = RESULTS_DIR
GLOBAL_BATCH = 256
POOL = 8192


def _configs(sx):
    return {
        "prefetch=2 (default)": sx.InputOptions(),
        "prefetch=0": sx.InputOptions(experimental_prefetch_to_device=0),
        "fetch_to_device=False": sx.InputOptions(experimental_fetch_to_device=False),
    }


def _batches(images, labels, steps, seed):
    """The host pipeline: shuffled rows, uint8 -> float32, normalised (work done per batch)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    for _ in range(steps):
        rows = rng.integers(0, len(images), GLOBAL_BATCH)
        x = images[rows].astype(np.float32)
        x = (x - x.mean(axis=1, keepdims=True)) / (x.std(axis=1, keepdims=True) + 1e-6)
        yield x, labels[rows]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--steps", type=int, default=60, help="timed steps per run")
    parser.add_argument("--devices", type=int, default=0, help="CPU replicas (0: default)")
    args = parser.parse_args()
    if args.reps < 3:
        parser.error(f"--reps {args.reps}: use at least 3 for a median with min/max.")
    if args.devices:
        os.environ["STRATAX_CPU_DEVICES"] = str(args.devices)

    import jax
    import jax.numpy as jnp
    import numpy as np

    import stratax as sx

    strategy = sx.MirroredStrategy()
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (POOL, 784), dtype=np.uint8)
    labels = rng.integers(0, 10, POOL).astype(np.int32)
    keys = jax.random.split(jax.random.key(0), 2)
    params = (jax.random.normal(keys[0], (784, 1024)) * 0.03, jnp.zeros(1024),
              jax.random.normal(keys[1], (1024, 10)) * 0.03, jnp.zeros(10))

    def step(params, batch):
        x, y = batch

        def loss_fn(p):
            logits = jax.nn.relu(x @ p[0] + p[1]) @ p[2] + p[3]
            per_example = -jnp.take_along_axis(jax.nn.log_softmax(logits), y[:, None], 1)[:, 0]
            return sx.compute_average_loss(per_example)

        loss, grads = jax.value_and_grad(loss_fn)(params)
        grads = sx.get_replica_context().all_reduce("sum", grads)
        return jax.tree.map(lambda p, g: p - 0.1 * g, params, grads), loss

    def timed(options, seed):
        nonlocal params
        dist = strategy.experimental_distribute_dataset(
            _batches(images, labels, args.steps + 5, seed), options)
        iterator = iter(dist)
        for _ in range(5):  # warm-up: compile, fill the queue
            params, _ = strategy.run(step, args=(params, next(iterator)))
        jax.block_until_ready(params)
        start = time.perf_counter()
        for batch in iterator:
            params, _ = strategy.run(step, args=(params, batch))
        jax.block_until_ready(params)
        return args.steps * GLOBAL_BATCH / (time.perf_counter() - start)

    configs = _configs(sx)
    rates = {name: [] for name in configs}
    for rep in range(args.reps):
        for name, options in configs.items():
            rates[name].append(timed(options, seed=rep))
            print(f"rep {rep}: {name}: {rates[name][-1]:,.0f} samples/s", flush=True)

    meta = {"jax": jax.__version__, "device": jax.devices()[0].device_kind,
            "replicas": strategy.num_replicas_in_sync, "cpus": os.cpu_count(),
            "python": platform.python_version(), "global_batch": GLOBAL_BATCH,
            "timed_steps": args.steps, "reps": args.reps}
    rows = [{"options": name, "median": statistics.median(r), "min": min(r), "max": max(r),
             "samples_per_s": r} for name, r in rates.items()]
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "input_prefetch.json").write_text(json.dumps({"meta": meta, "rows": rows},
                                                            indent=2))
    title = (f"# Custom loop input prefetch ({meta['device']}, {meta['replicas']} replica(s), "
             f"jax {meta['jax']}, {meta['cpus']} CPUs)")
    table = [title, "", "| InputOptions | samples/s median | min | max |",
             "| --- | --- | --- | --- |"]
    table += [f"| {r['options']} | {r['median']:,.0f} | {r['min']:,.0f} | {r['max']:,.0f} |"
              for r in rows]
    (RESULTS / "input_prefetch.md").write_text("\n".join(table) + "\n")
    print("\n".join(table))


if __name__ == "__main__":
    main()
