"""The bound on steps in flight: how often the host waits, and how soon a failed step surfaces."""

import jax
import pytest

from stratax._src.runtime import throttle


class _Step:
    """A dispatched step's output: waiting on it raises once an earlier step failed (a failed
    step fails every later one, as a train step's state carries the failure)."""

    def __init__(self, index: int, failed_from: int, waits: list[int]) -> None:
        self.index, self.failed_from, self.waits = index, failed_from, waits

    def block_until_ready(self) -> "_Step":
        self.waits.append(self.index)
        if self.index >= self.failed_from:
            raise RuntimeError(f"step {self.failed_from} failed")
        return self


def _admit(window: throttle.DispatchWindow, steps: int, failed_from: int = 10**9) -> list[int]:
    waits: list[int] = []
    for index in range(steps):
        window.admit({"loss": _Step(index, failed_from, waits)})
    return waits


def test_the_window_waits_once_per_release():
    assert _admit(throttle.DispatchWindow(2), 6) == [0, 1, 2, 3]
    assert _admit(throttle.DispatchWindow(16, 8), 40) == [7, 15, 23]
    assert _admit(throttle.DispatchWindow(0), 40) == []


@pytest.mark.parametrize("size, release", [(2, 1), (4, 2), (16, 8)])
def test_a_failed_step_surfaces_at_the_first_wait(size, release):
    window, waits, admitted = throttle.DispatchWindow(size, release), [], 0
    with pytest.raises(RuntimeError, match="step 0 failed"):
        for index in range(3 * size):
            window.admit(_Step(index, 0, waits))
            admitted += 1
    assert admitted == size  # step `size` found the window full and waited
    assert waits == [release - 1]


def test_drain_raises_a_late_failure_and_forget_drops_the_rest():
    window = throttle.DispatchWindow(16, 8)
    waits: list[int] = []
    for index in range(5):
        window.admit(_Step(index, 3, waits))
    with pytest.raises(RuntimeError, match="step 3 failed"):
        window.drain()
    window.forget()
    window.drain()  # nothing left to wait for
    assert waits == [0, 1, 2, 3]


def test_release_must_fit_the_window():
    with pytest.raises(ValueError, match=r"release must be in \[1, size=4\]; received 5"):
        throttle.DispatchWindow(4, release=5)


def test_multi_process_jobs_are_bounded_and_one_process_is_not():
    devices = jax.devices()[:1]
    window = throttle.window_for(devices, 2)
    assert (window.size, window.release) == (throttle.MULTI_PROCESS_WINDOW,
                                             throttle.MULTI_PROCESS_RELEASE)
    assert throttle.window_for(devices, 1).size == 0
