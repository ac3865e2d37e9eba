"""The launcher's journal of a run: ``<run_dir>/events.jsonl``.

``stratax launch`` appends one JSON object per event, so the dashboard can show restarts and
failures with their root cause, live and after the run:

- ``start``: ``restart`` (0, 1, ...), ``tasks`` (names as TF_CONFIG gives them, ``chief_0``,
  ``worker_1``, ``ps_2``: the names of the metrics files), ``ranks`` (their global ranks),
  ``pids``;
- ``failure``: ``restart``, ``task``, ``rank`` (under the launcher), ``pid``, ``returncode``,
  ``message`` (one line), ``tail`` (the task's last output lines: the root cause),
  ``traceback`` (its last Python traceback, whole, chained exceptions included; ``[]`` if it
  printed none);
- ``restart``: ``restart`` (the coming start), ``message``;
- ``end``: ``exit_code``, ``message`` (the launcher's summary, several lines).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Sequence
from typing import Any

from stratax._src.observe.run_dir import PathLike, events_path

EVENT_KINDS = ("start", "failure", "restart", "end")


class EventLog:
    """Appends events to ``<run_dir>/events.jsonl`` (creates the directory).

    Example:
        >>> log = EventLog("/tmp/run")  # doctest: +SKIP
        >>> log.append("restart", restart=1, message="restart 1 of 3")  # doctest: +SKIP
    """

    def __init__(self, run_dir: PathLike) -> None:
        self.path = events_path(run_dir)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()

    def append(self, kind: str, **fields: Any) -> None:
        """Appends one event of ``kind`` (one of ``EVENT_KINDS``) with JSON-able ``fields``.

        Raises:
            ValueError: an unknown kind, naming it and the known ones.
        """
        if kind not in EVENT_KINDS:
            raise ValueError(f"Unknown event kind {kind!r}; use one of {EVENT_KINDS}.")
        line = json.dumps({"t": time.time(), "kind": kind, **fields}, default=str) + "\n"
        with self._lock, open(self.path, "a", encoding="utf-8") as file:
            file.write(line)

    def failure(self, *, restart: int, task: str, pid: int, returncode: int, message: str,
                tail: Sequence[str], traceback: Sequence[str] = (),
                rank: int | None = None) -> None:
        """Appends a ``failure`` event: the first task that failed in start ``restart``.

        ``rank``, the task's global rank, is written when given (``stratax launch`` does).
        """
        ranked = {} if rank is None else {"rank": rank}
        self.append("failure", restart=restart, task=task, **ranked, pid=pid,
                    returncode=returncode, message=message, tail=list(tail),
                    traceback=list(traceback))
