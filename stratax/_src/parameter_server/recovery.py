"""Recovery of synchronous steps from a dead worker, and retries of calls to a restarting ps.

Synchronous mode needs every worker's gradient for each step, computed on that worker's own
batches, so a dead worker's share cannot move to a survivor without moving its data. Instead
the share waits for the task to be restarted at its address (by a supervisor, ``stratax
launch``'s restarts or by hand): the coordinator rebuilds the restarted task's iterators,
skips the batches of the steps it had finished, and re-sends its unfinished closure. Pushes
the dead task made before dying are kept by the parameter servers (a worker's gradient for a
step is taken once), so the re-run adds exactly the missing gradients and the result equals
the run without the failure. Survivors whose pull gave up waiting for the dead worker's
gradient re-run their share (the worker re-reads the same batches, see ``tasks.worker``).
If the task does not come back within ``timeout_seconds``, its pending steps fail with an
error naming it, so ``join()`` never waits forever. In asynchronous mode a dead worker's
closure moves to the others; when all are lost, closures wait (as in TensorFlow) for the
first one back, for at most ``timeout_seconds``.

The coordinator's dispatch thread for each worker calls in here when a closure fails:
``worker_lost`` (the worker died, hung or was restarted: its closure is re-queued and the
worker waited for, ``revive``) and ``step_failed`` (the step raised: its ``RemoteValue`` fails,
unless a synchronous share only gave up waiting for a dead peer). ``call_run`` notices a hung
worker in asynchronous mode from the chief's heartbeat.
"""

from __future__ import annotations

import functools
import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent import futures
from typing import Any, TypeVar

from stratax._src.core.errors import StrataxError, WorkerUnavailableError
from stratax._src.parameter_server import per_worker_variables
from stratax._src.parameter_server.step_errors import step_error
from stratax._src.parameter_server.transport.rpc import RemoteError

logger = logging.getLogger(__name__)
T = TypeVar("T")
# What a worker answers when asked for an iterator, program or per-worker variable it does not
# have: it was restarted (the coordinator makes sure all exist before sending a closure).
MISSING_REPLICA = "No resident variable"  # a worker lacks its hybrid-mode replica
_LOST_STATE = ("No iterator", "is not registered on worker", per_worker_variables.MISSING,
               MISSING_REPLICA)
# The error of a synchronous pull (a ps) or gradient exchange (a worker) that gave up.
SYNC_WAIT = "still waiting for gradients"


def _rejoin_limit(coordinator: Any) -> float:
    """How long a dead worker is waited for: the strategy's ``timeout_seconds`` (0 for a
    strategy without one: fail at once)."""
    return float(getattr(coordinator.strategy, "_timeout", 0.0))


def retry_sync_share(coordinator: Any, worker: Any, closure: Any, error: BaseException) -> bool:
    """Re-queues a survivor's synchronous share that failed waiting for a worker that died
    recently (within the rejoin limit); returns False when the error is another one."""
    if not closure.pinned or SYNC_WAIT not in str(error):
        return False
    now = time.monotonic()
    recent = [w for w in coordinator.workers
              if w.died_at is not None and now - w.died_at < _rejoin_limit(coordinator)]
    if not recent or not coordinator.queue.run_share_again(worker.index, closure):
        return False
    logger.warning("worker %d: synchronous closure %d waits for %s; running it again",
                   worker.index, closure.ident,
                   ", ".join(f"worker {w.index} at {w.client.address}" for w in recent))
    return True


def expire_sync_shares(coordinator: Any, worker: Any) -> None:
    """Fails the synchronous steps waiting for dead ``worker`` once it has been down longer
    than the rejoin limit (``timeout_seconds``), naming it; called while waiting for it."""
    limit = _rejoin_limit(coordinator)
    if worker.died_at is None or time.monotonic() - worker.died_at < limit:
        return
    error = WorkerUnavailableError(
        f"Synchronous training needs every worker: worker {worker.index} at "
        f"{worker.client.address} died and was not restarted within {limit:g} s "
        "(timeout_seconds); restart it at the same address (e.g. under a supervisor) or "
        "use mode='async', which continues on the remaining workers.")
    if coordinator.queue.fail_waiting_for(worker.index, error):
        worker.died_at = time.monotonic()


