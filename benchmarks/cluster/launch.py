"""Start a chief + workers + ps cluster on 127.0.0.1 and reap every task with its peak memory.

Shared by the parameter-server benchmarks that report each task's peak RSS
(``ps_big_table``, ``recsys``): each task is a fresh process with its own TF_CONFIG and log
file, in its own session (so a deadline kills its whole group), reaped with ``wait4`` so the
kernel's ``ru_maxrss`` of every task comes back, servers that never exit (TensorFlow's)
included.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from benchmarks import REPO_ROOT


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """``count`` distinct TCP ports free on ``host`` now, reserved together: all are bound
    before any is released, so none repeats (ports taken one call at a time may). Another
    process may still take one before its task binds it."""
    socks: list[socket.socket] = []
    try:
        for _ in range(count):
            socks.append(socket.socket())
            socks[-1].bind((host, 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def cluster_spec(workers: int, ps: int) -> dict[str, list[str]]:
    """TF_CONFIG's ``cluster``: one chief, ``workers`` workers and ``ps`` ps on free ports."""
    ports = iter(free_ports(1 + workers + ps))
    return {job: [f"127.0.0.1:{next(ports)}" for _ in range(n)]
            for job, n in (("chief", 1), ("worker", workers), ("ps", ps))}


def reap(pid: int, deadline: float) -> tuple[int, float] | None:
    """``(exit status, peak RSS MiB)`` of child ``pid`` via ``wait4``; None past ``deadline``."""
    while time.monotonic() < deadline:
        done, status, usage = os.wait4(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status), usage.ru_maxrss / 1024
        time.sleep(0.05)
    return None


@dataclasses.dataclass
class ClusterRun:
    """What one cluster left: the chief's output, every task's exit code and peak RSS (MiB),
    keyed ``chief0``, ``worker0``, ..., ``ps1``, and the directory of the tasks' logs."""

    chief_output: str
    exit_codes: dict[str, int]
    peak_rss_mib: dict[str, float]
    log_dir: Path

    def result(self) -> dict:
        """The chief's last ``RESULT {json}`` line, parsed."""
        lines = [ln for ln in self.chief_output.splitlines() if ln.startswith("RESULT ")]
        if not lines:
            raise RuntimeError(f"the chief printed no result (exit {self.exit_codes['chief0']}; "
                               f"logs in {self.log_dir}):\n{self.chief_output[-3000:]}")
        return json.loads(lines[-1][len("RESULT "):])


def run_cluster(argv: Sequence[str], spec: Mapping[str, list[str]], timeout: float,
                env: Mapping[str, str] | None = None, servers_exit: bool = True,
                preexec: Mapping[str, Callable[[], None]] | None = None,
                log_prefix: str = "cluster_") -> ClusterRun:
    """Runs ``argv`` once per task of ``spec`` and waits for the chief.

    Args:
        argv: the command every task runs (its TF_CONFIG says which task it is).
        spec: TF_CONFIG's ``cluster`` (``cluster_spec`` makes one).
        timeout: seconds for the chief; past them every task is killed and ``TimeoutError``
            raised.
        env: the tasks' environment (default: this process's, without TF_CONFIG); the
            repository root is prepended to its PYTHONPATH.
        servers_exit: whether worker and ps tasks exit by themselves once the chief is done
            (stratax's do, within 60 s); when False (TensorFlow's servers), or when the chief
            failed, they are killed as soon as the chief has exited. Either way their peak RSS
            is reaped.
        preexec: per job name, a function run in the child before it starts (limits).
        log_prefix: prefix of the per-task log files in a fresh temporary directory.
    """
    base = {k: v for k, v in (os.environ if env is None else env).items() if k != "TF_CONFIG"}
    # Task programs run as scripts and import ``benchmarks``: put the repository on their path.
    base["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), base.get("PYTHONPATH")]))
    log_dir = Path(tempfile.mkdtemp(prefix=log_prefix))
    procs: dict[str, subprocess.Popen] = {}
    peaks: dict[str, float] = {}
    codes: dict[str, int] = {}
    try:
        for job, addresses in spec.items():
            for index in range(len(addresses)):
                name = f"{job}{index}"
                task_env = dict(base, PYTHONUNBUFFERED="1", TF_CONFIG=json.dumps(
                    {"cluster": dict(spec), "task": {"type": job, "index": index}}))
                with open(log_dir / f"{log_prefix}{name}.log", "w") as log:
                    procs[name] = subprocess.Popen(
                        list(argv), env=task_env, stdout=log, stderr=subprocess.STDOUT,
                        start_new_session=True, preexec_fn=(preexec or {}).get(job))
        deadline = time.monotonic() + timeout
        for name in ["chief0", *(n for n in procs if n != "chief0")]:
            if name != "chief0" and (not servers_exit or codes["chief0"]):
                os.killpg(procs[name].pid, signal.SIGKILL)
            reaped = reap(procs[name].pid, deadline if name == "chief0" else
                          min(deadline, time.monotonic() + 60))
            if reaped is None:
                raise TimeoutError(f"{name} (pid {procs[name].pid}) did not exit in time; see "
                                   f"{log_dir}/{log_prefix}{name}.log")
            procs[name].returncode = codes[name] = reaped[0]
            peaks[name] = round(reaped[1], 1)
    finally:
        for proc in procs.values():
            if proc.returncode is None:
                os.killpg(proc.pid, signal.SIGKILL)
                os.waitpid(proc.pid, 0)
                proc.returncode = -9
    return ClusterRun((log_dir / f"{log_prefix}chief0.log").read_text(), codes, peaks, log_dir)


def drop_page_cache() -> bool:
    """Empties the page cache where this process may (root), so the next reads come from the
    disk; returns whether it could."""
    os.sync()
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        return False
