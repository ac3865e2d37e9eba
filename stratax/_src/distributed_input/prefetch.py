"""``Prefetcher``: runs an iterator in a background thread, a bounded number of items ahead.

The distributed iterators use it to read, split and place batches on the devices while the
previous step runs (``InputOptions.experimental_fetch_to_device``), and ``fit`` can use it the
same way. The thread is a daemon and stops when the iterator is exhausted, closed or garbage
collected; an exception raised by the source iterator is raised again in the consumer, with its
original traceback chained.

Example:
    >>> for batch in Prefetcher(placed_batches(), depth=2):     # doctest: +SKIP
    ...     step(batch)
"""

from __future__ import annotations

import queue
import threading
import weakref
from collections.abc import Iterator
from typing import Any

_POLL_SECONDS = 0.1


class _End:
    """Marks the end of the source iterator in the queue."""


class _Failure:
    """Carries an exception from the producer thread to the consumer."""

    def __init__(self, error: BaseException) -> None:
        self.error = error


def _produce(source: Iterator[Any], items: queue.Queue[Any], stop: threading.Event) -> None:
    """The producer thread: moves items from ``source`` to ``items`` until the end or ``stop``."""
    try:
        for item in source:
            while not stop.is_set():
                try:
                    items.put(item, timeout=_POLL_SECONDS)
                    break
                except queue.Full:
                    continue
            if stop.is_set():
                return
        item = _End()
    except BaseException as error:  # re-raised in the consumer
        item = _Failure(error)
    while not stop.is_set():
        try:
            items.put(item, timeout=_POLL_SECONDS)
            return
        except queue.Full:
            continue


class Prefetcher:
    """Iterates ``source`` in a daemon thread, keeping up to ``depth`` items ready.

    ``depth`` 0 runs ``source`` in the caller's thread (no thread, no look-ahead).

    Args:
        source: the iterator to run ahead (it must not be used elsewhere meanwhile).
        depth: how many produced items may wait for the consumer.

    Raises:
        ValueError: ``depth`` is negative.
    """

    def __init__(self, source: Iterator[Any], depth: int) -> None:
        if depth < 0:
            raise ValueError(f"Prefetch depth must be >= 0; received {depth}.")
        self._source = source if depth == 0 else None
        self._done = False
        self._stop = threading.Event()
        self._items: queue.Queue[Any] = queue.Queue(maxsize=max(depth, 1))
        self._thread: threading.Thread | None = None
        if depth:
            self._thread = threading.Thread(
                target=_produce, args=(source, self._items, self._stop),
                name="stratax-prefetch", daemon=True,
            )
            self._thread.start()
            # Stops the producer when the consumer is garbage collected mid-iteration.
            self._finalizer = weakref.finalize(self, self._stop.set)

    def __iter__(self) -> Prefetcher:
        return self

    @property
    def done(self) -> bool:
        """Whether the iteration ended (exhausted, failed or closed)."""
        return self._done

    def __next__(self) -> Any:
        if self._done:
            raise StopIteration
        if self._thread is None:
            try:
                return next(self._source)  # type: ignore[arg-type]
            except StopIteration:
                self._done = True
                raise
        item = self._take()
        if isinstance(item, _End):
            self.close()
            raise StopIteration
        if isinstance(item, _Failure):
            self.close()
            raise item.error
        return item

    def _take(self) -> Any:
        """The next produced item; a producer that died without a word is an error, not a hang."""
        while True:
            try:
                return self._items.get(timeout=_POLL_SECONDS)
            except queue.Empty:
                if self._thread is not None and not self._thread.is_alive() and self._items.empty():
                    raise RuntimeError(
                        "The prefetch thread of a distributed iterator ended without a result; "
                        "iterate with InputOptions(experimental_fetch_to_device=False) to run "
                        "the input pipeline in this thread and see its error."
                    ) from None

    def close(self) -> None:
        """Stops the producer thread and waits for it (up to a few seconds); idempotent."""
        self._done = True
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5.0)
