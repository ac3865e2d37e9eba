"""All-reduce between 2 worker processes against a memcpy of the same size, 4 KB ... 64 MB.

Two processes join a ``MultiWorkerMirroredStrategy`` through TF_CONFIG (127.0.0.1 by default,
process i pinned to core i) and time ``strategy.run`` of an ``all_reduce(SUM)`` of one float32
tensor per size (median of the timed iterations, after a warm-up that also checks the sum), and
the same all-reduce repeated in one compiled loop (``fori_loop``, as ``fit`` runs
``steps_per_execution`` steps): the transport's own latency, without the per-call dispatch.
Reported per size: latency (the median time of one all-reduce), algorithm bandwidth
(bytes / time) and bus bandwidth (algorithm bandwidth x 2(n-1)/n, NCCL's convention: the bytes
each process must send and receive in a ring; equal to the algorithm bandwidth for n = 2).
In the same run, worker 0 times a single-threaded numpy copy of the same size: data that
crosses processes through the kernel's loopback can at best approach that.

Run::

    python -m benchmarks.workloads.allreduce  # gloo over 127.0.0.1 (the default)
    python -m benchmarks.workloads.allreduce --transport mpi  # JAX's MPI collectives (see README)
    python -m benchmarks.workloads.allreduce --transport shm  # stratax's shared-memory all-reduce
    python -m benchmarks.workloads.allreduce --netns h6a,h6b --addresses 10.213.0.1,10.213.0.2
                                                        # two network namespaces (tests/hosts)

writes ``benchmarks/results/allreduce[_TAG].{json,md}`` (``--tag``; default: the transport).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from typing import Any

from benchmarks import RESULTS_DIR
from benchmarks.cluster import workers

SIZES = (4 << 10, 64 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20)
RESULTS = RESULTS_DIR


def _label(nbytes: int) -> str:
    return f"{nbytes >> 20} MB" if nbytes >= 1 << 20 else f"{nbytes >> 10} KB"


def _worker(index: int, iters: int, pin: bool) -> None:
    if pin:
        os.sched_setaffinity(0, {index % os.cpu_count()})
    import numpy as np

    import stratax as sx

    strategy = sx.MultiWorkerMirroredStrategy(
        communication_options=sx.CommunicationOptions(timeout_seconds=120))
    import jax

    def step(x: Any) -> Any:
        return sx.get_replica_context().all_reduce(sx.ReduceOp.SUM, x)

    out = {}
    for nbytes in SIZES:
        n = nbytes // 4
        value = strategy.experimental_distribute_values_from_function(
            lambda ctx, n=n: np.full((n,), ctx.replica_id_in_sync_group + 1, np.float32))
        result = strategy.run(step, args=(value,))
        jax.block_until_ready(result)
        expected = sum(range(1, strategy.num_replicas_in_sync + 1))
        if float(np.asarray(result)[0]) != expected:
            raise RuntimeError(f"all-reduce gave {np.asarray(result)[0]}, expected {expected}")
        count = iters if nbytes >= 1 << 20 else iters * 10
        times = []
        for _ in range(count):
            start = time.perf_counter()
            jax.block_until_ready(strategy.run(step, args=(value,)))
            times.append(time.perf_counter() - start)
        copies = []
        source, target = np.ones(n, np.float32), np.empty(n, np.float32)
        for _ in range(count):
            start = time.perf_counter()
            np.copyto(target, source)
            copies.append(time.perf_counter() - start)
        out[str(nbytes)] = {"allreduce_s": statistics.median(times),
                            "memcpy_s": statistics.median(copies),
                            "in_loop_s": _in_loop(strategy, step, value, count)}
    out.update(_gradient_rows(strategy, iters * 10))
    if strategy.worker_index == 0:
        print("RESULT " + json.dumps(out), flush=True)
    sys.stdout.flush()
    os._exit(0)


def _in_loop(strategy: Any, step: Any, value: Any, count: int) -> float:
    """Seconds per all-reduce when ``count`` of them run in one compiled loop (as in ``fit``
    with ``steps_per_execution``): the transport without the per-call dispatch; each round
    also halves the tensor (one elementwise pass) to keep the values bounded."""
    import jax

    def looped(x: Any) -> Any:
        return jax.lax.fori_loop(0, count, lambda _, v: step(v) * 0.5, x)

    jax.block_until_ready(strategy.run(looped, args=(value,)))
    start = time.perf_counter()
    jax.block_until_ready(strategy.run(looped, args=(value,)))
    return (time.perf_counter() - start) / count


# The MLP's gradients (784-128-10) plus the loss: the 5 tensors fit's step all-reduces.
MLP_GRADS = ((), (784, 128), (128,), (128, 10), (10,))


def _gradient_rows(strategy: Any, count: int) -> dict[str, dict[str, float]]:
    """The MLP's gradients all-reduced one collective per tensor (as XLA does in ``fit``)
    and packed into one flat buffer (``ctx.all_reduce``, ``CommunicationOptions.bytes_per_pack``).
    """
    import jax
    import numpy as np

    import stratax as sx

    value = strategy.experimental_distribute_values_from_function(
        lambda ctx: [np.full(s, ctx.replica_id_in_sync_group + 1, np.float32) for s in MLP_GRADS])

    def per_tensor(grads: Any) -> Any:
        return [jax.lax.psum(g, "replica") for g in grads]

    def packed(grads: Any) -> Any:
        return sx.get_replica_context().all_reduce(sx.ReduceOp.SUM, grads)

    rows = {}
    for name, fn in (("mlp_grads_per_tensor", per_tensor), ("mlp_grads_packed", packed)):
        jax.block_until_ready(strategy.run(fn, args=(value,)))
        times = []
        for _ in range(count):
            start = time.perf_counter()
            jax.block_until_ready(strategy.run(fn, args=(value,)))
            times.append(time.perf_counter() - start)
        rows[name] = {"allreduce_s": statistics.median(times)}
    return rows


def _one_rep(args: argparse.Namespace) -> dict[str, dict[str, float]]:
    command = [sys.executable, "-m", "benchmarks.workloads.allreduce", "--iters", str(args.iters)]
    command += ["--no-pin"] if args.no_pin else []
    procs = workers.start([[*command, "--worker", str(i)] for i in range(2)],
                          transport=args.transport, addresses=tuple(args.addresses.split(",")),
                          namespaces=tuple(args.netns.split(",")) if args.netns else (None, None))
    return workers.result(workers.finish(procs))


def _median_of(row: dict[str, Any], key: str) -> str:
    return f"{statistics.median(row[key]):,.0f}" if row.get(key) else "-"  # older results


def table(rows: list[dict[str, Any]]) -> str:
    """The markdown table of ``rows`` (as stored in the JSON)."""
    lines = ["| tensor | latency (us, median) | in a compiled loop (us) | "
             "algorithm GB/s, median [min-max] | bus GB/s | "
             "numpy memcpy, same run (GB/s) | all-reduce / memcpy |",
             "| ---: | ---: | ---: | --- | ---: | ---: | ---: |"]
    for row in rows:
        ar, mc = row["algbw_gbps"], row["memcpy_gbps"]
        lines.append(
            f"| {_label(row['bytes'])} | {statistics.median(row['latency_us']):,.0f} | "
            f"{_median_of(row, 'in_loop_us')} | "
            f"{statistics.median(ar):.3f} [{min(ar):.3f}-{max(ar):.3f}] | "
            f"{statistics.median(row['busbw_gbps']):.3f} | {statistics.median(mc):.1f} | "
            f"{row['ratio_median']:.3f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--iters", type=int, default=10,
                        help="timed all-reduces per size >= 1 MB (10x for smaller sizes)")
    parser.add_argument("--transport", choices=("gloo", "mpi", "shm"), default="gloo",
                        help="JAX CPU collectives (sets STRATAX_CPU_COLLECTIVES)")
    parser.add_argument("--addresses", default="127.0.0.1,127.0.0.1",
                        help="the two workers' host addresses")
    parser.add_argument("--netns", default="",
                        help="two network namespaces to run the workers in (ip netns exec)")
    parser.add_argument("--no-pin", action="store_true", help="do not pin process i to core i")
    parser.add_argument("--tag", default="", help="result file suffix (default: transport)")
    parser.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker is not None:
        _worker(args.worker, args.iters, not args.no_pin)
        return
    reps = [_one_rep(args) for _ in range(max(args.reps, 1))]
    n = 2
    rows = []
    for nbytes in SIZES:
        key = str(nbytes)
        ar = [nbytes / r[key]["allreduce_s"] / 1e9 for r in reps]
        rows.append({"bytes": nbytes, "latency_us": [r[key]["allreduce_s"] * 1e6 for r in reps],
                     "in_loop_us": [r[key]["in_loop_s"] * 1e6 for r in reps],
                     "algbw_gbps": ar, "busbw_gbps": [a * 2 * (n - 1) / n for a in ar],
                     "memcpy_gbps": [nbytes / r[key]["memcpy_s"] / 1e9 for r in reps]})
        rows[-1]["ratio_median"] = (statistics.median(ar)
                                    / statistics.median(rows[-1]["memcpy_gbps"]))
    grads = {name: [r[name]["allreduce_s"] * 1e6 for r in reps]
             for name in ("mlp_grads_per_tensor", "mlp_grads_packed")}
    RESULTS.mkdir(exist_ok=True)
    meta = {"cpu_count": os.cpu_count(), "python": platform.python_version(),
            "machine": platform.machine(), "reps": args.reps, "iters": args.iters,
            "transport": args.transport, "addresses": args.addresses, "netns": args.netns,
            "pinned": not args.no_pin, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "loadavg_before": os.getloadavg()}
    stem = "allreduce_" + (args.tag or args.transport)
    record = {"meta": meta, "rows": rows, "mlp_grads_us": grads}
    (RESULTS / f"{stem}.json").write_text(json.dumps(record, indent=2))
    text = (f"2 processes, transport {args.transport}, addresses {args.addresses}"
            f"{', namespaces ' + args.netns if args.netns else ''}, "
            f"{'pinned one core each' if not args.no_pin else 'not pinned'}; "
            f"{args.reps} reps.\n\n" + table(rows)
            + "\nThe MLP's 5 gradient tensors (0.4 MB), all-reduced in one `strategy.run`: "
            "one collective per tensor "
            f"{statistics.median(grads['mlp_grads_per_tensor']):,.0f} us, "
            f"packed into one buffer {statistics.median(grads['mlp_grads_packed']):,.0f} us "
            "(median).\n")
    (RESULTS / f"{stem}.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
