"""Parameter-server benchmark: chief + W workers + P ps on 127.0.0.1, steps/s, median of reps.

    python -m benchmarks.ps                      # 2 workers, 1 ps, every workload, spe 1 and 10
    python -m benchmarks.ps --workers 1 --ps 2 --reps 3 --workloads emb_lazy_adam

Each configuration runs in a fresh cluster; per-worker batch 256; steps/s counts every step of
every worker after a warm-up of 4 scheduled calls. The per-step breakdown (milliseconds of
worker time per step, summed over workers: data, pull, compute, push; and ps time applying the
optimizer) comes from the workers' and the ps' own timers. TensorFlow's figures are the ones
measured on this machine earlier (``/work/shared/FINDINGS.md``), not re-run here.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent
RESULTS = HERE / "results"
WORKLOADS = ("mlp_adam", "emb_sgd", "emb_lazy_adam", "emb_dense_adam")
# TF 2.21 ParameterServerStrategy, chief + 2 workers + 1 ps, this machine (FINDINGS.md).
TF_STEPS_PER_S = {("mlp_adam", 1): 186, ("mlp_adam", 10): 258, ("emb_sgd", 1): 184,
                  ("emb_sgd", 10): 265, ("emb_dense_adam", 1): 43, ("emb_dense_adam", 10): 43,
                  ("emb_lazy_adam", 1): 43, ("emb_lazy_adam", 10): 43}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_once(workload: str, spe: int, calls: int, workers: int, ps: int, timeout: float) -> dict:
    spec = {"chief": [f"127.0.0.1:{_free_port()}"],
            "worker": [f"127.0.0.1:{_free_port()}" for _ in range(workers)],
            "ps": [f"127.0.0.1:{_free_port()}" for _ in range(ps)]}
    env = {k: v for k, v in os.environ.items() if k not in ("TF_CONFIG",)}
    procs = []
    try:
        for job, addresses in spec.items():
            for index in range(len(addresses)):
                task_env = dict(env, TF_CONFIG=json.dumps(
                    {"cluster": spec, "task": {"type": job, "index": index}}))
                procs.append(subprocess.Popen(
                    [sys.executable, str(HERE / "ps_program.py"), workload, str(spe), str(calls)],
                    env=task_env, stdout=subprocess.PIPE if job == "chief" else subprocess.DEVNULL,
                    stderr=subprocess.STDOUT, text=True, start_new_session=True))
        out, _ = procs[0].communicate(timeout=timeout)
        lines = [line for line in out.splitlines() if line.startswith("RESULT ")]
        if procs[0].returncode or not lines:
            raise RuntimeError(f"{workload} spe {spe} failed:\n{out[-3000:]}")
        return json.loads(lines[-1][len("RESULT "):])
    finally:
        for proc in procs:
            if proc.poll() is None:
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(timeout=10)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.ps", description=__doc__)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--ps", type=int, default=1)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--steps", type=int, default=300, help="timed steps per run")
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--spe", default="1,10")
    parser.add_argument("--timeout", type=float, default=600)
    args = parser.parse_args(argv)
    rows, raw = [], []
    for workload in args.workloads.split(","):
        for spe in (int(s) for s in args.spe.split(",")):
            runs = []
            for rep in range(args.reps):
                result = run_once(workload, spe, max(args.steps // spe, 1), args.workers, args.ps,
                                  args.timeout)
                print(f"{workload} spe {spe} rep {rep}: {result['steps_per_s']:.1f} steps/s "
                      f"{result['ms_per_step']}", flush=True)
                runs.append(result)
            raw.extend(runs)
            rates = [r["steps_per_s"] for r in runs]
            median = statistics.median(rates)
            middle = min(runs, key=lambda r: abs(r["steps_per_s"] - median))
            tf = TF_STEPS_PER_S.get((workload, spe)) if (args.workers, args.ps) == (2, 1) else None
            rows.append((workload, spe, median, min(rates), max(rates), tf, middle["ms_per_step"]))
    name = f"ps_w{args.workers}_p{args.ps}"
    if args.workloads != ",".join(WORKLOADS) or args.spe != "1,10":
        name += "_subset"  # a partial run never overwrites the full table
    title = (f"# ParameterServerStrategy: chief + {args.workers} workers + {args.ps} ps "
             f"(127.0.0.1, batch 256 per worker, median of {args.reps})")
    header = ("| workload | steps/call | steps/s median (min-max) | TF PSS steps/s | ratio | "
              "ms/step: data / pull / compute / push (worker) / apply (ps) |")
    lines = [title, "",
             f"Load average at the end: {os.getloadavg()[0]:.1f} (a shared 2-core machine).", "",
             header, "| --- | --- | --- | --- | --- | --- |"]
    for workload, spe, median, low, high, tf, ms in rows:
        ratio = f"{median / tf:.2f}x" if tf else "-"
        lines.append(f"| {workload} | {spe} | {median:.1f} ({low:.1f}-{high:.1f}) | "
                     f"{tf or '-'} | {ratio} | {ms['data']:.2f} / {ms['pull']:.2f} / "
                     f"{ms['compute']:.2f} / {ms['push']:.2f} / {ms['ps_apply']:.2f} |")
    lines += ["", ("TF's Embedding+Adam figure (43) is Keras 3's dense Adam on the whole table; "
                   "it is the reference for both emb_lazy_adam and emb_dense_adam.")]
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{name}.md").write_text("\n".join(lines) + "\n")
    (RESULTS / f"{name}.json").write_text(json.dumps(raw, indent=1) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
