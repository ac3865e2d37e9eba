"""Where an observed run keeps its files, and what this process is called there.

Resolution order (as everywhere in stratax): explicit argument, then environment variable
(``STRATAX_RUN_DIR``, ``STRATAX_TASK_NAME``), then auto-detection (the task name from the rank
``stratax launch`` gives, else from ``TF_CONFIG``, else ``main``).
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

from stratax._src.core import env as env_names

METRICS_DIR = "metrics"
EVENTS_FILE = "events.jsonl"
_TASK_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")

PathLike = str | os.PathLike


def resolve_run_dir(run_dir: PathLike | None = None) -> Path | None:
    """The run directory: ``run_dir`` if given, else ``$STRATAX_RUN_DIR``, else ``None``."""
    if run_dir is not None:
        return Path(run_dir)
    value = os.environ.get(env_names.STRATAX_RUN_DIR)
    return Path(value) if value else None


def check_task_name(task: str) -> str:
    """Returns ``task`` when it is a safe file name (letters, digits, ``_.-``), else raises.

    Raises:
        ValueError: naming the received value and the allowed form.
    """
    if not isinstance(task, str) or not _TASK_RE.match(task) or task in (".", ".."):
        raise ValueError(
            f"Task name {task!r} is not usable as a file name; use 1-64 letters, digits, '_', "
            f"'.' or '-', e.g. 'worker_0' or 'ps_1'."
        )
    return task


def resolve_task_name(task: str | None = None) -> str:
    """This process's task name: ``task``, ``$STRATAX_TASK_NAME``, the launcher's rank, TF_CONFIG.

    ``stratax launch`` children are ``worker_<global rank>``; a process with a ``TF_CONFIG``
    task is ``<type>_<index>`` (``chief_0``, ``ps_1``); anything else is ``main``.
    """
    if task is None:
        task = os.environ.get(env_names.STRATAX_TASK_NAME) or _detected_task_name()
    return check_task_name(task)


def _detected_task_name() -> str:
    rank = os.environ.get(env_names.STRATAX_PROCESS_ID)
    if rank is not None and rank.isdigit():
        return f"worker_{int(rank)}"
    try:
        task = json.loads(os.environ.get(env_names.TF_CONFIG) or "{}").get("task") or {}
    except (ValueError, AttributeError):
        return "main"  # a malformed TF_CONFIG is reported by the cluster resolvers, not here
    if isinstance(task, dict) and isinstance(task.get("type"), str):
        return f"{task['type']}_{int(task.get('index', 0))}"
    return "main"


def metrics_path(run_dir: PathLike, task: str) -> Path:
    """``<run_dir>/metrics/<task>.jsonl``."""
    return Path(run_dir) / METRICS_DIR / f"{check_task_name(task)}.jsonl"


def events_path(run_dir: PathLike) -> Path:
    """``<run_dir>/events.jsonl``."""
    return Path(run_dir) / EVENTS_FILE


def default_run_dir(base: PathLike = "stratax_runs") -> Path:
    """A new, unused ``<base>/run-YYYYmmdd-HHMMSS[-N]`` directory path (not created)."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    candidate = Path(base) / f"run-{stamp}"
    suffix = 1
    while candidate.exists():
        suffix += 1
        candidate = Path(base) / f"run-{stamp}-{suffix}"
    return candidate
