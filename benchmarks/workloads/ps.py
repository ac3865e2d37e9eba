"""Parameter-server benchmark: chief + W workers + P ps on 127.0.0.1, steps/s, median of reps.

    python -m benchmarks.workloads.ps  # 2 workers, 1 ps, every workload, spe 1 and 10
    python -m benchmarks.workloads.ps --workers 1 --ps 2 --reps 3 --workloads emb_lazy_adam

Each configuration runs in a fresh cluster; per-worker batch 256; steps/s counts every step of
every worker after a warm-up of 4 scheduled calls. The per-step breakdown (milliseconds of
worker time per step, summed over workers: data, pull, compute, push; and ps time applying the
optimizer) comes from the workers' and the ps' own timers.

TensorFlow's ``ParameterServerStrategy`` (``ps_tf_program.py``: tf-keras, the TF guide's
custom loop, ``tf.distribute.Server`` on workers and ps) runs the same workloads on the same
cluster shape in the same invocation, repetitions interleaved with stratax's, from the
TensorFlow virtual environment (``benchmarks/.venvs/tf-cpu``, see ``envs.py``; created on the
first run, which takes minutes; ``--systems stratax`` skips it). The ratio column is
stratax's median over TF's median.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import statistics
import subprocess
import sys
import time

from benchmarks import CLUSTER_DIR, PEERS_DIR, REPO_ROOT, RESULTS_DIR
from benchmarks.cluster.launch import cluster_spec
from benchmarks.harness.report import write_table

RESULTS = RESULTS_DIR
WORKLOADS = ("mlp_adam", "emb_sgd", "emb_lazy_adam", "emb_dense_adam")
SYSTEMS = ("stratax", "tf")
PROGRAMS = {"stratax": CLUSTER_DIR / "ps_program.py", "base": CLUSTER_DIR / "ps_program.py",
            "tf": PEERS_DIR / "ps_tf_program.py"}


def run_once(workload: str, spe: int, calls: int, workers: int, ps: int, timeout: float,
             system: str = "stratax", python: str = sys.executable,
             pythonpath: str | None = None, extra_env: dict[str, str] | None = None) -> dict:
    """One fresh cluster of ``system`` running ``workload``; the chief's ``RESULT`` dict.
    ``pythonpath`` runs another stratax tree (``--baseline``); ``extra_env`` is set in every
    task (``--baseline-env``)."""
    spec = cluster_spec(workers, ps)
    env = {k: v for k, v in os.environ.items() if k not in ("TF_CONFIG",)}
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    env.update(extra_env or {})
    # This cluster's secret, as `stratax launch` makes one: gRPC calls carry it (the same-host
    # socket checks the caller's uid instead), so `--baseline-env STRATAX_PS_TRANSPORT=grpc` runs.
    env.setdefault("STRATAX_PS_TOKEN", secrets.token_urlsafe(32))
    procs = []
    try:
        for job, addresses in spec.items():
            for index in range(len(addresses)):
                task_env = dict(env, TF_CONFIG=json.dumps(
                    {"cluster": spec, "task": {"type": job, "index": index}}))
                procs.append(subprocess.Popen(
                    [python, str(PROGRAMS[system]), workload, str(spe), str(calls)],
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
                    # TensorFlow's servers never return from join(); stratax's exit by
                    # themselves once the chief is done.
                    proc.wait(timeout=0.1 if system == "tf" else 10)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(timeout=10)


def _interpreters(systems: list[str]) -> dict[str, str | None]:
    pythons: dict[str, str | None] = {"stratax": sys.executable}
    if "tf" in systems:
        from benchmarks.harness.envs import tf_interpreter

        found = tf_interpreter("cpu", say=lambda line: print(line, flush=True))
        if found.python is None:
            print(f"TensorFlow skipped: {found.reason}. Run again, or `--systems stratax` to "
                  "measure stratax alone.", flush=True)
        pythons["tf"] = found.python
    return pythons


def _cell(rates: list[float]) -> str:
    if not rates:
        return "-"
    return f"{statistics.median(rates):.1f} ({min(rates):.1f}-{max(rates):.1f})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.workloads.ps", description=__doc__)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--ps", type=int, default=1)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--steps", type=int, default=300, help="timed steps per run")
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--spe", default="1,10")
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--name", default="", help="suffix of the result files")
    parser.add_argument("--baseline", default="",
                        help="another stratax source tree (e.g. `git archive` of an older "
                             "commit) run as system 'base' beside this one: before/after")
    parser.add_argument("--baseline-env", action="append", default=[], metavar="NAME=VALUE",
                        help="run the baseline with this environment variable set in every "
                             "task (repeatable); without --baseline, the baseline is this "
                             "tree, e.g. --baseline-env STRATAX_PS_TRANSPORT=grpc")
    args = parser.parse_args(argv)
    base_env = dict(item.split("=", 1) for item in args.baseline_env)
    if base_env and not args.baseline:
        args.baseline = str(REPO_ROOT)
    systems = args.systems.split(",")
    if args.baseline:
        systems.insert(1, "base")
    pythons = _interpreters(systems)
    pythons["base"] = sys.executable
    rows, raw = [], []
    loads = [os.getloadavg()[0]]
    for workload in args.workloads.split(","):
        for spe in (int(s) for s in args.spe.split(",")):
            runs: dict[str, list[dict]] = {s: [] for s in systems}
            for rep in range(args.reps):
                for system in systems:
                    if not pythons.get(system):
                        continue
                    loads.append(os.getloadavg()[0])
                    for attempt in (1, 2):  # a free port taken by another process: retry once
                        try:
                            result = run_once(workload, spe, max(args.steps // spe, 1),
                                              args.workers, args.ps, args.timeout, system,
                                              pythons[system],
                                              args.baseline if system == "base" else None,
                                              base_env if system == "base" else None)
                            break
                        except RuntimeError as err:
                            if attempt == 2:
                                raise
                            print(f"retrying once: {str(err)[:300]}", flush=True)
                    result["system"] = system
                    print(f"{system} {workload} spe {spe} rep {rep}: "
                          f"{result['steps_per_s']:.1f} steps/s {result.get('ms_per_step', '')}",
                          flush=True)
                    runs[system].append(result)
            for system in systems:
                raw.extend(runs[system])
            sx_rates = [r["steps_per_s"] for r in runs.get("stratax", [])]
            tf_rates = [r["steps_per_s"] for r in runs.get("tf", [])]
            middle = None
            if sx_rates:
                median = statistics.median(sx_rates)
                middle = min(runs["stratax"], key=lambda r: abs(r["steps_per_s"] - median))
            base_rates = [r["steps_per_s"] for r in runs.get("base", [])]
            rows.append((workload, spe, sx_rates, tf_rates,
                         middle["ms_per_step"] if middle else None, base_rates))
    loads.append(os.getloadavg()[0])
    name = f"ps_w{args.workers}_p{args.ps}{args.name}"
    if args.workloads != ",".join(WORKLOADS) or args.spe != "1,10":
        name += "_subset"  # a partial run never overwrites the full table
    title = (f"# ParameterServerStrategy: chief + {args.workers} workers + {args.ps} ps "
             f"(127.0.0.1, batch 256 per worker, median of {args.reps})")
    header = ("| workload | steps/call | stratax steps/s median (min-max) | TF PSS steps/s median "
              "(min-max) | stratax / TF | ms/step: data / pull / compute / push (worker) / "
              "apply (ps) |")
    if args.baseline:
        what = " ".join([args.baseline, *args.baseline_env])
        header = header.replace("| stratax / TF |", f"| stratax / TF | baseline "
                                f"({what}) steps/s median (min-max) | "
                                "stratax / baseline |")
    lines = [title, "",
             f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; 1-min load average "
             f"{min(loads):.1f}-{max(loads):.1f} before the runs (a shared 2-core machine). "
             "Repetitions of the systems interleaved, each in a fresh cluster.", "",
             header, "|" + " --- |" * (header.count("|") - 1)]
    for workload, spe, sx_rates, tf_rates, ms, base_rates in rows:
        ratio = (f"{statistics.median(sx_rates) / statistics.median(tf_rates):.2f}x"
                 if sx_rates and tf_rates else "-")
        breakdown = ("-" if ms is None else f"{ms['data']:.2f} / {ms['pull']:.2f} / "
                     f"{ms['compute']:.2f} / {ms['push']:.2f} / {ms['ps_apply']:.2f}")
        base = ""
        if args.baseline:
            gain = (f"{statistics.median(sx_rates) / statistics.median(base_rates):.2f}x"
                    if sx_rates and base_rates else "-")
            base = f" {_cell(base_rates)} | {gain} |"
        lines.append(f"| {workload} | {spe} | {_cell(sx_rates)} | {_cell(tf_rates)} | {ratio} |"
                     f"{base} {breakdown} |")
    lines += ["", ("TensorFlow (tf-keras) has one Adam for an embedding's sparse gradient: it "
                   "decays both moments of every row each step (dense cost, like stratax's "
                   "`sparse_updates=\"dense\"`); its emb_lazy_adam and emb_dense_adam rows run "
                   "that same program. The breakdown is of the stratax run nearest the median: "
                   "worker milliseconds per step summed over workers, and the ps' optimizer "
                   "time per step.")]
    write_table(RESULTS, name, lines, raw)
    return 0


if __name__ == "__main__":
    sys.exit(main())
