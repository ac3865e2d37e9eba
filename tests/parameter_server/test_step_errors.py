"""A failed closure, as TensorFlow's coordinator reports it: the step's own exception type, and
the closures running elsewhere cancelled (``cluster_coordinator_test``'s cancellation cases)."""

import concurrent.futures
import time

import pytest

from stratax._src.core.errors import StrataxError
from stratax._src.parameter_server.closures import RemoteValueStatus
from stratax._src.parameter_server.coordinator import ClusterCoordinator
from stratax._src.parameter_server.step_errors import StepCancelledError, StepError, step_error
from stratax._src.parameter_server.transport import rpc
from stratax._src.parameter_server.transport.rpc_server import RpcServer

pytestmark = pytest.mark.timeout(120)


def _worker(fail_after=None, late=None):
    """A worker task that answers its first ``run`` after ``fail_after`` s with a ValueError,
    or after ``late[0]`` s with success (``late[1] == "ok"``) or an error of its own; later
    calls succeed at once."""
    calls = []

    def handle(frame):
        if frame.meta["method"] != "run":
            return rpc.response()
        calls.append(frame.meta["closure"])
        if fail_after is not None and len(calls) == 1:
            time.sleep(fail_after)
            raise ValueError("batch 3 has a negative id")
        if late is not None and len(calls) == 1:
            time.sleep(late[0])
            if late[1] != "ok":
                raise ZeroDivisionError("late failure")
        return rpc.response({"counts": [], "timing": {}})

    return handle


class _Strategy:
    """What the coordinator reads from its strategy: worker clients and the step deadline."""

    def __init__(self, servers):
        self._worker_clients = [rpc.RpcClient(f"worker {i}", f"127.0.0.1:{s.port}", timeout=20)
                                for i, s in enumerate(servers)]
        self._step_timeout = 20.0
        self._coordinator = None


@pytest.mark.parametrize("late", ["ok", "error"])
def test_running_closures_are_cancelled_and_their_late_end_reports_nothing(late):
    servers = [RpcServer("worker 0", "127.0.0.1", 0, _worker(fail_after=1.0), max_workers=2),
               RpcServer("worker 1", "127.0.0.1", 0, _worker(late=(3.0, late)),
                         max_workers=2)]
    for server in servers:
        server.start()
    strategy = _Strategy(servers)
    coordinator = ClusterCoordinator(strategy, progress_seconds=0)
    try:
        started = [coordinator.schedule(lambda: 1) for _ in range(2)]  # one per worker
        queued = [coordinator.schedule(lambda: 1) for _ in range(3)]
        with pytest.raises(ValueError, match="batch 3 has a negative id") as raised:
            coordinator.join()
        # TensorFlow re-raises the step's type; stratax's text and base class are kept.
        assert isinstance(raised.value, StepError) and isinstance(raised.value, StrataxError)
        assert f"worker 0 at 127.0.0.1:{servers[0].port}: run failed: ValueError" in str(
            raised.value)
        failed = [v for v in started if isinstance(v._error, ValueError)]
        assert len(failed) == 1, [v._error for v in started]
        with pytest.raises(ValueError, match="negative id"):
            failed[0].fetch()
        # The closure running on worker 1 when the error came is cancelled at once.
        second = next(v for v in started if v is not failed[0])
        assert second.status is RemoteValueStatus.FAILED
        with pytest.raises(concurrent.futures.CancelledError, match="running on worker 1"):
            second.fetch(timeout=0)
        for value in queued:
            with pytest.raises(StepCancelledError, match="earlier error"):
                value.fetch(timeout=0)
        # Worker 1 ends its call later; neither its result nor its error is reported.
        deadline = time.monotonic() + 30
        while not coordinator.done():
            assert time.monotonic() < deadline
            time.sleep(0.05)
        coordinator.join()
        with pytest.raises(StepCancelledError):
            second.fetch()
        assert coordinator.stats()["worker 1"].get("closures", 0) == (1 if late == "ok" else 0)
        # The error was reported: the coordinator schedules and joins again (TF's case).
        again = [coordinator.schedule(lambda: 2) for _ in range(4)]
        coordinator.join()
        assert [v.fetch() for v in again] == [2] * 4
    finally:
        coordinator.shutdown()
        for client in strategy._worker_clients:
            client.close()
        for server in servers:
            server.stop(0)


def test_only_builtin_types_are_rebuilt():
    typed = step_error("worker 0", rpc.RemoteError("worker 0: run failed: KeyError: 'w'",
                                                    "KeyError"))
    assert isinstance(typed, KeyError) and isinstance(typed, StepError)
    assert str(typed) == "worker 0: run failed: KeyError: 'w'"  # not quoted again as KeyError's
    for name in ("MyError", "RemoteError", "StopIteration", "print", "KeyboardInterrupt"):
        error = rpc.RemoteError(f"worker 0: run failed: {name}: x", name)
        assert step_error("worker 0", error) is error       # the worker's error as it came
    local = step_error("worker 1 at h:1", TypeError("bad leaf"))
    assert isinstance(local, TypeError) and str(local) == "worker 1 at h:1: TypeError: bad leaf"
    lost = StrataxError("gone")
    assert step_error("worker 0", lost) is lost
