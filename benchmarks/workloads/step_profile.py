"""Where the time of one MultiWorkerMirroredStrategy training step goes (2 processes, 1 core each).

Runs the benchmark suite's MLP (784-128-10, Adam, global batch 256, ``steps_per_execution``
32) with ``model.fit`` in three layouts, each in fresh processes pinned one core each:

- ``1proc``: one process, ``OneDeviceStrategy`` (the compute of the full batch on one core);
- ``2proc``: two processes, ``MultiWorkerMirroredStrategy`` over 127.0.0.1 (TF_CONFIG);
- ``2proc-local``: the same two processes and the same per-process batch (128), but every
  process trains alone (``OneDeviceStrategy``): the compute a 2-process step cannot avoid.

Every execution of ``steps_per_execution`` steps is timed with the host waiting for it
(per-step time = execution time / spe). Process 0 of ``2proc`` also records a
``jax.profiler`` trace of a few executions (not under MPI, which the profiler ends) and sums
the time of each trace event per execution: XLA's ops and the runtime's (``ops``: the
all-reduce's custom call, the dots, the optimizer's fusions) apart from Python frames
(``top``). That is the per-op breakdown in ``benchmarks/HISTORY.md``.

Run: ``python -m benchmarks.workloads.step_profile [--workload mlp] [--spe 32] [--reps 3]``; writes
``benchmarks/results/step_profile.{json,md}``. Extra environment for the workers (e.g.
``XLA_FLAGS``) is passed through, except ``STRATAX_*`` settings: ``--transport`` and
``--replicated-update`` choose those.
"""

from __future__ import annotations

import argparse
import collections
import glob
import gzip
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

from benchmarks import RESULTS_DIR
from benchmarks.cluster import workers

RESULTS = RESULTS_DIR
LAYOUTS = ("1proc", "2proc-local", "2proc")


def _trace_breakdown(trace_dir: str, executions: int) -> dict[str, Any]:
    """Per-execution time by kind, from the Perfetto trace that ``jax.profiler`` wrote."""
    files = glob.glob(os.path.join(trace_dir, "**", "*.trace.json.gz"), recursive=True)
    if not files:
        return {"error": f"no trace file under {trace_dir}"}
    with gzip.open(files[0], "rt") as handle:
        events = json.load(handle)["traceEvents"]
    by_name: collections.Counter[str] = collections.Counter()
    counts: collections.Counter[str] = collections.Counter()
    for event in events:
        if event.get("ph") != "X":
            continue
        by_name[event["name"]] += event.get("dur", 0)
        counts[event["name"]] += 1
    def rows(names: list[str]) -> list[dict[str, Any]]:
        return [{"name": n, "us_per_exec": by_name[n] / executions,
                 "calls_per_exec": counts[n] / executions} for n in names]

    ranked = [n for n, _ in by_name.most_common()]
    # Python frames are named "$file:line function"; the rest are XLA's and the runtime's.
    return {"top": rows(ranked[:40]), "ops": rows([n for n in ranked if n[:1] != "$"][:40])}


