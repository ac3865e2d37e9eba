"""Fixtures for the launcher tests: tiny child scripts, pid bookkeeping and cleanup.

Child scripts record their pid in ``<tmp_path>/<name>.pid``; the ``scripts`` fixture kills every
recorded pid (and its process group) after the test, so a failing test leaks no process.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]

# Prepended to every child script: helpers to record pids and wait for files.
CHILD_PRELUDE = '''
import json, os, signal, subprocess, sys, time
RANK = int(os.environ.get("STRATAX_PROCESS_ID", "-1"))
RESTART = int(os.environ.get("STRATAX_RESTART_COUNT", "-1"))
OUT = {out!r}

def spawn_sleeper():
    """A grandchild that sleeps; its command line names OUT so cleanup can find it."""
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", OUT])

def record_pid(name, pid=None):
    path = os.path.join(OUT, name + ".pid")
    with open(path + ".tmp", "w") as f:
        f.write(str(pid or os.getpid()))
    os.replace(path + ".tmp", path)

def wait_for(name, limit=20.0):
    deadline = time.time() + limit
    while not os.path.exists(os.path.join(OUT, name)):
        if time.time() > deadline:
            sys.exit("timed out waiting for " + name)
        time.sleep(0.02)
'''


def pid_alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


def wait_gone(pid: int, limit: float = 5.0) -> bool:
    """Waits up to ``limit`` s for ``pid`` to be gone; True if it is."""
    deadline = time.monotonic() + limit
    while pid_alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def _runs_from(pid: int, directory: Path) -> bool:
    """True when ``pid`` is alive and its command line names ``directory`` (ours, not reused)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return str(directory).encode() in f.read()
    except OSError:
        return False


class Scripts:
    """Writes child scripts into a temporary directory and reads what the children recorded."""

    def __init__(self, out: Path) -> None:
        self.out = out

    def write(self, name: str, body: str) -> str:
        path = self.out / name
        path.write_text(CHILD_PRELUDE.format(out=str(self.out)) + textwrap.dedent(body))
        return str(path)

    def pid(self, name: str, limit: float = 10.0) -> int:
        path = self.out / f"{name}.pid"
        deadline = time.monotonic() + limit
        while not path.exists():
            if time.monotonic() > deadline:
                raise AssertionError(f"{path} was never written")
            time.sleep(0.02)
        return int(path.read_text())

    alive = staticmethod(pid_alive)
    wait_gone = staticmethod(wait_gone)

    def recorded_pids(self) -> list[int]:
        return [int(p.read_text()) for p in self.out.glob("*.pid") if p.read_text().strip()]


@pytest.fixture
def scripts(tmp_path: Path) -> Iterator[Scripts]:
    helper = Scripts(tmp_path)
    yield helper
    for pid in helper.recorded_pids():
        if not _runs_from(pid, tmp_path):  # gone, or the pid was reused by another program
            continue
        for kill in (os.killpg, os.kill):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                kill(pid, signal.SIGKILL)


# Runs the launcher's __main__ without executing stratax/__init__.py, which imports Keras and
# JAX (~4 s on 2 cores) that the launcher never uses; one test keeps the real entry point.
_LIGHT_ENTRY = (
    "import sys, types; pkg = types.ModuleType('stratax'); pkg.__path__ = [{path!r}]; "
    "sys.modules['stratax'] = pkg; from stratax._src.launch.__main__ import main; "
    "sys.exit(main(sys.argv[1:]))"
)


@pytest.fixture
def run_cli(tmp_path: Path) -> Iterator[Callable[..., subprocess.Popen[str]]]:
    """Starts the launcher CLI with ARGS in its own process group; kills it after the test.

    ``run_cli(*args, real_entry_point=True)`` runs exactly ``python -m stratax._src.launch``.
    """
    started: list[subprocess.Popen[str]] = []

    def start(*args: str, real_entry_point: bool = False) -> subprocess.Popen[str]:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT),
                                                          env.get("PYTHONPATH")]))
        if real_entry_point:
            entry = ["-m", "stratax._src.launch"]
        else:
            entry = ["-c", _LIGHT_ENTRY.format(path=str(REPO_ROOT / "stratax"))]
        proc = subprocess.Popen(
            [sys.executable, *entry, *args], cwd=tmp_path, env=env,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
        )
        started.append(proc)
        return proc

    yield start
    for proc in started:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.fixture
def listening_socket() -> Iterator[socket.socket]:
    """A TCP socket listening on 127.0.0.1 at a free port (a stand-in coordinator)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    yield sock
    sock.close()
