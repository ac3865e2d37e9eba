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
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

from stratax._src.core.errors import StrataxError, WorkerUnavailableError
from stratax._src.parameter_server import per_worker_variables
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
    if not recent or not coordinator.run_share_again(worker, closure):
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
    if coordinator.fail_waiting_for(worker, error):
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
        coordinator.fail_queued(error)


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
        coordinator.fail_all(StrataxError(
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
