"""The closures of a ``ClusterCoordinator``: waiting, running, and the first error to report.

One condition variable guards it all; the coordinator's dispatch threads (one per worker) take
closures from it, and ``recovery`` moves them on failure. An asynchronous closure waits in one
queue for any worker; a synchronous one (``mode="sync"``, hybrid mode) is queued once per worker,
for that worker (each worker computes its share on its own batches). A closure's
``RemoteValue`` goes PENDING -> READY (its outputs) or FAILED (its error, a cancellation);
a failed closure's error is raised once by ``join``, ``done`` or ``schedule``, whichever comes
first, and cancels the closures still queued, as TensorFlow does.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Iterable

from stratax._src.parameter_server.closures import Closure, RemoteValueStatus
from stratax._src.parameter_server.step_errors import StepCancelledError


class ClosureQueue:
    """Closures queued (for any worker or pinned to one) and running, by worker index."""

    def __init__(self, workers: Iterable[int]) -> None:
        self.cond = threading.Condition()
        self._queue: collections.deque[Closure] = collections.deque()
        # Synchronous mode: each closure is queued once per worker, for that worker.
        self._pinned: dict[int, collections.deque[Closure]] = {
            w: collections.deque() for w in workers}
        self._last_step: str | None = None
        self._inflight = 0
        self._running: dict[int, Closure] = {}  # worker index -> the closure it runs
        self._error: BaseException | None = None

    def put(self, closure: Closure, sync: bool) -> None:
        """Queues a recorded closure: for every worker, after the previous synchronous step
        (``sync``), else for the first free worker."""
        with self.cond:
            if sync:
                closure.pinned = True
                closure.after = self._last_step
                if closure.runs:
                    self._last_step = f"c{closure.ident}:{len(closure.runs) - 1}"
                for queue in self._pinned.values():
                    queue.append(closure)
            else:
                self._queue.append(closure)
            self.cond.notify_all()

    def pending(self) -> bool:
        """Whether a closure is queued or running."""
        return bool(self._queue or self._inflight or any(self._pinned.values()))

    def wait_idle(self) -> bool:
        """Waits until nothing is pending or a step failed; returns whether one failed."""
        with self.cond:
            while self.pending() and self._error is None:
                self.cond.wait(1.0)
            return self._error is not None

    def raise_error_once(self) -> None:
        """Raises a step's error, once: it is cleared and the closures still queued are
        cancelled with it."""
        with self.cond:
            error, self._error = self._error, None
            if error is not None:
                self._cancel_queued(
                    StepCancelledError(f"Cancelled after an earlier error: {error}"))
                raise error

    def take(self, worker: int, stop: threading.Event) -> Closure | None:
        """The next closure for ``worker`` (its own synchronous share first), marked running;
        ``None`` once ``stop`` is set. After an error no closure starts until it is reported
        (which cancels the queued ones): a step whose result would be dropped is not run."""
        pinned = self._pinned[worker]
        with self.cond:
            while ((not self._queue and not pinned) or self._error is not None) and (
                    not stop.is_set()):
                self.cond.wait(0.5)
            if stop.is_set():
                return None
            closure = pinned.popleft() if pinned else self._queue.popleft()
            self._inflight += 1
            self._running[worker] = closure
            return closure

    def finished(self, worker: int) -> None:
        """``worker``'s closure is done (its outputs are in its ``RemoteValue``)."""
        with self.cond:
            self._inflight -= 1
            self._running.pop(worker, None)
            self.cond.notify_all()

    def requeue(self, worker: int, closure: Closure) -> None:
        """``worker`` died running ``closure``: a synchronous one waits at the head of the
        worker's own queue for its restart, an asynchronous one at the head of the shared
        queue; one cancelled meanwhile does not run again."""
        with self.cond:
            self._inflight -= 1
            self._running.pop(worker, None)
            if closure.remote.status is RemoteValueStatus.PENDING:
                (self._pinned[worker] if closure.pinned else self._queue).appendleft(closure)
            self.cond.notify_all()

    def run_share_again(self, worker: int, closure: Closure) -> bool:
        """Puts ``worker``'s failed share of a synchronous step back at the head of its
        queue, unless the step is already final; returns whether it did."""
        with self.cond:
            if closure.remote.status is not RemoteValueStatus.PENDING:
                return False
            self._inflight -= 1
            self._running.pop(worker, None)
            self._pinned[worker].appendleft(closure)
            self.cond.notify_all()
        return True

    def failed(self, worker: int, closure: Closure, error: BaseException) -> None:
        """``closure`` failed on ``worker`` with ``error``; the synchronous steps after it are
        cancelled (they would wait for this one)."""
        with self.cond:
            self._inflight -= 1
            self._running.pop(worker, None)
            self._fail(closure, error)
            if closure.pinned:
                self._cancel_queued(StepCancelledError(f"Cancelled after: {error}"))
            self.cond.notify_all()

    def fail_waiting_for(self, worker: int, error: BaseException) -> bool:
        """Fails the synchronous steps queued for ``worker``, and every step not yet started,
        with ``error``; returns False when none was queued for it."""
        with self.cond:
            if not self._pinned[worker]:
                return False
            for closure in list(self._pinned[worker]):
                self._fail(closure, error)
            self._cancel_queued(error)
            self.cond.notify_all()
        return True

    def fail_queued(self, error: BaseException) -> None:
        """Fails the first queued step with ``error`` (reported once) and cancels the rest."""
        with self.cond:
            if self._queue:
                self._fail(self._queue[0], error)
                self._cancel_queued(error)
                self.cond.notify_all()

    def fail_all(self, error: BaseException) -> None:
        """Fails every step running or not yet started with ``error``, which ``join``,
        ``done`` or ``schedule`` raise once even when none was pending: the cluster lost state
        that no step can be exact from."""
        with self.cond:
            for closure in list(self._running.values()):
                self._fail(closure, error)
            self._cancel_queued(error)
            if self._error is None:
                self._error = error
            self.cond.notify_all()

    def wake(self) -> None:
        """Wakes every waiting dispatch thread (to see a stop)."""
        with self.cond:
            self.cond.notify_all()

    def _fail(self, closure: Closure, error: BaseException) -> None:
        """Fails ``closure`` with ``error`` (lock held), to be raised once, and cancels the
        closures other workers are running, as TensorFlow does. A closure already final
        (cancelled while it ran) reports nothing."""
        if closure.remote.status is not RemoteValueStatus.PENDING:
            return
        closure.remote._set(error=error)
        if self._error is None:
            self._error = error
        for index, running in self._running.items():
            if running.remote.status is RemoteValueStatus.PENDING:
                running.remote._set(error=StepCancelledError(
                    f"Cancelled while running on worker {index} after closure {closure.ident} "
                    f"failed: {error}"))

    def _cancel_queued(self, error: BaseException) -> None:
        """Fails every closure not yet started (lock held)."""
        queued = [*self._queue, *(c for q in self._pinned.values() for c in q)]
        for closure in {id(c): c for c in queued}.values():
            if closure.remote.status is RemoteValueStatus.PENDING:
                closure.remote._set(error=error)
        self._queue.clear()
        for pinned in self._pinned.values():
            pinned.clear()
