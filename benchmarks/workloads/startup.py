"""Start-up: wall time from ``stratax launch --nproc-per-node 2`` to the first training step.

The parent notes the wall clock, starts ``python -m stratax launch --nproc-per-node 2``
on a small MultiWorkerMirroredStrategy program (the suite's MLP, ``fit`` on numpy arrays),
and every worker prints the wall clock at fixed points: interpreter up, ``import stratax``
done, strategy created (cluster joined), Keras imported, model compiled, first training step
begun and done. Reported per point: seconds since the launch, worst worker, median over
repetitions. Run: ``python -m benchmarks.workloads.startup [--reps 3]``; writes
``benchmarks/results/startup.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from benchmarks import REPO_ROOT, RESULTS_DIR

RESULTS = RESULTS_DIR
POINTS = ("python up", "import stratax", "strategy (cluster joined)", "import keras",
          "model compiled", "first step begun", "first step done")


def _mark(name: str) -> None:
    print(f"MARK {name}|{time.time():.6f}", flush=True)


def _worker() -> None:
    _mark("python up")
    import stratax as sx

    _mark("import stratax")
    strategy = sx.MultiWorkerMirroredStrategy()
    _mark("strategy (cluster joined)")
    import jax
    import keras
    import numpy as np

    _mark("import keras")
    with strategy.scope():
        model = keras.Sequential([keras.Input((784,)), keras.layers.Dense(128, activation="relu"),
                                  keras.layers.Dense(10)])
        model.compile(optimizer="adam",
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    _mark("model compiled")

    class First(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch: int, logs: object = None) -> None:
            if batch == 0:
                _mark("first step begun")

        def on_train_batch_end(self, batch: int, logs: object = None) -> None:
            if batch == 0:
                jax.block_until_ready(jax.live_arrays())
                _mark("first step done")

    x = np.zeros((512, 784), np.float32)
    y = np.zeros((512,), np.int32)
    model.fit(x, y, batch_size=256, epochs=1, verbose=0, callbacks=[First()])


def _one_rep() -> dict[str, float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STRATAX_") and k != "TF_CONFIG"}
    env["JAX_PLATFORMS"] = "cpu"
    env["PYTHONPATH"] = str(REPO_ROOT)
    start = time.time()
    proc = subprocess.run([sys.executable, "-m", "stratax", "launch", "--nproc-per-node", "2",
                           "--timeout", "300", "-m", "benchmarks.workloads.startup", "--worker"],
                          env=env, capture_output=True, text=True, timeout=360,
                          cwd=REPO_ROOT)
    if proc.returncode:
        raise RuntimeError(f"launch failed:\n{(proc.stdout + proc.stderr)[-3000:]}")
    worst: dict[str, float] = {}
    for line in proc.stdout.splitlines():
        if "MARK " not in line:
            continue
        name, stamp = line.split("MARK ", 1)[1].rsplit("|", 1)
        worst[name] = max(worst.get(name, 0.0), float(stamp) - start)
    missing = [p for p in POINTS if p not in worst]
    if missing:
        raise RuntimeError(f"no mark for {missing} in:\n{proc.stdout[-3000:]}")
    return worst


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        _worker()
        return
    load_before = os.getloadavg()[0]
    reps = [_one_rep() for _ in range(args.reps)]
    lines = ["| point (slowest of the 2 workers) | s since `stratax launch`, median (min-max) |",
             "| --- | --- |"]
    for point in POINTS:
        values = [r[point] for r in reps]
        lines.append(f"| {point} | {statistics.median(values):.1f} ({min(values):.1f}-"
                     f"{max(values):.1f}) |")
    text = (f"2 workers on this machine, {args.reps} reps; 1-min load average before: "
            f"{load_before:.1f}.\n\n" + "\n".join(lines) + "\n")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "startup.json").write_text(json.dumps({"reps": reps}, indent=1))
    (RESULTS / "startup.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
