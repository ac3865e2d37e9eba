"""Kills a writing process at the moment it has a partial file on disk (for leftover tests)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path


def kill_while_writing(program: str, directory: Path, prefix: str, tries: int = 20,
                       seconds: float = 30.0) -> list[str]:
    """Runs ``python -c program directory`` (it prints ``first`` once it has written one
    complete file, then keeps writing) and SIGKILLs its process group as soon as a file whose
    name starts with ``prefix`` exists in ``directory``; retries until such a file outlives the
    kill. Returns the names of those leftovers (empty when no kill landed in ``tries``)."""
    for _ in range(tries):
        proc = subprocess.Popen([sys.executable, "-c", program, str(directory)],
                                stdout=subprocess.PIPE, text=True, start_new_session=True)
        try:
            assert proc.stdout.readline().strip() == "first"
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                if any(p.name.startswith(prefix) for p in directory.iterdir()):
                    os.killpg(proc.pid, signal.SIGKILL)
                    break
                time.sleep(0.0005)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
            proc.stdout.close()
        leftovers = [p.name for p in directory.iterdir() if p.name.startswith(prefix)]
        if leftovers:
            return leftovers
    return []
