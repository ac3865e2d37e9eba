"""Synchronous vs asynchronous parameter-server training, side by side, with a straggler.

    python -m benchmarks.workloads.ps_sync_async --quick     # 1 repetition, ~7 min on 2 busy cores
    python -m benchmarks.workloads.ps_sync_async  # 3 repetitions, plus 2 workers + straggler
    python -m benchmarks.workloads.ps_sync_async --dry-run   # print the plan, run nothing

Trains the same model both ways (``ParameterServerStrategy(mode="sync")`` and the default
asynchronous mode, custom loop with ``ClusterCoordinator``) on two tasks: the digits embedded in
stratax (MLP 64-64-10, cross-entropy) and a synthetic embedding task (a 5000 x 8 table read
row-sparse, Zipf ids, mean-pooled, linear head, squared error). Each run is a fresh cluster on
127.0.0.1 (chief + W workers + 1 ps, one process each) with W = 1, 2, 4, and W = 4 with one
straggler (its ``dataset_fn`` sleeps ``--sleep`` seconds before each batch, set through
``SX_BENCH_SLEEP_S`` in that worker's environment only). Every run trains on the same budget of
examples (``--batches`` per-worker batches of 32) with plain SGD; the chief samples the
held-out loss every ``--period`` seconds from the parameter servers' current values (see
``ps_sync_async_program.py``). Writes ``benchmarks/results/ps_sync_async.{md,json}`` and one
PNG per task: held-out loss against wall time and against updates applied.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from benchmarks import CLUSTER_DIR, RESULTS_DIR
from benchmarks.cluster.launch import cluster_spec

RESULTS = RESULTS_DIR
PROGRAM = CLUSTER_DIR / "ps_sync_async_program.py"
TASKS = ("digits", "embedding")
MODES = ("sync", "async")


def plan(full: bool) -> list[tuple[int, bool]]:
    """The (workers, straggler) configurations of a run."""
    configs = [(1, False), (2, False), (4, False), (4, True)]
    return [*configs, (2, True)] if full else configs


def run_once(task: str, mode: str, workers: int, straggler: bool, args: argparse.Namespace
             ) -> dict[str, Any]:
    """One fresh cluster (chief + ``workers`` + 1 ps); returns the chief's RESULT."""
    spec = cluster_spec(workers, 1)
    base = {k: v for k, v in os.environ.items() if k not in ("TF_CONFIG", "SX_BENCH_SLEEP_S")}
    procs = []
    try:
        for job, addresses in spec.items():
            for index in range(len(addresses)):
                env = dict(base, TF_CONFIG=json.dumps(
                    {"cluster": spec, "task": {"type": job, "index": index}}))
                if straggler and job == "worker" and index == workers - 1:
                    env["SX_BENCH_SLEEP_S"] = str(args.sleep)
                procs.append(subprocess.Popen(
                    [sys.executable, str(PROGRAM), task, mode, str(args.batches),
                     str(args.period)],
                    env=env, stdout=subprocess.PIPE if job == "chief" else subprocess.DEVNULL,
                    stderr=subprocess.STDOUT, text=True, start_new_session=True))
        out, _ = procs[0].communicate(timeout=args.timeout)
        lines = [line for line in out.splitlines() if line.startswith("RESULT ")]
        if procs[0].returncode or not lines:
            raise RuntimeError(f"{task} {mode} W={workers} failed:\n{out[-3000:]}")
        result = json.loads(lines[-1][len("RESULT "):])
        result["straggler"] = straggler
        return result
    finally:
        for proc in procs:
            if proc.poll() is None:
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(timeout=10)


def _key(r: dict[str, Any]) -> tuple[str, int, bool, str]:
    return r["task"], r["workers"], r["straggler"], r["mode"]


def _label(workers: int, straggler: bool, mode: str) -> str:
    return f"{mode}, {workers} worker{'s' if workers > 1 else ''}" + (
        " + straggler" if straggler else "")


