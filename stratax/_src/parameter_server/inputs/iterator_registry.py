"""The chief's live per-worker iterators: what a restarted worker rebuilds, and their release.

Each ``PerWorkerIterator`` the user holds is registered here by name with its dataset
``Source``. When the user's iterator is garbage collected (``weakref.finalize``), its name is
queued; a daemon thread then drops it from the registry and asks each worker that holds it to
release it (``drop_iterator``), as TensorFlow deletes a worker's iterator resource with its
last reference. So the workers hold, and a restarted worker rebuilds, only the live ones.

``lock`` orders a release against a worker's rebuild (``recovery.revive``) and the
creation of an iterator: whoever holds it sees the registry and each worker's ``iterators``
agree. The finalizer itself only queues (it may run inside any code, locks held).
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Sequence
from typing import Any

from stratax._src.core.errors import StrataxError

logger = logging.getLogger(__name__)


class IteratorRegistry:
    """Live iterators by name, over ``workers`` (the coordinator's ``_Worker`` records: their
    ``alive``, ``iterators``, ``consumed`` and ``client``)."""

    def __init__(self, workers: Sequence[Any]) -> None:
        self.lock = threading.RLock()
        self._workers = workers
        self._sources: dict[str, Any] = {}
        self._released: queue.SimpleQueue[str | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._drain, daemon=True,
                                        name="stratax-iterator-release")
        self._thread.start()

    def add(self, name: str, source: Any) -> None:
        """Registers iterator ``name``, built from ``source``."""
        with self.lock:
            self._sources[name] = source

    def live(self) -> dict[str, Any]:
        """A copy of the live iterators: name -> source."""
        with self.lock:
            return dict(self._sources)

    def released(self, name: str) -> None:
        """The finalizer of the user's iterator ``name``: queues its release (safe from a
        garbage-collection callback: no lock taken)."""
        self._released.put(name)

    def release(self, name: str) -> None:
        """Forgets iterator ``name`` and drops it on the live workers that hold it (a dead
        worker lost it with its process and will not rebuild it)."""
        with self.lock:
            self._sources.pop(name, None)
            holders = []
            for worker in self._workers:
                worker.consumed.pop(name, None)
                if name in worker.iterators:
                    worker.iterators.discard(name)
                    if worker.alive:
                        holders.append(worker)
        for worker in holders:
            try:
                worker.client.call("drop_iterator", {"iterator": name})
            except StrataxError as err:  # it goes with the worker's process anyway
                logger.info("worker %d did not release iterator %s: %s", worker.index, name, err)

    def stop(self) -> None:
        """Ends the release thread once the releases queued so far are done."""
        self._released.put(None)
        self._thread.join(timeout=5)

    def _drain(self) -> None:
        while (name := self._released.get()) is not None:
            self.release(name)
