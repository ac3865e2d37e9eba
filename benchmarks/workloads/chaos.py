"""Chaos trials: kill or freeze a random role at a random step, then check that nothing was lost.

    python -m benchmarks.workloads.chaos --trials 50                  # every mode, 50 trials each
    python -m benchmarks.workloads.chaos --mode ps-sync --trials 5 --seed 3
    python -m benchmarks.workloads.chaos --dry-run --trials 4         # print the plan, run nothing

Each trial is one ``stratax launch`` of ``chaos_program.py`` (``fit`` with
``sx.BackupAndRestore`` every 4 steps, Adam, 48 steps) with ``--max-restarts 3`` (``elastic``:
1):

* ``mwms``: 2 MultiWorkerMirrored workers; the launcher restarts the group after a failure and
  the backup resumes it.
* ``elastic``: ``mwms`` launched with ``--nproc-per-node 1:2 --max-restarts 1``: a worker
  removed for good, then one added back. After the fault, the struck worker is killed again at
  every start of two workers until the launcher drops its slot; the one left resumes the
  backup alone, and is killed after a step; at that restart the dropped slot rejoins, and
  two workers resume the backup and finish.
* ``ps-sync`` / ``ps-async`` / ``hybrid`` (``dense_variables="workers"``, synchronous tables,
  a model with an ``Embedding``): chief + 2 workers + 1 ps; a failed worker or ps is restarted
  alone (the ps reloads its snapshot, written every ``SNAPSHOT_EVERY`` updates), a failed chief
  restarts the whole group, which resumes from the backup.
* ``ps-table``: ``ps-sync`` with the ``Embedding``'s table and its Adam slots built by the
  servers (never on the chief), so the backup holds them as the servers' sharded checkpoint.

The fault strikes the victim (a random role) when the chief's step counter reaches a random
step: ``kill`` is SIGKILL, ``freeze`` is SIGSTOP for 1.5 x the strategy's timeout, then SIGCONT.
After the launch ends the trial checks: the fault struck (a trial it never hit fails); the
run completed; no step lost or applied twice, from every parameter-server shard's ledger of
applied step ids and its update count (``judge``; MultiWorkerMirrored, which has no ledger,
from ``optimizer.iterations`` and the weights); the final weights against an uninterrupted run
where the mode promises equality (every mode but ``ps-async``, whose check is the ledger), in
hybrid mode the replicated dense variables' own; no process of the trial left and every port of
every group it started (restarted ones too) free. The exit status is 1 unless every trial
passed. Writes ``benchmarks/results/chaos.{json,md}``.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import CLUSTER_DIR, RESULTS_DIR
from benchmarks.harness.report import run_meta, write_table

RESULTS = RESULTS_DIR
PROGRAM = CLUSTER_DIR / "chaos_program.py"
MODES = ("mwms", "elastic", "ps-sync", "ps-async", "hybrid", "ps-table")
ROLES = {"mwms": ("worker0", "worker1"),
         "elastic": ("worker0", "worker1"),
         "ps-sync": ("chief0", "worker0", "worker1", "ps0"),
         "ps-async": ("chief0", "worker0", "worker1", "ps0"),
         "hybrid": ("chief0", "worker0", "worker1", "ps0"),
         "ps-table": ("chief0", "worker0", "worker1", "ps0")}
ACTIONS = ("kill", "freeze")
EXPECTED_STEPS = 48            # chaos_program: 4 epochs x 12 steps
TIMEOUT_SECONDS = 10.0         # chaos_program's timeout_seconds
SNAPSHOT_EVERY = 5             # ps snapshot every N updates
WEIGHTS_EQUAL = 1e-5           # the promise of every mode but ps-async: the uninterrupted run's
TRIAL_LIMIT_S = 420.0
TAG = "STRATAX_CHAOS_TRIAL"    # marks every process of a trial (inherited by the launch's tasks)


@dataclass
class Trial:
    mode: str
    role: str | None           # None: the uninterrupted reference run
    action: str | None
    at_step: int
    struck_at_step: int | None = None
    exit_code: int | None = None
    completed: bool = False
    iterations: int | None = None
    resumed_at: int | None = None        # the step the final run (after restarts) began at
    lost_updates: int | None = None      # steps of the run missing from a shard's ledger
    extra_updates: int | None = None     # ledger entries (or updates) that are no step of it
    skipped_resends: int | None = None   # re-sent steps the servers recognized and skipped
    weights_diff: float | None = None
    dense_weights_diff: float | None = None  # hybrid: the variables replicated on the workers
    leftover_processes: list[str] = field(default_factory=list)
    ports_in_use: list[int] = field(default_factory=list)
    restarts: int | None = None
    regrown: bool | None = None          # elastic: a slot was dropped, rejoined, 2 finished
    follow_ups: int = 0                  # elastic: strikes after the first (see _follow_up)
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)
    run_dir: str = ""                    # the trial's program output (weights, result, logs)

    @property
    def struck(self) -> bool:
        """The fault hit (always true of the uninterrupted reference run): a trial whose
        fault never struck tested nothing, and fails."""
        return self.role is None or (self.struck_at_step is not None and (
            self.mode != "elastic" or self.follow_ups >= 2))

    @property
    def nothing_lost(self) -> bool:
        """Every step applied once (the ledgers), the uninterrupted run's weights where the
        mode promises them, nothing left running, and the fault struck."""
        equal_promised = self.mode != "ps-async"
        return (self.struck and self.completed and self.lost_updates == 0
                and self.extra_updates == 0 and self.iterations == EXPECTED_STEPS
                and (not equal_promised or (self.weights_diff is not None
                                            and self.weights_diff <= WEIGHTS_EQUAL))
                and (self.mode != "hybrid" or (self.dense_weights_diff is not None
                                               and self.dense_weights_diff <= WEIGHTS_EQUAL))
                and (self.mode != "elastic" or self.role is None or bool(self.regrown))
                and not self.leftover_processes and not self.ports_in_use)


def plan(modes: list[str], trials: int, seed: int) -> list[Trial]:
    """``trials`` random (role, action, step) faults per mode, reproducible from ``seed``; an
    elastic fault strikes by step 30, so that the worker left alone has steps to be struck at."""
    rng = random.Random(seed)
    return [Trial(mode, rng.choice(ROLES[mode]), rng.choice(ACTIONS),
                  rng.randint(2, EXPECTED_STEPS - (18 if mode == "elastic" else 6)))
            for mode in modes for _ in range(trials)]


def _launch_command(mode: str, out_dir: Path) -> list[str]:
    shape = {"mwms": ["--nproc-per-node", "2", "--max-restarts", "3"],
             "elastic": ["--nproc-per-node", "1:2", "--max-restarts", "1"]}.get(
        mode, ["--workers", "2", "--ps", "1", "--max-restarts", "3"])
    return [sys.executable, "-m", "stratax", "launch", *shape,
            "--timeout", str(int(TRIAL_LIMIT_S - 20)), str(PROGRAM), mode, str(out_dir)]


def _environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    pairs = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, v in pairs}


def _parent(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def _tagged(tag: str) -> dict[int, dict[str, str]]:
    """Every live process carrying ``tag`` (the launcher, its tasks and their children)."""
    found = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            env = _environ(int(entry))
            if env.get(TAG) == tag:
                found[int(entry)] = env
    return found


def _role(env: dict[str, str]) -> str | None:
    task = json.loads(env.get("TF_CONFIG") or "{}").get("task") or {}
    if task.get("type") in ("chief", "worker", "ps") and "STRATAX_PS_ROLES" in env:
        return f"{task['type']}{task.get('index', 0)}"
    rank = env.get("STRATAX_PROCESS_ID")
    return None if rank is None else f"worker{rank}"


def _tasks(tag: str, launcher: int) -> dict[str, tuple[int, dict[str, str]]]:
    """The launch's tasks (its direct children) by role."""
    return {role: (pid, env) for pid, env in _tagged(tag).items()
            if _parent(pid) == launcher and (role := _role(env)) is not None}


