"""``ClusterCoordinator``: schedules step functions on workers, TensorFlow's way.

``schedule(fn, args)`` runs ``fn`` once on the coordinator in *recording* mode: inside it,
``next(per_worker_iterator)`` gives placeholders for the worker's next batch and
``strategy.run(replica_fn, args=(batch,))`` records an exported step (traced once per
function and shapes, then cached). ``fn`` may call ``next`` and ``strategy.run`` any number of
times (e.g. a loop of 10 steps, TF's ``steps_per_execution``), ``strategy.reduce`` (identity: one
replica per worker), and return any structure of ``run`` results. Anything else it computes runs
on the coordinator at schedule time, not per step. The recorded closure goes to a free worker;
its ``RemoteValue`` receives the returned structure as numpy arrays.

Failures: an error in a step (raised by ``dataset_fn``, bad ids, ...) fails its ``RemoteValue``
and is raised by the next ``join()``, naming the worker and its address, of the step's own type
where it is a builtin (``step_errors``); the closures other workers are running are cancelled
(``StepCancelledError``), as TensorFlow cancels them. A worker that stops
answering (deadline ``timeout_seconds``; asynchronous mode: also a worker that misses the
chief's heartbeat that long while running a closure, e.g. SIGSTOPped) is marked dead and its
in-flight closure re-queued on the others (the parameter servers apply each step id at most
once per shard, so a re-run closure does not apply twice what the dead worker already pushed);
a task restarted at its address is taken back.
"""

from __future__ import annotations

import collections
import functools
import itertools
import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from concurrent import futures
from typing import Any

import jax
import numpy as np

from stratax._src.core.errors import StrataxError, WorkerUnavailableError
from stratax._src.parameter_server import closures, per_worker_variables, progress, recovery
from stratax._src.parameter_server.closures import (
    Closure,
    PerWorkerValues,
    RemoteValue,
    RemoteValueStatus,
)
from stratax._src.parameter_server.inputs import dataset_source
from stratax._src.parameter_server.inputs.iterator_registry import IteratorRegistry
from stratax._src.parameter_server.inputs.per_worker_dataset import (
    PerWorkerDataset,
    PerWorkerIterator,
)
from stratax._src.parameter_server.step_errors import StepCancelledError, StepError, step_error
from stratax._src.parameter_server.transport import rpc

logger = logging.getLogger(__name__)


class _Worker:
    def __init__(self, index: int, client: rpc.RpcClient) -> None:
        self.index, self.client = index, client
        self.alive = True
        self.programs: set[str] = set()
        self.iterators: set[str] = set()
        self.per_worker: set[str] = set()  # keys of the per-worker variables it holds
        self.resident: set[str] = set()  # hybrid mode: shard keys its replica holds
        self.stats = collections.Counter()
        self.consumed = collections.Counter()  # iterator name -> batches of finished closures
        self.died_at: float | None = None
        self.restarted = False  # the heartbeat saw a new process: state rebuilt before use
        self.caller = _Caller(index)


class _Caller:
    """A daemon thread that makes one worker's ``run`` calls, so the dispatch thread can stop
    waiting for a hung worker (a thread pool's threads would hold the chief's exit)."""

    def __init__(self, index: int) -> None:
        self._calls: queue.SimpleQueue[tuple[Callable[[], Any], futures.Future] | None] = (
            queue.SimpleQueue())
        threading.Thread(target=self._loop, daemon=True, name=f"stratax-run-{index}").start()

    def submit(self, call: Callable[[], Any]) -> futures.Future:
        future: futures.Future = futures.Future()
        self._calls.put((call, future))
        return future

    def stop(self) -> None:
        """Ends the thread once its current call (if any) returns."""
        self._calls.put(None)

    def _loop(self) -> None:
        while (item := self._calls.get()) is not None:
            call, future = item
            try:
                future.set_result(call())
            except BaseException as err:  # handed to the waiting dispatch thread
                future.set_exception(err)


