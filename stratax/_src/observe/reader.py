"""Tails a run directory: new metrics records and launcher events, in arrival order.

The dashboard polls :meth:`RunReader.snapshot` with the sequence number it has seen; only
complete lines are read (a line still being written is picked up on the next poll), so a live
run and a finished one read the same way.
"""

from __future__ import annotations

import json
import logging
import statistics
import threading
from pathlib import Path
from typing import Any

from stratax._src.observe.run_dir import METRICS_DIR, PathLike, events_path

logger = logging.getLogger(__name__)

# A worker whose step time exceeds the median of all workers by this factor is the straggler.
STRAGGLER_FACTOR = 1.05


class _Tail:
    """Reads the complete lines appended to one file since the last call."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = 0
        self._partial = b""

    def read_lines(self) -> list[dict[str, Any]]:
        try:
            with open(self.path, "rb") as file:
                file.seek(self._offset)
                data = file.read()
        except FileNotFoundError:
            return []
        self._offset += len(data)
        data = self._partial + data
        *lines, self._partial = data.split(b"\n")
        out = []
        for line in lines:
            if not line.strip():
                continue
            try:
                value = json.loads(line)
            except ValueError:
                logger.warning("Skipping a line of %s that is not JSON: %r", self.path, line[:80])
                continue
            if isinstance(value, dict):
                out.append(value)
        return out


class RunReader:
    """Everything recorded in a run directory so far; thread-safe.

    Example:
        >>> reader = RunReader("stratax_runs/run-20261130-151500")  # doctest: +SKIP
        >>> data = reader.snapshot(since=0)  # doctest: +SKIP
        >>> data["tasks"]["worker_0"]["samples_per_s"]  # doctest: +SKIP
    """

    def __init__(self, run_dir: PathLike) -> None:
        self.run_dir = Path(run_dir)
        self._tails: dict[Path, _Tail] = {}
        self._events_tail = _Tail(events_path(self.run_dir))
        self._records: list[dict[str, Any]] = []
        self._events: list[dict[str, Any]] = []
        self._latest: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()

    def poll(self) -> None:
        """Reads what was appended since the last poll."""
        with self._lock:
            metrics_dir = self.run_dir / METRICS_DIR
            for path in sorted(metrics_dir.glob("*.jsonl")) if metrics_dir.is_dir() else ():
                tail = self._tails.setdefault(path, _Tail(path))
                for entry in tail.read_lines():
                    task = str(entry.get("task") or path.stem)
                    entry["task"] = task
                    entry["seq"] = len(self._records) + 1
                    self._records.append(entry)
                    self._latest.setdefault(task, {}).update(entry)
            self._events.extend(self._events_tail.read_lines())

    def snapshot(self, since: int = 0) -> dict[str, Any]:
        """Polls, then returns ``{"seq", "records" (seq > since), "events", "tasks"}``.

        ``tasks`` maps each task to its latest value of every scalar, plus ``straggler``.
        """
        self.poll()
        with self._lock:
            records = self._records[max(0, since):]
            tasks = {name: dict(values) for name, values in self._latest.items()}
            events = list(self._events)
            seq = len(self._records)
        straggler = find_straggler(tasks)
        for name, values in tasks.items():
            values["straggler"] = name == straggler
        return {"seq": seq, "records": records, "events": events, "tasks": tasks,
                "run_dir": str(self.run_dir)}


def find_straggler(tasks: dict[str, dict[str, Any]]) -> str | None:
    """The task that holds the others up, or ``None`` (fewer than two tasks, or no clear gap).

    Asynchronous workers: the one whose latest ``step_s`` exceeds the median by
    ``STRAGGLER_FACTOR``. Synchronous workers (``synchronous`` records) step together, since
    each waits for the slowest inside the all-reduce, so their step times differ only by noise:
    there it is the worker whose host time before its step (``input_s``) exceeds the median of
    the workers' by more than ``STRAGGLER_FACTOR - 1`` of the median step time.
    """
    times = {name: float(v["step_s"]) for name, v in tasks.items()
             if isinstance(v.get("step_s"), (int, float))}
    if len(times) < 2:
        return None
    median_step = statistics.median(times.values())
    if all(tasks[name].get("synchronous") for name in times):
        waits = {name: float(tasks[name]["input_s"]) for name in times
                 if isinstance(tasks[name].get("input_s"), (int, float))}
        if len(waits) < 2:
            return None
        slowest = max(waits, key=lambda name: waits[name])
        gap = waits[slowest] - statistics.median(waits.values())
        return slowest if gap > (STRAGGLER_FACTOR - 1) * median_step else None
    slowest = max(times, key=lambda name: times[name])
    return slowest if times[slowest] > STRAGGLER_FACTOR * median_step else None