def _no_worker_error(coordinator: Any) -> WorkerUnavailableError | None:
    """The error to fail with when every worker has been dead longer than the rejoin limit
    (``timeout_seconds``); None while one is alive or the limit has not passed."""
    workers = coordinator.workers
    if any(w.alive for w in workers):
        return None
    limit = _rejoin_limit(coordinator)
    since = max(w.died_at or 0.0 for w in workers)
    if time.monotonic() - since < limit:
        return None
    return WorkerUnavailableError(
        f"No worker is left: none came back within {limit:g} s (timeout_seconds) of losing "
        "all of them: "
        + ", ".join(f"worker {w.index} at {w.client.address}" for w in workers)
        + ". Restart them at the same addresses (the coordinator takes them back) or give "
        "ParameterServerStrategy a larger timeout_seconds.")


def expire_when_no_worker_came_back(coordinator: Any) -> None:
    """Asynchronous mode, as TensorFlow's coordinator: when every worker is lost, closures
    wait for one to come back; after the rejoin limit they fail (``join()`` raises, naming
    the workers). Called while waiting for a dead worker."""
    error = _no_worker_error(coordinator)
    if error is not None and not coordinator.synchronous:
        coordinator.queue.fail_queued(error)


def raise_if_no_worker_came_back(coordinator: Any) -> None:
    """``schedule()``'s check: raises once every worker has been lost longer than the limit
    (before that the closure is queued for the first worker back)."""
    error = _no_worker_error(coordinator)
    if error is not None:
        raise error


def run_detecting_restart(run: Callable[[Any, Any], None], worker: Any, closure: Any) -> None:
    """``run(worker, closure)``, turning the error of a worker restarted since the coordinator
    last saw it (it lost its iterators, programs or per-worker variables) into
    ``WorkerUnavailableError``, so the closure is re-queued and the task taken back like a
    worker that died visibly."""
    try:
        run(worker, closure)
    except RemoteError as err:
        if not any(lost in str(err) for lost in _LOST_STATE):
            raise
        raise WorkerUnavailableError(
            f"worker {worker.index} at {worker.client.address} was restarted and lost its "
            f"state ({err})") from None


def task_restarted(coordinator: Any, client: Any, sync: bool) -> None:
    """The heartbeat saw the task of ``client`` (the session's) answer as a new process: the
    coordinator rebuilds a restarted worker's state before its next closure. A ps restarted
    in ``mode="sync"`` (its snapshot, if any, lacks the steps after it and the partial sums in
    flight) fails the steps, so the run resumes from its last backup or checkpoint instead of
    going on with updates lost."""
    for worker in coordinator.workers:
        if worker.client.name == client.name and worker.alive:
            worker.restarted = True  # it lost its programs, iterators, per-worker variables
    if sync and client.name.startswith("ps "):
        coordinator.queue.fail_all(StrataxError(
            f"{client.name} at {client.address} was restarted: in mode='sync' its state "
            "after its last snapshot is lost, so training cannot go on exactly. Restart "
            "the program; sx.BackupAndRestore (or restore_checkpoint) resumes it from the "
            "last backup, as `stratax launch --max-restarts` does."))


def with_retries(call: Callable[[], T], name: str, timeout: float) -> T:
    """Runs ``call`` again, with backoff (0.2 s doubling to 2 s), while it fails with
    ``WorkerUnavailableError`` (a parameter server restarting) for at most ``timeout``
    seconds; then raises the last error, which names the server."""
    deadline = time.monotonic() + timeout
    delay = 0.2
    while True:
        try:
            return call()
        except WorkerUnavailableError:
            if time.monotonic() + delay > deadline:
                raise
            logger.warning("%s does not answer; retrying in %.1f s", name, delay)
            time.sleep(delay)
            delay = min(2 * delay, 2.0)


