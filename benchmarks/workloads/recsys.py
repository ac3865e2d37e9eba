"""DLRM-shaped recommender benchmark: TF's ParameterServerStrategy against stratax's strategies,
stratax's hybrid parameter-server mode among them, and a one-process reference.

    python -m benchmarks.workloads.recsys --quick            # 100k-row largest table, 1 repetition
    python -m benchmarks.workloads.recsys                    # 2M-row largest table, 3 repetitions
    python -m benchmarks.workloads.recsys --quick --dry-run  # print the plan, run nothing

Data: synthetic Criteo-shaped clicks with a hidden model behind the labels
(``recsys_data.py``): 13 dense features, 26 categorical ones with Zipf ids over tables from 10
rows to ``largest``, a held-out set. Model: DLRM (``recsys_model.py``: bottom MLP, one
``Embedding`` per feature, pairwise dot interaction, top MLP, sigmoid), plain SGD, the same
initial weights everywhere. Systems, side by side in one run, repetitions interleaved
(rep-major), each repetition a fresh cluster on 127.0.0.1:

- ``tf-ps``: TensorFlow's ParameterServerStrategy, tf-keras ``fit`` (``recsys_tf_program.py``,
  from ``benchmarks/.venvs/tf-cpu``, made by ``envs.py``), chief + 2 workers + 2 ps; the anchor.
- ``sx-ps``: stratax ParameterServerStrategy, Keras 3 ``fit`` (``recsys_program.py``), chief +
  2 workers + 2 ps, every variable on the ps, asynchronous; the tables take the row-sparse
  path.
- ``sx-ps-sync``: the same, ``mode="sync"``: every variable on the ps, one update per step
  from both workers' gradients (computes the same bits as ``sx-hybrid``).
- ``sx-hybrid``: the same cluster and partitioner in hybrid mode (``mode="sync",
  dense_variables="workers"``): the tables stay on the ps (row-sparse, updated
  synchronously), every other variable is replicated on the 2 workers, which sum their
  gradients among themselves (the exchange) and apply them locally.
- ``sx-hybrid-async``: hybrid mode with ``mode="async"``: each worker's rows applied on
  arrival, the replicated variables still synchronous.
- ``sx-mwms``: stratax MultiWorkerMirroredStrategy, 2 processes of ``stratax launch``, every
  table replicated; run only while the tables fit ``--replicated-limit-mib``.
- ``sx-one``: the same model in one process, plain Keras 3 ``fit`` with no strategy, the same
  global batch: the synchronous one-process run that is the AUC reference (its table
  gradients are dense, so it is no speed peer for large tables).

Each trains on the same examples (a few warm-up batches that compile, then the training set
once, timed) and reports examples/s of the timed ``fit``, the held-out AUC, bytes per step
where the system exposes them (the ps' counters; hybrid's exchange among the workers and
MWMS's all-reduce computed from the variables' sizes), and each task's peak RSS. The report
ends with issue 38's goals for the hybrid mode: examples/s >= 3x ``tf-ps``'s and >= 1.5x
``sx-ps``'s, held-out AUC within 0.002 of ``sx-one``'s. Results:
``benchmarks/results/recsys[_quick].{md,json,png}``.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks import CACHE_DIR, CLUSTER_DIR, PEERS_DIR, REPO_ROOT, RESULTS_DIR
from benchmarks.cluster import launch as cluster
from benchmarks.harness import envs
from benchmarks.harness.stats import summarize
from benchmarks.workloads import recsys_data

SYSTEMS = ("tf-ps", "sx-ps", "sx-ps-sync", "sx-hybrid", "sx-hybrid-async", "sx-mwms",
           "sx-one")
BASELINE = "tf-ps"
REFERENCE = "sx-one"   # the AUC reference: synchronous, one process
HYBRID = "sx-hybrid"
# Issue 38's goals for the hybrid mode.
GOAL_OVER_BASELINE, GOAL_OVER_PS, GOAL_AUC_GAP = 3.0, 1.5, 0.002
RESULTS = RESULTS_DIR
SIZES = {
    # the test's configuration: seconds of training, the clusters' start-up dominates
    "smoke": recsys_data.DataConfig(smallest=10, largest=1_000, train=32_768, held_out=8_192),
    "quick": recsys_data.DataConfig(smallest=10, largest=100_000, train=131_072,
                                    held_out=32_768),
    "full": recsys_data.DataConfig(smallest=10, largest=2_000_000, train=1_048_576,
                                   held_out=131_072),
}
PROGRAM = CLUSTER_DIR / "recsys_program.py"
TF_PROGRAM = PEERS_DIR / "recsys_tf_program.py"
RESULT_LINE = re.compile(r"^\[worker (\d+)\] RESULT (.*)$", re.MULTILINE)


@dataclasses.dataclass(frozen=True)
class Plan:
    """One invocation: the data, the systems (with why any is left out), the options every
    program gets, repetitions and the result files' stem."""

    size: str
    data: recsys_data.DataConfig
    systems: tuple[str, ...]
    skipped: dict[str, str]
    options: dict[str, int]
    reps: int
    name: str


