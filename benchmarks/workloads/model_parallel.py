"""Model parallelism across processes: a dense model whose state one capped process cannot hold.

    python -m benchmarks.workloads.model_parallel  # 3 repetitions, cap 1360 MiB
    python -m benchmarks.workloads.model_parallel --reps 5 --steps 8 --cap-mib 1360 \
        --out benchmarks/results/model_parallel.json

The model is an MLP 512 -> H -> H -> 10 (``--hidden`` H, 8192: 71.4M parameters, 272 MiB;
with Adam's two slots 817 MiB of state) trained with ``model.fit`` (global batch 16, Adam).
Every configuration runs in fresh processes (this file is every process's program), the
repetitions interleaved (repetition 1 of every configuration, then repetition 2, ...):

- ``one``: one process, ``sx.OneDeviceStrategy``: holds everything.
- ``replicated``: ``sx.MultiWorkerMirroredStrategy()``, 2 processes x 1 CPU device: data
  parallelism, each process holds everything.
- ``tensor``: ``MultiWorkerMirroredStrategy(cores_per_replica=2, layout_map=...)``, 2
  processes x 1 device: one replica over both, the hidden layers split Megatron-style
  (first kernel by columns, second by rows); each process holds half of the large kernels
  and of their Adam slots.
- ``fsdp``: ``MultiWorkerMirroredStrategy(layout_map=...)``: 2 replicas, the large kernels
  split by rows over ``"replica"`` (FSDP-style); each process holds half.
- ``one-capped`` (once): ``one`` under the cap: it must fail, proof that the cap is real.

``tensor`` processes run under a hard memory cap, ``RLIMIT_DATA`` (as
``benchmarks.workloads.ps_big_table``); the others run uncapped for the comparison. ``fsdp`` cannot
run under the same cap: each step gathers a split kernel whole for its layer (FSDP's way),
so one 8192 x 8192 layer's gathered kernel and gradient exceed it.
Reports each process's peak RSS (``ru_maxrss`` from ``wait4``), the state it holds, samples/s
over the timed steps (after a warm-up ``fit`` that compiles), the final loss, and the
1-minute load average before each run. Prints ``RESULT {json}`` per run and writes the JSON
and a Markdown table (``--out``, default ``benchmarks/results/model_parallel.json`` and
``.md``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

FEATURES, CLASSES = 512, 10
CONFIGS = ("one", "replicated", "tensor", "fsdp")
CAPPED = ("tensor",)


def _args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.workloads.model_parallel",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--hidden", type=int, default=8192)
    parser.add_argument("--batch", type=int, default=16, help="global batch")
    parser.add_argument("--steps", type=int, default=8, help="timed steps")
    parser.add_argument("--warmup", type=int, default=3, help="steps of the compiling fit")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--cap-mib", type=int, default=1360,
                        help="RLIMIT_DATA of each process of the sharded configurations")
    parser.add_argument("--timeout", type=float, default=300)
    parser.add_argument("--out", default="benchmarks/results/model_parallel.json")
    parser.add_argument("--task", choices=CONFIGS, help=argparse.SUPPRESS)  # a task's program
    return parser.parse_args(argv)


# ----- a task's program ------------------------------------------------------------------
def _layout_map(config: str):
    import keras

    layout = keras.distribution.LayoutMap(None)
    if config == "tensor":
        layout[".*hidden_a.*kernel"] = (None, "core")
        layout[".*hidden_a.*bias"] = ("core",)
        layout[".*hidden_b.*kernel"] = ("core", None)
    else:
        layout[".*hidden_.*kernel"] = ("replica", None)
    return layout


def _strategy(config: str):
    import stratax as sx

    if config == "one":
        return sx.OneDeviceStrategy("cpu:0")
    options = sx.CommunicationOptions(timeout_seconds=120)
    if config == "replicated":
        return sx.MultiWorkerMirroredStrategy(communication_options=options)
    return sx.MultiWorkerMirroredStrategy(
        cores_per_replica=2 if config == "tensor" else None, layout_map=_layout_map(config),
        communication_options=options)


def task(args: argparse.Namespace) -> None:
    """One process of one run: train, then print ``RESULT {json}`` (process 0 only)."""
    strategy = _strategy(args.task)
    import keras
    import numpy as np

    rng = np.random.default_rng(0)
    rows = args.batch * (args.warmup + args.steps)
    x = rng.normal(size=(rows, FEATURES)).astype(np.float32)
    y = rng.integers(0, CLASSES, rows)
    keras.utils.set_random_seed(1)
    with strategy.scope():
        model = keras.Sequential([
            keras.Input((FEATURES,)),
            keras.layers.Dense(args.hidden, activation="relu", name="hidden_a"),
            keras.layers.Dense(args.hidden, activation="relu", name="hidden_b"),
            keras.layers.Dense(CLASSES, name="head")])
        model.compile(optimizer=keras.optimizers.Adam(1e-4),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    warm = args.batch * args.warmup
    model.fit(x[:warm], y[:warm], batch_size=args.batch, epochs=1, shuffle=False, verbose=0)
    begin = time.perf_counter()
    history = model.fit(x[warm:], y[warm:], batch_size=args.batch, epochs=1, shuffle=False,
                        verbose=0)
    wall = time.perf_counter() - begin
    state = [v.value for v in [*model.variables, *model.optimizer.variables]]
    held = sum(s.data.nbytes for a in state for s in a.addressable_shards)
    if getattr(strategy, "worker_index", 0) == 0:
        print("RESULT " + json.dumps({
            "config": args.task, "samples_per_s": args.batch * args.steps / wall,
            "loss": float(history.history["loss"][-1]), "state_held_mib": held / 2**20,
            "vm_data_mib_after_fit": _vm_data_mib(),
            "mesh": {k: int(v) for k, v in strategy.mesh.shape.items()}}), flush=True)


def _vm_data_mib() -> float:
    """This process's private writable memory now (what ``RLIMIT_DATA`` bounds), MiB."""
    with open("/proc/self/status") as status:
        fields = dict(line.split(":", 1) for line in status if ":" in line)
    return int(fields["VmData"].split()[0]) / 1024