class ClusterCoordinator:
    """Schedules functions on the workers of a ``ParameterServerStrategy``.

    Args:
      strategy: The ``ParameterServerStrategy``.
      progress_seconds: Period of the progress line on stderr (per-worker steps/s, the slowest
        worker and whether it is a straggler; see ``progress``), also written as JSON records
        to ``$STRATAX_RUN_DIR`` when set; default ``$STRATAX_PS_PROGRESS_SECONDS`` or 10 s;
        0 turns it off.

    Example:
      >>> coordinator = sx.coordinator.ClusterCoordinator(strategy)       # doctest: +SKIP
      >>> it = iter(coordinator.create_per_worker_dataset(dataset_fn))    # doctest: +SKIP
      >>> loss = coordinator.schedule(step_fn, args=(it,))                # doctest: +SKIP
      >>> coordinator.join(); loss.fetch()                                # doctest: +SKIP

    As in TensorFlow there is one coordinator per strategy: constructing another returns the
    existing one (``model.fit`` schedules through it too).
    """

    def __new__(cls, strategy: Any, progress_seconds: float | None = None) -> ClusterCoordinator:
        existing = getattr(strategy, "_coordinator", None)
        return existing if isinstance(existing, cls) else super().__new__(cls)

    def __init__(self, strategy: Any, progress_seconds: float | None = None) -> None:
        if getattr(strategy, "_coordinator", None) is self:
            return  # the strategy's existing coordinator (see __new__)
        every = progress.resolve_every_seconds(progress_seconds)
        self.strategy = strategy
        strategy._coordinator = self
        self._workers = [_Worker(i, c) for i, c in enumerate(strategy._worker_clients)]
        self._sync = getattr(strategy, "synchronous", getattr(strategy, "mode", "") == "sync")
        self._residency = getattr(strategy, "_residency", None)  # hybrid mode's replicas
        self._queue: collections.deque[Closure] = collections.deque()
        # Synchronous mode: each closure is queued once per worker, for that worker.
        self._pinned: dict[int, collections.deque[Closure]] = {
            w.index: collections.deque() for w in self._workers}
        self._last_step: str | None = None
        self._iterators = IteratorRegistry(self._workers)  # the live per-worker iterators
        self._inflight = 0
        self._running: dict[int, Closure] = {}  # worker index -> the closure it runs
        self._error: BaseException | None = None
        self._cond = threading.Condition()
        self._ids = itertools.count()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._serve, args=(w,), daemon=True,
                                          name=f"stratax-worker-{w.index}")
                         for w in self._workers]
        for thread in self._threads:
            thread.start()
        self.progress = progress.ProgressReporter(
            lambda: {f"worker {w.index}": (w.alive, w.stats) for w in self._workers},
            self._pending, sync=self._sync, every_seconds=every)
        self.progress.start()

    # ----- user API -------------------------------------------------------------------------
    def schedule(self, fn: Callable[..., Any], args: Sequence[Any] = (),
                 kwargs: dict[str, Any] | None = None) -> RemoteValue:
        """Records ``fn(*args, **kwargs)`` as a closure, queues it and returns its result.

        Raises:
          StrataxError: A previous closure failed and ``join()`` has not reported it yet (its
            own error: a ``StepError``, of the step's builtin type where it has one).
          ValueError: ``args`` or ``kwargs`` hold a ``RemoteValue`` (as in TensorFlow).
        """
        if _holds_remote_value((args, kwargs)):
            raise ValueError(
                "schedule() got a RemoteValue among its arguments; a scheduled function takes "
                "values, per-worker iterators or variables. Pass remote_value.fetch() instead.")
        with self._cond:
            self._raise_error_once()
        recovery.raise_if_no_worker_came_back(self)
        with closures.recording_into(Closure(next(self._ids))) as closure:
            closure.result_tree = fn(*args, **(kwargs or {}))
        with self._cond:
            if self._sync:
                closure.pinned = True
                closure.after = self._last_step
                if closure.runs:
                    self._last_step = f"c{closure.ident}:{len(closure.runs) - 1}"
                for queue in self._pinned.values():
                    queue.append(closure)
            else:
                self._queue.append(closure)
            self._cond.notify_all()
        return closure.remote

    def join(self) -> None:
        """Waits until every scheduled closure is done; raises the first error of a step.
        Hybrid mode: the workers' replicas of the dense variables go back to the parameter
        servers (see ``residency``)."""
        with self._cond:
            while self._pending() and self._error is None:
                self._cond.wait(1.0)
            failed = self._error is not None
        if self._residency is not None:
            try:
                self._residency.end(self._workers)
            except Exception as err:
                if not failed:
                    raise
                logger.warning("could not copy the workers' replicas back after a failed "
                               "step: %s", err)
        with self._cond:
            self._raise_error_once()

    def flush_replicas(self) -> None:
        """Hybrid mode: copies the workers' replicas of the dense variables to the parameter
        servers, where saves and the chief's reads find them (no-op otherwise)."""
        if self._residency is not None:
            self._residency.flush(self._workers)

    def drop_replicas(self) -> None:
        """Hybrid mode: the workers forget their replicas; the next steps copy them again
        from the parameter servers (after a restore wrote new values there)."""
        if self._residency is not None:
            self._residency.drop(self._workers)

    def done(self) -> bool:
        """True when nothing is queued or running (raises a pending error like ``join``)."""
        with self._cond:
            self._raise_error_once()
            return not self._pending()

    def _raise_error_once(self) -> None:
        """Under the lock: raises a step's error, once, as TensorFlow reports it (from
        ``schedule``, ``join`` or ``done``, whichever comes first): it is cleared and the
        closures still queued are cancelled with it."""
        error, self._error = self._error, None
        if error is not None:
            self._cancel_queued(StepCancelledError(f"Cancelled after an earlier error: {error}"))
            raise error

    def fetch(self, values: Any) -> Any:
        """``fetch()`` of every ``RemoteValue`` in a structure (also ``PerWorkerValues``)."""
        if isinstance(values, RemoteValue):
            return values.fetch()
        if isinstance(values, PerWorkerValues):
            return tuple(self.fetch(v) for v in values)
        return jax.tree_util.tree_map(
            self.fetch, values,
            is_leaf=lambda x: isinstance(x, (RemoteValue, PerWorkerValues)))

    def create_per_worker_dataset(self, dataset_fn: Any) -> PerWorkerDataset:
        """A dataset built on each worker, as TensorFlow's ``create_per_worker_dataset``.

        Args:
          dataset_fn: A function, run on each worker as ``dataset_fn(input_context)`` (or
            ``dataset_fn()``) and sent by name (see ``functions``); a ``tf.data.Dataset``,
            sent as its graph, every worker iterating a copy; or what
            ``strategy.distribute_datasets_from_function`` / ``experimental_distribute_dataset``
            return on the chief.

        Raises:
          TypeError: ``dataset_fn`` is none of these.
          ValueError: a function the workers cannot import, or a dataset that runs Python.
        """
        return PerWorkerDataset(self, dataset_source.describe(dataset_fn, self.strategy))

    def data_shares(self) -> int:
        """Parts a batch of ``worker_data.array_data`` splits into: one per worker in
        synchronous mode (worker ``i`` takes part ``i``), else 1 (a worker reads it whole)."""
        return len(self._workers) if self._sync else 1

    def release_data(self, data: Any) -> None:
        """Makes the workers forget ``worker_data.array_data`` arrays (after their ``fit``)."""
        for worker in self._live_workers():
            if data.name in worker.iterators:
                worker.iterators.discard(data.name)
                try:
                    worker.client.call("drop_arrays", {"name": data.name})
                except StrataxError as err:
                    logger.info("worker %d did not drop %s: %s", worker.index, data.name, err)

    def stats(self) -> dict[str, dict[str, float]]:
        """Per worker: closures and steps done, seconds spent waiting for its calls (``wall``)
        and, inside them, in data, pull, compute and push, and ``steps_per_s`` (steps / wall:
        a straggler shows a lower rate)."""
        out = {}
        for w in self._workers:
            stats = dict(w.stats)
            if stats.get("wall"):
                stats["steps_per_s"] = stats.get("steps", 0) / stats["wall"]
            out[f"worker {w.index}"] = stats
        return out

    def shutdown(self) -> None:
        """Stops the dispatch threads (the strategy calls it on exit)."""
        self._stop.set()
        with self._cond:
            self._cond.notify_all()
        for thread in self._threads:
            thread.join(timeout=5)
        for worker in self._workers:
            worker.caller.stop()
        self._iterators.stop()
        self.progress.stop()

    # ----- what ``recovery`` decides with -------------------------------------------------

    @property
    def workers(self) -> tuple[_Worker, ...]:
        """The coordinator's record of each worker (index, client, ``alive``, ``died_at``)."""
        return tuple(self._workers)

    @property
    def synchronous(self) -> bool:
        """Whether every step runs on every worker (sync or hybrid mode)."""
        return self._sync

    def run_share_again(self, worker: _Worker, closure: Closure) -> bool:
        """Puts ``worker``'s failed share of a synchronous step back at the head of its
        queue, unless the step is already final; returns whether it did."""
        with self._cond:
            if closure.remote.status is not RemoteValueStatus.PENDING:
                return False
            self._inflight -= 1
            self._pinned[worker.index].appendleft(closure)
            self._cond.notify_all()
        return True

    def fail_waiting_for(self, worker: _Worker, error: BaseException) -> bool:
        """Fails the synchronous steps queued for ``worker``, and every step not yet started,
        with ``error``; returns False when none was queued for it."""
        with self._cond:
            if not self._pinned[worker.index]:
                return False
            for closure in list(self._pinned[worker.index]):
                self._fail(closure, error)
            self._cancel_queued(error)
            self._cond.notify_all()
        return True

    def fail_queued(self, error: BaseException) -> None:
        """Fails the first queued step with ``error`` (reported once) and cancels the rest."""
        with self._cond:
            if self._queue:
                self._fail(self._queue[0], error)
                self._cancel_queued(error)
                self._cond.notify_all()

    def fail_all(self, error: BaseException) -> None:
        """Fails every step running or not yet started with ``error``, which ``join``,
        ``done`` or ``schedule`` raise once even when none was pending: the cluster lost state
        that no step can be exact from."""
        with self._cond:
            for closure in list(self._running.values()):
                self._fail(closure, error)
            self._cancel_queued(error)
            if self._error is None:
                self._error = error
            self._cond.notify_all()

    # ----- internals ------------------------------------------------------------------------
    def _read_per_worker(self, variable: Any) -> list[np.ndarray]:
        """Each worker's value of a ``PerWorkerVariable`` (its ``read_all``)."""
        return per_worker_variables.read_all(self._workers, variable)

    def _make_iterator(self, source: dataset_source.Source) -> PerWorkerIterator:
        """Builds iterator ``it<N>`` on the live workers and registers it (a worker down now
        gets it when it is taken back, see ``_on_live_workers``)."""
        name = f"{getattr(self.strategy, '_namespace', '')}it{next(self._ids)}"
        with self._iterators.lock:
            replies = self._on_live_workers("iterator", {"iterator": name}, source)
            for index in replies:
                self._workers[index].iterators.add(name)
            self._iterators.add(name, source)
        return PerWorkerIterator(name, *self._batch_spec(replies), self._iterators.released)

    def _dataset_spec(self, source: dataset_source.Source) -> tuple[Any, list[Any]]:
        """Builds ``source`` on the live workers, keeping nothing there; returns the structure
        and leaf specs of its batches."""
        return self._batch_spec(self._on_live_workers("dataset_spec", {}, source))

    def _on_live_workers(self, method: str, meta: dict[str, Any],
                         source: dataset_source.Source) -> dict[int, Any]:
        """Sends ``source`` with ``meta`` to every live worker; returns the replies by worker.

        As in TensorFlow, a worker that does not answer (down, not yet noticed) does not fail
        the call: it is marked dead, and its serving thread takes it back when it answers
        again, rebuilding every registered iterator there (``_revive``).

        Raises:
          WorkerUnavailableError: no worker answered.
        """
        replies, lost = {}, []
        for worker in self._live_workers():
            try:
                replies[worker.index] = worker.client.call(
                    method, {**meta, "source": source.meta}, source.tensors,
                    stream=bool(source.tensors))
            except WorkerUnavailableError as err:
                logger.warning("%s; it gets this dataset when it answers again", err)
                worker.died_at = time.monotonic()
                worker.alive = False
                lost.append(str(err))
        if not replies:
            raise WorkerUnavailableError("No worker answered to build the dataset: "
                                         + "; ".join(lost))
        return replies

    @staticmethod
    def _batch_spec(replies: dict[int, Any]) -> tuple[Any, list[jax.ShapeDtypeStruct]]:
        """``(structure, leaf specs)`` of the workers' batches, which must agree.

        Raises:
          ValueError: two workers' batches differ.
        """
        first_index, first = next(iter(replies.items()))
        for index, reply in replies.items():
            if (reply.meta["specs"] != first.meta["specs"]
                    or reply.meta["structure"] != first.meta["structure"]):
                raise ValueError(
                    f"Worker {index}'s dataset yields {reply.meta['specs']}, worker "
                    f"{first_index}'s {first.meta['specs']}; every worker's batches need one "
                    "structure and shape.")
        return first.meta["structure"], [jax.ShapeDtypeStruct(tuple(shape), np.dtype(dtype))
                                         for dtype, shape in first.meta["specs"]]

    def _pending(self) -> bool:
        return bool(self._queue or self._inflight or any(self._pinned.values()))

    def _cancel_queued(self, error: BaseException) -> None:
        """Fails every closure not yet started (lock held)."""
        queued = [*self._queue, *(c for q in self._pinned.values() for c in q)]
        for closure in {id(c): c for c in queued}.values():
            if closure.remote.status is RemoteValueStatus.PENDING:
                closure.remote._set(error=error)
        self._queue.clear()
        for pinned in self._pinned.values():
            pinned.clear()

    def _live_workers(self) -> list[_Worker]:
        live = [w for w in self._workers if w.alive]
        if not live:
            raise WorkerUnavailableError("No worker is left: " + ", ".join(
                f"worker {w.index} at {w.client.address}" for w in self._workers) + " died.")
        return live

    def _serve(self, worker: _Worker) -> None:
        while not self._stop.is_set():
            closure = None  # a finished closure must not keep its iterators alive while idle
            pinned = self._pinned[worker.index]
            with self._cond:
                # After an error no closure starts until it is reported (which cancels the
                # queued ones): a step whose result would be dropped is not run.
                while ((not self._queue and not pinned) or self._error is not None) and (
                        not self._stop.is_set()):
                    self._cond.wait(0.5)
                if self._stop.is_set():
                    return
                closure = pinned.popleft() if pinned else self._queue.popleft()
                self._inflight += 1
                self._running[worker.index] = closure
            try:
                recovery.run_detecting_restart(self._run, worker, closure)
            except WorkerUnavailableError as err:
                logger.warning("%s; re-queueing closure %d %s", err, closure.ident,
                               "for its restart" if closure.pinned else "on the other workers")
                worker.alive = False
                worker.died_at = time.monotonic()
                with self._cond:
                    self._inflight -= 1
                    self._running.pop(worker.index, None)
                    # A closure cancelled meanwhile does not run again. A synchronous step
                    # needs this worker's gradient, on this worker's data: it waits for the
                    # task to be restarted (see _revive); an asynchronous one goes to another
                    # worker, or (none left) to the first one back.
                    if closure.remote.status is RemoteValueStatus.PENDING:
                        (pinned if closure.pinned else self._queue).appendleft(closure)
                    self._cond.notify_all()
                if not self._revive(worker):
                    return
                continue
            except Exception as err:
                if recovery.retry_sync_share(self, worker, closure, err):
                    with self._cond:
                        self._running.pop(worker.index, None)
                    continue
                error = step_error(f"worker {worker.index} at {worker.client.address}", err)
                with self._cond:
                    self._inflight -= 1
                    self._running.pop(worker.index, None)
                    self._fail(closure, error)
                    if closure.pinned:  # later synchronous steps would wait for this worker
                        self._cancel_queued(StepCancelledError(f"Cancelled after: {error}"))
                    self._cond.notify_all()
                continue
            with self._cond:
                self._inflight -= 1
                self._running.pop(worker.index, None)
                self._cond.notify_all()

    def _revive(self, worker: _Worker) -> bool:
        """Waits for a dead worker to answer again (a restarted task at the same address),
        rebuilds its iterators (asynchronous mode: from the start of their ``dataset_fn``;
        synchronous mode: past the batches of its finished steps, see ``recovery``) and takes
        it back; returns False when the coordinator stops first."""
        while not self._stop.wait(1.0):
            if self._sync:
                recovery.expire_sync_shares(self, worker)
            recovery.expire_when_no_worker_came_back(self)
            try:
                session = getattr(self.strategy, "_session", None)
                if session is not None:  # records its incarnation (see recovery.task_restarted)
                    session.refresh(worker.client, timeout=2.0)
                else:
                    worker.client.call("ping", timeout=2.0)
            except StrataxError:
                continue
            with self._iterators.lock:  # no iterator is created or released meanwhile
                try:
                    live = self._iterators.live()
                    for name, source in live.items():
                        # Synchronous mode: skip the batches of the steps already done, so the
                        # re-run steps read the batches the dead task would have read.
                        skip = worker.consumed[name] if self._sync else 0
                        worker.client.call("iterator", {"iterator": name, "skip": skip,
                                                        "source": source.meta},
                                           source.tensors, stream=bool(source.tensors))
                except StrataxError:
                    continue
                worker.programs = set()
                worker.per_worker = set()  # recreated from their initial values on use
                worker.resident = set()  # a live worker's replica, before its next step
                worker.restarted = False
                worker.iterators = set(live)
                worker.stats["rejoined"] += 1
                worker.alive = True
            logger.warning("worker %d at %s answers again; it gets work again", worker.index,
                           worker.client.address)
            return True
        return False

    def _fail(self, closure: Closure, error: BaseException) -> None:
        """Fails ``closure`` with ``error`` (lock held), to be raised once by ``join``,
        ``done`` or ``schedule``, and cancels the closures other workers are running, as
        TensorFlow does. A closure already final (cancelled while it ran) reports nothing."""
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

    def _run(self, worker: _Worker, closure: Closure) -> None:
        if worker.restarted or not worker.alive:
            why = ("was restarted (a new process)" if worker.restarted else
                   "did not answer when a per-worker dataset was created")
            raise WorkerUnavailableError(f"worker {worker.index} at {worker.client.address} {why}")
        for program in closure.programs:
            if program.key not in worker.programs:
                tensors = [np.frombuffer(program.step, np.uint8)]
                if program.ids is not None:
                    tensors.append(np.frombuffer(program.ids, np.uint8))
                worker.client.call("register", {"program": program.meta}, tensors, stream=True)
                worker.programs.add(program.key)
        per_worker_variables.ensure_created(
            worker, [v for program in closure.programs for v in program.per_worker])
        if self._residency is not None:
            self._residency.ensure(worker, self._workers, closure.programs)
        names = [iterator.name for iterator in closure.iterators]
        missing = sorted(set(names) - worker.iterators)
        if missing:
            raise StepError(f"Iterators {missing} do not exist on worker {worker.index}; "
                            "create iterators after all workers joined.")
        data = closure.data
        if data is not None and data.name not in worker.iterators:
            worker.client.call("arrays", {"name": data.name}, data.leaves, stream=True)
            worker.iterators.add(data.name)
        start = time.perf_counter()
        sync = len(self._workers) if closure.pinned else 1
        reply = self._call_run(worker, closure, {
            "closure": f"c{closure.ident}", "iterators": names,
            "batches": closure.batches, "runs": closure.runs, "sync": sync, "after": closure.after,
            "data": data.name if data is not None else None,
            "hybrid": getattr(self.strategy, "hybrid", None),
        })
        outputs, position = [], 0
        for count in reply.meta["counts"]:
            outputs.append(reply.tensors[position:position + count])
            position += count
        worker.stats["closures"] += 1
        worker.consumed.update(names)
        worker.stats["steps"] += len(closure.runs)
        worker.stats["wall"] += time.perf_counter() - start
        for key, seconds in reply.meta.get("timing", {}).items():
            worker.stats[key] += float(seconds)
        with self._cond:
            closure.parts[worker.index] = outputs
            closure.resolve(sync)


    def _call_run(self, worker: _Worker, closure: Closure, meta: dict[str, Any]) -> Any:
        """The worker's ``run`` call (deadline ``step_timeout_seconds``). Asynchronous mode:
        if the worker stops answering the chief's heartbeat for ``timeout_seconds`` meanwhile
        (hung, SIGSTOPped, its host unreachable), raises ``WorkerUnavailableError`` so the
        closure moves to another worker; the abandoned call's pushes, should it finish, are
        skipped by the parameter servers (same step ids)."""
        call = functools.partial(worker.client.call, "run", meta, closure.rows,
                                 timeout=self.strategy._step_timeout)
        session = getattr(self.strategy, "_session", None)
        if self._sync or session is None:
            return call()  # a synchronous step needs this worker anyway
        future = worker.caller.submit(call)
        limit = float(self.strategy._timeout)
        while True:
            try:
                return future.result(timeout=0.25)
            except futures.TimeoutError:
                quiet = session.quiet_seconds(worker.client)
                if quiet > limit:
                    worker.caller.stop()  # it ends when the abandoned call returns
                    worker.caller = _Caller(worker.index)
                    raise WorkerUnavailableError(
                        f"worker {worker.index} at {worker.client.address} has not answered "
                        f"for {quiet:.1f} s (timeout_seconds={limit:g}) while running closure "
                        f"{closure.ident}: hung or stopped") from None


def _holds_remote_value(tree: Any) -> bool:
    """Whether a structure of lists, tuples and dicts holds a ``RemoteValue``."""
    if isinstance(tree, RemoteValue):
        return True
    if isinstance(tree, (list, tuple)):
        return any(_holds_remote_value(item) for item in tree)
    if isinstance(tree, dict):
        return any(_holds_remote_value(item) for item in tree.values())
    return False
