"""The benchmarks' tests: the repository root importable (``import benchmarks``), and no test
leaves a child process behind (several start clusters).

``python -m pytest`` from the repository root runs them with the package's tests
(``testpaths`` in the root ``pyproject.toml``), whose ``tests/conftest.py`` then also sets the
session's environment; ``python -m pytest benchmarks/tests`` runs them alone.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def _children() -> set[int]:
    """Live child processes of this one, from /proc."""
    found = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == os.getpid() and fields[0] != "Z":
                found.add(int(entry))
    return found


@pytest.fixture(autouse=True)
def _no_child_left():
    before = _children()
    yield
    leaked = _children() - before
    if leaked:
        pytest.fail(f"child processes leaked: {sorted(leaked)}")