# ----- the launcher ----------------------------------------------------------------------
def _run(args: argparse.Namespace, config: str, capped: bool) -> dict:
    from benchmarks.cluster.launch import run_cluster
    from benchmarks.workloads.ps_big_table import _capped

    spec = {"chief": ["127.0.0.1:0"]}
    if config != "one":
        from benchmarks.cluster.launch import free_ports
        first, second = free_ports(2)
        spec = {"chief": [f"127.0.0.1:{first}"], "worker": [f"127.0.0.1:{second}"]}
    argv = [sys.executable, "-m", "benchmarks.workloads.model_parallel", "--task", config,
            "--hidden", str(args.hidden), "--steps", str(args.steps),
            "--warmup", str(args.warmup), "--batch", str(args.batch)]
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("STRATAX_") and k != "XLA_FLAGS"}
    # One CPU device per process; few malloc arenas, whose reservations would otherwise count
    # against RLIMIT_DATA per thread (the same setting for every configuration).
    env.update(STRATAX_CPU_DEVICES="1", MALLOC_ARENA_MAX="2")
    load = os.getloadavg()[0]
    limit = _capped(args.cap_mib << 20) if capped else None
    cluster = run_cluster(argv, spec, args.timeout, env=env,
                          preexec={"chief": limit, "worker": limit} if capped else None,
                          log_prefix="model_parallel_")
    result: dict = {"config": config, "capped": capped, "exit_codes": cluster.exit_codes,
                    "peak_rss_mib": cluster.peak_rss_mib, "load_1min": load}
    try:
        result.update(cluster.result())
    except RuntimeError as err:
        result["error"] = str(err)[-600:]
    return result