def time_to(trace: list[list[float]], target: float) -> float | None:
    """Seconds until the held-out loss first reaches ``target`` (None: never)."""
    return next((t for t, _, loss in trace if loss <= target), None)


def summarize(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (task, workers, straggler, mode): medians over repetitions, and the
    repetition of median wall time (whose trace is plotted)."""
    groups: dict[tuple[str, int, bool, str], list[dict[str, Any]]] = {}
    for r in results:
        groups.setdefault(_key(r), []).append(r)
    targets = {task: max((r["trace"][-1][2] for r in results if r["task"] == task
                          and math.isfinite(r["trace"][-1][2])), default=math.nan)
               for task in {r["task"] for r in results}}
    rows = []
    for key in sorted(groups, key=lambda k: (TASKS.index(k[0]), k[2], k[1], MODES.index(k[3]))):
        runs = groups[key]
        walls = [r["wall"] for r in runs]
        middle = min(runs, key=lambda r: abs(r["wall"] - statistics.median(walls)))
        reach = [time_to(r["trace"], targets[key[0]]) for r in runs]
        rows.append({
            "task": key[0], "workers": key[1], "straggler": key[2], "mode": key[3],
            "reps": len(runs), "wall": statistics.median(walls), "wall_min": min(walls),
            "wall_max": max(walls),
            "updates": statistics.median(r["updates"] for r in runs),
            "examples_per_s": statistics.median(r["examples"] / r["wall"] for r in runs),
            "final_loss": statistics.median(r["trace"][-1][2] for r in runs),
            "target": targets[key[0]],
            "time_to_target": statistics.median(t for t in reach if t is not None)
            if any(t is not None for t in reach) else None,
            "per_worker_steps": middle["per_worker_steps"],
            "slowest": middle.get("slowest"), "flagged": middle.get("straggler_flagged"),
            "trace": middle["trace"],
        })
    return rows


def table(rows: list[dict[str, Any]], header: str) -> str:
    lines = [header, "",
             "| task | workers | mode | wall s median (min-max) | updates | examples/s | "
             "held-out loss at end | s to reach target | batches per worker | progress line's "
             "slowest |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        reach = "-" if r["time_to_target"] is None else f"{r['time_to_target']:.2f}"
        steps = "/".join(str(int(s)) for _, s in sorted(r["per_worker_steps"].items()))
        slowest = "-" if not r["slowest"] else r["slowest"] + (" (straggler)" if r["flagged"]
                                                               else "")
        workers = f"{r['workers']}" + (" + straggler" if r["straggler"] else "")
        lines.append(
            f"| {r['task']} | {workers} | {r['mode']} | {r['wall']:.2f} ({r['wall_min']:.2f}-"
            f"{r['wall_max']:.2f}) | {r['updates']:.0f} | {r['examples_per_s']:.0f} | "
            f"{r['final_loss']:.4f} | {reach} (target {r['target']:.4f}) | {steps} | "
            f"{slowest} |")
    return "\n".join(lines) + "\n"


def plot(rows: list[dict[str, Any]], task: str, path: Path) -> None:
    """Held-out loss vs wall time and vs updates: top, 1/2/4 workers; bottom, 4 workers with
    and without a straggler (sync solid, async dashed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    mine = [r for r in rows if r["task"] == task]
    straggled = sorted({r["workers"] for r in mine if r["straggler"]})
    figure, axes = plt.subplots(2, 2, figsize=(12, 8), squeeze=False)
    panels = [(0, [r for r in mine if not r["straggler"]], "1, 2, 4 workers"),
              (1, [r for r in mine if r["workers"] in straggled],
               f"{'/'.join(map(str, straggled))} workers, with and without a straggler")]
    colors = {(1, False): "tab:blue", (2, False): "tab:orange", (4, False): "tab:green",
              (4, True): "tab:red", (2, True): "tab:purple"}
    for row, runs, title in panels:
        for r in runs:
            t, updates, loss = zip(*r["trace"], strict=True)
            style = dict(color=colors.get((r["workers"], r["straggler"]), "black"),
                         linestyle="-" if r["mode"] == "sync" else "--",
                         label=_label(r["workers"], r["straggler"], r["mode"]))
            axes[row][0].plot(t, loss, **style)
            axes[row][1].plot(updates, loss, **style)
        for col, xlabel in enumerate(("wall time (s)", "updates applied (sync: global steps)")):
            axes[row][col].set(xlabel=xlabel, ylabel="held-out loss", yscale="log",
                               title=f"{task}: {title}")
            axes[row][col].grid(alpha=0.3)
        axes[row][1].legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=90)
    plt.close(figure)


def write_report(results: list[dict[str, Any]], header: str, name: str = "ps_sync_async"
                 ) -> list[Path]:
    """Writes the table, the raw results and one plot per task to ``benchmarks/results``."""
    RESULTS.mkdir(exist_ok=True)
    rows = summarize(results)
    written = [RESULTS / f"{name}.md", RESULTS / f"{name}.json"]
    written[0].write_text(table(rows, header))
    written[1].write_text(json.dumps(results, indent=1) + "\n")
    for task in sorted({r["task"] for r in rows}):
        path = RESULTS / f"{name}_{task}.png"
        plot(rows, task, path)
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.workloads.ps_sync_async",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="1 repetition, 4 configurations")
    parser.add_argument("--reps", type=int, default=None, help="repetitions (default 3; quick 1)")
    parser.add_argument("--batches", type=int, default=None,
                        help="per-worker batches of 32 per run (default 1536; quick 768)")
    parser.add_argument("--sleep", type=float, default=0.02,
                        help="seconds the straggler sleeps before each batch")
    parser.add_argument("--period", type=float, default=0.1, help="loss sampling period (s)")
    parser.add_argument("--tasks", default=",".join(TASKS))
    parser.add_argument("--timeout", type=float, default=300)
    parser.add_argument("--dry-run", action="store_true", help="print the plan, run nothing")
    args = parser.parse_args(argv)
    args.reps = args.reps or (1 if args.quick else 3)
    args.batches = args.batches or (768 if args.quick else 1536)
    tasks = args.tasks.split(",")
    unknown = sorted(set(tasks) - set(TASKS))
    if unknown or args.batches % 4:
        parser.error(f"--tasks takes {TASKS} (got {unknown}); --batches must be a multiple of 4 "
                     f"(got {args.batches}) so every worker count splits it")
    configs = plan(full=not args.quick)
    runs = [(t, m, w, s) for t in tasks for w, s in configs for m in MODES]
    print(f"{len(runs)} configurations x {args.reps} repetitions, {args.batches} batches each:")
    for t, m, w, s in runs:
        print(f"  {t}: {_label(w, s, m)}")
    if args.dry_run:
        return 0
    results = []
    for rep in range(args.reps):
        for t, m, w, s in runs:
            try:
                result = run_once(t, m, w, s, args)
            except RuntimeError as err:  # e.g. a free port taken by another job in between
                print(f"rep {rep} {t} {_label(w, s, m)} failed, running it again once: "
                      f"{str(err)[-300:]}", flush=True)
                result = run_once(t, m, w, s, args)
            results.append(result)
            print(f"rep {rep} {t} {_label(w, s, m)}: {result['wall']:.2f} s, "
                  f"{result['updates']} updates, loss {result['trace'][-1][2]:.4f}, "
                  f"steps per worker {result['per_worker_steps']}", flush=True)
    load = os.getloadavg()
    header = (f"# Sync vs async ParameterServerStrategy (127.0.0.1, chief + W workers + 1 ps, "
              f"{args.reps} repetition(s), {args.batches} batches of 32 per run, straggler "
              f"sleeps {args.sleep * 1000:.0f} ms per batch)\n\n"
              f"Load average at the end: {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} "
              f"(1/5/15 min; a shared 2-core machine). Target: the highest final held-out loss "
              f"of any run of that task that did not diverge, so every such run reaches it.")
    for path in write_report(results, header):
        print("wrote", path)
    print((RESULTS / "ps_sync_async.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
