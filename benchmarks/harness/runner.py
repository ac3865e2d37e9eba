"""Parent side: start the child process(es) of one repetition, time them out, collect results.

Each child runs in its own session (process group), with stdout and stderr in a log file.
The parent reaps children with ``os.wait4`` so that each child's own peak RSS
(``ru_maxrss``) is known, not the running maximum over all children.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from benchmarks import REPO_ROOT
from benchmarks.cluster.launch import free_ports
from benchmarks.harness.configs import SYSTEMS, WORKLOADS, Config, Device, Mode

logger = logging.getLogger(__name__)

# Environment variables the parent controls; inherited values are dropped first.
_CONTROLLED = ("XLA_FLAGS", "KERAS_BACKEND", "TF_CONFIG", "PYTHONPATH", "JAX_PLATFORMS",
               "TF_USE_LEGACY_KERAS")


@dataclasses.dataclass
class RepResult:
    """Outcome of one repetition: the chief's numbers, or a one-line failure reason."""

    ok: bool
    reason: str
    data: dict[str, Any]


def child_env(config: Config, device: Device, tf_config: str | None) -> dict[str, str]:
    """The environment of a child: inherited, minus controlled names, plus this system's."""
    system = SYSTEMS[config.system]
    # STRATAX_* settings of the caller's shell (device counts, dispatch window) would change
    # what a stratax row measures, so none is inherited.
    env = {k: v for k, v in os.environ.items()
           if k not in _CONTROLLED and not k.startswith("STRATAX_")}
    env["PYTHONPATH"] = str(REPO_ROOT)
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    env["KERAS_BACKEND"] = "tensorflow" if system.family == "tf" else "jax"
    if system.xla_devices:
        env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={system.xla_devices}"
    if device == "cpu" and system.family != "tf":
        env["JAX_PLATFORMS"] = "cpu"
    if system.legacy_keras:
        env["TF_USE_LEGACY_KERAS"] = "1"
    if system.prefetch is not None:
        env["STRATAX_PREFETCH_DEPTH"] = str(system.prefetch)
    if not system.resident_arrays:
        env["STRATAX_RESIDENT_ARRAY_BYTES"] = "0"
    if not system.sharded_update:
        env["STRATAX_SHARDED_UPDATE"] = "off"
    # Explicit even for gloo: unset means auto, which is shm for same-host single-device workers.
    env["STRATAX_CPU_COLLECTIVES"] = "shm" if system.transport == "shm" else "gloo"
    if tf_config is not None:
        env["TF_CONFIG"] = tf_config
    return env


def _tail(path: Path, lines: int = 3) -> str:
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    useful = [line for line in text if line.strip()]
    return " | ".join(useful[-lines:])[-300:]


def _kill(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)


def run_rep(config: Config, rep: int, mode: Mode, device: Device, python: str,
            data: tuple[Path, Path], work_dir: Path) -> RepResult:
    """Run repetition ``rep`` of ``config`` with interpreter ``python``; never raises on failure.

    Multi-process systems get a TF_CONFIG on free loopback ports; process i is pinned to core
    i when the system asks for pinning. The chief (task 0) supplies throughput and loss; peak
    RSS is the largest over the processes.
    """
    system, workload = SYSTEMS[config.system], WORKLOADS[config.workload]
    steps_per_epoch, timed = workload.steps(mode, config.spe)
    work_dir.mkdir(parents=True, exist_ok=True)
    n = system.processes
    tf_configs: list[str | None] = [None] * n
    if n > 1:  # MWMS reads TF_CONFIG; the PyTorch peer takes its rendezvous address from it
        workers = [f"127.0.0.1:{p}" for p in free_ports(n)]
        tf_configs = [json.dumps({"cluster": {"worker": workers},
                                  "task": {"type": "worker", "index": i}}) for i in range(n)]
    if system.transport == "mpi" and mpi_unavailable():
        return RepResult(False, mpi_unavailable(), {"status": "failed"})
    procs, logs, results, commands = [], [], [], []
    load_before = os.getloadavg()[0]  # other work on the machine shows up here
    for i in range(n):
        stem = f"{config.key}.rep{rep}.task{i}"
        result_path = work_dir / f"{stem}.result.json"
        spec: dict[str, Any] = {
            "system": config.system, "workload": config.workload, "spe": config.spe,
            "steps_per_epoch": steps_per_epoch, "timed_epochs": timed, "device": device,
            "x_path": str(data[0]), "y_path": str(data[1]), "task_index": i,
            "pin_core": i if system.pin else None, "result_path": str(result_path)}
        spec_path = work_dir / f"{stem}.spec.json"
        spec_path.write_text(json.dumps(spec, indent=1))
        result_path.unlink(missing_ok=True)
        log = work_dir / f"{stem}.log"
        command = [python, "-m", "benchmarks.harness.child", str(spec_path)]
        logs.append(log)
        results.append(result_path)
        if system.transport == "mpi":  # started together below, by one mpiexec
            commands.append(command)
            continue
        with open(log, "wb") as fh:
            procs.append(subprocess.Popen(
                command, cwd=REPO_ROOT, env=child_env(config, device, tf_configs[i]), stdout=fh,
                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True))
    if commands:
        procs.append(_start_mpi(commands, tf_configs, child_env(config, device, None), logs[0]))
        logs = [logs[0]] * n
    status = _wait_all([p.pid for p in procs], workload.timeout_s[mode])
    for p, (code, _, _) in zip(procs, status, strict=True):
        p.returncode = code  # reaped by os.wait4 already
    if commands:  # one mpiexec for every task: its status (and the largest RSS) for each
        status = status * n
    got = _collect(status, logs, results, workload.timeout_s[mode])
    got.data["loadavg_before"] = load_before
    return got


