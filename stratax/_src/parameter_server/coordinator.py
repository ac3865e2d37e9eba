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

Here: the user API and one dispatch thread per worker that sends it closures. The closures'
states live in ``closure_queue``; what happens when a worker dies, hangs or a step fails, and
how a worker is taken back, in ``recovery``; how a per-worker dataset is built on the workers,
in ``inputs/per_worker_dataset``.
"""

from __future__ import annotations

import collections
import itertools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from stratax._src.core.errors import StrataxError, WorkerUnavailableError
from stratax._src.parameter_server import closures, per_worker_variables, progress, recovery
from stratax._src.parameter_server.closure_queue import ClosureQueue
from stratax._src.parameter_server.closures import (
    Closure,
    PerWorkerValues,
    RemoteValue,
)
from stratax._src.parameter_server.inputs import dataset_source
from stratax._src.parameter_server.inputs.iterator_registry import IteratorRegistry
from stratax._src.parameter_server.inputs.per_worker_dataset import (
    PerWorkerDataset,
    PerWorkerIterator,
    batch_spec,
    build_on_workers,
)
from stratax._src.parameter_server.step_errors import StepError
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
        self.caller = recovery.Caller(index)


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
        self.queue = ClosureQueue(w.index for w in self._workers)
        self._iterators = IteratorRegistry(self._workers)  # the live per-worker iterators
        self._ids = itertools.count()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._serve, args=(w,), daemon=True,
                                          name=f"stratax-worker-{w.index}")
                         for w in self._workers]
        for thread in self._threads:
            thread.start()
        self.progress = progress.ProgressReporter(
            lambda: {f"worker {w.index}": (w.alive, w.stats) for w in self._workers},
            self.queue.pending, sync=self._sync, every_seconds=every)
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
        self.queue.raise_error_once()
        recovery.raise_if_no_worker_came_back(self)
        with closures.recording_into(Closure(next(self._ids))) as closure:
            closure.result_tree = fn(*args, **(kwargs or {}))
        self.queue.put(closure, self._sync)
        return closure.remote

    def join(self) -> None:
        """Waits until every scheduled closure is done; raises the first error of a step.
        Hybrid mode: the workers' replicas of the dense variables go back to the parameter
        servers (see ``residency``)."""
        failed = self.queue.wait_idle()
        if self._residency is not None:
            try:
                self._residency.end(self._workers)
            except Exception as err:
                if not failed:
                    raise
                logger.warning("could not copy the workers' replicas back after a failed "
                               "step: %s", err)
        self.queue.raise_error_once()

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
        self.queue.raise_error_once()
        return not self.queue.pending()

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
        self.queue.wake()
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
    def stopping(self) -> threading.Event:
        """Set when the coordinator shuts down (its threads stop waiting)."""
        return self._stop

    @property
    def iterators(self) -> IteratorRegistry:
        """The live per-worker iterators, rebuilt on a worker taken back (``recovery``)."""
        return self._iterators

    @property
    def synchronous(self) -> bool:
        """Whether every step runs on every worker (sync or hybrid mode)."""
        return self._sync

    # ----- internals ------------------------------------------------------------------------
    def _read_per_worker(self, variable: Any) -> list[np.ndarray]:
        """Each worker's value of a ``PerWorkerVariable`` (its ``read_all``)."""
        return per_worker_variables.read_all(self._workers, variable)

    def _make_iterator(self, source: dataset_source.Source) -> PerWorkerIterator:
        """Builds iterator ``it<N>`` on the live workers and registers it (a worker down now
        gets it when it is taken back, see ``build_on_workers``)."""
        name = f"{getattr(self.strategy, '_namespace', '')}it{next(self._ids)}"
        with self._iterators.lock:
            replies = build_on_workers(self._live_workers(), "iterator", {"iterator": name},
                                       source)
            for index in replies:
                self._workers[index].iterators.add(name)
            self._iterators.add(name, source)
        return PerWorkerIterator(name, *batch_spec(replies), self._iterators.released)

    def _dataset_spec(self, source: dataset_source.Source) -> tuple[Any, list[Any]]:
        """Builds ``source`` on the live workers, keeping nothing there; returns the structure
        and leaf specs of its batches."""
        return batch_spec(build_on_workers(self._live_workers(), "dataset_spec", {}, source))

    def _live_workers(self) -> list[_Worker]:
        live = [w for w in self._workers if w.alive]
        if not live:
            raise WorkerUnavailableError("No worker is left: " + ", ".join(
                f"worker {w.index} at {w.client.address}" for w in self._workers) + " died.")
        return live

    def _serve(self, worker: _Worker) -> None:
        """One worker's dispatch thread: runs its closures until the coordinator stops;
        ``recovery`` handles a lost worker (its closure re-queued, the worker waited for) and
        a failed step."""
        while not self._stop.is_set():
            closure = self.queue.take(worker.index, self._stop)
            if closure is None:
                return
            try:
                recovery.run_detecting_restart(self._run, worker, closure)
            except WorkerUnavailableError as err:
                if not recovery.worker_lost(self, worker, closure, err):
                    return
                continue
            except Exception as err:
                recovery.step_failed(self, worker, closure, err)
                continue
            finally:
                closure = None  # a finished closure must not keep its iterators alive
            self.queue.finished(worker.index)

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
        reply = recovery.call_run(self, worker, closure, {
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
        with self.queue.cond:
            closure.parts[worker.index] = outputs
            closure.resolve(sync)


def _holds_remote_value(tree: Any) -> bool:
    """Whether a structure of lists, tuples and dicts holds a ``RemoteValue``."""
    if isinstance(tree, RemoteValue):
        return True
    if isinstance(tree, (list, tuple)):
        return any(_holds_remote_value(item) for item in tree)
    if isinstance(tree, dict):
        return any(_holds_remote_value(item) for item in tree.values())
    return False
