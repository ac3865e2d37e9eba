"""A count of refused peers, logged at most once per interval: a flood of refusals (a port
scanner, a client of another cluster, an attacker) must not flood the task's log as well."""

from __future__ import annotations

import threading
import time


class Refusals:
    """``note()`` counts one refusal and returns how many to report now (0: stay quiet).

    Example:
      >>> refusals = Refusals(10.0)
      >>> refusals.note(), refusals.note()
      (1, 0)
    """

    def __init__(self, every_seconds: float = 10.0) -> None:
        self._every = every_seconds
        self._count = 0
        self._logged = -float("inf")
        self._lock = threading.Lock()

    def note(self) -> int:
        now = time.monotonic()
        with self._lock:
            self._count += 1
            if now - self._logged < self._every:
                return 0
            self._logged, count, self._count = now, self._count, 0
        return count

    def unreported(self) -> int:
        """The refusals counted since the last report that ``note`` did not report (a flood's
        tail, when the log ends); they count as reported now."""
        with self._lock:
            count, self._count = self._count, 0
        return count
