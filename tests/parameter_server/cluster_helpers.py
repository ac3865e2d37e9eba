"""Real parameter-server clusters on 127.0.0.1: one process per task, killed by process group.

A helper module, not a conftest: test files import ``cluster`` (the fixture) from here, so no
second ``conftest`` module competes with ``tests/multiprocess``' ``from conftest import ...``.
"""

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from stratax._src.launch.network import reserve_free_ports

PROGRAMS = Path(__file__).parent / "programs"  # the programs the tasks run


def cluster_addresses(jobs: dict[str, int]) -> dict[str, list[str]]:
    """A cluster spec on 127.0.0.1 whose ports were reserved together, so no two tasks get
    the same one (ports taken one call at a time may repeat)."""
    ports = iter(reserve_free_ports(sum(jobs.values())))
    return {job: [f"127.0.0.1:{next(ports)}" for _ in range(n)] for job, n in jobs.items()}


class Cluster:
    """Starts ``program`` once per task with its TF_CONFIG; logs go to ``log_dir``."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.procs: dict[str, subprocess.Popen] = {}
        self._commands: dict[str, tuple[list[str], dict[str, str]]] = {}
        self._logs = []

    def start(self, program: str, jobs: dict[str, int], args=(), skip=(), generic=(), env=None,
              clusters=None):
        """Starts every task but those in ``skip``; tasks named in ``generic`` (e.g.
        ``"ps0"``) run ``stratax server`` instead of the program; ``env`` is added to every
        task's environment; ``clusters`` maps a task name to ``f(spec) -> cluster`` for a task
        given another TF_CONFIG cluster than the others."""
        spec = cluster_addresses(jobs)
        base = {k: v for k, v in os.environ.items()
                if not k.startswith("STRATAX_") and k not in ("TF_CONFIG", "PYTEST_CURRENT_TEST")}
        for job, addresses in spec.items():
            for index in range(len(addresses)):
                name = f"{job}{index}"
                if name in skip:
                    continue
                cluster = (clusters or {}).get(name, lambda spec: spec)(spec)
                task_env = dict(base, **(env or {}), PYTHONUNBUFFERED="1", TF_CONFIG=json.dumps(
                    {"cluster": cluster, "task": {"type": job, "index": index}}))
                command = ([sys.executable, "-m", "stratax._src.cli", "server"] if name in generic
                           else [sys.executable, str(PROGRAMS / program), *args])
                self._commands[name] = (command, task_env)
                self._launch(name)
        return spec

    def _launch(self, name: str) -> None:
        command, env = self._commands[name]
        log = open(self.log_dir / f"{name}.log", "a")  # noqa: SIM115 - closed in kill_all
        self._logs.append(log)
        self.procs[name] = subprocess.Popen(command, cwd=PROGRAMS, env=env, stdout=log,
                                            stderr=subprocess.STDOUT, start_new_session=True)

    def kill(self, name: str) -> None:
        """SIGKILLs task ``name``'s process group and reaps it."""
        os.killpg(self.procs[name].pid, signal.SIGKILL)
        self.procs[name].wait(timeout=10)

    def kill_on(self, marker: str, name: str, timeout: float = 200) -> None:
        """SIGKILLs task ``name`` once the chief has printed ``marker``."""
        deadline = time.monotonic() + timeout
        while marker not in self.output("chief0"):
            assert time.monotonic() < deadline and self.procs["chief0"].poll() is None, \
                self.output("chief0")[-3000:]
            time.sleep(0.05)
        self.kill(name)

    def restart(self, name: str, args=None, as_name=None) -> None:
        """Starts task ``name`` again with the same command and TF_CONFIG (with ``args`` for
        the program's arguments, if given; as another process named ``as_name``, if given)."""
        command, env = self._commands[name]
        if args is not None:
            command = [*command[:2], *args]
        self._commands[as_name or name] = (command, env)
        self._launch(as_name or name)

    def wait(self, name: str, timeout: float) -> tuple[int, str]:
        """Waits for task ``name`` (e.g. ``"chief0"``); returns its exit code and output."""
        code = self.procs[name].wait(timeout=timeout)
        return code, self.output(name)

    def output(self, name: str) -> str:
        return (self.log_dir / f"{name}.log").read_text()

    def result(self, name: str = "chief0") -> dict:
        lines = [line for line in self.output(name).splitlines() if line.startswith("RESULT ")]
        assert lines, self.output(name)[-3000:]
        return json.loads(lines[-1][len("RESULT "):])

    def kill_all(self):
        for proc in self.procs.values():
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        for log in self._logs:
            log.close()


@pytest.fixture
def cluster(tmp_path):
    group = Cluster(tmp_path)
    yield group
    group.kill_all()


def wait_all(cluster: Cluster, timeout: float) -> dict[str, int]:
    deadline = time.monotonic() + timeout
    return {name: proc.wait(timeout=max(deadline - time.monotonic(), 0.1))
            for name, proc in cluster.procs.items()}


@contextlib.contextmanager
def local_servers(ps: int = 2, workers: int = 1):
    """A cluster of ``workers`` workers and ``ps`` ps served by threads of this process
    (``sx.Server``); yields a function that builds a chief strategy on it (each shut down at
    the end, before the servers)."""
    import stratax as sx

    spec = cluster_addresses({"chief": 1, "worker": workers, "ps": ps})
    servers = [sx.Server(spec, job_name=job, task_index=i, timeout_seconds=20)
               for job in ("ps", "worker") for i in range(len(spec[job]))]
    strategies = []

    def make(**kwargs):
        resolver = sx.cluster_resolver.SimpleClusterResolver(spec, task_type="chief", task_id=0)
        strategies.append(sx.ParameterServerStrategy(resolver, timeout_seconds=20, **kwargs))
        return strategies[-1]

    try:
        yield make
    finally:
        for strategy in reversed(strategies):
            strategy.shutdown()
        for server in servers:
            server.stop()


@pytest.fixture
def local_cluster():
    """A cluster of 1 worker and 2 ps served by threads of this process (``local_servers``),
    for strategy API tests that need real servers but no process of their own."""
    with local_servers() as make:
        yield make