def replicated_mib(data: recsys_data.DataConfig) -> float:
    """MiB of the 26 tables (float32, the model's embedding width): what every MWMS worker
    holds, and all-reduces as a dense gradient each step."""
    from benchmarks.workloads.recsys_model import EMBEDDING_DIM

    return sum(data.table_sizes()) * EMBEDDING_DIM * 4 / 2**20


def make_plan(args: argparse.Namespace) -> Plan:
    """The plan of ``args``; raises ``ValueError`` naming a bad option."""
    size = args.size or ("quick" if args.quick else "full")
    data = SIZES[size]
    systems = tuple(args.systems.split(","))
    unknown = sorted(set(systems) - set(SYSTEMS))
    if unknown:
        raise ValueError(f"--systems takes {','.join(SYSTEMS)}, got {unknown}.")
    skipped = {}
    if "sx-mwms" in systems and replicated_mib(data) > args.replicated_limit_mib:
        skipped["sx-mwms"] = (f"skipped: tables of {replicated_mib(data):.0f} MiB exceed "
                              f"--replicated-limit-mib {args.replicated_limit_mib}")
    reps = args.reps or (1 if args.quick or size == "smoke" else 3)
    if reps < 1 or (size == "full" and reps < 3):
        raise ValueError(f"--reps {reps}: a full run needs at least 3 repetitions.")
    options = {"batch": args.batch, "warm_steps": args.warm_steps, "spe": args.spe}
    name = "recsys" if size == "full" else f"recsys_{size}"
    return Plan(size, data, tuple(s for s in systems if s not in skipped), skipped, options,
                reps, args.name or name)


def describe(plan: Plan) -> str:
    """The plan in words (what ``--dry-run`` prints)."""
    sizes = plan.data.table_sizes()
    lines = [f"recsys, size {plan.size}: 26 tables of {sizes[0]:,}..{sizes[-1]:,} rows "
             f"({sum(sizes):,} in all, {replicated_mib(plan.data):.0f} MiB), "
             f"{plan.data.train:,} training and {plan.data.held_out:,} held-out examples, "
             f"global batch {plan.options['batch']}, {plan.options['warm_steps']} warm-up "
             f"batches, steps_per_execution {plan.options['spe']}, {plan.reps} repetition(s)"]
    lines += [f"  {s}" + (" (AUC reference; dense table gradients of "
                          f"{replicated_mib(plan.data):.0f} MiB a step)" if s == REFERENCE else "")
              for s in plan.systems]
    lines += [f"  {s}: {why}" for s, why in plan.skipped.items()]
    lines.append(f"results: {RESULTS / plan.name}.{{md,json,png}}")
    return "\n".join(lines)


def _run_ps(system: str, root: Path, plan: Plan, timeout: float, python: str) -> dict[str, Any]:
    """One chief + 2 workers + 2 ps cluster of ``tf-ps``, ``sx-ps`` or ``sx-hybrid``."""
    options = json.dumps(plan.options)
    argv = ([python, str(TF_PROGRAM), str(root), options] if system == "tf-ps"
            else [python, str(PROGRAM), system.removeprefix("sx-"), str(root), options])
    run = cluster.run_cluster(argv, cluster.cluster_spec(workers=2, ps=2), timeout,
                              servers_exit=system != "tf-ps", log_prefix=f"{system}_")
    result = run.result()
    result["peak_rss_mib"] = run.peak_rss_mib
    return result


