"""gloo's I/O thread is found among the threads the backend starts, and yields its core.

The 2-process check that JAX's own gloo thread is the one changed is in
tests/multiprocess/test_shm_collectives.py (``idle threads``).
"""

from __future__ import annotations

import os
import select
import threading

import pytest

from stratax._src.runtime import gloo_io

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="needs Linux /proc")


class _Waiter:
    """A thread blocked in ``epoll`` (like gloo's I/O loop) or on a futex (like XLA's pool)."""

    def __init__(self, in_epoll: bool) -> None:
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._epoll = select.epoll() if in_epoll else None
        self._read, self._write = os.pipe()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        self._ready.wait(5)

    def _run(self) -> None:
        self._ready.set()
        if self._epoll is not None:
            self._epoll.register(self._read, select.EPOLLIN)
            self._epoll.poll(30)  # until close() writes to the pipe
        else:
            self._stop.wait(30)

    def wait_blocked(self) -> None:
        """Until the thread sleeps in the kernel (its state is S)."""
        tid = self.thread.native_id
        for _ in range(500):
            with open(f"/proc/self/task/{tid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "S":
                    return
            threading.Event().wait(0.01)
        raise AssertionError(f"thread {tid} never blocked")

    def close(self) -> None:
        self._stop.set()
        os.write(self._write, b"x")
        self.thread.join(5)
        for fd in (self._read, self._write):
            os.close(fd)
        if self._epoll is not None:
            self._epoll.close()


@pytest.fixture
def waiters():
    made: list[_Waiter] = []
    yield lambda in_epoll: made.append(_Waiter(in_epoll)) or made[-1]
    for waiter in made:
        waiter.close()


def test_a_thread_in_epoll_is_found_and_one_on_a_futex_is_not(waiters):
    poller, sleeper = waiters(True), waiters(False)
    poller.wait_blocked()
    sleeper.wait_blocked()
    assert gloo_io.waits_in_epoll(poller.thread.native_id)
    assert not gloo_io.waits_in_epoll(sleeper.thread.native_id)
    assert not gloo_io.waits_in_epoll(2**22 + 12345)  # no such thread


@pytest.mark.parametrize("priority", ["idle", "nice"])
def test_deprioritize_changes_only_that_thread(waiters, priority):
    poller = waiters(True)
    tid = poller.thread.native_id
    assert gloo_io.deprioritize(tid, priority)
    if priority == "idle":
        assert os.sched_getscheduler(tid) == os.SCHED_IDLE
    else:
        assert os.getpriority(os.PRIO_PROCESS, tid) == 19
    assert os.sched_getscheduler(threading.get_native_id()) != os.SCHED_IDLE
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) != 19


def test_a_refused_change_warns_and_names_the_switch(caplog):
    assert not gloo_io.deprioritize(2**22 + 12345, "idle")  # no such thread: ESRCH
    assert "STRATAX_GLOO_IO_PRIORITY=normal" in caplog.text


def test_priority_from_the_environment(monkeypatch):
    monkeypatch.delenv("STRATAX_GLOO_IO_PRIORITY", raising=False)
    assert gloo_io.io_priority() == "idle"
    monkeypatch.setenv("STRATAX_GLOO_IO_PRIORITY", " Normal ")
    assert gloo_io.io_priority() == "normal"
    monkeypatch.setenv("STRATAX_GLOO_IO_PRIORITY", "low")
    with pytest.raises(ValueError, match=r"STRATAX_GLOO_IO_PRIORITY='low' .* idle, nice, normal"):
        gloo_io.io_priority()
