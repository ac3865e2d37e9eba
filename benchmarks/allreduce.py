"""All-reduce bandwidth between 2 worker processes vs. the memcpy bandwidth of the same box.

Two processes on 127.0.0.1 (process i pinned to core i) join a ``MultiWorkerMirroredStrategy``
through TF_CONFIG and time ``strategy.run`` of an ``all_reduce(SUM)`` of 4 MB and 64 MB float32
tensors (algorithm bandwidth = bytes / time, median of the timed iterations). In the same run,
worker 0 times a single-threaded numpy copy of the same sizes: the loopback all-reduce can at
best approach that. Run: ``python -m benchmarks.allreduce [--reps 3] [--iters 20]``; writes
``benchmarks/results/allreduce.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

SIZES_MB = (4, 64)
RESULTS = Path(__file__).parent / "results"


def _worker(index: int, iters: int) -> None:
    os.sched_setaffinity(0, {index % os.cpu_count()})
    import numpy as np

    import stratax as sx

    strategy = sx.MultiWorkerMirroredStrategy(
        communication_options=sx.CommunicationOptions(timeout_seconds=120))
    import jax

    out = {}
    for size_mb in SIZES_MB:
        n = size_mb * 2**20 // 4
        value = strategy.experimental_distribute_values_from_function(
            lambda ctx, n=n: np.full((n,), ctx.replica_id_in_sync_group + 1, np.float32))

        def step(x):
            return sx.get_replica_context().all_reduce(sx.ReduceOp.SUM, x)

        result = strategy.run(step, args=(value,))
        jax.block_until_ready(result)
        expected = sum(range(1, strategy.num_replicas_in_sync + 1))
        if float(np.asarray(result)[0]) != expected:
            raise RuntimeError(f"all-reduce gave {np.asarray(result)[0]}, expected {expected}")
        times = []
        for _ in range(iters):
            start = time.perf_counter()
            jax.block_until_ready(strategy.run(step, args=(value,)))
            times.append(time.perf_counter() - start)
        copies = []
        source, target = np.ones(n, np.float32), np.empty(n, np.float32)
        for _ in range(iters):
            start = time.perf_counter()
            np.copyto(target, source)
            copies.append(time.perf_counter() - start)
        out[size_mb] = {"allreduce_s": statistics.median(times),
                        "memcpy_s": statistics.median(copies)}
    if strategy.worker_index == 0:
        print("RESULT " + json.dumps(out), flush=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _one_rep(iters: int) -> dict[str, dict[str, float]]:
    cluster = {"worker": [f"127.0.0.1:{_free_port()}", f"127.0.0.1:{_free_port()}"]}
    procs = []
    for index in range(2):
        env = {k: v for k, v in os.environ.items() if not k.startswith("STRATAX_")}
        env["TF_CONFIG"] = json.dumps({"cluster": cluster, "task": {"type": "worker",
                                                                     "index": index}})
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "benchmarks.allreduce", "--worker", str(index),
             "--iters", str(iters)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True, cwd=Path(__file__).parent.parent, start_new_session=True))
    try:
        outputs = [p.communicate(timeout=600)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    if any(p.returncode for p in procs):
        raise RuntimeError("a worker failed:\n" + outputs[0][-2000:] + outputs[1][-2000:])
    result = next(line for line in outputs[0].splitlines() if line.startswith("RESULT "))
    return json.loads(result[len("RESULT "):])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker is not None:
        _worker(args.worker, args.iters)
        return
    reps = [_one_rep(args.iters) for _ in range(max(args.reps, 1))]
    rows = []
    for size_mb in SIZES_MB:
        key = str(size_mb)
        nbytes = size_mb * 2**20
        ar = [nbytes / r[key]["allreduce_s"] / 1e9 for r in reps]
        mc = [nbytes / r[key]["memcpy_s"] / 1e9 for r in reps]
        rows.append({"size_mb": size_mb, "allreduce_gbps": ar, "memcpy_gbps": mc,
                     "ratio_median": statistics.median(ar) / statistics.median(mc)})
    RESULTS.mkdir(exist_ok=True)
    meta = {"cpu_count": os.cpu_count(), "python": platform.python_version(),
            "machine": platform.machine(), "reps": args.reps, "iters": args.iters}
    (RESULTS / "allreduce.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
    lines = ["| tensor | all-reduce, 2 processes (GB/s, median [min-max]) | numpy memcpy, same run "
             "(GB/s) | all-reduce / memcpy |", "| --- | --- | --- | --- |"]
    for row in rows:
        ar, mc = row["allreduce_gbps"], row["memcpy_gbps"]
        lines.append(f"| {row['size_mb']} MB | {statistics.median(ar):.2f} [{min(ar):.2f}-"
                     f"{max(ar):.2f}] | {statistics.median(mc):.1f} | "
                     f"{row['ratio_median']:.3f} |")
    table = "\n".join(lines) + "\n"
    (RESULTS / "allreduce.md").write_text(table)
    print(table)


if __name__ == "__main__":
    main()
