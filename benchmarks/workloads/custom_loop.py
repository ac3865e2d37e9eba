"""TensorFlow's custom training loop on stratax, one process against two: host time per step.

The loop of TensorFlow's "Custom training with tf.distribute.Strategy" guide, as
``examples/custom_training_loop.py`` writes it: every step is one
``strategy.run(train_step, args=(state, batch))`` over a batch of
``experimental_distribute_dataset``, whose step computes the gradients with Keras' stateless
API, all-reduces them with ``ctx.all_reduce`` and applies Adam; then
``strategy.reduce(SUM, per_replica_losses)`` as the guide's ``distributed_train_step`` returns.
The suite's MLP (784-128-10), global batch 256, fresh processes pinned one core each:

- ``1proc``: ``OneDeviceStrategy``, one process;
- ``2proc-shm`` / ``2proc-gloo``: ``MultiWorkerMirroredStrategy``, two processes, the
  all-reduce over shared memory or gloo (``STRATAX_CPU_COLLECTIVES``).

Each run times ``--steps`` steps after a warm-up and reports samples/s (the steps' samples over
the wall time, the host waiting for the last step) and the host time of a ``strategy.run``
call (its median, without waiting for the step). Unlike ``fit`` with ``steps_per_execution``,
this loop pays the host's dispatch at every step, so it shows what ``strategy.run`` costs
between processes. Repetitions are interleaved.

Run: ``python -m benchmarks.workloads.custom_loop [--reps 5] [--steps 300] [--tag NAME]``; writes
``benchmarks/results/custom_loop[_NAME].{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

from benchmarks import RESULTS_DIR
from benchmarks.cluster import workers

RESULTS = RESULTS_DIR
LAYOUTS = ("1proc", "2proc-shm", "2proc-gloo")
WARMUP_STEPS = 20


def _worker(layout: str, core: int, steps: int) -> None:
    os.sched_setaffinity(0, {core})
    import stratax as sx

    strategy = (sx.OneDeviceStrategy("cpu:0") if layout == "1proc"
                else sx.MultiWorkerMirroredStrategy())
    import jax
    import keras
    import numpy as np

    from benchmarks.harness.configs import GLOBAL_BATCH, WORKLOADS
    from benchmarks.workloads.models import build_model, initial_weights

    rng = np.random.default_rng(0)
    count = WARMUP_STEPS + steps
    x = rng.standard_normal((count * GLOBAL_BATCH, 784), dtype=np.float32)
    y = rng.integers(0, 10, count * GLOBAL_BATCH).astype(np.int32)
    with strategy.scope():
        model = build_model(keras, WORKLOADS["mlp"])
        current = model.get_weights()
        model.set_weights(initial_weights([tuple(w.shape) for w in current], current))
        optimizer = keras.optimizers.Adam(1e-3)
        optimizer.build(model.trainable_variables)
    loss_object = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)

    def train_step(state, batch):
        images, labels = batch

        def loss_fn(trainable):
            logits, _ = model.stateless_call(trainable, state["non_trainable"], images,
                                             training=True)
            return sx.compute_average_loss(loss_object(labels, logits),
                                           global_batch_size=GLOBAL_BATCH)

        loss, grads = jax.value_and_grad(loss_fn)(state["trainable"])
        grads = sx.get_replica_context().all_reduce(sx.ReduceOp.SUM, grads)
        trainable, optimizer_vars = optimizer.stateless_apply(state["optimizer"], grads,
                                                              state["trainable"])
        return loss, {"trainable": trainable, "non_trainable": state["non_trainable"],
                      "optimizer": optimizer_vars}

    state = {"trainable": [v.value for v in model.trainable_variables],
             "non_trainable": [v.value for v in model.non_trainable_variables],
             "optimizer": [v.value for v in optimizer.variables]}
    batches = [(x[i:i + GLOBAL_BATCH], y[i:i + GLOBAL_BATCH])
               for i in range(0, len(x), GLOBAL_BATCH)]
    dataset = iter(strategy.experimental_distribute_dataset(batches))
    calls = []
    total = None
    for index in range(count):
        if index == WARMUP_STEPS:
            jax.block_until_ready((total, state))
            start = time.perf_counter()
        batch = next(dataset)
        called = time.perf_counter()
        losses, state = strategy.run(train_step, args=(state, batch))
        calls.append(time.perf_counter() - called)
        total = strategy.reduce(sx.ReduceOp.SUM, losses, axis=None)
    jax.block_until_ready((total, state))
    elapsed = time.perf_counter() - start
    print("RESULT " + json.dumps({"core": core, "samples_per_s": steps * GLOBAL_BATCH / elapsed,
                                  "run_call_ms": statistics.median(calls[WARMUP_STEPS:]) * 1e3,
                                  "final_loss": float(total)}), flush=True)
    sys.stdout.flush()
    os._exit(0)  # no jax.distributed shutdown barrier: the parent collects both results


def _layout(layout: str, steps: int) -> dict[str, Any]:
    """Process 0's result of one run of ``layout``."""
    cores = (0,) if layout == "1proc" else (0, 1)
    commands = [[sys.executable, "-m", "benchmarks.workloads.custom_loop",
                 "--worker", layout, str(core),
                 "--steps", str(steps)] for core in cores]
    if layout == "1proc":
        env = {**os.environ, "JAX_PLATFORMS": "cpu"}
        procs = [subprocess.Popen(command, env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True, cwd=workers.ROOT,
                                  start_new_session=True) for command in commands]
    else:
        procs = workers.start(commands, transport=layout.split("-")[1])
    return workers.result(workers.finish(procs, timeout=300))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--steps", type=int, default=300, help="timed steps per run")
    parser.add_argument("--tag", default="", help="suffix of the result files")
    parser.add_argument("--worker", nargs=2, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker is not None:
        _worker(args.worker[0], int(args.worker[1]), args.steps)
        return
    runs: dict[str, list[dict[str, Any]]] = {layout: [] for layout in LAYOUTS}
    for _ in range(max(args.reps, 1)):
        for layout in LAYOUTS:
            runs[layout].append(_layout(layout, args.steps))
    median = {layout: {key: statistics.median(r[key] for r in rs)
                       for key in ("samples_per_s", "run_call_ms")}
              for layout, rs in runs.items()}
    # Per repetition: 2 processes' samples/s over twice one process's (same repetition).
    scaling = {layout: [r["samples_per_s"] / (2 * alone["samples_per_s"])
                        for r, alone in zip(runs[layout], runs["1proc"], strict=True)]
               for layout in LAYOUTS if layout != "1proc"}
    RESULTS.mkdir(exist_ok=True)
    stem = "custom_loop" + (f"_{args.tag}" if args.tag else "")
    (RESULTS / f"{stem}.json").write_text(json.dumps(
        {"args": vars(args), "runs": runs, "median": median, "scaling_per_rep": scaling},
        indent=1))
    lines = ["# Custom training loop (strategy.run per step), MLP, process i on core i", "",
             f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {args.reps} interleaved "
             f"repetitions of {args.steps} steps, global batch 256.", "",
             "| layout | samples/s, median (per repetition) | scaling vs 1proc, median | "
             "strategy.run host ms per call, median | final loss |",
             "| --- | --- | ---: | ---: | ---: |"]
    for layout in LAYOUTS:
        per_rep = ", ".join(f"{r['samples_per_s']:,.0f}" for r in runs[layout])
        ratio = f"{statistics.median(scaling[layout]):.1%}" if layout in scaling else ""
        lines.append(f"| {layout} | {median[layout]['samples_per_s']:,.0f} ({per_rep}) | "
                     f"{ratio} | {median[layout]['run_call_ms']:.2f} | "
                     f"{runs[layout][-1]['final_loss']:.4f} |")
    (RESULTS / f"{stem}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