def _worker(layout: str, index: int, workload_name: str, spe: int, epochs: int,
            trace: bool, pin: bool) -> None:
    if pin:
        os.sched_setaffinity(0, {index % os.cpu_count()})
    import numpy as np

    import stratax as sx

    if layout == "2proc":
        strategy = sx.MultiWorkerMirroredStrategy()
    else:
        strategy = sx.OneDeviceStrategy("cpu:0")
    import jax
    import keras

    from benchmarks.harness.configs import GLOBAL_BATCH, WORKLOADS
    from benchmarks.workloads.models import build_model, initial_weights

    workload = WORKLOADS[workload_name]
    batch = GLOBAL_BATCH // 2 if layout == "2proc-local" else GLOBAL_BATCH
    steps = spe * 4
    rng = np.random.default_rng(0)
    x = rng.standard_normal((steps * batch, *workload.input_shape), dtype=np.float32)
    y = rng.integers(0, workload.num_classes, steps * batch).astype(np.int32)
    with strategy.scope():
        model = build_model(keras, workload)
        model.compile(optimizer=keras.optimizers.Adam(1e-3),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      steps_per_execution=spe)
        current = model.get_weights()
        model.set_weights(initial_weights([tuple(w.shape) for w in current], current))

    class Timer(keras.callbacks.Callback):
        def __init__(self) -> None:
            super().__init__()
            self.marks: list[float] = []

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            jax.block_until_ready(jax.live_arrays())
            self.marks.append(time.perf_counter())

    timer = Timer()
    model.fit(x, y, batch_size=batch, epochs=1, shuffle=False, verbose=0, callbacks=[timer])
    timer.marks.clear()
    model.fit(x, y, batch_size=batch, epochs=epochs, shuffle=False, verbose=0, callbacks=[timer])
    gaps = [b - a for a, b in zip(timer.marks, timer.marks[1:], strict=False)]
    out: dict[str, Any] = {"layout": layout, "step_ms": statistics.median(gaps) / spe * 1e3,
                           "step_ms_min": min(gaps) / spe * 1e3}
    if trace:  # every process trains the traced epoch (collectives need all); 0 records it
        trace_dir = tempfile.mkdtemp(prefix="stratax-trace-")
        if index == 0:
            jax.profiler.start_trace(trace_dir, create_perfetto_trace=True)
        model.fit(x, y, batch_size=batch, epochs=1, shuffle=False, verbose=0)
        if index == 0:
            jax.profiler.stop_trace()
            out["trace"] = _trace_breakdown(trace_dir, steps // spe)
    if index == 0:
        print("RESULT " + json.dumps(out), flush=True)
    sys.stdout.flush()
    os._exit(0)


def _run(layout: str, args: argparse.Namespace, trace: bool) -> dict[str, Any]:
    command = [sys.executable, "-m", "benchmarks.workloads.step_profile",
               "--workload", args.workload,
               "--spe", str(args.spe), "--epochs", str(args.epochs)]
    command += (["--trace"] if trace else []) + (["--no-pin"] if args.no_pin else [])
    count = 1 if layout == "1proc" else 2
    commands = [[*command, "--worker", layout, str(i)] for i in range(count)]
    if layout == "2proc":
        procs = workers.start(commands, transport=args.transport, extra_env=(
            {"STRATAX_SHARDED_UPDATE": "off"} if args.replicated_update else None))
    else:  # independent processes, no cluster
        procs = [subprocess.Popen(c, env={**os.environ, "JAX_PLATFORMS": "cpu"},
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                  cwd=workers.ROOT, start_new_session=True) for c in commands]
    return workers.result(workers.finish(procs))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="mlp")
    parser.add_argument("--spe", type=int, default=32)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--tag", default="", help="suffix of the result files")
    parser.add_argument("--no-pin", action="store_true",
                        help="let every process use every core (default: process i on core i)")
    parser.add_argument("--layouts", default=",".join(LAYOUTS))
    parser.add_argument("--transport", choices=("gloo", "mpi", "shm"), default="gloo")
    parser.add_argument("--replicated-update", action="store_true",
                        help="every process applies the whole optimizer update "
                             "(STRATAX_SHARDED_UPDATE=off)")
    parser.add_argument("--trace", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--worker", nargs=2, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker is not None:
        _worker(args.worker[0], int(args.worker[1]), args.workload, args.spe, args.epochs,
                args.trace, not args.no_pin)
        return
    layouts = args.layouts.split(",")
    runs: dict[str, list[dict[str, Any]]] = {layout: [] for layout in layouts}
    for rep in range(args.reps):
        for layout in layouts:
            # jax.profiler under mpiexec ends the worker silently: trace the others only.
            runs[layout].append(_run(layout, args, trace=(rep == 0 and args.transport != "mpi")))
    summary = {layout: statistics.median(r["step_ms"] for r in rs) for layout, rs in runs.items()}
    RESULTS.mkdir(exist_ok=True)
    stem = f"step_profile{('_' + args.tag) if args.tag else ''}"
    (RESULTS / f"{stem}.json").write_text(json.dumps(
        {"args": vars(args), "summary_step_ms": summary, "runs": runs,
         "xla_flags": os.environ.get("XLA_FLAGS", "")}, indent=1))
    print(json.dumps(summary, indent=1))
    for layout in layouts:
        trace = runs[layout][0].get("trace", {})
        print(f"\n== {layout}: top XLA and runtime trace events (us per execution of "
              f"{args.spe} steps)")
        for row in trace.get("ops", [])[:25]:
            print(f"  {row['us_per_exec']:10.0f} us  x{row['calls_per_exec']:6.1f}  {row['name']}")


if __name__ == "__main__":
    main()
