"""The most 2-process data parallelism can give on this machine, with no framework around it.

A hand-written ``jax.jit`` step of the suite's MLP (784-128-10, softmax cross-entropy, Adam),
32 steps per compiled ``lax.scan`` as ``fit`` runs ``steps_per_execution`` 32, timed in fresh
processes pinned one core each:

- ``alone-256``: one process, the global batch (256): the suite's one-process baseline;
- ``alone-128``: one process, half of it: what each of 2 workers computes;
- ``pair-128``: two such processes at once, one per core, without any communication: the
  same plus whatever the two cores cost each other (shared caches, memory, the hypervisor).

``pair-128 / alone-256`` (the pair's samples/s summed, over twice one process's) is the
scaling efficiency a 2-process ``fit`` would reach with a free all-reduce, no optimizer update
beyond its share and no host work: the ceiling the suite's ``multiworker_shm`` ratios are
measured against (``benchmarks/README.md``). Repetitions are interleaved; each reports
samples/s from the median execution.

Run: ``python -m benchmarks.ceiling [--reps 5] [--seconds 3]``; writes
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
from pathlib import Path
from typing import Any

from benchmarks import workers

RESULTS = Path(__file__).parent / "results"
STEPS = 32
LAYOUTS = ("alone-256", "alone-128", "pair-128")


def _worker(core: int, batch: int, seconds: float) -> None:
    os.sched_setaffinity(0, {core})
    import jax
    import jax.numpy as jnp
    import numpy as np

    rng = np.random.default_rng(core)
    shapes = ((784, 128), (128,), (128, 10), (10,))
    params = [jnp.asarray(rng.standard_normal(s, dtype=np.float32) * 0.05) for s in shapes]
    x = jnp.asarray(rng.standard_normal((batch, 784), dtype=np.float32))
    y = jnp.asarray(rng.integers(0, 10, batch))

    def loss(p: Any) -> Any:
        logits = jax.nn.relu(x @ p[0] + p[1]) @ p[2] + p[3]
        return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), y[:, None], 1))

    def step(carry: Any, _: Any) -> Any:
        p, m, v = carry
        g = jax.grad(loss)(p)
        m = [0.9 * a + 0.1 * b for a, b in zip(m, g, strict=True)]
        v = [0.999 * a + 0.001 * b * b for a, b in zip(v, g, strict=True)]
        p = [a - 1e-3 * b / (jnp.sqrt(c) + 1e-7) for a, b, c in zip(p, m, v, strict=True)]
        return (p, m, v), None

    run = jax.jit(lambda carry: jax.lax.scan(step, carry, None, length=STEPS)[0])
    carry = jax.block_until_ready(run((params, [jnp.zeros_like(a) for a in params],
                                       [jnp.zeros_like(a) for a in params])))
    times = []
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        t = time.perf_counter()
        carry = jax.block_until_ready(run(carry))
        times.append(time.perf_counter() - t)
    print("RESULT " + json.dumps({"core": core, "executions": len(times),
                                  "samples_per_s": STEPS * batch / statistics.median(times)}),
          flush=True)


def _layout(layout: str, seconds: float) -> list[float]:
    """samples/s of each process of one run of ``layout``."""
    batch = int(layout.split("-")[1])
    cores = (0, 1) if layout.startswith("pair") else (0,)
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    procs = [subprocess.Popen([sys.executable, "-m", "benchmarks.ceiling", "--worker", str(core),
                               str(batch), "--seconds", str(seconds)],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, cwd=workers.ROOT, start_new_session=True)
             for core in cores]
    outputs = workers.finish_all(procs, timeout=120 + seconds)
    return [workers.result(output)["samples_per_s"] for output in outputs]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=3.0, help="timed seconds per run")
    parser.add_argument("--worker", nargs=2, type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker is not None:
        _worker(args.worker[0], args.worker[1], args.seconds)
        return
    runs: dict[str, list[list[float]]] = {layout: [] for layout in LAYOUTS}
    for _ in range(max(args.reps, 1)):
        for layout in LAYOUTS:
            runs[layout].append(_layout(layout, args.seconds))
    median = {layout: statistics.median(statistics.mean(r) for r in rs)
              for layout, rs in runs.items()}
    ceiling = [sum(pair) / (2 * alone[0])
               for pair, alone in zip(runs["pair-128"], runs["alone-256"], strict=True)]
    summary = {"median_samples_per_s": median,
               "half_batch_efficiency": median["alone-128"] / median["alone-256"],
               "ceiling_per_rep": ceiling, "ceiling_median": statistics.median(ceiling)}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "ceiling.json").write_text(json.dumps(
        {"args": vars(args), "runs": runs, **summary}, indent=1))
    lines = ["# Data-parallel ceiling: hand-written jax.jit MLP step, process i on core i", "",
             f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {args.reps} interleaved "
             f"repetitions of {args.seconds:g} s, samples/s from the median execution of "
             f"{STEPS} steps.", "",
             "| layout | samples/s per process, median | per repetition |",
             "| --- | ---: | --- |"]
    for layout in LAYOUTS:
        per_rep = ", ".join("/".join(f"{v:,.0f}" for v in r) for r in runs[layout])
        lines.append(f"| {layout} | {median[layout]:,.0f} | {per_rep} |")
    per_rep = ", ".join(f"{c:.1%}" for c in ceiling)
    lines += ["", "Ceiling (pair-128 summed / 2 x alone-256): median "
              f"{summary['ceiling_median']:.1%} (per repetition: {per_rep}); half batch alone: "
              f"{summary['half_batch_efficiency']:.1%}.", ""]
    (RESULTS / "ceiling.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