def _cluster_ports(env: dict[str, str]) -> list[int]:
    cluster = json.loads(env.get("TF_CONFIG") or "{}").get("cluster") or {}
    return sorted(int(address.rsplit(":", 1)[1])
                  for addresses in cluster.values() for address in addresses)


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _progress(out_dir: Path) -> int:
    try:
        return int((out_dir / "progress").read_text() or 0)
    except (OSError, ValueError):
        return 0


def _follow_up(trial: Trial, tasks: dict[str, tuple[int, dict[str, str]]], struck: set[int],
               out_dir: Path, alone: dict[str, float]) -> None:
    """An elastic trial after its first fault: the struck role is killed at every new start of
    two workers until its slot is dropped (the launcher gives each slot one restart), then the
    worker left alone is killed once it has trained a step of its own (a lone worker's steps
    are fast: waiting for more can miss the end of the run); at that restart the dropped slot
    rejoins. ``trial.follow_ups`` is 1 once a lone worker ran, 2 once it was struck; ``alone``
    holds when the lone worker was seen."""
    def of_group(size: int) -> dict[str, int]:  # the live, unstruck tasks of a start of size
        return {role: pid for role, (pid, env) in tasks.items()
                if pid not in struck and env.get("STRATAX_NUM_PROCESSES") == str(size)}

    lone, victim = list(of_group(1).values()), of_group(2).get(trial.role or "")
    if trial.follow_ups == 0 and victim is not None:
        struck.add(victim)
        os.kill(victim, signal.SIGKILL)
    elif trial.follow_ups == 0 and lone:
        trial.follow_ups = 1
        alone["since"] = time.time()
    elif trial.follow_ups == 1 and lone:
        try:
            written = (out_dir / "progress").stat().st_mtime > alone["since"]
        except OSError:
            written = False
        if written:
            struck.add(lone[0])
            os.kill(lone[0], signal.SIGKILL)
            trial.follow_ups = 2


