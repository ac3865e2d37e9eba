"""The most 2-process data parallelism can give on this machine, with no framework around it.

A hand-written ``jax.jit`` step of the suite's MLP (784-128-10, softmax cross-entropy, Adam),
32 steps per compiled ``lax.scan`` as ``fit`` runs ``steps_per_execution`` 32, timed in fresh
processes pinned one core each:

- ``alone-256``: one process, the global batch (256): the suite's one-process baseline;
- ``alone-128``: one process, half of it: what each of 2 workers computes;
- ``pair-128``: two such processes at once, one per core, without any communication: the
  same plus whatever the two cores cost each other (shared caches, memory, the hypervisor);
- ``barrier-128``: the same two processes as one ``MultiWorkerMirroredStrategy``, the scan in
  ``strategy.run``, all-reducing only the loss (4 bytes) each step and scaling their gradients
  by it (x 1): the pair made to wait for each other once per step, as synchronous training
  must, with no data to move;
- ``sync-128``: the same, all-reducing the gradients (0.4 MB) each step: synchronous data
  parallelism written by hand with ``strategy.run`` and stratax's all-reduce (the transport of
  ``STRATAX_CPU_COLLECTIVES``, shared memory by default here), no Keras;
- ``sgd-128``: ``sync-128`` with plain SGD (``p - lr * g``) in place of Adam: an optimizer
  update that costs next to nothing, the most that sharding the update over the processes
  (each updating half of the parameters) could save, against the same Adam baseline.

``pair-128 / alone-256`` (the pair's samples/s summed, over twice one process's) is the
scaling efficiency a 2-process ``fit`` would reach with a free all-reduce, no optimizer update
beyond its share and no host work: the ceiling the suite's ``multiworker_shm`` ratios are
measured against (``benchmarks/HISTORY.md``). ``barrier-128`` and ``sync-128`` split what a
synchronous step costs beyond it: waiting for the slower process at every step (each process's
step time varies from step to step, and the pair runs at the pace of the slower one), then the
all-reduce's own work. Repetitions are interleaved; each reports samples/s from the median
execution.

Run: ``python -m benchmarks.workloads.ceiling [--reps 5] [--executions 100]``; writes
``benchmarks/results/ceiling.{json,md}``.
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
STEPS = 32
LAYOUTS = ("alone-256", "alone-128", "pair-128", "barrier-128", "sync-128", "sgd-128")
# What a synchronised layout all-reduces each step.
_REDUCED = {"barrier": "loss", "sync": "gradients", "sgd": "gradients"}


def _worker(layout: str, core: int, batch: int, executions: int) -> None:
    os.sched_setaffinity(0, {core})
    kind = layout.split("-")[0]
    if kind in _REDUCED:
        import stratax as sx

        strategy = sx.MultiWorkerMirroredStrategy()
    import jax
    import jax.numpy as jnp
    import numpy as np

    rng = np.random.default_rng(core)
    shapes = ((784, 128), (128,), (128, 10), (10,))
    params = [jnp.asarray(np.random.default_rng(0).standard_normal(s, dtype=np.float32) * 0.05)
              for s in shapes]
    x = rng.standard_normal((batch, 784), dtype=np.float32)
    y = rng.integers(0, 10, batch).astype(np.int32)

    def all_reduce(value: Any) -> Any:
        return sx.get_replica_context().all_reduce(sx.ReduceOp.MEAN, value)

    def loss(p: Any, x: Any, y: Any) -> Any:
        logits = jax.nn.relu(x @ p[0] + p[1]) @ p[2] + p[3]
        return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), y[:, None], 1))

    def steps(carry: Any, x: Any, y: Any) -> Any:
        def step(carry: Any, _: Any) -> Any:
            p, m, v = carry
            value, g = jax.value_and_grad(loss)(p, x, y)
            if _REDUCED.get(kind) == "gradients":
                g = all_reduce(g)
            elif _REDUCED.get(kind) == "loss":  # wait for the peer; the gradients stay local
                mean = all_reduce(value)
                g = [a * (mean / jax.lax.stop_gradient(mean)) for a in g]
            if kind == "sgd":
                return ([a - 1e-3 * b for a, b in zip(p, g, strict=True)], m, v), None
            m = [0.9 * a + 0.1 * b for a, b in zip(m, g, strict=True)]
            v = [0.999 * a + 0.001 * b * b for a, b in zip(v, g, strict=True)]
            p = [a - 1e-3 * b / (jnp.sqrt(c) + 1e-7) for a, b, c in zip(p, m, v, strict=True)]
            return (p, m, v), None

        return jax.lax.scan(step, carry, None, length=STEPS)[0]

    if kind in _REDUCED:
        def per_replica(value: np.ndarray) -> Any:
            return strategy.experimental_distribute_values_from_function(lambda _: value)

        inputs = (per_replica(x), per_replica(y))

        def run(carry: Any) -> Any:
            return strategy.run(steps, args=(carry, *inputs))
    else:
        inputs = (jnp.asarray(x), jnp.asarray(y))
        compiled = jax.jit(steps)

        def run(carry: Any) -> Any:
            return compiled(carry, *inputs)

    carry = jax.block_until_ready(run((params, [jnp.zeros_like(a) for a in params],
                                       [jnp.zeros_like(a) for a in params])))
    times = []
    for _ in range(executions):  # a count, not a duration: synchronised processes stop together
        t = time.perf_counter()
        carry = jax.block_until_ready(run(carry))
        times.append(time.perf_counter() - t)
    print("RESULT " + json.dumps({"core": core, "executions": len(times),
                                  "samples_per_s": STEPS * batch / statistics.median(times)}),
          flush=True)
    sys.stdout.flush()
    os._exit(0)  # no jax.distributed shutdown barrier: the parent collects both results


def _layout(layout: str, executions: int) -> list[float]:
    """samples/s of each process of one run of ``layout``."""
    batch = int(layout.split("-")[1])
    cores = (0,) if layout.startswith("alone") else (0, 1)
    commands = [[sys.executable, "-m", "benchmarks.workloads.ceiling",
                 "--worker", layout, str(core),
                 str(batch), "--executions", str(executions)] for core in cores]
    if layout.split("-")[0] in _REDUCED:
        transport = os.environ.get("STRATAX_CPU_COLLECTIVES", "shm")
        procs = workers.start(commands, transport=transport)
    else:
        env = {**os.environ, "JAX_PLATFORMS": "cpu"}
        procs = [subprocess.Popen(command, env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True, cwd=workers.ROOT,
                                  start_new_session=True) for command in commands]
    outputs = workers.finish_all(procs, timeout=300)
    return [workers.result(output)["samples_per_s"] for output in outputs]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--executions", type=int, default=100,
                        help=f"timed executions of {STEPS} steps per run")
    parser.add_argument("--worker", nargs=3, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker is not None:
        layout, core, batch = args.worker
        _worker(layout, int(core), int(batch), args.executions)
        return
    runs: dict[str, list[list[float]]] = {layout: [] for layout in LAYOUTS}
    for _ in range(max(args.reps, 1)):
        for layout in LAYOUTS:
            runs[layout].append(_layout(layout, args.executions))
    median = {layout: statistics.median(statistics.mean(r) for r in rs)
              for layout, rs in runs.items()}
    # Per repetition: the pair's samples/s summed over twice one process's (same repetition).
    scaling = {layout: [sum(pair) / (2 * alone[0])
                        for pair, alone in zip(runs[layout], runs["alone-256"], strict=True)]
               for layout in LAYOUTS if not layout.startswith("alone")}
    summary = {"median_samples_per_s": median,
               "half_batch_efficiency": median["alone-128"] / median["alone-256"],
               "scaling_per_rep": scaling,
               "scaling_median": {k: statistics.median(v) for k, v in scaling.items()}}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "ceiling.json").write_text(json.dumps(
        {"args": vars(args), "runs": runs, **summary}, indent=1))
    lines = ["# Data-parallel ceiling: hand-written jax.jit MLP step, process i on core i", "",
             f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {args.reps} interleaved "
             f"repetitions of {args.executions} executions, samples/s from the median execution "
             f"of {STEPS} steps.", "",
             "| layout | samples/s per process, median | scaling vs alone-256, median "
             "(per repetition) | per repetition |",
             "| --- | ---: | --- | --- |"]
    for layout in LAYOUTS:
        per_rep = ", ".join("/".join(f"{v:,.0f}" for v in r) for r in runs[layout])
        ratio = "" if layout not in scaling else (
            f"{summary['scaling_median'][layout]:.1%} ("
            + ", ".join(f"{c:.1%}" for c in scaling[layout]) + ")")
        lines.append(f"| {layout} | {median[layout]:,.0f} | {ratio} | {per_rep} |")
    lines += ["", f"Half batch alone (alone-128 / alone-256): "
              f"{summary['half_batch_efficiency']:.1%}.", ""]
    (RESULTS / "ceiling.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