def mpi_unavailable() -> str:
    """Why MPI rows cannot run here ("" when they can)."""
    if shutil.which("mpiexec") is None:
        return "not installed: mpiexec (an MPI, e.g. apt-get install mpich; docs/transport.md)"
    if not os.environ.get("MPITRAMPOLINE_LIB"):
        return "not installed: MPITRAMPOLINE_LIB unset (MPIwrapper; docs/transport.md)"
    return ""


def _start_mpi(commands: list[list[str]], tf_configs: list[str | None], env: dict[str, str],
               log: Path) -> subprocess.Popen[bytes]:
    """One ``mpiexec`` running task i's command as MPI rank i (= JAX process i), MPMD style."""
    line = ["mpiexec"]
    for i, command in enumerate(commands):
        line += ([":"] if i else []) + ["-n", "1", "-env", "TF_CONFIG", str(tf_configs[i]),
                                         *command]
    env = {**env, "STRATAX_CPU_COLLECTIVES": "mpi"}
    with open(log, "wb") as fh:
        return subprocess.Popen(line, cwd=REPO_ROOT, env=env, stdout=fh,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)


_Reaped = tuple[int | None, float, float]  # exit code (None: killed at deadline), MiB, CPU s


def _wait_all(pids: list[int], timeout_s: float) -> list[_Reaped]:
    """Reap every pid; kill all process groups at the deadline or 60 s after a failure.

    Returns (exit code or None if killed at the deadline, peak RSS MiB, user+system CPU s)
    per pid.
    """
    deadline = time.monotonic() + timeout_s
    done: dict[int, _Reaped] = {}
    while len(done) < len(pids):
        for pid in pids:
            if pid in done:
                continue
            got, status, usage = os.wait4(pid, os.WNOHANG)
            if got:
                done[pid] = (os.waitstatus_to_exitcode(status), usage.ru_maxrss / 1024,
                             usage.ru_utime + usage.ru_stime)
                if done[pid][0] != 0:  # a dead peer: the others would wait on it
                    deadline = min(deadline, time.monotonic() + 60)
        if len(done) < len(pids) and time.monotonic() > deadline:
            _kill([p for p in pids if p not in done])
            for pid in pids:
                if pid not in done:
                    _, status, usage = os.wait4(pid, 0)
                    done[pid] = (None, usage.ru_maxrss / 1024, usage.ru_utime + usage.ru_stime)
        time.sleep(0.05)
    _kill(pids)  # leftovers of the groups (e.g. helper processes), if any
    return [done[p] for p in pids]


def _collect(status: list[_Reaped], logs: list[Path], results: list[Path],
             timeout_s: float) -> RepResult:
    rss = max(r for _, r, _ in status)
    per_task: list[dict[str, Any]] = []
    rows = zip(status, logs, results, strict=True)
    for i, ((code, task_rss, cpu_s), log, res) in enumerate(rows):
        if res.exists():
            data = json.loads(res.read_text())
        elif code is None:
            data = {"status": "failed", "reason": f"timed out after {timeout_s:.0f} s "
                    f"(task {i}; last output: {_tail(log, 1) or 'none'})"}
        else:
            why = f"signal {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
            data = {"status": "failed", "reason": f"task {i} died with {why}: {_tail(log)}"}
        data["peak_rss_mib"] = task_rss
        data["cpu_s"] = cpu_s
        data["log"] = str(log)
        per_task.append(data)
    failed = [d for d in per_task if d.get("status") != "ok"]
    chief = dict(per_task[0])
    chief["peak_rss_mib"] = rss
    chief["tasks"] = per_task if len(per_task) > 1 else None
    if failed:
        return RepResult(False, failed[0].get("reason", "unknown failure"), chief)
    return RepResult(True, "", chief)