def _strike(trial: Trial, pid: int) -> None:
    if trial.action == "kill":
        os.kill(pid, signal.SIGKILL)
        return
    os.kill(pid, signal.SIGSTOP)
    try:
        time.sleep(1.5 * TIMEOUT_SECONDS)
    finally:
        with contextlib.suppress(ProcessLookupError):   # the launcher tore it down meanwhile
            os.kill(pid, signal.SIGCONT)


def run_trial(trial: Trial, work_dir: Path, reference: dict[str, np.ndarray] | None) -> Trial:
    """Runs one launch, strikes, waits, checks; fills in ``trial`` and returns it."""
    out_dir = work_dir / f"{trial.mode}-{trial.role}-{trial.action}-{time.monotonic_ns()}"
    out_dir.mkdir(parents=True)
    trial.run_dir = str(out_dir)
    tag = out_dir.name
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    env.update({TAG: tag, "STRATAX_PS_SNAPSHOT_DIR": str(out_dir / "snapshots"),
                "STRATAX_PS_SNAPSHOT_EVERY": str(SNAPSHOT_EVERY)})
    started = time.monotonic()
    ports: set[int] = set()      # every port of every group the launch started, restarts too
    struck: set[int] = set()     # pids struck
    alone: dict[str, float] = {}  # elastic: see _follow_up
    with open(out_dir / "launch.log", "w") as log:
        launcher = subprocess.Popen(_launch_command(trial.mode, out_dir), env=env, stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        try:
            while launcher.poll() is None and time.monotonic() - started < TRIAL_LIMIT_S:
                tasks = _tasks(tag, launcher.pid)
                for _, task_env in tasks.values():
                    ports.update(_cluster_ports(task_env))
                if (trial.role is not None and trial.struck_at_step is None
                        and _progress(out_dir) >= trial.at_step and trial.role in tasks):
                    trial.struck_at_step = _progress(out_dir)
                    struck.add(tasks[trial.role][0])
                    _strike(trial, tasks[trial.role][0])
                elif trial.mode == "elastic" and trial.struck_at_step is not None:
                    _follow_up(trial, tasks, struck, out_dir, alone)
                time.sleep(0.02)
            trial.exit_code = launcher.wait(timeout=max(1.0, TRIAL_LIMIT_S
                                                        - (time.monotonic() - started)))
        except subprocess.TimeoutExpired:
            trial.notes.append(f"hung: the launch did not end within {TRIAL_LIMIT_S:.0f} s")
            os.killpg(launcher.pid, signal.SIGKILL)
            launcher.wait()
    trial.seconds = time.monotonic() - started
    if not trial.struck:
        trial.notes.append(f"not struck (a failed trial): the run ended at step "
                           f"{_progress(out_dir)}")
    time.sleep(0.5)
    leftovers = _tagged(tag)
    trial.leftover_processes = [f"{_role(env) or 'process'} (pid {pid})"
                                for pid, env in leftovers.items()]
    for pid in leftovers:               # clean up what the trial left, by process id
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    trial.ports_in_use = [port for port in sorted(ports) if not _port_free(port)]
    _check(trial, out_dir, reference)
    return trial


def _check(trial: Trial, out_dir: Path, reference: dict[str, np.ndarray] | None) -> None:
    result_file = out_dir / "result.json"
    trial.completed = trial.exit_code == 0 and result_file.exists()
    if not trial.completed:
        tail = (out_dir / "launch.log").read_text(errors="replace").splitlines()[-3:]
        trial.notes.append("failed: " + " | ".join(line.strip() for line in tail))
        return
    judge(trial, json.loads(result_file.read_text()))
    if trial.mode == "elastic":
        restarts = [line for line in (out_dir / "launch.log").read_text(errors="replace")
                    .splitlines() if "restarting the group" in line]
        # The last restart took the dropped slot back: the run ended on two workers.
        trial.regrown = (any("is dropped" in line for line in restarts)
                         and "rejoin: the group restarts with 2 worker(s)" in restarts[-1])
    if reference is not None:
        with np.load(out_dir / "weights.npz") as weights:
            diffs = {k: float(np.abs(weights[k] - reference[k]).max()) for k in reference}
        trial.weights_diff = max(diffs.values())
        if trial.mode == "hybrid":
            trial.dense_weights_diff = max(d for k, d in diffs.items() if "embedding" not in k)


def expected_ledger(steps: int) -> set[str]:
    """The step ids of a run that trains ``steps`` steps: one closure per step, numbered from
    0 by the chief that scheduled them (``c<closure>:<step in it>``)."""
    return {f"c{k}:0" for k in range(steps)}


def judge(trial: Trial, result: dict[str, Any]) -> None:
    """Fills in the trial's counts from the chief's ``result.json``. The final run (after any
    restart of the group) trained the steps from ``resumed_at`` on: every shard's ledger must
    hold each of them once and nothing else, and its optimizer must have counted one update
    per entry on top of the ``resumed_at`` the backup restored. A step applied twice shows as
    an id that is no step of the run (or an update outside the ledger), a lost one as a
    missing id, each on its own shard, so one cannot hide the other. MultiWorkerMirrored has no
    ledger: its count is ``optimizer.iterations`` and its check the uninterrupted weights."""
    trial.iterations, trial.restarts = result["iterations"], result["restart"]
    trial.resumed_at = result.get("resumed_at")
    shards = result.get("shards")
    if shards is None:                   # mwms
        trial.lost_updates = max(0, EXPECTED_STEPS - trial.iterations)
        trial.extra_updates = max(0, trial.iterations - EXPECTED_STEPS)
        return
    steps = expected_ledger(EXPECTED_STEPS - trial.resumed_at)
    lost, extra = [], []
    for shard in shards:
        outside = shard["iterations"] - trial.resumed_at          # updates in the final run
        if shard["ledger"] is None:      # hybrid's dense variables: counted, weights checked
            lost.append(max(0, len(steps) - outside))
            extra.append(max(0, outside - len(steps)))
            continue
        ledger = shard["ledger"]
        unledgered = outside - len(ledger)
        lost.append(len(steps - set(ledger)) + max(0, -unledgered))
        extra.append(len(set(ledger) - steps) + (len(ledger) - len(set(ledger)))
                     + max(0, unledgered))
    trial.lost_updates, trial.extra_updates = max(lost), max(extra)
    trial.skipped_resends = sum(shard["duplicates"] for shard in shards)


def reference_weights(mode: str, work_dir: Path) -> dict[str, np.ndarray]:
    """The uninterrupted run's final weights (a trial without a fault)."""
    trial = run_trial(Trial(mode, None, None, 0), work_dir, None)
    if not trial.completed or trial.lost_updates or trial.extra_updates:
        raise RuntimeError(f"the uninterrupted {mode} run failed: {trial}")
    with np.load(Path(trial.run_dir) / "weights.npz") as weights:
        return {k: weights[k].copy() for k in weights.files}


def summarize(trials: list[Trial]) -> list[dict[str, Any]]:
    """One row per (mode, role, action): counts, the worst loss, the slowest recovery."""
    groups: dict[tuple[str, str, str], list[Trial]] = collections.defaultdict(list)
    for t in trials:
        groups[(t.mode, t.role or "-", t.action or "-")].append(t)
    rows = []
    for (mode, role, action), group in sorted(groups.items()):
        lost = [t.lost_updates for t in group if t.lost_updates is not None]
        diffs = [t.weights_diff for t in group if t.weights_diff is not None]
        rows.append({"mode": mode, "role": role, "action": action, "trials": len(group),
                     "completed": sum(t.completed for t in group),
                     "nothing_lost": sum(t.nothing_lost for t in group),
                     "max_lost_updates": max(lost, default=None),
                     "max_weights_diff": max(diffs, default=None),
                     "leftovers": sum(bool(t.leftover_processes or t.ports_in_use)
                                      for t in group),
                     "median_s": statistics.median(t.seconds for t in group)})
    return rows


def markdown(rows: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    lines = [f"# Chaos trials ({meta['date']}, {meta['machine']}, load {meta['load']})", "",
             f"`{meta['command']}`", "",
             "| mode | role | fault | trials | completed | nothing lost | most updates lost | "
             "largest weight diff | processes/ports left | median s |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        diff = "-" if r["max_weights_diff"] is None else f"{r['max_weights_diff']:.1e}"
        lost = "-" if r["max_lost_updates"] is None else str(r["max_lost_updates"])
        lines.append(f"| {r['mode']} | {r['role']} | {r['action']} | {r['trials']} | "
                     f"{r['completed']} | {r['nothing_lost']} | {lost} | {diff} | "
                     f"{r['leftovers']} | {r['median_s']:.0f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=MODES, action="append",
                        help="a mode to run (repeatable); default: all")
    parser.add_argument("--trials", type=int, default=50, help="trials per mode")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dry-run", action="store_true")
    parser.add_argument("--results", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    modes = args.mode or list(MODES)
    trials = plan(modes, args.trials, args.seed)
    if args.dry_run:
        for t in trials:
            print(f"{t.mode}: {t.action} {t.role} at step {t.at_step}")
        return 0
    done: list[Trial] = []
    with tempfile.TemporaryDirectory(prefix="stratax-chaos-") as work:
        for mode in modes:
            reference = None if mode == "ps-async" else reference_weights(mode, Path(work))
            for t in (t for t in trials if t.mode == mode):
                run_trial(t, Path(work), reference)
                done.append(t)
                print(f"{t.mode} {t.action} {t.role} at {t.struck_at_step}: "
                      f"{'passed' if passed(t) else 'LOST/FAILED'} "
                      f"iterations={t.iterations} lost={t.lost_updates} "
                      f"diff={t.weights_diff} {t.seconds:.0f}s {'; '.join(t.notes)}",
                      flush=True)
    meta = run_meta("workloads.chaos", argv)
    rows = summarize(done)
    write_table(args.results, "chaos", markdown(rows, meta).splitlines(),
                {"meta": meta, "summary": rows, "trials": [asdict(t) for t in done]})
    return verdict(done)


def passed(trial: Trial) -> bool:
    """The trial kept the mode's promise: nothing lost, or only what the docs allow."""
    return trial.nothing_lost or _documented_loss(trial)


def verdict(trials: list[Trial]) -> int:
    """The exit status of a chaos run: 0 when every trial passed, else 1 (a trial that was
    not struck fails too: it tested nothing)."""
    return 0 if trials and all(passed(t) for t in trials) else 1


def _documented_loss(trial: Trial) -> bool:
    """A ps restarted from its snapshot loses at most the updates after it (asynchronous mode;
    in synchronous modes, hybrid included, the run resumes from its backup instead): steps
    missing from its ledger, none applied twice. (``optimizer.iterations`` reads the servers'
    count, so it is short by as many.)"""
    return (trial.mode == "ps-async" and trial.role == "ps0" and trial.struck
            and trial.completed and trial.lost_updates is not None
            and 0 < trial.lost_updates <= SNAPSHOT_EVERY and trial.extra_updates == 0
            and not trial.leftover_processes and not trial.ports_in_use)


if __name__ == "__main__":
    sys.exit(main())