def _run_mwms(root: Path, plan: Plan, timeout: float) -> dict[str, Any]:
    """Two processes of ``stratax launch`` running ``recsys_program.py mwms``."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    argv = [sys.executable, "-m", "stratax", "launch", "--nproc-per-node", "2", "--timeout",
            str(int(timeout)), str(PROGRAM), "mwms", str(root), json.dumps(plan.options)]
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout + 30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    found = {int(rank): json.loads(text) for rank, text in RESULT_LINE.findall(out)}
    if proc.returncode or sorted(found) != [0, 1]:
        raise RuntimeError(f"stratax launch exited {proc.returncode} with results from "
                           f"workers {sorted(found)}:\n{out[-3000:]}")
    result = found[0]
    result["peak_rss_mib"] = {f"worker{r}": round(found[r]["peak_rss_mib"], 1) for r in found}
    return result


def _run_one(root: Path, plan: Plan, timeout: float) -> dict[str, Any]:
    """``recsys_program.py one``: one process, no strategy; its peak RSS reaped by ``wait4``."""
    env = dict(os.environ)
    env.pop("TF_CONFIG", None)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    log_dir = Path(tempfile.mkdtemp(prefix="sx-one_"))
    with open(log_dir / "process0.log", "w") as log:
        proc = subprocess.Popen([sys.executable, str(PROGRAM), "one", str(root),
                                 json.dumps(plan.options)], env=env, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
    reaped = cluster.reap(proc.pid, time.monotonic() + timeout)
    if reaped is None:
        os.killpg(proc.pid, signal.SIGKILL)
        os.waitpid(proc.pid, 0)
        raise TimeoutError(f"sx-one (pid {proc.pid}) did not exit in time; see {log_dir}")
    proc.returncode = reaped[0]
    run = cluster.ClusterRun((log_dir / "process0.log").read_text(), {"chief0": reaped[0]},
                             {"process0": round(reaped[1], 1)}, log_dir)
    result = run.result()
    result["peak_rss_mib"] = run.peak_rss_mib
    return result


def run_system(system: str, root: Path, plan: Plan, timeout: float, python: str
               ) -> dict[str, Any]:
    """One repetition of ``system``, retried once (a free port may be taken in between)."""
    def once() -> dict[str, Any]:
        if system == "sx-mwms":
            return _run_mwms(root, plan, timeout)
        if system == REFERENCE:
            return _run_one(root, plan, timeout)
        return _run_ps(system, root, plan, timeout, python)

    try:
        return once()
    except (RuntimeError, TimeoutError, subprocess.TimeoutExpired) as err:
        print(f"{system} failed, running it again once: {str(err)[-400:]}", flush=True)
    return once()


def summarize_runs(runs: list[dict[str, Any]], systems: list[str]) -> list[dict[str, Any]]:
    """One row per system: medians (and ranges) over its successful repetitions, or its
    failure; ``ratio`` is its median examples/s over the baseline's."""
    rows = []
    for system in systems:
        mine = [r for r in runs if r["system"] == system]
        ok = [r for r in mine if "error" not in r]
        row: dict[str, Any] = {"system": system, "reps": len(ok)}
        if not ok:
            row["status"] = next((r["error"] for r in mine), "not run")
            rows.append(row)
            continue
        row["examples_per_s"] = summarize([r["examples_per_s"] for r in ok])
        row["auc"] = summarize([r["auc"] for r in ok])
        row["examples"] = ok[0]["examples"]
        row["train_loss"] = summarize([r["train_loss"] for r in ok])
        peaks: dict[str, list[float]] = {}
        for r in ok:
            for task, mib in r["peak_rss_mib"].items():
                peaks.setdefault(task, []).append(mib)
        row["peak_rss_mib"] = {task: summarize(v).median for task, v in peaks.items()}
        for key in ("ps_bytes_per_step", "allreduce_bytes_per_step", "exchange_bytes_per_step",
                    "exchange_bytes_per_worker_step", "exchange_s_per_step"):
            if key in ok[0]:
                row[key] = summarize([r[key] for r in ok]).median
        rows.append(row)
    base = next((r for r in rows if r["system"] == BASELINE and "examples_per_s" in r), None)
    for row in rows:
        if base and "examples_per_s" in row:
            row["ratio"] = row["examples_per_s"].median / base["examples_per_s"].median
            row["rep_ratios"] = paired(runs, row["system"], BASELINE, "examples_per_s")
    return rows