# ----- the dispatch threads' failures -----------------------------------------------------
def worker_lost(coordinator: Any, worker: Any, closure: Any,
                error: WorkerUnavailableError) -> bool:
    """``worker`` died (or hung, or was restarted) running ``closure``: marks it dead,
    re-queues the closure (see ``ClosureQueue.requeue``) and waits for the worker to come
    back (``revive``); returns False when the coordinator stops first."""
    logger.warning("%s; re-queueing closure %d %s", error, closure.ident,
                   "for its restart" if closure.pinned else "on the other workers")
    worker.alive = False
    worker.died_at = time.monotonic()
    coordinator.queue.requeue(worker.index, closure)
    return revive(coordinator, worker)


def step_failed(coordinator: Any, worker: Any, closure: Any, error: Exception) -> None:
    """``closure`` raised ``error`` on ``worker``: a synchronous share that gave up waiting
    for a recently dead peer runs again (``retry_sync_share``); otherwise the closure fails
    with the error, named by worker (``step_errors``)."""
    if retry_sync_share(coordinator, worker, closure, error):
        return
    coordinator.queue.failed(worker.index, closure, step_error(
        f"worker {worker.index} at {worker.client.address}", error))


def revive(coordinator: Any, worker: Any) -> bool:
    """Waits for a dead worker to answer again (a restarted task at the same address),
    rebuilds its iterators (asynchronous mode: from the start of their ``dataset_fn``;
    synchronous mode: past the batches of its finished steps) and takes it back; returns
    False when the coordinator stops first."""
    while not coordinator.stopping.wait(1.0):
        if coordinator.synchronous:
            expire_sync_shares(coordinator, worker)
        expire_when_no_worker_came_back(coordinator)
        try:
            session = getattr(coordinator.strategy, "_session", None)
            if session is not None:  # also records its incarnation (see task_restarted)
                session.refresh(worker.client, timeout=2.0)
            else:
                worker.client.call("ping", timeout=2.0)
        except StrataxError:
            continue
        iterators = coordinator.iterators
        with iterators.lock:  # no iterator is created or released meanwhile
            try:
                live = iterators.live()
                for name, source in live.items():
                    # Synchronous mode: skip the batches of the steps already done, so the
                    # re-run steps read the batches the dead task would have read.
                    skip = worker.consumed[name] if coordinator.synchronous else 0
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


class Caller:
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


def call_run(coordinator: Any, worker: Any, closure: Any, meta: dict[str, Any]) -> Any:
    """The worker's ``run`` call (deadline ``step_timeout_seconds``). Asynchronous mode: if
    the worker stops answering the chief's heartbeat for ``timeout_seconds`` meanwhile (hung,
    SIGSTOPped, its host unreachable), raises ``WorkerUnavailableError`` so the closure moves
    to another worker; the abandoned call's pushes, should it finish, are skipped by the
    parameter servers (same step ids)."""
    strategy = coordinator.strategy
    call = functools.partial(worker.client.call, "run", meta, closure.rows,
                             timeout=strategy._step_timeout)
    session = getattr(strategy, "_session", None)
    if coordinator.synchronous or session is None:
        return call()  # a synchronous step needs this worker anyway
    future = worker.caller.submit(call)
    limit = float(strategy._timeout)
    while True:
        try:
            return future.result(timeout=0.25)
        except futures.TimeoutError:
            quiet = session.quiet_seconds(worker.client)
            if quiet > limit:
                worker.caller.stop()  # it ends when the abandoned call returns
                worker.caller = Caller(worker.index)
                raise WorkerUnavailableError(
                    f"worker {worker.index} at {worker.client.address} has not answered "
                    f"for {quiet:.1f} s (timeout_seconds={limit:g}) while running closure "
                    f"{closure.ident}: hung or stopped") from None