def _summary(runs: list[dict], args: argparse.Namespace) -> dict:
    rows = {}
    for config in CONFIGS:
        done = [r for r in runs if r["config"] == config and r["capped"] == (config in CAPPED)
                and "samples_per_s" in r]
        if not done:
            rows[config] = {"failed": [r.get("error", "") for r in runs
                                       if r["config"] == config][:1]}
            continue
        rates = [r["samples_per_s"] for r in done]
        peaks = [max(r["peak_rss_mib"].values()) for r in done]
        rows[config] = {"runs": len(done), "samples_per_s_median": statistics.median(rates),
                        "samples_per_s_min": min(rates), "samples_per_s_max": max(rates),
                        "peak_rss_mib_median": statistics.median(peaks),
                        "state_held_mib": done[0]["state_held_mib"],
                        "loss_median": statistics.median(r["loss"] for r in done)}
    return rows


def _markdown(report: dict) -> str:
    args, rows = report["args"], report["summary"]
    base = rows.get("replicated", {}).get("samples_per_s_median")
    lines = [f"# Model parallelism across processes ({report['date']})", "",
             f"Command: `{report['command']}`", "",
             f"Box: {report['machine']}; 1-minute load average before the runs "
             f"{min(report['loads']):.1f}-{max(report['loads']):.1f} (other jobs ran on this "
             "box: figures from a loaded machine; there a 2-process run also gets a larger "
             "share of the CPUs than a 1-process one, so compare `tensor`, `fsdp` and "
             "`replicated`, all 2 processes, with each other).", "",
             f"MLP {FEATURES}->{args['hidden']}->{args['hidden']}->{CLASSES}, Adam, global "
             f"batch {args['batch']}, {args['steps']} timed steps after a {args['warmup']}-step "
             f"compiling fit; median of {args['reps']} runs (min-max). `tensor` processes ran "
             f"under RLIMIT_DATA = {args['cap_mib']} MiB, the others uncapped (`fsdp` "
             "gathers each split kernel whole for its layer's step, which exceeds that cap "
             "with one 8192 x 8192 layer). Each configuration starts fresh processes; the "
             "repetitions interleave. One CPU device per process, MALLOC_ARENA_MAX=2.", "",
             "| configuration | processes | state held per process (MiB) | peak RSS per "
             "process, max over processes (MiB) | samples/s | vs replicated | final loss |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for config in CONFIGS:
        row = rows[config]
        if "failed" in row:
            lines.append(f"| {config} | | | | failed: {row['failed']} | | |")
            continue
        ratio = f"{row['samples_per_s_median'] / base:.2f}x" if base else ""
        lines.append(
            f"| {config} | {1 if config == 'one' else 2} | {row['state_held_mib']:.0f} | "
            f"{row['peak_rss_mib_median']:.0f} | {row['samples_per_s_median']:.1f} "
            f"({row['samples_per_s_min']:.1f}-{row['samples_per_s_max']:.1f}) | {ratio} | "
            f"{row['loss_median']:.4f} |")
    capped = report["one_capped"]
    failure = next((line for line in reversed(capped.get("error", "").splitlines())
                    if "rror" in line and not line.startswith("stratax:")), "")
    lines += ["", f"`one` under the same {args['cap_mib']} MiB cap: exit codes "
              f"{capped['exit_codes']}, {'no result' if 'error' in capped else 'TRAINED'}"
              f" (peak RSS {max(capped['peak_rss_mib'].values()):.0f} MiB)"
              f"{f': `{failure.strip()}`' if failure else ''}.", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    if args.task:
        task(args)
        return 0
    runs = []
    for rep in range(args.reps):
        for config in CONFIGS:
            result = _run(args, config, capped=config in CAPPED)
            result["rep"] = rep
            print("RESULT " + json.dumps(result), flush=True)
            runs.append(result)
    one_capped = _run(args, "one", capped=True)
    print("RESULT " + json.dumps(one_capped), flush=True)
    report = {
        "date": time.strftime("%Y-%m-%d"),
        "command": "python -m benchmarks.workloads.model_parallel " + " ".join(
            argv if argv is not None else sys.argv[1:]),
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
        "args": {k: v for k, v in vars(args).items() if k != "task"},
        "loads": [r["load_1min"] for r in runs], "summary": _summary(runs, args),
        "one_capped": one_capped, "runs": runs}
    out = Path(args.out)
    out.write_text(json.dumps(report, indent=1) + "\n")
    out.with_suffix(".md").write_text(_markdown(report))
    print(_markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