def paired(runs: list[dict[str, Any]], system: str, other: str, key: str,
           gap: bool = False) -> list[float]:
    """Per repetition that both ran: ``system``'s ``key`` over ``other``'s (``gap``: the
    absolute difference instead)."""
    theirs = {r["rep"]: r[key] for r in runs if r["system"] == other and "error" not in r}
    return [abs(r[key] - theirs[r["rep"]]) if gap else r[key] / theirs[r["rep"]]
            for r in runs if r["system"] == system and "error" not in r and r["rep"] in theirs]


def goals(rows: list[dict[str, Any]], runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Issue 38's goals for ``sx-hybrid``: each one's measured median value (ratios of
    medians; the AUC gap between medians), its per-repetition values, the goal and whether it
    is met; a goal whose systems did not both run says so."""
    done = {r["system"]: r for r in rows if "examples_per_s" in r}
    out = []
    for other, key, goal, what in (
            (BASELINE, "examples_per_s", GOAL_OVER_BASELINE, f"examples/s over {BASELINE}'s"),
            ("sx-ps", "examples_per_s", GOAL_OVER_PS, "examples/s over sx-ps's"),
            (REFERENCE, "auc", GOAL_AUC_GAP, f"held-out AUC gap to {REFERENCE}'s")):
        gap = key == "auc"
        entry: dict[str, Any] = {"goal": what, "target": goal, "gap": gap}
        if HYBRID not in done or other not in done:
            entry["missing"] = ", ".join(s for s in (HYBRID, other) if s not in done)
        else:
            mine, theirs = done[HYBRID][key].median, done[other][key].median
            entry["value"] = abs(mine - theirs) if gap else mine / theirs
            entry["reps"] = paired(runs, HYBRID, other, key, gap=gap)
            entry["met"] = entry["value"] <= goal if gap else entry["value"] >= goal
        out.append(entry)
    return out


def goals_text(entries: list[dict[str, Any]]) -> list[str]:
    """The goals as a markdown table."""
    lines = ["", f"Issue 38's goals for {HYBRID} (medians; per repetition in brackets):", "",
             "| goal | target | measured | per repetition | met |",
             "| --- | ---: | ---: | --- | --- |"]
    for e in entries:
        fmt = (lambda x: f"{x:.5f}") if e["gap"] else (lambda x: f"{x:.2f}x")
        target = f"<= {e['target']:.3f}" if e["gap"] else f">= {e['target']:.1f}x"
        if "missing" in e:
            lines.append(f"| {e['goal']} | {target} | not measured ({e['missing']} did not "
                         "run) | - | - |")
            continue
        lines.append(f"| {e['goal']} | {target} | {fmt(e['value'])} | "
                     f"[{', '.join(fmt(x) for x in e['reps'])}] | "
                     f"{'yes' if e['met'] else 'no'} |")
    return lines


def _bytes(row: dict[str, Any]) -> str:
    if "exchange_bytes_per_step" in row:
        seconds = row.get("exchange_s_per_step")
        return (f"{row['ps_bytes_per_step'] / 1e6:.2f} MB to and from the ps (ps counters: "
                f"rows) + {row['exchange_bytes_per_step'] / 1e6:.2f} MB exchanged among the "
                f"workers ({row['exchange_bytes_per_worker_step'] / 1e6:.2f} MB fetched per "
                "worker, computed)" + (f"; exchange {seconds * 1e3:.1f} ms per worker-step"
                                       if seconds is not None else ""))
    if "ps_bytes_per_step" in row:
        return f"{row['ps_bytes_per_step'] / 1e6:.2f} MB to and from the ps (ps counters)"
    if "allreduce_bytes_per_step" in row:
        return (f"{row['allreduce_bytes_per_step'] / 1e6:.2f} MB of gradients all-reduced "
                "(computed)")
    if row["system"] == REFERENCE:
        return "none (one process)"
    return "not measured (no counter)"


def table(rows: list[dict[str, Any]], skipped: dict[str, str], header: list[str],
          goal_lines: list[str] = ()) -> str:
    """The markdown table of ``rows`` under ``header``, then ``goal_lines``."""
    lines = [*header, "",
             "| system | examples/s median (min-max) | x tf-ps | held-out AUC median (min-max) "
             "| examples seen | final train loss | bytes per step | peak RSS MiB per task |",
             "| --- | ---: | ---: | ---: | ---: | ---: | --- | --- |"]
    for row in rows:
        name = row["system"] + (" (AUC reference)" if row["system"] == REFERENCE else "")
        if "examples_per_s" not in row:
            lines.append(f"| {name} | failed: {row['status'][-200:]} | - | - | - | - "
                         "| - | - |".replace("\n", " "))
            continue
        speed, auc = row["examples_per_s"], row["auc"]
        flag = " (!)" if speed.flagged else ""
        ratio = f"{row['ratio']:.2f}" if "ratio" in row else "-"
        peaks = ", ".join(f"{t} {m:.0f}" for t, m in row["peak_rss_mib"].items())
        lines.append(
            f"| {name} | {speed.median:,.0f} ({speed.min:,.0f}-{speed.max:,.0f}){flag} "
            f"| {ratio} | {auc.median:.4f} ({auc.min:.4f}-{auc.max:.4f}) | {row['examples']:,} "
            f"| {row['train_loss'].median:.4f} | {_bytes(row)} | {peaks} |")
    lines += [f"| {system} | {why} | - | - | - | - | - | - |" for system, why in skipped.items()]
    pairs = [f"{r['system']} {', '.join(f'{x:.2f}' for x in r['rep_ratios'])}"
              for r in rows if r.get("rep_ratios") and r["system"] != BASELINE]
    if pairs:
        lines += ["", f"examples/s over {BASELINE}'s in the same repetition: "
                  + "; ".join(pairs) + "."]
    lines += goal_lines
    return "\n".join(lines) + "\n"


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    """Two panels: examples/s and held-out AUC per system (bars: median, whiskers: range)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    done = [r for r in rows if "examples_per_s" in r]
    figure, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, key, label in ((axes[0], "examples_per_s", "examples/s (timed fit)"),
                           (axes[1], "auc", "held-out AUC")):
        values = [r[key] for r in done]
        names = [r["system"] for r in done]
        ax.bar(names, [v.median for v in values],
               yerr=[[v.median - v.min for v in values], [v.max - v.median for v in values]],
               capsize=4, color=[{BASELINE: "tab:gray", HYBRID: "tab:orange",
                                  REFERENCE: "tab:green"}.get(n, "tab:blue") for n in names])
        ax.set(ylabel=label, title=label)
        ax.tick_params(axis="x", labelrotation=20)
        ax.grid(axis="y", alpha=0.3)
    reference = next((r for r in done if r["system"] == REFERENCE), None)
    if reference is not None:
        axes[1].axhline(reference["auc"].median, color="tab:green", linestyle="--", linewidth=1,
                        label=f"{REFERENCE} (reference)")
        axes[1].legend(loc="lower right", fontsize=8)
    if done:
        low = min(r["auc"].min for r in done)
        axes[1].set_ylim(min(0.5, low - 0.02), max(r["auc"].max for r in done) + 0.02)
    figure.tight_layout()
    figure.savefig(path, dpi=90)
    plt.close(figure)


def write_report(runs: list[dict[str, Any]], plan: Plan, meta: dict[str, Any]) -> list[Path]:
    """Writes ``<name>.md`` (table), ``<name>.json`` (every repetition, machine, versions)
    and ``<name>.png`` under ``RESULTS``."""
    rows = summarize_runs(runs, list(plan.systems))
    loads = meta["loads"]
    header = [f"# DLRM-shaped recommender: TF ParameterServerStrategy vs stratax ({plan.size})",
              "", f"Command: `{meta['command']}`  ",
              f"{meta['finished']}; machine {meta['machine']['cpu_model']}, "
              f"{meta['machine']['cpu_count']} cores, {meta['machine']['mem_total_gib']} GiB; "
              f"1-min load average {min(loads):.1f}-{max(loads):.1f} before the repetitions "
              "(a machine shared with other work: compare the ratios of one run).  ",
              describe(plan).splitlines()[0] + ".  ",
              "Every system: the same data, model, initial weights (checksum "
              f"{meta['checksums']}), SGD and number of examples; clusters on 127.0.0.1 "
              "(PS and hybrid: chief + 2 workers + 2 ps; MWMS: 2 processes of `stratax "
              f"launch`; {REFERENCE}: one process, plain Keras, no strategy, the AUC "
              "reference). Peak RSS: `ru_maxrss` of every task (wait4; MWMS: each process's "
              "own). PS bytes per step: values the parameter servers sent (their counters: "
              "whole shards and row-sparse rows) times 2 for the gradients pushed back; in "
              "hybrid mode only the tables' rows cross to the ps, and each worker fetches every "
              "other worker's gradients of the replicated (non-table) variables each step "
              "(W(W-1) x their bytes in all, computed; the seconds from the coordinator's "
              "`exchange` timing). TF exposes no transport counter."]
    RESULTS.mkdir(parents=True, exist_ok=True)
    stem = RESULTS / plan.name
    written = [stem.with_suffix(".md"), stem.with_suffix(".json"), stem.with_suffix(".png")]
    written[0].write_text(table(rows, plan.skipped, header, goals_text(goals(rows, runs))))
    written[1].write_text(json.dumps({"meta": meta, "plan": dataclasses.asdict(plan),
                                      "runs": runs}, indent=1, default=str) + "\n")
    plot(rows, written[2])
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.workloads.recsys",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="quick size, 1 repetition")
    parser.add_argument("--size", choices=sorted(SIZES), help="data size (overrides --quick's)")
    parser.add_argument("--reps", type=int, default=None, help="default 3; quick 1")
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    parser.add_argument("--batch", type=int, default=512, help="global batch")
    parser.add_argument("--warm-steps", type=int, default=4)
    parser.add_argument("--spe", type=int, default=1, help="steps_per_execution")
    parser.add_argument("--replicated-limit-mib", type=float, default=64,
                        help="largest total of tables MWMS replicates")
    parser.add_argument("--timeout", type=float, default=900, help="per cluster, seconds")
    parser.add_argument("--name", default="", help="stem of the result files")
    parser.add_argument("--dry-run", action="store_true", help="print the plan, run nothing")
    args = parser.parse_args(argv)
    try:
        plan = make_plan(args)
    except ValueError as err:
        parser.error(str(err))
    print(describe(plan), flush=True)
    pythons = {s: sys.executable for s in plan.systems}
    if "tf-ps" in plan.systems:
        found = envs.tf_interpreter("cpu", install=not args.dry_run,
                                    say=lambda line: print(line, flush=True))
        pythons["tf-ps"] = found.python
        if found.python is None:
            print(f"tf-ps: not installed: {found.reason}", flush=True)
    if args.dry_run:
        return 0
    root = recsys_data.ensure(plan.data, CACHE_DIR / "recsys")
    runs, loads = [], []
    for rep in range(plan.reps):
        for system in plan.systems:
            if pythons[system] is None:
                if rep == 0:
                    runs.append({"system": system, "rep": rep, "error": "not installed"})
                continue
            loads.append(os.getloadavg()[0])
            start = time.perf_counter()
            try:
                result = run_system(system, root, plan, args.timeout, pythons[system])
            except (RuntimeError, TimeoutError, subprocess.TimeoutExpired) as err:
                result = {"system": system, "error": str(err).splitlines()[0][:300]}
            result.update(rep=rep, loadavg_before=loads[-1],
                          cluster_s=time.perf_counter() - start)
            runs.append(result)
            print(f"rep {rep} {system}: " + (f"{result['examples_per_s']:,.0f} examples/s, "
                  f"AUC {result['auc']:.4f}" if "error" not in result else result["error"]),
                  flush=True)
    meta = {"command": "python -m benchmarks.workloads.recsys "
                       + " ".join(sys.argv[1:] if argv is None else argv),
            "finished": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "machine": envs.machine_info(), "loads": loads or [os.getloadavg()[0]],
            "checksums": sorted({r["weights_checksum"] for r in runs if "weights_checksum" in r}),
            "versions": {s: envs.package_versions(p) for s, p in pythons.items() if p}}
    for path in write_report(runs, plan, meta):
        print("wrote", path)
    print((RESULTS / f"{plan.name}.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
